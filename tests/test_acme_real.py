"""The seed incident on Acme's own code: dm-acme 0.4.0 from PyPI.

`examples/acme_sync_loop.py` runs Acme's `make_reverb_dataset`, adder, prefetch thread,
`EnvironmentLoop` and synchronous `Agent` (act, insert, and one `learner.step()` per
`batch / samples_per_insert` observations) on the seed's limiter: `SampleToInsertRatio`
with insert blocking disabled. With 12 workers the packaged Acme hangs for real, in each
of 6 runs here (4 or 5 batches delivered, then 1152 samples stranded each time): 0.4.0's
`Agent` steps the learner by its observation count without asking `can_sample` first, so
there is no race to retry (the seed's later loop asks, and wins most races:
agents/seed_hang.py). With one worker the same loop keeps learning.

The job runs in a child (a hung tf.data pipeline never exits; the `spawn` fixture kills
its process group), Acme's imports shimmed by `tests/support/acme_compat.py`. Two sidecar
cores watch it in this process, one given the learner's probe (placed as the README's Acme
section says; that block is the example's, `test_acme_readme.py`), one Reverb alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from harness.procs import PYTHON, Proc, get_json
from replaywatch.config import PollConfig, ProbeTarget, WatchConfig
from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.model import Finding, Severity
from replaywatch.wiring import Sidecar, build_sidecar

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300), pytest.mark.frameworks]

EXAMPLE = "examples/acme_sync_loop.py"
POLL_S = 0.25
THRESHOLDS = Thresholds(stall_window_s=3.0, min_history_s=1.0, startup_grace_s=1.0)
WATCH_S = 12.0  # a healthy loop watched for four stall windows


def start_loop(spawn: Callable[..., Proc], workers: int, *flags: str) -> dict[str, Any]:
    proc = spawn([PYTHON, "-m", "tests.support.acme_compat", EXAMPLE,
                  "--num-parallel-calls", str(workers), *flags], name=f"acme-{workers}")
    return proc.announce()


def sidecar(stack: ExitStack, job: dict[str, Any], tmp_path: Path, with_probe: bool
            ) -> Sidecar:
    probes = (ProbeTarget(job["probe"], None),) if with_probe else ()
    config = WatchConfig(targets=(job["reverb"],), probes=probes, thresholds=THRESHOLDS,
                         poll=PollConfig(interval_s=POLL_S, history_s=300.0))
    db = tmp_path / f"incidents-{'probe' if with_probe else 'reverb'}.db"
    return stack.enter_context(build_sidecar(config, incidents_path=str(db)))


def found(findings: tuple[Finding, ...] | list[Finding], kind: str) -> Finding | None:
    return next((f for f in findings if f.kind == kind), None)


def test_twelve_workers_hang_acmes_loop_named_worker_starvation_with_the_probe(
        spawn: Callable[..., Proc], tmp_path: Path) -> None:
    job = start_loop(spawn, 12)
    seen: set[str] = set()
    with ExitStack() as stack:
        probed, alone = (sidecar(stack, job, tmp_path, p) for p in (True, False))
        deadline, starved, blocked = time.monotonic() + 120, None, None
        while time.monotonic() < deadline and (starved is None or blocked is None):
            probed_state, alone_state = probed.poller.tick(), alone.poller.tick()
            seen |= {f.kind for f in (*probed_state.findings, *alone_state.findings)}
            starved = starved or found(probed_state.findings, "worker_starvation")
            blocked = blocked or found(alone_state.findings, "sample_blocked")
            time.sleep(POLL_S)
        alone_kinds = {f.kind for f in alone.poller.tick().findings}
    probe = get_json(f"{job['probe']}/probe", 2.0)[1]
    assert starved is not None, (seen, probe)
    assert blocked is not None, seen
    # The probe sits on the learner's own iterator: its steps are Acme's learner steps.
    assert probe["num_parallel_calls"] == 12 and probe["blocked_in_next"], probe
    assert probe["learner_steps"] == probe["batches_retrieved"], probe
    assert starved.severity is Severity.CRITICAL
    ev = starved.evidence
    print(f"\nworker_starvation: stranded {ev['stranded_samples']} (drawn {ev['drawn']}, "
          f"delivered {ev['delivered']}, prefetched {ev['prefetched']}), sampling iterators "
          f"up to {ev['sampling_iterators_up_to']}, blocked {ev['blocked_for_s']:.1f} s")
    assert ev["layout"].startswith("synchronous") and ev["workers"] == 12
    # The circular wait in numbers: a batch's worth or more drawn and held by the workers, and
    # fewer than 12 x 256, or one worker would have completed a batch.
    assert 256 <= ev["stranded_samples"] < 12 * 256, ev
    assert ev["delivered"] == 256 * probe["batches_retrieved"], (ev, probe)
    assert "the loop inserts only after a learner step" in starved.summary
    # The budget model's fixes: one worker cannot split a batch, nor hold 12 x 255.
    assert "num_parallel_calls=1 (now 12" in starved.fix
    assert {f["knob"] for f in ev["fixes"]} >= {"num_parallel_calls", "error_buffer"}
    # Reverb alone: the loop, not actors, and the same fix first, with how to settle it.
    assert blocked.evidence["layout"].startswith("synchronous")
    assert "the loop that inserts is the loop that samples" in blocked.summary
    assert "actors" not in blocked.summary
    assert "fewer num_parallel_calls" in blocked.fix
    assert "TrainerProbe" in blocked.fix
    assert "worker_starvation" not in alone_kinds  # only stacks or the probe can prove it


def test_one_worker_keeps_acmes_loop_learning_with_no_alarm(
        spawn: Callable[..., Proc], tmp_path: Path) -> None:
    job = start_loop(spawn, 1)
    alarms: list[Finding] = []
    steps: list[int] = []
    with ExitStack() as stack:
        probed, alone = (sidecar(stack, job, tmp_path, p) for p in (True, False))
        start = time.monotonic()
        while time.monotonic() - start < WATCH_S or len(steps) < 2 or steps[-1] == 0:
            assert time.monotonic() - start < 120, ("no learner step in 120 s", steps)
            for state in (probed.poller.tick(), alone.poller.tick()):
                alarms += [f for f in state.findings if f.severity >= Severity.WARNING]
            steps.append(get_json(f"{job['probe']}/probe", 2.0)[1]["learner_steps"])
            time.sleep(POLL_S)
    learning = [s for s in steps if s > 0]
    assert learning[-1] > learning[0] + 50, steps  # one step per 2 observations goes on
    assert not alarms, [(f.kind, f.summary) for f in alarms]
