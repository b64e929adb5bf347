"""Fixtures that start real processes (Reverb workloads, the sidecar), and the `slow` mark.

Two tiers: `make test-fast` runs `pytest -m "not slow"` (pure core, fakes behind
our interfaces, in-process API and SQLite: seconds); `make test` runs all.
A test is slow when it starts processes, a Reverb server, an agent, or needs
Debian packages. Marked slow here, without a line in the test: a test that uses
the process fixtures below, and every test of a module that imports what starts
agents or Reverb (or costs seconds to import: JAX, TensorFlow). Any other
module that is slow as a whole says `pytestmark = pytest.mark.slow`.
"""

from __future__ import annotations

import ast
import functools
import http.client
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from harness.procs import PYTHON, Proc, free_port, get_json

WORKLOAD = "harness/reverb_workload.py"

# Fixtures that start processes: a test using one is slow wherever it lives.
PROCESS_FIXTURES = frozenset({"spawn", "sidecar", "reverb_workload", "unguarded_sidecar"})
_SLOW_MODULE = re.compile(r"^pytestmark = .*pytest\.mark\.slow\b", re.MULTILINE)
# A module importing these starts agents or Reverb servers, or pays seconds of imports.
SLOW_IMPORTS = ("reverb", "tensorflow", "jax", "harness.agent", "bench.detection")


@functools.cache
def is_slow_module(path: Path) -> bool:
    """Read from the source, so that a fast run need not import the module at all."""
    text = path.read_text()
    if _SLOW_MODULE.search(text):
        return True
    for node in ast.parse(text, str(path)).body:  # module level: what collection imports
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
            [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
        if any(n == m or n.startswith(m + ".") for n in names for m in SLOW_IMPORTS):
            return True
    return False


def pytest_configure(config: pytest.Config) -> None:
    for name, meaning in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {meaning}")


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Under -m "not slow", a module that is slow as a whole is not even imported.

    None of its tests would run, but importing it would: the agent and Reverb
    test modules import TensorFlow and JAX, several seconds each on this machine.
    """
    if config.getoption("markexpr", "") != "not slow" or collection_path.suffix != ".py":
        return None
    if not collection_path.name.startswith("test_"):
        return None
    return is_slow_module(collection_path) or None


@pytest.fixture
def short_temp() -> Iterator[Path]:
    """Ray's temp dir: short, since its socket paths must fit AF_UNIX's 107 bytes."""
    temp = Path(tempfile.mkdtemp(prefix="rwrl-"))
    yield temp
    shutil.rmtree(temp, ignore_errors=True)


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
        return proc, proc.announce()["reverb"]

    return start


@pytest.fixture
def reverb_servers(spawn: Callable[..., Proc]) -> Callable[[int], list[str]]:
    """N independent Reverb servers in one subprocess (one TensorFlow import, not N); load
    on the first only. For tests that never kill or stop one of them alone."""

    def start(n: int) -> list[str]:
        proc = spawn([PYTHON, WORKLOAD, "--servers", str(n)], name="reverb")
        return list(proc.announce()["all"])

    return start


def _serving(proc: Proc, base: str, ok: tuple[int, ...], timeout_s: float = 60.0) -> bool:
    """Whether `proc` answers `/healthz` with one of `ok` before it exits; False when another
    process took its port first (free_port's port is free only until someone binds it: Ray,
    Reverb and other lanes bind ephemeral ports too); any other exit or a timeout raises with
    the end of its log, so a crash is told from a slow start."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if get_json(f"{base}/healthz", 1.0)[0] in ok:
                return True
        except (OSError, http.client.HTTPException, ValueError):  # not up yet
            pass
        if proc.returncode is not None:
            log = proc.log_path.read_text(errors="replace") if proc.log_path else ""
            if "Address already in use" in log:
                return False
            raise RuntimeError(f"the sidecar exited {proc.returncode}: {log[-2000:]}")
        time.sleep(0.1)
    log = proc.log_path.read_text(errors="replace") if proc.log_path else ""
    raise TimeoutError(f"the sidecar did not answer {base}/healthz in {timeout_s:g} s: "
                       f"{log[-2000:]}")


@pytest.fixture
def sidecar(spawn: Callable[..., Proc]) -> Callable[..., tuple[Proc, str]]:
    """`replaywatch watch` as a real process on a free port: (proc, base URL)."""

    def start(*flags: str, env: dict[str, str] | None = None) -> tuple[Proc, str]:
        for _ in range(3):
            port = free_port()
            proc = spawn([PYTHON, "-m", "replaywatch", "watch", "--listen",
                          f"127.0.0.1:{port}", *flags], name="sidecar", env=env)
            base = f"http://127.0.0.1:{port}"
            # 401 counts as up: a test may protect /healthz with a token.
            if _serving(proc, base, (200, 401)):
                return proc, base
        raise RuntimeError("three free ports were taken before the sidecar could bind them")

    return start


@pytest.fixture(scope="module")
def unguarded_sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Proc, str]]:
    """One `replaywatch watch` (no token, an unreachable Reverb target) for a whole module
    whose tests only read it: a start costs seconds of both cores."""
    where = tmp_path_factory.mktemp("sidecar")
    for attempt in range(3):
        port = free_port()
        proc = Proc([PYTHON, "-m", "replaywatch", "watch", "--listen", f"127.0.0.1:{port}",
                     "--reverb", "127.0.0.1:9", "--db", str(where / f"i{attempt}.db")],
                    stdout_path=where / f"sidecar-{attempt}.log")
        base = f"http://127.0.0.1:{port}"
        try:
            if not _serving(proc, base, (200,)):
                continue
        except Exception:
            proc.kill()
            raise
        try:
            yield proc, base
        finally:
            proc.kill()
        return
    raise RuntimeError("three free ports were taken before the sidecar could bind them")


