"""Learned stall windows on real processes: a healthy learner whose step takes 12 s is not
paged, however it is watched, nor by a sidecar restarted mid-run in its first minute.

The job is the loop workload (harness/loop_workload.py) in its asynchronous layout: an actor
thread inserting until the limiter holds it at max_diff, a learner that takes a batch and
sleeps 12 s (a device step), a TrainerProbe and an ActorProbe. Four sidecars poll it once a
second from this process: Reverb alone, with the trainer probe, with every probe, and with
every probe under a pinned 10 s window (the old behaviour, which must page: the test can
fail). At 30 s the every-probe sidecar is restarted on its incident log: it resumes the
rhythm and pages nothing in the minute after. How fast a hung 12 s learner is named is
tests/test_windows_core.py's (36 to 38 s) and bench/RESULTS.md's (a real run).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

import pytest

from harness.procs import PYTHON, Proc
from replaywatch.config import PollConfig, ProbeTarget, WatchConfig
from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.model import Severity
from replaywatch.wiring import Sidecar, build_sidecar

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

STEP_S = 12.0
RESTART_AT_S = 30.0
WATCH_S = RESTART_AT_S + 60.0
JOB = ["harness/loop_workload.py", "--layout", "async", "--workers", "1", "--batch-size", "16",
       "--samples-per-insert", "4", "--min-size", "100", "--error-buffer", "64",
       "--learner-step-s", str(STEP_S), "--train-s", "600", "--timeout-s", "600",
       "--hang-after", "600"]


def test_a_12_s_learner_is_never_paged_nor_after_a_sidecar_restart(
        spawn: Callable[..., Proc], tmp_path: Path) -> None:
    job = spawn([PYTHON, *JOB], name="slow-learner").announce(timeout_s=120)
    reverb = job["reverb"].replace("localhost", "127.0.0.1")
    trainer, actor = ProbeTarget(job["probe"], None), ProbeTarget(job["actor_probe"], None)
    watched = {"reverb alone": (), "trainer probe": (trainer,), "every probe": (trainer, actor),
               "pinned 10 s": (trainer, actor)}

    def start(stack: ExitStack, mode: str) -> Sidecar:
        th = Thresholds(learned_windows=mode != "pinned 10 s")
        config = WatchConfig(targets=(reverb,), probes=watched[mode], thresholds=th,
                             poll=PollConfig(interval_s=1.0, history_s=900.0))
        return stack.enter_context(build_sidecar(
            config, incidents_path=str(tmp_path / f"{mode.replace(' ', '-')}.db")))

    paged: dict[str, list[tuple[float, str, str]]] = {m: [] for m in watched}
    began = time.monotonic()
    restarted = False
    with ExitStack() as outer:
        cars = {m: start(outer, m) for m in watched if m != "every probe"}
        inner = ExitStack()
        cars["every probe"] = start(inner, "every probe")
        try:
            while time.monotonic() - began < WATCH_S:
                at = time.monotonic() - began
                if not restarted and at >= RESTART_AT_S:
                    inner.close()  # the sidecar stops; a new one opens its incident log
                    inner = ExitStack()
                    cars["every probe"] = start(inner, "every probe")
                    restarted = True
                for mode, car in cars.items():
                    for f in car.poller.tick().findings:
                        if f.severity >= Severity.WARNING:
                            paged[mode].append((at, f.kind, f.evidence.get("window_why", "")))
                time.sleep(max(0.0, 1.0 - (time.monotonic() - began) % 1.0))
        finally:
            inner.close()
    # Healthy all along, however it is watched, and after the restart.
    assert restarted
    for mode in ("reverb alone", "trainer probe", "every probe"):
        assert paged[mode] == [], (mode, paged[mode][:3])
    # The fixed window pages the healthy learner.
    assert paged["pinned 10 s"], paged["pinned 10 s"]
