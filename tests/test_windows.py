"""Learned stall windows on real processes: a healthy learner whose step takes 12 s is not
paged, however it is watched, and the same learner hung is named within 3 of its steps.

The job is the loop workload (harness/loop_workload.py) in its asynchronous layout: an actor
thread inserting until the limiter holds it at max_diff, a learner that takes a batch and
sleeps 12 s (a device step), a TrainerProbe and an ActorProbe. Four sidecars poll it once a
second from this process: Reverb alone, with the trainer probe, with every probe, and with
every probe under a pinned 10 s window (the old behaviour, which must page: the test can
fail). Half way the every-probe sidecar is restarted on its incident log: it resumes the
rhythm and pages nothing. The learner then hangs for good outside next().
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
HANG_AT_S = 50.0  # after about four steps
RESTART_AT_S = 30.0
JOB = ["harness/loop_workload.py", "--layout", "async", "--workers", "1", "--batch-size", "16",
       "--samples-per-insert", "4", "--min-size", "100", "--error-buffer", "64",
       "--learner-step-s", str(STEP_S), "--learner-hang-at-s", str(HANG_AT_S),
       "--train-s", "600", "--timeout-s", "600", "--hang-after", "600"]


def test_a_12_s_learner_is_never_paged_and_its_hang_is_named_within_3_steps(
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
            named = set()  # the probe sidecars that named the hang: then it is done
            while (time.monotonic() - began < HANG_AT_S + 3 * STEP_S + 15
                   and named != {"trainer probe", "every probe"}):
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
                        if f.kind == "learner_stalled" and at > HANG_AT_S:
                            named.add(mode)
                time.sleep(max(0.0, 1.0 - (time.monotonic() - began) % 1.0))
        finally:
            inner.close()
    # Healthy until it hangs, however it is watched.
    for mode in ("reverb alone", "trainer probe", "every probe"):
        before = [p for p in paged[mode] if p[0] < HANG_AT_S + STEP_S]
        assert before == [], (mode, before[:3])
    # With a probe, the hang is named within 3 x the learner's 12 s step of its last progress
    # (+ the step it hung in, + 2 polls, + a poll of slack for this loop's own timing).
    # Reverb alone sees the learner only through sampling, which its prefetching pipeline
    # draws every other step: it learns a 24 s rhythm, and 4 learner-paced draws must pass
    # before it can tell a learner that trained from one still starting (tests in
    # test_windows_core.py; make bench-long times it).
    for mode in ("trainer probe", "every probe"):
        critical = [p for p in paged[mode] if p[1] == "learner_stalled"]
        assert critical, (mode, paged[mode][:3])
        assert critical[0][0] <= HANG_AT_S + STEP_S + 3 * STEP_S + 3, (mode, critical[0])
        assert critical[0][2].startswith("learned: "), (mode, critical[0])
    # The fixed window pages the healthy learner long before it hangs.
    assert [p for p in paged["pinned 10 s"] if p[0] < HANG_AT_S][:1], paged["pinned 10 s"]