# `make test` runs four xdist workers with `--dist loadgroup`. A module marked `agents`
# starts the JAX agent (a Ray cluster, 12 tf.data workers), each some 10-20 s of both cores at
# start-up, and asserts that a stall is named within windows of seconds: those modules share
# one lane, one after another, un-niced. Two agents starting at once on 2 cores starve each
# other's actors of CPU for seconds, which is a real `sample_blocked`, not a flake to retry.
# A module marked `frameworks` runs a framework's own loop (Acme, TF-Agents, Launchpad,
# RLlib): those share a second lane, niced like every lane but the agents', so the agent lane
# keeps the cores first; every other test runs beside them in the other two.
# A module marked `long` has tests of 15 s or more (sleep-bound sidecars over learned
# windows, browsers, real faults): handed out first, since xdist hands tests out in
# collection order and a long test collected last makes its lane the last to finish.
MARKERS = {
    "slow": "starts processes, Reverb, an agent or needs Debian packages; deselect with "
            "-m 'not slow' (make test-fast)",
    "agents": "starts the JAX agent: runs in make test's agent lane, one after another",
    "frameworks": "runs Acme's, TF-Agents', Launchpad's or RLlib's own loop: make test's "
                  "second lane",
    "long": "has tests of 15 s or more: handed out first, the longest first "
            "(long(seconds=N) where more than 15)",
    "launchpad": "the Launchpad tier: required to pass where REPLAYWATCH_REQUIRE_LAUNCHPAD=1",
    "rllib": "the RLlib tier in make test: required to pass where REPLAYWATCH_REQUIRE_RLLIB=1",
}


# The agent lane is make test's critical path; the other lanes, handed their long tests
# first, finish before it. Their workers (and what their tests start) run at
# nice 3, a weight of 526 against the agent lane's 1024: its start-ups (JAX, TensorFlow,
# Ray, twelve tf.data workers) get the cores first, and the other lanes spend their slack.
OTHER_LANES_NICE = 3
LANES = ("agents", "frameworks")  # marks that are lanes of their own (one worker each)
_niced: list[bool] = []


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if (os.environ.get("PYTEST_XDIST_WORKER") and not _niced
            and item.get_closest_marker("agents") is None):
        os.nice(OTHER_LANES_NICE)  # for good: a worker that ran the agent lane has done so
        _niced.append(True)


def _handed_out(item: pytest.Item) -> tuple[int, float]:
    """The two lanes first (a group each, one worker each), then the long tests, the longest
    first (`long(seconds=N)`, else 15), then the rest. A long test handed out late lands on
    whichever lane frees first, the agent lane included, and becomes the critical path."""
    if _lane(item):
        return (0, 0.0)
    long = item.get_closest_marker("long")
    return (1, -float(long.kwargs.get("seconds", 15.0))) if long else (2, 0.0)


