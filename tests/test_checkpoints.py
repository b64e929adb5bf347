"""Checkpoints and restores on real Reverb servers, each a replay process with its ReplayProbe
handed the server (harness/replay_checkpoints.py), watched by the sidecar over the server's
port and the probe's HTTP, every cycle's bundle replayed (tests/support/repro.py):

  * Reverb's default checkpointer with an interval is checkpoint_unrestorable before any
    restart, and a restart of it does start empty; the printed fix (a DefaultCheckpointer
    with a directory) restores every item after a restart, and is not named;
  * a directory the server cannot write is checkpoint_failed with Reverb's error, and so is a
    write cut by a kill, once the process starts again on the same directory;
  * a restore into code with another max_size, sampler and limiter is
    restore_config_override naming both sides; the printed fix (a directory without that
    checkpoint) serves the code's settings, and is not named;
  * a restore that takes seconds (the replay process held to 5 % of a core by a cpu cgroup,
    as a slow disk or a busy host would) is restoring with an ETA, never target_down, then a
    restart from the checkpoint. How close the ETA comes on a long load: make
    bench-checkpoints (bench/RESULTS.md).
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from harness.cgroups import CPU, cpu_limited
from harness.procs import PYTHON, Proc
from replaywatch.config import PollConfig, ProbeTarget, WatchConfig
from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.model import Finding, Name, Severity
from replaywatch.state import Published
from replaywatch.wiring import Sidecar, build_sidecar
from tests.support.repro import free_port, tick_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240), pytest.mark.long(seconds=60)]
SCRIPT = "harness/replay_checkpoints.py"


def replay(spawn: Callable[..., Proc], *flags: str, name: str = "replay",
           argv: tuple[str, ...] = ()) -> tuple[Proc, dict]:
    proc = spawn([*argv, PYTHON, SCRIPT, *flags], name=name)
    return proc, proc.announce(match=lambda r: r.get("event") == "serving")


def watching(address: str, probe: str, interval_s: float = 0.2) -> Sidecar:
    config = WatchConfig(targets=(address,), probes=(ProbeTarget(probe, address),),
                         thresholds=Thresholds(stall_window_s=5.0),
                         poll=PollConfig(interval_s=interval_s, history_s=300.0))
    return build_sidecar(config, incidents_path=":memory:")


def found(state: Published, kind: Name) -> Finding | None:
    return next((f for f in state.findings if f.kind == kind), None)


def wait_for(proc: Proc, event: str, timeout_s: float = 60.0) -> dict:
    return proc.announce(timeout_s=timeout_s, match=lambda r: r.get("event") == event)


def test_a_temporary_checkpointer_is_unrestorable_and_a_directory_restores(
        spawn: Callable[..., Proc], tmp_path: Path) -> None:
    proc, up = replay(spawn, "--every-s", "1", "--fill", "20")
    with watching(up["reverb"], up["replay_probe"]) as car:
        # Named from the checkpointer's path alone; its evidence counts the writes once the
        # first (every second, slower on loaded cores) is done.
        seen: list = []
        assert tick_until(car, lambda s: (g := found(s, Name.CHECKPOINT_UNRESTORABLE))
                          is not None and g.evidence["checkpoints_written"] >= 1, 20.0,
                          seen=seen) is not None
        f = found(seen[-1], Name.CHECKPOINT_UNRESTORABLE)
    assert f is not None and f.severity is Severity.WARNING
    assert f.evidence["checkpointer_path"].startswith(tempfile.gettempdir())
    assert f.evidence["checkpoints_written"] >= 1 and f.evidence["every_s"] == 1.0
    # What it warns of: the same process started again finds nothing.
    proc.kill()
    _, again = replay(spawn, "--every-s", "1", name="replay-again")
    assert again["size"] == 0

    # The printed fix: a directory that outlives the process. Restarted, every item is back.
    ckpt = tmp_path / "ckpt"
    proc, up = replay(spawn, "--dir", str(ckpt), "--every-s", "1", "--fill", "20",
                      name="replay-dir")
    wait_for(proc, "checkpoint")
    proc.kill()
    _, restored = replay(spawn, "--dir", str(ckpt), "--every-s", "1", name="replay-restored")
    assert restored["size"] == 20
    with watching(restored["reverb"], restored["replay_probe"]) as car:
        seen: list[Published] = []
        tick_until(car, lambda s: False, 3.0, seen=seen)
    assert not any(found(s, Name.CHECKPOINT_UNRESTORABLE) or found(s, Name.CHECKPOINT_FAILED)
                   for s in seen)


@pytest.fixture
def read_only_dir() -> Iterator[tuple[Path, tuple[str, ...]]]:
    """A checkpoint directory the replay process may read and not write. Root writes through
    any mode, so as root the process runs in its own mount namespace where the directory is
    a read-only bind mount (a read-only volume, as a pod may have one)."""
    parent = Path(tempfile.mkdtemp(prefix="rw-ro-"))
    ckpt = parent / "ckpt"
    ckpt.mkdir()
    argv: tuple[str, ...] = ()
    if os.geteuid() == 0:
        argv = ("unshare", "-m", "sh", "-c",
                'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"',
                str(ckpt))
        if shutil.which("unshare") is None or subprocess.run(
                [*argv, "true"], capture_output=True).returncode != 0:
            pytest.skip("running as root where no mount namespace can be made: no directory "
                        "is read-only to root")
    else:
        ckpt.chmod(stat.S_IRUSR | stat.S_IXUSR)
    yield ckpt, argv
    shutil.rmtree(parent, ignore_errors=True)


def test_a_directory_the_server_cannot_write_is_checkpoint_failed(
        spawn: Callable[..., Proc], read_only_dir: tuple[Path, tuple[str, ...]]) -> None:
    ckpt, argv = read_only_dir
    proc, up = replay(spawn, "--dir", str(ckpt), "--every-s", "1", "--fill", "5", argv=argv)
    wait_for(proc, "checkpoint")
    with watching(up["reverb"], up["replay_probe"]) as car:
        assert tick_until(car, lambda s: found(s, Name.CHECKPOINT_FAILED) is not None,
                          10.0) is not None
        f = found(car.poller.tick(), Name.CHECKPOINT_FAILED)
    assert f is not None and any(why in f.evidence["error"] for why in (
        "Read-only file system", "Permission denied")), f.evidence
    assert f.evidence["last_complete"] is None and f.evidence["failed_calls"] >= 1


def test_a_write_cut_by_a_kill_is_checkpoint_failed_after_the_restart(
        spawn: Callable[..., Proc], tmp_path: Path) -> None:
    # 300 items of 1 MiB: a write of a few seconds, killed once Reverb made its directory.
    ckpt = tmp_path / "ckpt"
    proc, _ = replay(spawn, "--dir", str(ckpt), "--fill", "300", "--item-kib", "1024",
                     "--max-size", "300", "--checkpoint-once", name="replay-cut")
    deadline = time.monotonic() + 60
    while not (ckpt.is_dir() and any(ckpt.iterdir())) and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.kill()
    cut = [d.name for d in ckpt.iterdir() if not (d / "DONE").exists()]
    assert cut, "the write ended before the kill: the case proves nothing"
    _, up = replay(spawn, "--dir", str(ckpt), "--max-size", "300", name="replay-after")
    assert up["size"] == 0  # Reverb skips a checkpoint without DONE: nothing came back
    with watching(up["reverb"], up["replay_probe"]) as car:
        assert tick_until(car, lambda s: found(s, Name.CHECKPOINT_FAILED) is not None,
                          10.0) is not None
        f = found(car.poller.tick(), Name.CHECKPOINT_FAILED)
    assert f is not None and f.evidence["incomplete"] == cut, f.evidence


def test_a_restore_into_other_code_is_an_override_and_a_fresh_directory_serves_the_code(
        spawn: Callable[..., Proc], tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    proc, _ = replay(spawn, "--dir", str(ckpt), "--max-size", "1000", "--fill", "50",
                     "--checkpoint-once", name="replay-old")
    wait_for(proc, "checkpoint")
    proc.kill()
    code = ("--max-size", "500", "--spi", "4", "--min-size", "10", "--error-buffer", "50",
            "--sampler", "prioritized")
    _, up = replay(spawn, "--dir", str(ckpt), *code, name="replay-new")
    assert up["size"] == 50  # the checkpoint's items, under the checkpoint's settings
    with watching(up["reverb"], up["replay_probe"]) as car:
        assert tick_until(car, lambda s: found(s, Name.RESTORE_CONFIG_OVERRIDE) is not None,
                          10.0) is not None
        f = found(car.poller.tick(), Name.RESTORE_CONFIG_OVERRIDE)
    assert f is not None and f.table == "replay"
    assert {"max_size", "sampler", "samples_per_insert", "min_size_to_sample"} <= set(
        f.evidence["changed"]), f.evidence
    assert f.evidence["code"]["max_size"] == 500 and f.evidence["served"]["max_size"] == 1000
    assert f.evidence["code"]["sampler"] == "prioritized"
    assert f.evidence["served"]["sampler"] == "uniform"
    assert f.evidence["restored_from"].startswith(str(ckpt))

    # The printed fix: a directory without that checkpoint serves what the code wrote.
    _, fresh = replay(spawn, "--dir", str(tmp_path / "fresh"), *code, name="replay-fresh")
    with watching(fresh["reverb"], fresh["replay_probe"]) as car:
        seen: list[Published] = []
        tick_until(car, lambda s: False, 3.0, seen=seen)
    assert seen and not any(found(s, Name.RESTORE_CONFIG_OVERRIDE) for s in seen)
    assert seen[-1].tables[(fresh["reverb"], "replay")].max_size == 500


@pytest.fixture
def slow_cpu() -> Iterator[Path]:
    """A cpu cgroup (v1) holding its processes to 5 % of one core."""
    try:
        with cpu_limited(0.05, "replaywatch-restore") as group:
            yield group
    except OSError as e:
        pytest.skip(f"no cpu cgroup to slow a restore with ({e.strerror}: {CPU})")


def test_a_restore_that_takes_seconds_is_restoring_with_an_eta_then_a_restart(
        spawn: Callable[..., Proc], tmp_path: Path, slow_cpu: Path) -> None:
    ckpt, port, probe_port = tmp_path / "ckpt", free_port(), free_port()
    same = ("--dir", str(ckpt), "--port", str(port), "--probe-port", str(probe_port),
            "--max-size", "1000")
    proc, up = replay(spawn, *same, "--fill", "200", "--item-kib", "1024",
                      "--checkpoint-once", name="replay-full")
    wait_for(proc, "checkpoint")
    seen: list[Published] = []
    # Polled once a second: a probe held to 5 % of a core answers in a few tenths.
    with watching(up["reverb"], up["replay_probe"], interval_s=1.0) as car:
        tick_until(car, lambda s: False, 1.0)
        proc.kill()
        go = tmp_path / "go"
        loading = spawn([PYTHON, SCRIPT, *same, "--wait-file", str(go)], name="replay-load")
        pid = wait_for(loading, "probe")["pid"]
        (slow_cpu / "cgroup.procs").write_text(str(pid))
        go.touch()
        began = time.monotonic()
        tick_until(car, lambda s: found(s, Name.SERVER_RESTARTED) is not None, 90.0,
                   seen=seen)
        wait_for(loading, "serving", 5.0)
        restarted = found(seen[-1], Name.SERVER_RESTARTED)

        def loaded(s: Published) -> bool:
            code = s.memory[up["reverb"]].code
            return code is not None and code.restore is not None and bool(code.restore.ended_at)

        # The port may answer a poll before the probe's own thread does
        assert tick_until(car, loaded, 10.0, seen=seen) is not None
    # The load as its probe timed it (from the moment it began reading)
    last = seen[-1].memory[up["reverb"]].code
    assert last is not None and last.restore is not None and last.restore.ended_at is not None
    took = last.restore.ended_at - last.restore.started_at
    restoring = [f for s in seen if (f := found(s, Name.RESTORING)) is not None]
    assert restoring, [sorted(f.kind for f in s.findings) for s in seen[-5:]]
    assert not any(found(s, Name.TARGET_DOWN) for s in seen)
    # Each reading's whole load (so far plus its ETA) against the load's real length, once a
    # quarter of it passed (the first reads are the files' headers, not the load's pace).
    totals = [f.evidence["restoring_for_s"] + f.evidence["eta_s"] for f in restoring
              if f.evidence.get("eta_s") is not None and f.evidence["restoring_for_s"] >= took / 4]
    print("restore took", took, "each reading's whole load", totals)
    assert took >= 2.0 and totals, (totals, took)
    assert all(abs(t - took) <= 0.3 * took for t in totals), (totals, took)
    assert restarted is not None
    assert restarted.evidence["tables"]["replay"]["restored_from_checkpoint"] is True
    assert time.monotonic() - began < 120
