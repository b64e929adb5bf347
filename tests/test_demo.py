"""`make demo` shows only its own job, and takes every process it started with it.

Real processes: tools/demo.py as `make demo` runs it, its JAX agent and its sidecar. The
port check needs no agent; each signal test waits for the demo's banner (agent and sidecar
both up), signals the demo alone (not its process group), and then finds none of the
processes that were below it.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import time
from pathlib import Path

import pytest

from harness.procs import PYTHON, Proc, alive, descendants, free_port, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("demo"), pytest.mark.timeout(240)]


def demo(tmp_path: Path, port: int) -> Proc:
    return Proc([PYTHON, "tools/demo.py"], env={"DEMO_PORT": str(port), "DEMO_DIR": str(tmp_path)},
                stdout_path=tmp_path / "demo.out")



def test_a_port_already_answering_is_refused_before_anything_starts(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = demo(tmp_path, port)
        code = proc.popen.wait(timeout=60)
    out = (tmp_path / "demo.out").read_text()
    assert code != 0
    assert f"127.0.0.1:{port} is already in use" in out and "DEMO_PORT=0" in out
    assert not (tmp_path / "demo-agent.log").exists()  # no agent was started


def test_a_port_left_in_time_wait_by_a_stopped_demo_is_free_again() -> None:
    spec = importlib.util.spec_from_file_location("demo_tool", "tools/demo.py")
    assert spec is not None and spec.loader is not None
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert tool.port_in_use(port)  # listening: in use
        with socket.create_connection(("127.0.0.1", port)) as client:
            accepted, _ = server.accept()
            accepted.close()  # the server side closes first, as a stopped sidecar does
            client.recv(1)
    with socket.socket() as plain:  # the TIME_WAIT a plain bind trips over
        with pytest.raises(OSError):
            plain.bind(("127.0.0.1", port))
    assert not tool.port_in_use(port)


# SIGHUP is handled as SIGTERM is (tools/demo.py installs one handler for both): each run
# starts the agent and the sidecar, ~25 s of both cores, so the shared path runs once.
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL],
                         ids=lambda s: signal.Signals(s).name)
def test_no_agent_or_sidecar_outlives_the_demo(tmp_path: Path, sig: int) -> None:
    proc = demo(tmp_path, free_port())
    try:
        wait_until(lambda: "replaywatch demo:" in (tmp_path / "demo.out").read_text()
                   or proc.returncode is not None, 180)
        assert proc.returncode is None, (tmp_path / "demo.out").read_text()[-2000:]
        below = descendants(proc.pid)
        assert len(below) >= 2, below  # the agent and the sidecar
        os.kill(proc.pid, sig)
        proc.popen.wait(timeout=60)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and any(alive(p) for p in below):
            time.sleep(0.2)
        left = [p for p in below if alive(p)]
        assert left == [], f"still running after {signal.Signals(sig).name}: {left}"
    finally:
        proc.kill()
