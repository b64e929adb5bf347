"""Real processes: spawn in their own session, read the announce line, always clean up.

Every HTTP call here has a timeout, and `Proc.kill`/`Proc.terminate` end the child's
whole tree (its process group and every descendant), so neither a test nor a bench run
can outlive a hung child.
"""

from __future__ import annotations

import atexit
import ctypes
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def descendants(pid: int) -> list[int]:
    """Every live process below `pid`, from /proc's parent links.

    Ray starts its GCS, raylet and workers in sessions of their own, out of reach of a
    signal to the child's group; once the child dies they are reparented and can no
    longer be found, so this is read before anything is signalled. Measured: a killed
    distributed agent's learner and actors ran on for 4 s at 70% and 40% of a core each,
    in the next test's time.
    """
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:  # it exited while we read
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])  # after the name, which may hold spaces
        children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    """Whether `pid` runs: a killed child its parent has not reaped yet (a zombie) is gone."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def parent_death_signal(sig: int) -> Callable[[], None]:
    """A preexec_fn: the child gets `sig` when the thread that started it dies, SIGKILL of
    the parent included (Linux's PR_SET_PDEATHSIG). A hung agent runs no handler, so a
    parent that only cleans up on the way out leaves it behind when it is killed outright."""
    parent = os.getpid()
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork

    def arm() -> None:
        if prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            os._exit(126)
        if os.getppid() != parent:  # the parent died before the signal was armed
            os._exit(126)

    return arm


# How long a child may take to print its first line. Most import TensorFlow, JAX or torch
# first: alone a few seconds, but on make test's 2 shared cores, niced beside a cluster of
# RLlib jobs, one took over a minute. A child that dies is said at once, whatever this is.
STARTUP_S = 240.0


# The programs whose preloaded modules read nothing from the environment at import that a
# test sets per process: where REPLAYWATCH_FORK_WORKLOADS=1 (make test) each is forked from a
# zygote that imported them once (harness/zygote.py), not started from scratch. Measured
# here: four workload modules 154.8 -> 88.8 CPU-s, test_tf_agents 96.9 -> 79.0, two agent
# modules 83.6 -> 77.3. A zygote starts with its first child's environment: what a module
# reads from it at import holds for every child. A child that asks for a death signal is
# always started as before.
_REVERB = ("numpy", "reverb", "tensorflow", "replaywatch.probe")
FORKABLE = {
    "harness/reverb_workload.py": _REVERB,
    "harness/loop_workload.py": _REVERB,
    "harness/replay_checkpoints.py": _REVERB,
    "tests/support/starved_learner.py": _REVERB,
    "examples/tf_agents_dqn.py": _REVERB + (
        "tf_agents.agents.dqn.dqn_agent", "tf_agents.drivers.py_driver",
        "tf_agents.environments.suite_gym", "tf_agents.environments.tf_py_environment",
        "tf_agents.networks.sequential", "tf_agents.policies.py_tf_eager_policy",
        "tf_agents.policies.random_py_policy", "tf_agents.replay_buffers.reverb_replay_buffer",
        "tf_agents.replay_buffers.reverb_utils", "tf_agents.specs.tensor_spec",
        "tf_agents.utils.common"),
    # The JAX agent: what its synchronous run imports (jax, haiku, TensorFlow, Reverb), not
    # Ray, which its distributed run imports only once it has set Ray's environment.
    "-m agents.run": _REVERB + ("jax", "haiku", "optax", "agents.local"),
    # Acme's example, after the shims that must come before Acme's first import (not Acme).
    "-m tests.support.acme_compat": _REVERB + ("jax",),
}


def fork_key(args: list[str]) -> str | None:
    """What `args` runs, as FORKABLE names it (`SCRIPT`, or `-m MODULE`), if Python runs it."""
    rest = args[1:] if args[:1] == [PYTHON] else []
    rest = rest[1:] if rest[:1] == ["-u"] else rest  # unbuffered: so is every forked child
    if rest[:1] == ["-m"] and len(rest) > 1:
        return f"-m {rest[1]}"
    return rest[0] if rest else None


_zygote_lock = threading.Lock()
_zygotes: dict[tuple[str, ...], tuple[subprocess.Popen[bytes], str]] = {}


def _forget_zygote(preload: tuple[str, ...], path: str) -> None:
    """Drops the zygote at `path` once it is gone, so that the next ask starts another."""
    with _zygote_lock:
        if preload in _zygotes and _zygotes[preload][1] == path:
            zygote = _zygotes.pop(preload)[0]
            zygote.kill()
            zygote.wait(timeout=30)


def _zygote_path(preload: tuple[str, ...], env: dict[str, str]) -> str:
    """The socket of this process's zygote for `preload`, started (or restarted) here."""
    with _zygote_lock:
        if preload in _zygotes and _zygotes[preload][0].poll() is None:
            return _zygotes[preload][1]
        home = tempfile.mkdtemp(prefix="rwz-")  # short: AF_UNIX paths fit in 107 bytes
        path, log = os.path.join(home, "sock"), Path(home, "log")
        with open(log, "wb") as out:
            zygote = subprocess.Popen([PYTHON, "-m", "harness.zygote", path, *preload],
                                      cwd=ROOT, start_new_session=True, stdout=out,
                                      stderr=subprocess.STDOUT, env=env)
        atexit.register(shutil.rmtree, home, True)  # runs after the kill below (LIFO)
        atexit.register(zygote.kill)
        deadline = time.monotonic() + STARTUP_S
        while b'"zygote"' not in log.read_bytes():
            if zygote.poll() is not None or time.monotonic() > deadline:
                zygote.kill()
                raise RuntimeError(f"the workload zygote did not start: "
                                   f"{log.read_text(errors='replace')[-2000:]}")
            time.sleep(0.05)
        _zygotes[preload] = (zygote, path)
        return path


class Forked:
    """A workload forked by the zygote, read as the subset of Popen that Proc uses: its
    exit status arrives on the connection that asked for it."""

    def __init__(self, args: list[str], env: dict[str, str], out: int | None,
                 preload: tuple[str, ...]):
        """`args`: [PYTHON, SCRIPT, ...] or [PYTHON, -m, MODULE, ...] (-u allowed first).
        Its stdout and stderr both go to descriptor `out`, or, where `out` is None, to two
        text pipes, `stdout` and `stderr`, that the caller must read."""
        key = fork_key(args)
        assert key is not None, args
        self.args = args
        self.returncode: int | None = None
        self.stdout: IO[str] | None = None
        self.stderr: IO[str] | None = None
        self.pid = 0  # none yet: the zygote's first reply names it
        program = args[args.index(key.split()[-1]):]  # from the script or module on
        request = {"argv": program, "module": key.startswith("-m "), "env": env,
                   "cwd": str(ROOT), "nice": os.nice(0)}
        reply: dict[str, Any] | None = None
        for attempt in (1, 2):
            path = _zygote_path(preload, env)
            try:
                reply = self._ask(path, request, out)
                break
            except (ConnectionRefusedError, ConnectionResetError, BrokenPipeError,
                    FileNotFoundError) as e:
                # A zygote that died as it was asked: its connection closed before the
                # listening socket went, so a dying one is still taken for alive. Its kernel
                # refused or reset the request unread, so nothing was forked: ask a new one.
                self._conn.close()
                for pipe in (self.stdout, self.stderr):
                    if pipe is not None:
                        pipe.close()
                self.stdout = self.stderr = None
                if attempt == 2:
                    raise RuntimeError(f"the workload zygote could not start {args}: {e}"
                                       ) from None
                _forget_zygote(preload, path)
        if reply is None or "pid" not in reply:
            raise RuntimeError(f"the workload zygote could not start {args}: {reply}")
        self.pid = int(reply["pid"])

    def _ask(self, path: str, request: dict[str, Any], out: int | None
             ) -> dict[str, Any] | None:
        """Sends `request` to the zygote at `path`: its first reply (the child's pid)."""
        self._conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._conn.settimeout(30.0)
        self._conn.connect(path)
        ends: list[int] = []
        if out is None:
            (read_out, write_out), (read_err, write_err) = os.pipe(), os.pipe()
            self.stdout, self.stderr = open(read_out), open(read_err)  # noqa: SIM115
            ends = [write_out, write_err]
        try:
            with open(os.devnull, "rb") as stdin:
                socket.send_fds(self._conn, [json.dumps(request).encode() + b"\n"],
                                [stdin.fileno(), *(ends if out is None else [out, out])])
        finally:
            for end in ends:  # the child holds its own copies
                os.close(end)
        self._buffer = b""
        return self._line(30.0)

    def _line(self, timeout_s: float | None) -> dict[str, Any] | None:
        """The zygote's next line; None when none came in `timeout_s`."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while b"\n" not in self._buffer:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([self._conn], [], [], left)[0]:
                return None
            data = self._conn.recv(4096)
            if not data:  # the zygote died: its child is not left running unwatched
                if self.pid:  # none yet: it read the request and died (never asked twice)
                    try:
                        os.killpg(self.pid, signal.SIGKILL)
                    except OSError:
                        pass
                return {"status": -signal.SIGKILL}
            self._buffer += data
        line, self._buffer = self._buffer.split(b"\n", 1)
        return dict(json.loads(line))

    def poll(self) -> int | None:
        if self.returncode is None:
            reply = self._line(0.0)
            if reply is not None:
                self.returncode = int(reply["status"])
                self._conn.close()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            reply = self._line(timeout)
            if reply is None:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            self.returncode = int(reply["status"])
            self._conn.close()
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None and self.pid:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


class Proc:
    """A child in its own session, so the whole group can be signalled."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None,
                 stdout_path: Path | None = None, pipes: bool = False,
                 death_signal: int | None = None):
        """Output goes to `stdout_path` (stderr with it), to two text pipes the caller must
        read (`pipes`), or nowhere: a pipe nobody reads would fill and block the child.
        `death_signal`: the signal the child gets when the thread that started it dies
        (`parent_death_signal`); start such children from a thread that outlives them."""
        self.args = args
        self.log_path = stdout_path
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", "TF_CPP_MIN_LOG_LEVEL": "2",
                    "RAY_USAGE_STATS_ENABLED": "0", **(env or {})}
        out: Any = open(stdout_path, "wb") if stdout_path else subprocess.DEVNULL
        self.popen: subprocess.Popen[Any] | Forked
        key = fork_key(args)
        if (os.environ.get("REPLAYWATCH_FORK_WORKLOADS") == "1" and key in FORKABLE
                and death_signal is None):
            with open(os.devnull, "wb") as null:
                fd = None if pipes else out.fileno() if stdout_path else null.fileno()
                self.popen = Forked(args, full_env, fd, FORKABLE[key])
        else:
            self.popen = subprocess.Popen(
                args, cwd=ROOT, start_new_session=True, text=pipes,
                preexec_fn=parent_death_signal(death_signal) if death_signal else None,
                stdout=subprocess.PIPE if pipes else out,
                stderr=subprocess.PIPE if pipes else subprocess.STDOUT,
                env=full_env,
            )
        if stdout_path:
            out.close()  # the child holds its own copy

    @property
    def pid(self) -> int:
        return self.popen.pid

    def announce(self, timeout_s: float = STARTUP_S,
                 match: Callable[[dict[str, Any]], bool] = lambda record: True
                 ) -> dict[str, Any]:
        """The first JSON object line the child prints on stdout (that `match` accepts)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            record = self.announced(match)
            if record is not None:
                return record
            if self.popen.poll() is not None:
                assert self.log_path is not None
                raise RuntimeError(f"{self.args} exited {self.popen.returncode}: "
                                   f"{self.log_path.read_text(errors='replace')[-2000:]}")
            time.sleep(0.1)
        raise TimeoutError(f"{self.args} printed no JSON line in {timeout_s}s")

    def announced(self, match: Callable[[dict[str, Any]], bool] = lambda record: True
                  ) -> dict[str, Any] | None:
        """The first JSON object line printed so far that `match` accepts, else None."""
        assert self.log_path is not None
        for line in self.log_path.read_text(errors="replace").splitlines():
            if "{" in line:
                try:
                    # raw_decode from the first brace: a child's C++ threads log to the same
                    # file and may write into the line before or after the JSON.
                    record = json.JSONDecoder().raw_decode(line[line.index("{"):])[0]
                except ValueError:
                    continue
                if isinstance(record, dict) and match(record):
                    return record
        return None

    def signal(self, sig: int) -> None:
        try:
            os.killpg(self.popen.pid, sig)
        except ProcessLookupError:
            pass

    @property
    def returncode(self) -> int | None:
        return self.popen.poll()

    def kill(self, tree: list[int] | None = None) -> None:
        """SIGKILL the group and every descendant (`tree`: read earlier, see terminate)."""
        tree = descendants(self.pid) if tree is None else tree
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGKILL)
        for pid in tree:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            self.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass

    def terminate(self, timeout_s: float = 10.0) -> int | None:
        """TERM the group; what is left after the child exits (or `timeout_s`) is killed."""
        tree = descendants(self.pid)
        self.signal(signal.SIGTERM)
        try:
            code: int | None = self.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            code = None
        self.kill(tree)
        return code


def get_json(url: str, timeout_s: float = 5.0, headers: dict[str, str] | None = None
             ) -> tuple[int, Any]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        body = e.read()
        try:
            return e.code, json.loads(body)
        except ValueError:
            return e.code, body.decode(errors="replace")


def get_text(url: str, timeout_s: float = 5.0, headers: dict[str, str] | None = None
             ) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}),
                                    timeout=timeout_s) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def wait_until(predicate: Any, timeout_s: float, interval_s: float = 0.1) -> Any:
    """Polls `predicate` until it returns a truthy value; returns it or raises."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
        except Exception as e:  # the thing may not be up yet
            last = e
        if last and not isinstance(last, Exception):
            return last
        time.sleep(interval_s)
    raise TimeoutError(f"condition not met in {timeout_s}s (last: {last!r})")