def _lane(item: pytest.Item) -> str | None:
    return next((m for m in LANES if item.get_closest_marker(m)), None)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Marks process-starting tests slow and agent tests for their lane; drops haiku's shim.

    dm-haiku puts an object in sys.modules["haiku.experimental.flax"] whose every
    attribute raises ImportError; hypothesis' plugin reads `__file__` of every
    loaded module while collecting and would stop the whole session. We never
    use haiku's flax interop.
    """
    for item in items:
        if PROCESS_FIXTURES & set(getattr(item, "fixturenames", ())) or is_slow_module(
                Path(str(item.fspath))):
            item.add_marker(pytest.mark.slow)
        if (lane := _lane(item)) is not None:
            item.add_marker(pytest.mark.xdist_group(lane))
    items.sort(key=_handed_out)  # stable: each module's own order is kept
    shim = sys.modules.get("haiku.experimental.flax")
    if shim is not None and type(shim).__name__ == "FlaxNotInstalled":
        del sys.modules["haiku.experimental.flax"]


# CI (.ci/run) sets REPLAYWATCH_REQUIRE_LAUNCHPAD=1 and REPLAYWATCH_REQUIRE_RLLIB=1 through the
# Makefile: there each tier must have run and passed, whatever skipped or deselected it, or the
# session fails. Their venvs are built by make test and skip with one line where they cannot be.
TIERS = {"launchpad": ("REPLAYWATCH_REQUIRE_LAUNCHPAD",
                       "real Launchpad programs (Python 3.10, dm-launchpad 0.5.2)"),
         "rllib": ("REPLAYWATCH_REQUIRE_RLLIB", "real RLlib jobs (Ray 2.60, torch on the CPU)")}
_tier_passed: dict[str, list[str]] = {tier: [] for tier in TIERS}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call" and report.passed:
        for tier, passed in _tier_passed.items():
            if tier in report.keywords:
                passed.append(report.nodeid)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if hasattr(session.config, "workerinput") or session.config.getoption("collectonly"):
        return  # an xdist worker: the controller, which sees every report, judges
    for tier, (required, what) in TIERS.items():
        name = "RLlib" if tier == "rllib" else tier.capitalize()
        if _tier_passed[tier]:
            sys.stdout.write(f"\n{name} tier: {len(_tier_passed[tier])} tests passed on {what}\n")
        elif os.environ.get(required) == "1":
            sys.stderr.write(f"\n{required}=1: no test marked {tier} ran and passed (the {name} "
                             "tier was skipped)\n")
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


# REPLAYWATCH_LANE_LOG=FILE: each test's worker, start and end (seconds since the epoch) and
# the CPU seconds it cost, one line each, so that make test's critical path can be read lane
# by lane and its cost test by test (tools/lanes.py prints both). Wall time on 2 shared cores
# says little about cost: as root on cgroup v1 each worker moves into a cpuacct group of its
# own, which also charges the processes its tests start (servers, jobs, Ray) to the test.
_CPUACCT = Path("/sys/fs/cgroup/cpuacct")
_lane_cpu: list[Path] = []


def _lane_cpu_s() -> float | None:
    if not _lane_cpu:
        group = _CPUACCT / f"replaywatch-lane-{os.getpid()}"
        for stale in _CPUACCT.glob("replaywatch-lane-*"):
            try:
                stale.rmdir()  # an earlier run's, its worker gone; a live one's refuses
            except OSError:
                pass
        try:
            group.mkdir(exist_ok=True)
            (group / "cgroup.procs").write_text(str(os.getpid()))
        except OSError:
            return None  # not root, or cgroup v2: the log gives wall time only
        _lane_cpu.append(group / "cpuacct.usage")
    return int(_lane_cpu[0].read_text()) / 1e9


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    log = os.environ.get("REPLAYWATCH_LANE_LOG")
    began, cpu = time.time(), _lane_cpu_s() if log else None
    yield
    if log:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        spent = "" if cpu is None else f"{(_lane_cpu_s() or cpu) - cpu:.2f}"
        with open(log, "a") as out:
            out.write(f"{worker}\t{began:.2f}\t{time.time():.2f}\t{item.nodeid}\t{spent}\n")
