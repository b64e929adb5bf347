"""Fixtures that start real processes: Reverb workloads and the sidecar."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from harness.procs import PYTHON, Proc, free_port, get_json, wait_until

WORKLOAD = "tests/support/reverb_workload.py"


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., Proc]]:
    """Starts child processes that are killed (with their group) at teardown."""
    procs: list[Proc] = []

    def start(args: list[str], name: str = "proc", env: dict[str, str] | None = None) -> Proc:
        proc = Proc(args, env=env, stdout_path=tmp_path / f"{name}-{len(procs)}.log")
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.kill()


@pytest.fixture
def reverb_workload(spawn: Callable[..., Proc]) -> Callable[..., tuple[Proc, str]]:
    """A real Reverb server (+ insert/sample loops) in a subprocess: (proc, address)."""

    def start(*flags: str, port: int = 0) -> tuple[Proc, str]:
        proc = spawn([PYTHON, WORKLOAD, "--port", str(port), *flags], name="reverb")
        return proc, proc.announce(timeout_s=60)["reverb"]

    return start


@pytest.fixture
def sidecar(spawn: Callable[..., Proc]) -> Callable[..., tuple[Proc, str]]:
    """`replaywatch watch` as a real process on a free port: (proc, base URL)."""

    def start(*flags: str, env: dict[str, str] | None = None) -> tuple[Proc, str]:
        port = free_port()
        proc = spawn([PYTHON, "-m", "replaywatch", "watch", "--listen", f"127.0.0.1:{port}",
                      *flags], name="sidecar", env=env)
        base = f"http://127.0.0.1:{port}"
        # 401 counts as up: a test may protect /healthz with a token.
        wait_until(lambda: get_json(f"{base}/healthz", 1.0)[0] in (200, 401), timeout_s=30)
        return proc, base

    return start


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems() -> None:
    """Drop haiku's flax shim before hypothesis scans sys.modules.

    dm-haiku puts an object in sys.modules["haiku.experimental.flax"] whose every
    attribute raises ImportError; hypothesis' plugin reads `__file__` of every
    loaded module while collecting and would stop the whole session. We never
    use haiku's flax interop.
    """
    import sys

    shim = sys.modules.get("haiku.experimental.flax")
    if shim is not None and type(shim).__name__ == "FlaxNotInstalled":
        del sys.modules["haiku.experimental.flax"]
