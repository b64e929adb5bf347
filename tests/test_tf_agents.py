"""TF-Agents' own DQN job on Reverb (tf-agents 0.19.0): its replay buffer, observer, driver
and `as_dataset` pipeline, with the probe attached as the README's TF-Agents block says.

`examples/tf_agents_dqn.py` is a "collect K steps, train one" loop: a loop on a schedule, and
a pipeline of min(B, 32) Reverb datasets read by `num_parallel_calls` interleave threads with
one batch after the interleave. Measured here (B = 64): with 32 threads and error_buffer 256
it trains; with 3 threads, spi 8, error_buffer 40 and one collect step a train step, the
limiter has released 40 samples when the loop asks for 64, and it hangs in every run.

The job runs in a child (the `spawn` fixture kills its process group); the sidecar's core
polls it from this process.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from harness.procs import PYTHON, ROOT, Proc, get_json
from replaywatch.config import PollConfig, ProbeTarget, WatchConfig
from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.model import Finding, Severity
from replaywatch.wiring import Sidecar, build_sidecar

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420), pytest.mark.frameworks]

EXAMPLE = "examples/tf_agents_dqn.py"
POLL_S = 0.25
# The default stall window: what is judged here is the configuration, not a stall.
THRESHOLDS = Thresholds(min_history_s=1.0)
WATCH_S = 12.0
# The error_buffer-40 job: spi 8, one collect step a train step, 3 interleave threads.
BELOW_A_BATCH = ["--samples-per-insert", "8", "--error-buffer", "40", "--num-parallel-calls",
                 "3", "--collect-steps", "1"]
PREDICT_FLAGS = ["--samples-per-insert", "8", "--min-size-to-sample", "200", "--error-buffer",
                 "40", "--batch-size", "64", "--num-parallel-calls", "3", "--layout",
                 "sync-ratio", "--pipeline", "tf-agents", "--inserts-per-step", "1",
                 "--first-step-at", "202"]
CONFIG_KINDS = {"deadlock_risk", "batch_exceeds_headroom", "worker_starvation"}


def start_job(spawn: Callable[..., Proc], name: str, *flags: str) -> dict[str, Any]:
    proc = spawn([PYTHON, EXAMPLE, *flags], name=name)
    return proc.announce()


def sidecar(stack: ExitStack, job: dict[str, Any], tmp_path: Path, name: str) -> Sidecar:
    config = WatchConfig(targets=(job["reverb"].replace("localhost", "127.0.0.1"),),
                         probes=(ProbeTarget(job["probe"], None),), thresholds=THRESHOLDS,
                         poll=PollConfig(interval_s=POLL_S, history_s=300.0))
    return stack.enter_context(build_sidecar(config, incidents_path=str(tmp_path / name)))


def test_a_healthy_tf_agents_loop_of_32_threads_raises_no_risk(
        spawn: Callable[..., Proc], tmp_path: Path) -> None:
    job = start_job(spawn, "tfa-healthy", "--num-parallel-calls", "32", "--error-buffer", "256",
                    "--samples-per-insert", "16", "--collect-steps", "4",
                    "--train-steps", "1000000")
    alarms: list[Finding] = []
    with ExitStack() as stack:
        watched = sidecar(stack, job, tmp_path, "healthy.db")
        # Watched from its start, and for WATCH_S once it trains: under make test's load its
        # 32 interleave threads took 12 s to the first batch.
        start, batches, training = time.monotonic(), 0, None
        while training is None or time.monotonic() - training < WATCH_S:
            assert time.monotonic() - start < 120, "no batch in 120 s"
            state = watched.poller.tick()
            alarms += [f for f in state.findings if f.kind in CONFIG_KINDS]
            try:
                batches = get_json(f"{job['probe']}/probe", 2.0)[1]["batches_retrieved"]
            except OSError:
                # On make test's loaded cores the job once answered neither its probe nor
                # ServerInfo for 2 s, early in its run; the sidecar says so and polls on, and
                # so does this. What is judged is what the sidecar said, to WATCH_S of training.
                continue
            if batches and training is None:
                training = time.monotonic()
            time.sleep(POLL_S)
    assert batches > 100, batches
    assert not alarms, [(f.kind, f.summary) for f in alarms]


def fixed_flags(fix: dict[str, Any]) -> list[str]:
    """A fix as the example's flags: both knobs of a pair. A first step at N items is an
    initial collect of N + 2 steps (the observer's items trail its steps by about two)."""
    flags: list[str] = []
    part: dict[str, Any] | None = fix
    while part is not None:
        knob, value = part["knob"], part["value"]
        flag = {"batch_size": "--batch-size", "error_buffer": "--error-buffer",
                "num_parallel_calls": "--num-parallel-calls",
                "cycle_length": "--max-cycle-length", "inserts_per_step": "--collect-steps",
                "first_step_at": "--initial-collect"}[knob]
        flags += [flag, str(value + 2 if knob == "first_step_at" else value)]
        part = part.get("together_with")
    return flags


def run_to_the_end(flags: list[str]) -> dict[str, Any]:
    done = subprocess.run([PYTHON, EXAMPLE, *flags, "--train-steps", "300"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    lines = [x for x in done.stdout.splitlines() if x.startswith('{"outcome"')]
    return json.loads(lines[-1]) if lines else {"outcome": "error", "log": done.stderr[-800:]}


def test_a_limiter_that_releases_less_than_a_batch_is_named_before_the_first_next(
        spawn: Callable[..., Proc], tmp_path: Path) -> None:
    job = start_job(spawn, "tfa-below", *BELOW_A_BATCH, "--start-delay", "4")
    with ExitStack() as stack:
        watched = sidecar(stack, job, tmp_path, "below.db")
        deadline, certain, before = time.monotonic() + 60, None, None
        while time.monotonic() < deadline and certain is None:
            state = watched.poller.tick()
            certain = next((f for f in state.findings if f.kind == "batch_exceeds_headroom"),
                           None)
            before = get_json(f"{job['probe']}/probe", 2.0)[1]
            time.sleep(POLL_S)
    assert certain is not None
    # Named while the loop had not yet asked for a batch: from its declaration alone.
    assert before is not None and before["next_strides"] is None, before
    assert certain.severity is Severity.CRITICAL
    ev = certain.evidence
    # 40 + 8 x 2 items past min_size at its first step (its initial collect of 204 steps).
    assert (ev["verdict"], ev["released_samples"], ev["gate"]) == ("will_hang", 56, "schedule")
    assert ev["strandable_samples"] == 63 + 29 * 6  # 29 of 32 datasets unread, 6 in flight
    # `replaywatch predict` with TF-Agents' pipeline says the same, fixes and all.
    out = subprocess.run([sys.executable, "-m", "replaywatch", "predict", *PREDICT_FLAGS,
                          "--json"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    doc = json.loads(out.stdout)
    assert out.returncode == 1 and doc["verdict"] == "will_hang"
    assert doc["fixes"] == ev["fixes"]
    # And from the running job: its limiter from --reverb, its dataset and loop from --probe.
    live = subprocess.run([sys.executable, "-m", "replaywatch", "predict", "--reverb",
                           job["reverb"].replace("localhost", "127.0.0.1"), "--probe",
                           job["probe"], "--layout", "sync-ratio", "--json"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert live.returncode == 1, live.stderr
    assert json.loads(live.stdout)["fixes"] == ev["fixes"]
    # Every fix it prints, applied, trains to the end; the job as it is hangs.
    assert ev["fixes"], ev
    for fix in ev["fixes"]:
        outcome = run_to_the_end([*BELOW_A_BATCH, *fixed_flags(fix)])
        assert outcome["outcome"] == "ran", (fix, outcome)


def first_risk(job: dict[str, Any], tmp_path: Path, db: str, timeout_s: float) -> Finding:
    """The first batch_exceeds_headroom or deadlock_risk a sidecar watching `job` names on
    the pipeline read from its graph. Before the probe's first read (late on a loaded
    machine) a risk is judged on what was declared alone: the declared job's, not this one."""
    with ExitStack() as stack:
        watched = sidecar(stack, job, tmp_path, db)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            named = next((f for f in watched.poller.tick().findings
                          if f.kind in ("batch_exceeds_headroom", "deadlock_risk")
                          and f.evidence.get("dataset_from") == "the tf.data graph"), None)
            if named is not None:
                return named
            time.sleep(POLL_S)
    raise AssertionError(f"no risk named in {timeout_s:g} s")


def test_with_nothing_declared_the_read_pipeline_judges_as_the_declared_one(
        spawn: Callable[..., Proc], tmp_path: Path) -> None:
    # Only the iterator and the observer's client wrapped: the probe reads as_dataset's
    # graph (32 datasets, 3 threads, one batch of 64 after them), and the verdict, numbers
    # and fixes are those `predict` gives the dataset declared in full (its max_in_flight 6
    # read, not derived from a batch a fix changes: the batch fix holds either way). The
    # loop's gate is no part of the graph: unsaid, both readings are judged and the worse (a
    # schedule: will_hang) is a risk, not a page, until the loop's calls prove its gate (it
    # asks at 204 items with 72 released, which a can_sample loop would do too).
    job = start_job(spawn, "tfa-undeclared", *BELOW_A_BATCH, "--probe-declares-nothing")
    named = first_risk(job, tmp_path, "undeclared.db", 90)
    ev = named.evidence
    assert ev["dataset_from"] == "the tf.data graph" and ev["declared_differs"] == {}
    assert (ev["batch_size"], ev["workers"], ev["samplers"], ev["pipeline"]) == (
        64, 3, 32, "after-interleave")
    assert ev["verdict"] == "will_hang" and ev["judged_gate"] == "schedule"
    declared = subprocess.run(
        [sys.executable, "-m", "replaywatch", "predict", "--samples-per-insert", "8",
         "--min-size-to-sample", "200", "--min-diff", "1560", "--max-diff", "1640",
         "--batch-size", "64", "--num-parallel-calls", "3", "--layout", "sync", "--pipeline",
         "tf-agents", "--max-in-flight", "6", "--item-bytes", "80", "--prefetch", "3",
         "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=60)
    said = json.loads(declared.stdout)
    assert (ev["verdict"], ev["released_samples"], ev["strandable_samples"]) == (
        said["verdict"], said["budget"], said["strandable"])
    assert ev["fixes"] == said["fixes"]
    if named.kind == "deadlock_risk":
        assert ev["gate"] == "unknown" and "gate is unknown" in named.summary
    else:  # the table had released less than a batch when the loop asked: it is proven
        assert "which a loop that waits on can_sample never does" in ev["gate_basis"]


def test_an_asynchronous_collector_that_dies_is_sample_blocked_not_starvation(
        spawn: Callable[..., Proc], tmp_path: Path) -> None:
    # TF-Agents' asynchronous shape: a collector of its own (its ActorProbe) feeds a learner
    # that only trains, then dies. The learner blocks in next() with samples held by the
    # datasets, but nothing waits on the learner: dead actors, not starving workers.
    job = start_job(spawn, "tfa-async", "--num-parallel-calls", "32", "--error-buffer", "256",
                    "--samples-per-insert", "16", "--async-collector-s", "6",
                    "--train-steps", "1000000", "--hang-after", "60")
    config = WatchConfig(targets=(job["reverb"].replace("localhost", "127.0.0.1"),),
                         probes=(ProbeTarget(job["probe"], None),
                                 ProbeTarget(job["actor_probe"], None)),
                         thresholds=Thresholds(stall_window_s=3.0, min_history_s=1.0,
                                               startup_grace_s=1.0),
                         poll=PollConfig(interval_s=POLL_S, history_s=300.0))
    kinds: set[str] = set()
    with build_sidecar(config, incidents_path=str(tmp_path / "async.db")) as watched:
        deadline, blocked = time.monotonic() + 90, None
        while time.monotonic() < deadline and blocked is None:
            findings = watched.poller.tick().findings
            kinds |= {f.kind for f in findings}
            blocked = next((f for f in findings if f.kind == "sample_blocked"), None)
            time.sleep(POLL_S)
    assert blocked is not None, kinds
    assert "worker_starvation" not in kinds, kinds
    probe = get_json(f"{job['probe']}/probe", 2.0)[1]
    assert probe["blocked_in_next"] and probe["batches_retrieved"] > 0, probe


def test_on_the_plain_recipe_the_printed_fix_sets_the_stride_it_was_not_told_and_trains(
        spawn: Callable[..., Proc], tmp_path: Path) -> None:
    # The README's plain tf.data recipe: the probe told the batch and the threads only. The
    # loop's gate and stride are not told; its first step may prove the gate (asked for 64
    # with 56 released) but one ask shows no stride, and K taken as batch / spi = 8 printed
    # error_buffer=222 and batch_size=10, which hang at its K of 1. The fix it prints now
    # sets K, with the error_buffer safe under both gates from min_size (237 can strand).
    job = start_job(spawn, "tfa-plain", *BELOW_A_BATCH, "--probe-plain")
    named = first_risk(job, tmp_path, "plain.db", 60)
    ev = named.evidence
    assert (ev["pipeline"], ev["samplers"], ev["strandable_samples"]) == (
        "after-interleave", 32, 237)
    assert [(f["knob"], f["value"], f["was"], f["together_with"]["knob"],
             f["together_with"]["value"]) for f in ev["fixes"]] == [
        ("inserts_per_step", 8, None, "error_buffer", 238)]
    outcome = run_to_the_end([*BELOW_A_BATCH, *fixed_flags(ev["fixes"][0])])
    assert outcome["outcome"] == "ran", outcome
