"""memory_exhaustion and a kill at the limit, on a real Reverb server in a real memory cgroup.

The test makes a cgroup v1 memory group as root (where none can be made it says so in one
line and skips), starts harness/memory_hog.py in it (a Reverb server filled with
incompressible 63,504-byte frames at 90 items a second by a real writer, towards a max_size
that cannot fit), sets the limit 448 MiB above what the group uses once the server is up,
and watches it with the sidecar's own poller, the server's process named by --reverb-pid.
memory_exhaustion must be active while the table is at most a quarter full and at least 60 s
before the kernel kills the server, its first time left within a quarter of the real time to
the kill and never above it (and at no poll more than a quarter above the time left then);
after the kill, target_down carries the cgroup's OOM kill. The cycle it opens in and
each after the kill replay to the live verdict. bench/memory.py runs the same with the
figures, and a table that fits.

Two shards of one job in one group, each of whose tables fits alone: memory_exhaustion named
on them together before the kernel kills one, each item read from its own process; then the
max_size printed for each, run in the same limit: full, no kill.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from harness.procs import PYTHON, Proc
from replaywatch.config import PollConfig, WatchConfig
from replaywatch.model import Finding
from replaywatch.wiring import build_sidecar
from tests.support.repro import assert_replays

pytestmark = [
    pytest.mark.slow, pytest.mark.timeout(300),
    # 80 s of a filling server beside the agent lane cost make test its 8 minutes: it runs in
    # `make test-memory` (and `make bench-memory` runs the same with the figures).
    pytest.mark.skipif(os.environ.get("REPLAYWATCH_MEMORY_TESTS") != "1",
                       reason="the real-cgroup OOM test runs in make test-memory"),
]

V1 = Path("/sys/fs/cgroup/memory")
HEADROOM = 448 << 20
RATE = 90.0
MAX_SIZE = 40_000


def make_cgroup(name: str) -> Path | None:
    try:
        path = V1 / name
        path.mkdir()
        return path
    except OSError:
        return None


@pytest.fixture
def cgroup() -> Iterator[Path]:
    path = make_cgroup(f"replaywatch-test-{os.getpid()}")
    if path is None:
        pytest.skip(f"no memory cgroup can be made under {V1} here (needs root and cgroup v1)")
    yield path
    for _ in range(50):  # its last process may take a moment to leave
        try:
            path.rmdir()
            return
        except OSError:
            time.sleep(0.1)


def test_a_table_that_cannot_fit_is_named_long_before_the_kill(
        spawn: Callable[..., Proc], cgroup: Path, tmp_path: Path) -> None:
    hog = spawn([PYTHON, "harness/memory_hog.py", "--cgroup", str(cgroup),
                 "--max-size", str(MAX_SIZE), "--rate", str(RATE)], name="memory-hog")
    start = hog.announce()
    used = int((cgroup / "memory.usage_in_bytes").read_text())
    (cgroup / "memory.limit_in_bytes").write_text(str(used + HEADROOM))
    config = WatchConfig(targets=(start["reverb"],), reverb_pids=((start["reverb"],
                                                                   start["pid"]),),
                         poll=PollConfig(interval_s=1.0, history_s=900.0))
    first: tuple[float, Finding] | None = None
    lefts: list[tuple[float, int]] = []  # each poll's time left: (when, seconds)
    down: Finding | None = None
    killed_at = None
    after_kill = None
    began = time.monotonic()
    with build_sidecar(config, incidents_path=str(tmp_path / "i.db")) as sidecar:
        while time.monotonic() - began < 240 and down is None:
            t0 = time.monotonic()
            state = sidecar.poller.tick()
            if hog.returncode is not None or (first is None and any(
                    f.kind == "memory_exhaustion" for f in state.findings)):
                # when it opens, and each cycle after the kill
                [bundle] = assert_replays(sidecar, state)
                if hog.returncode is not None and bundle.inputs.view.memory:
                    after_kill = bundle.inputs.view.memory[-1]
            if killed_at is None and hog.returncode is not None:
                killed_at = time.monotonic()
            for f in state.findings:
                if f.kind == "memory_exhaustion" and first is None:
                    first = (time.monotonic(), f)
                if f.kind == "memory_exhaustion" and f.evidence["seconds_left"] is not None:
                    lefts.append((time.monotonic(), f.evidence["seconds_left"]))
                if f.kind == "target_down" and f.evidence.get("killed_at_memory_limit"):
                    down = f
            time.sleep(max(0.0, 1.0 - (time.monotonic() - t0)))
    assert first is not None, "memory_exhaustion never opened"
    at, f = first
    ev = f.evidence
    assert ev["current_size"] <= MAX_SIZE // 4, ev
    assert ev["limit_from"] == "cgroup v1" and ev["found_by"] == "--reverb-pid"
    assert 60_000 <= ev["bytes_per_item"] <= 90_000, ev  # a 63,504-byte frame and its chunk
    assert killed_at is not None and down is not None, "the server was not killed in 240 s"
    to_kill = killed_at - at
    assert to_kill >= 60, to_kill
    assert 0.75 * to_kill <= ev["seconds_left"] <= to_kill + 1, (ev["seconds_left"], to_kill)
    # A poll later on: a second's rounding and the poll the kill is seen by, no more.
    over = [(left, killed_at - at) for at, left in lefts
            if left > max(1.25 * (killed_at - at), killed_at - at + 2)]
    assert not over, over
    assert down.evidence["oom_kills"] >= 1
    # The bundle of the cycle after the kill carries the memory series it was judged on.
    assert after_kill is not None and after_kill.pid is None and after_kill.oom_kills >= 1


SHARD_RATE = 60.0
SHARD_SIZES = (2_500, 5_000)  # ~63,504-byte frames: each fits the headroom alone, not both


def _oom_kills(cgroup: Path) -> int:
    for line in (cgroup / "memory.oom_control").read_text().splitlines():
        if line.startswith("oom_kill "):
            return int(line.split()[1])
    return 0


def _shards(spawn: Callable[..., Proc], cgroup: Path, sizes: tuple[int, ...], tmp_path: Path,
            name: str) -> tuple[list[Proc], Path]:
    """A Reverb server per size in `cgroup`, each filled by its own writer, listed as one job
    in a targets file."""
    hogs = [spawn([PYTHON, "harness/memory_hog.py", "--cgroup", str(cgroup), "--max-size",
                   str(size), "--rate", str(SHARD_RATE)], name=f"{name}-{i}")
            for i, size in enumerate(sizes)]
    addresses = [hog.announce()["reverb"] for hog in hogs]
    listed = tmp_path / f"{name}.json"
    listed.write_text(json.dumps([{"targets": addresses, "labels": {"job": "pong"}}]))
    return hogs, listed


def test_two_shards_in_one_group_are_named_together_and_the_sizes_printed_fit(
        spawn: Callable[..., Proc], cgroup: Path, tmp_path: Path) -> None:
    hogs, listed = _shards(spawn, cgroup, SHARD_SIZES, tmp_path, "shard")
    limit = int((cgroup / "memory.usage_in_bytes").read_text()) + HEADROOM
    (cgroup / "memory.limit_in_bytes").write_text(str(limit))
    config = WatchConfig(targets=(), targets_file=str(listed),
                         poll=PollConfig(interval_s=1.0, history_s=900.0))
    first: Finding | None = None
    named_at = 0.0
    began = time.monotonic()
    with build_sidecar(config, incidents_path=str(tmp_path / "i.db")) as sidecar:
        while time.monotonic() - began < 180 and all(h.returncode is None for h in hogs):
            t0 = time.monotonic()
            state = sidecar.poller.tick()
            together = [f for f in state.findings if f.kind == "memory_exhaustion"
                        and f.evidence.get("shares_limit_with")]
            if together and first is None:
                first, named_at = together[0], time.monotonic()
                assert_replays(sidecar, state)
            time.sleep(max(0.0, 1.0 - (time.monotonic() - t0)))
    killed_at = time.monotonic()
    assert first is not None, "memory_exhaustion of the two shards never opened"
    assert killed_at - named_at >= 20, (named_at - began, killed_at - began)
    ev = first.evidence
    assert ev["memory_from"] == "the cgroup's anonymous memory" and ev["limit_bytes"] == limit
    for server in ev["servers"].values():  # each item read from its own process
        for table in server["tables"].values():
            assert 60_000 <= table["bytes_per_item"] <= 90_000, ev
    assert any(h.returncode is not None for h in hogs) and _oom_kills(cgroup) >= 1, \
        "the kernel did not kill a shard: the finding was wrong"
    for hog in hogs:
        hog.kill()
    # The fix it printed, run: each server's max_size lowered to the one printed for it.
    printed = [ev["servers"][a]["tables"]["replay"]["fits_max_size"] if ev["servers"][a][
        "tables"] else size for a, size in zip(_listed(listed), SHARD_SIZES, strict=True)]
    kills = _oom_kills(cgroup)
    hogs, listed = _shards(spawn, cgroup, tuple(printed), tmp_path, "fixed")
    (cgroup / "memory.limit_in_bytes").write_text(str(limit))
    (cgroup / "memory.max_usage_in_bytes").write_text("0")  # the peak from here on
    fill_s = max(printed) / SHARD_RATE + 20
    time.sleep(fill_s)
    assert all(h.returncode is None for h in hogs) and _oom_kills(cgroup) == kills, printed
    peak = int((cgroup / "memory.max_usage_in_bytes").read_text())
    print(json.dumps({"named_s": round(named_at - began), "before_kill_s": round(
        killed_at - named_at), "limit": limit, "printed": printed, "peak": peak}))


def _listed(listed: Path) -> list[str]:
    return json.loads(listed.read_text())[0]["targets"]
