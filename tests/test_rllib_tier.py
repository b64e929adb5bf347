"""The RLlib tier: real RLlib jobs (Ray 2.60, torch on the CPU, .venv-rllib) watched from
outside with `--ray` and no code change in the job, in `make test-ray`.

Each case is harness/rllib_job.py on its own local cluster (a DQN with its replay buffer, one
EnvRunner, one Learner actor), a fault switched on by flag, and a sidecar in this process
polling the cluster's dashboard, its metrics endpoints (the service-discovery file in the
job's temp dir) and the result rows every second. A healthy job is never paged; a learner
that hangs in its update and an environment that hangs in `step()` are named with their
kind within the window the rules state plus two polls, counted from the job's last progress
as the history shows it. A cluster takes about a minute to start here, so the tier runs
apart from make test's budget (`make test-ray` sets up .venv-rllib; without it, one skip
line). make test's case, tests/test_rllib_cluster.py, runs the same faults, shorter, as six
jobs at once on one `ray start --head` cluster found with `--ray-job all`; these cases keep
what it does not: two EnvRunners sampling flat out, the RLlibProbe, a minute's windows.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from harness.procs import Proc
from replaywatch.config import PollConfig, RayTarget, WatchConfig
from replaywatch.model import Finding, Name, Severity
from replaywatch.wiring import build_sidecar
from tests.support.rllib_jobs import (
    APPO,
    DQN,
    INTERVAL_S,
    RLLIB_READY,
    SLACK_S,
    start_job,
    watch,
    windows_in,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.long,
    pytest.mark.timeout(600),
    pytest.mark.skipif(os.environ.get("REPLAYWATCH_RAY_TESTS") != "1",
                       reason="the RLlib tier runs in make test-ray"),
    pytest.mark.skipif(not RLLIB_READY.exists(), reason="no .venv-rllib: run make rllib-venv"),
]


@pytest.mark.parametrize("algo", ["dqn", "appo"])
def test_a_healthy_job_is_never_paged_to_its_own_end(spawn: Callable[..., Proc],
                                                      tmp_path: Path, short_temp: Path,
                                                      algo: str) -> None:
    # Its whole run: 100 s from its start, then algo.stop() (a DQN's EnvRunners killed, an
    # APPO job's let go), watched past its end.
    announced, temp = start_job(spawn, tmp_path, short_temp, "--seconds", "100",
                                algo=DQN if algo == "dqn" else APPO)
    paged, moved, began = watch(tmp_path, announced, temp, 150.0)
    print(f"\nhealthy {algo}: trained counter seen moving {len(moved)} times in 150 s, "
          f"{len(paged)} warning or critical findings")
    assert len(moved) >= 3, "the job never trained: the case proves nothing"
    assert paged == [], [(round(t - began), f.kind, f.summary) for t, f in paged[:3]]
    log = Path(announced["logdir"]) / "result.json"
    last = json.loads(log.read_text().splitlines()[-1])
    assert last["time_total_s"] >= 90, "it did not run to its end while watched"


@pytest.mark.parametrize("fault,kind", [
    (("--hang-learner-after", "300"), Name.LEARNER_STALLED),
    (("--hang-env-after", "700", "--hang-env-runner", "1"), Name("env_runner_stalled")),
])
def test_a_hang_is_named_within_its_window(spawn: Callable[..., Proc], tmp_path: Path,
                                           short_temp: Path, fault: tuple[str, ...],
                                           kind: Name) -> None:
    announced, temp = start_job(spawn, tmp_path, short_temp, *fault)
    paged, moved, began = watch(tmp_path, announced, temp, 360.0,
                                until=lambda f: f.kind == kind)
    named = [(t, f) for t, f in paged if f.kind == kind]
    assert named, [(round(t - began), f.kind) for t, f in paged[:5]]
    at, finding = named[0]
    assert [f.kind for t, f in paged if t < at] == [], "something else was paged first"
    # The finding holds once its series rested and its call ran past their windows: the
    # longest window its evidence states bounds it (a call's counts from the call's start).
    window = max(windows_in(finding.evidence))
    last_progress = max((t for t in moved if t < at), default=began)
    print(f"\n{kind}: named {at - last_progress:.1f} s after the job's last trained step "
          f"(window {window:.1f} s + 2 polls), {at - began:.0f} s into watching")
    assert at - last_progress <= window + 2 * INTERVAL_S + SLACK_S, (
        at - last_progress, window, finding.evidence)
    assert finding.fix


def test_a_learner_slower_than_its_env_runners_is_env_steps_dropped(
        spawn: Callable[..., Proc], tmp_path: Path, short_temp: Path) -> None:
    # Every update 1 s longer (a big network on a small host): APPO's EnvRunners go on
    # sampling and its learner's circular buffer overwrites what the learner did not take.
    announced, temp = start_job(spawn, tmp_path, short_temp, "--learner-step-s", "1.0",
                                algo=APPO)
    paged, moved, began = watch(tmp_path, announced, temp, 240.0,
                                until=lambda f: f.kind == Name.ENV_STEPS_DROPPED)
    named = [f for _, f in paged if f.kind == Name.ENV_STEPS_DROPPED]
    assert named, [(round(t - began), f.kind) for t, f in paged[:5]]
    f = named[0]
    print(f"\nenv_steps_dropped: {f.evidence['share_of_sampled']:.0%} of the "
          f"{f.evidence['env_steps_sampled']:.0f} sampled, by {sorted(f.evidence['by_series'])}")
    assert f.evidence["share_of_sampled"] >= f.evidence["page_share"]
    assert len(moved) >= 2, "the slow learner never trained: this would be a stall"
    assert [g.kind for _, g in paged if g.kind != Name.ENV_STEPS_DROPPED] == []
    assert "num_learners" in f.fix


# APPO with its learner in the driver (num_learners=0): the learner thread the probe reads.
APPO_IN_DRIVER = ["--algo", "appo", "--num-learners", "0", "--num-env-runners", "1",
                  "--min-time-per-iteration", "2", "--num-cpus", "2"]


def test_with_the_rllib_probe_a_driver_stalled_on_its_hung_learner_thread_says_so(
        spawn: Callable[..., Proc], tmp_path: Path, short_temp: Path) -> None:
    # APPO's learner thread in the driver hangs in its update; the driver's train() waits on
    # it, so nothing moves and no actor call runs: driver_stalled, whose two readings (its
    # learner, or the loop around train()) only a stack told apart. The probe tells. The one
    # change a user makes for it: its callbacks in the config; the job writes no
    # result.json (a plain loop's default), so the rows come from the probe too.
    announced, temp = start_job(spawn, tmp_path, short_temp, "--hang-learner-after", "300",
                                "--probe-listen", "127.0.0.1:0", "--no-rows",
                                algo=APPO_IN_DRIVER)
    url = announced["rllib_probe"]
    assert url, announced
    seen: list = []
    stalled = {Name.DRIVER_STALLED, Name.LEARNER_STALLED}
    paged, moved, began = watch(tmp_path, announced, temp, 360.0, results=url, seen=seen,
                                until=lambda f: f.kind in stalled)
    named = [(t, f) for t, f in paged if f.kind in stalled]
    assert named, [(round(t - began), f.kind) for t, f in paged[:5]]
    at, finding = named[0]
    assert not (Path(announced["logdir"]) / "result.json").exists()
    assert any(s.results and s.result_file == url for s in seen), "no row read from the probe"
    waited = [s.live.learner_waited_s for s in seen if s.live and s.live.learner_waited_s]
    assert waited, "the probe never saw the learner thread wait"
    queue = finding.evidence.get("learner_queue")
    print(f"\n{finding.kind} with the probe: {finding.summary}\n  queue {queue}, "
          f"{at - began:.0f} s into watching")
    assert queue is not None and queue["thread_alive"] is True and queue["waiting"] is False
    assert "hangs inside an update" in finding.summary and "user's loop" not in finding.summary
    window = max(windows_in(finding.evidence))
    last_progress = max((t for t in moved if t < at), default=began)
    assert at - last_progress <= window + 2 * INTERVAL_S + SLACK_S


def test_a_training_intensity_the_job_cannot_reach_is_spi_drift(
        spawn: Callable[..., Proc], tmp_path: Path, short_temp: Path) -> None:
    # training_intensity 4 on one EnvRunner with a batch of 32 trains at 8 (RLlib rounds its
    # train rounds and counts the driver's sampler too: bench/RESULTS.md, RLlib replay ratio).
    announced, temp = start_job(spawn, tmp_path, short_temp, "--train-batch-size", "32",
                                "--training-intensity", "4")
    paged, _, began = watch(tmp_path, announced, temp, 240.0,
                            until=lambda f: f.kind == Name.SPI_DRIFT)
    named = [f for _, f in paged if f.kind == Name.SPI_DRIFT]
    assert named, [(round(t - began), f.kind) for t, f in paged[:5]]
    f = named[0]
    print(f"\nspi_drift: {f.evidence['observed_trained_per_sampled']} trained per sampled "
          f"against training_intensity {f.evidence['training_intensity']}; fix: {f.fix}")
    assert f.evidence["training_intensity"] == 4
    assert f.evidence["observed_trained_per_sampled"] == pytest.approx(8.0, rel=0.15)
    assert "Set training_intensity to 2:" in f.fix, f.fix
    assert [g.kind for _, g in paged if g.kind != Name.SPI_DRIFT] == []


def test_a_warm_up_of_days_is_warmup_with_its_eta_never_a_stall(
        spawn: Callable[..., Proc], tmp_path: Path, short_temp: Path) -> None:
    # num_steps_sampled_before_learning_starts far past what the job will sample: RLlib 2.60
    # counts steps sampled (not stored), so the warm-up ends only at the sampling rate.
    announced, temp = start_job(spawn, tmp_path, short_temp, "--learning-starts", "500000000")
    target = RayTarget(announced["dashboard_url"], temp_dir=str(temp),
                       results=announced["logdir"])
    config = WatchConfig(targets=(), ray=(target,),
                         poll=PollConfig(interval_s=INTERVAL_S, timeout_s=3.0))
    warm: Finding | None = None
    paged: list[Finding] = []
    began = time.time()
    with build_sidecar(config, incidents_path=str(tmp_path / "i.db")) as car:
        while time.time() - began < 120.0:
            findings = car.poller.tick().findings
            paged += [f for f in findings if f.severity >= Severity.WARNING]
            warm = next((f for f in findings if f.kind == Name.WARMUP), warm)
            time.sleep(max(0.0, INTERVAL_S - (time.time() - began) % INTERVAL_S))
    assert paged == [], [(f.kind, f.summary) for f in paged[:3]]
    assert warm is not None and warm.evidence["told_by"] == "result row"
    print(f"\nwarmup: {warm.summary}")
    assert warm.evidence["eta_s"] > 86400 and "lower num_steps_sampled" in warm.fix
