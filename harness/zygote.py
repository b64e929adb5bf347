"""A process that has imported Reverb (so TensorFlow), and what else a workload imports,
once, and forks the tests' workloads from there: each a real process of its own, with a
real Reverb server or client.

Usage: python -m harness.zygote SOCKET MODULE...

Why: importing Reverb costs 3.5 to 5 CPU-s here, and `make test` starts some fifty such
processes (reverb_workload, loop_workload, replay_checkpoints, the TF-Agents example, the
JAX agent): about 150 CPU-s of its roughly 950, on 2 cores, spent importing the same
modules. A fork costs milliseconds. The programs and what each preloads: FORKABLE in
harness/procs.py.

What the child gets is what `python SCRIPT ARGS` would give it: its own session (so its
group can be signalled), the caller's stdin/stdout/stderr (passed as descriptors), working
directory, environment, `sys.argv` and `sys.path[0]`; the script runs as `__main__` and
the interpreter exits as it would (atexit, non-daemon threads joined, the exit status).
It differs in two ways, neither read by a workload: its command line is the zygote's, and
what TensorFlow read from the environment at import was the zygote's.

Fork safety: at the fork only the zygote's main thread runs Python; the other threads
importing TensorFlow leaves are OpenBLAS's servers (numpy's, scipy's), which OpenBLAS stops
and restarts across a fork. No TensorFlow runtime, gRPC channel, eager context or JAX
backend exists before the fork: the zygote only imports.

What draws randomness after the fork draws its own: Python's `random` reseeds itself in a
fork, numpy's global stream is reseeded here, and Reverb's keys and TensorFlow's unseeded
ops were checked to differ between two children.
Not Ray: its C++ IDs come from a generator seeded once per process, at import, and two RLlib
drivers forked after importing Ray drew the same WorkerIDs and ObjectIDs (one died in
Ray's WarmupStore: "Seal() called on an object without a reference to it"). A zygote that
finds Ray among its modules refuses to start.

Protocol, one connection per child on an AF_UNIX socket: the client sends one JSON line
(argv from the script or module on, whether it is a module, env, cwd, nice) with three
descriptors (SCM_RIGHTS); the zygote answers `{"pid": N}` and, when the child exits,
`{"status": S}` (Popen's returncode: minus the signal that killed it). A client that goes
away takes its child with it (SIGKILL to the child's group), and a zygote whose parent
dies kills its children and exits.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import sys
from typing import Any


def _read_request(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    conn.settimeout(10.0)  # a client sends its request at once
    data, fds, *_ = socket.recv_fds(conn, 1 << 20, 3)
    while not data.endswith(b"\n"):
        more = conn.recv(1 << 20)
        if not more:
            raise ConnectionError("the request ended early")
        data += more
    conn.settimeout(None)
    return json.loads(data), list(fds)


def _send(conn: socket.socket, record: dict[str, Any]) -> None:
    try:
        conn.sendall(json.dumps(record).encode() + b"\n")
    except OSError:  # the client went away: nothing to tell
        pass


def _enter_child(request: dict[str, Any], fds: list[int]) -> tuple[str, bool]:
    """In the fork: become `python SCRIPT ARGS` (or `python -m MODULE ARGS`); what to run,
    and whether it is a module."""
    os.setsid()
    try:
        os.setpriority(os.PRIO_PROCESS, 0, request["nice"])  # its client's, as a Popen child
    except (OSError, KeyError):
        pass
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    program = request["argv"][0]
    sys.argv = list(request["argv"])  # runpy sets argv[0] to the file it runs
    # What Python puts first on sys.path: the script's directory, or for -m the cwd.
    sys.path[0] = os.getcwd() if request["module"] else os.path.dirname(
        os.path.abspath(program))
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    import numpy as np
    np.random.seed()  # numpy's global stream was drawn once, in the zygote
    return program, bool(request["module"])


def serve(path: str) -> tuple[str, bool] | None:
    """The zygote's loop; returns only in a child, with what it must run."""
    parent = os.getppid()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    print(json.dumps({"zygote": path, "pid": os.getpid()}), flush=True)
    # pid -> its client's connection; None once that client left (the child is still reaped)
    children: dict[int, socket.socket | None] = {}
    while True:
        live = [conn for conn in children.values() if conn is not None]
        readable, _, _ = select.select([listener, *live], [], [], 0.1)
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            conn = children.pop(pid, None)
            if conn is not None:
                _send(conn, {"status": os.waitstatus_to_exitcode(status)})
                conn.close()
        if os.getppid() != parent:  # the tests' process died: so do its workloads
            for pid in children:
                _kill_group(pid)
            return None
        for ready in readable:
            if ready is listener:
                conn, _ = listener.accept()
                try:
                    request, fds = _read_request(conn)
                except (OSError, ValueError) as e:
                    _send(conn, {"error": f"bad request: {e}"})
                    conn.close()
                    continue
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    listener.close()
                    for other in children.values():
                        if other is not None:
                            other.close()
                    conn.close()
                    return _enter_child(request, fds)
                for fd in fds:
                    os.close(fd)
                children[pid] = conn
                _send(conn, {"pid": pid})
                continue
            pid = next((p for p, c in children.items() if c is ready), 0)
            try:
                gone = not ready.recv(1)
            except OSError:
                gone = True
            if pid and gone:  # the client closed its end: its child goes too
                _kill_group(pid)
                ready.close()
                children[pid] = None


def _kill_group(pid: int) -> None:
    for kill in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
        try:
            kill()
        except OSError:
            pass


def main() -> None:
    path, preload = sys.argv[1], sys.argv[2:]
    for name in preload:
        __import__(name)
    if "ray" in sys.modules:
        sys.exit(f"harness.zygote: {' '.join(preload)} imports Ray, whose IDs every forked "
                 "child would draw alike: start such a program as a process of its own")
    program = serve(path)
    if program is None:
        return
    import runpy
    name, module = program
    if module:
        runpy.run_module(name, run_name="__main__", alter_sys=True)
    else:
        runpy.run_path(name, run_name="__main__")


if __name__ == "__main__":
    main()
