"""The RLlib rules (diagnosis/rules_rllib.py and its helpers) on histories of RaySnapshot:
built from ray_model's records in the shapes real Ray 2.60 jobs showed
(docs/research/rllib-observables.md §6), and replayed from the documents recorded off real
jobs (tests/fixtures/ray/, parsed by the source's own parsers).

Counters move in steps of Ray's 10 s report interval and are polled every 5 s, as measured.
"""

from __future__ import annotations

import dataclasses
import json
import math
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from replaywatch.diagnosis import kinds, rllib_actors, rllib_progress, rules, rules_rllib
from replaywatch.diagnosis.registry import Rule, Shape
from replaywatch.diagnosis.rllib_rates import late_reads_allow
from replaywatch.diagnosis.rules_rllib import judge_rllib
from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.model import Finding, Name, Severity
from replaywatch.ray_model import (
    ActorRole,
    RayActor,
    RaySnapshot,
    RayTask,
    ResultRow,
    RllibCounters,
    RllibLive,
)
from replaywatch.sources.ray_cluster import (
    driver_worker_id,
    join_counters,
    parse_actors,
    parse_metrics,
    parse_tasks,
)
from replaywatch.sources.ray_results import parse_result_row

FIXTURES = Path(__file__).parent / "fixtures" / "ray"
TARGET, JOB = "127.0.0.1:8265", "02000000"
DRIVER_PID = 4500
TH = Thresholds()
T0 = 1_000_000.0
POLL_S = 5.0


def reported(t: float) -> float:
    """The time a counter was last reported at (every 10 s)."""
    return math.floor(t / 10.0) * 10.0


# -- the job's records -------------------------------------------------------------------------

def actor(role: ActorRole, n: int, state: str = "ALIVE", restarts: int = 0,
          cause: str | None = None) -> RayActor:
    cls = {ActorRole.ENV_RUNNER: "SingleAgentEnvRunner",
           ActorRole.LEARNER: "create_executable_class.<locals>._WrappedExecutable",
           ActorRole.AGGREGATOR: "AggregatorActor"}[role]
    return RayActor(f"{role}{n}".ljust(32, "0"), cls, role, state, restarts, cause,
                    pid=pid_of(role, n), node_id="node", job_id=JOB, worker_id=f"w-{role}{n}")


def pid_of(role: ActorRole, n: int) -> int:
    return {ActorRole.ENV_RUNNER: 4800, ActorRole.LEARNER: 6700,
            ActorRole.AGGREGATOR: 8700}[role] + n


def call(role: ActorRole, n: int, age: float, started: float) -> RayTask:
    name = ("SingleAgentEnvRunner.apply" if role is ActorRole.ENV_RUNNER
            else "_WrappedExecutable.apply")
    return RayTask(name, role, pid_of(role, n), f"w-{role}{n}", JOB, age,
                   actor_id=f"{role}{n}".ljust(32, "0"), task_id=f"{role}{n}-{started:.0f}")


def runner_counters(n: int, sampled: float | None) -> RllibCounters:
    return RllibCounters(f"w-{ActorRole.ENV_RUNNER}{n}", "SingleAgentEnvRunner",
                         ActorRole.ENV_RUNNER, True, env_steps_sampled=sampled)


def learner_counters(trained: float | None, dropped: float | None = None) -> RllibCounters:
    return RllibCounters(f"w-{ActorRole.LEARNER}0", "_WrappedExecutable", ActorRole.LEARNER,
                         True, env_steps_trained=trained, circular_buffer_dropped=dropped)


def algo_counters(algo: str, iterations: float, steps: float) -> RllibCounters:
    return RllibCounters(driver_worker_id(JOB), algo, ActorRole.OTHER, True,
                         iterations=iterations, training_steps=steps)


def row(iteration: int, at: float, **kw: Any) -> ResultRow:
    return ResultRow(iteration, at, 30.0, time_total_s=at - T0 + 20.0, pid=DRIVER_PID, **kw)


@dataclasses.dataclass
class Job:
    """A job's behaviour as functions of the time; each poll reads them at its time."""

    algo: str = "DQN"
    runners: int = 2
    sampled: Callable[[int, float], float | None] = lambda n, t: 17.0 * reported(t - T0)
    trained: Callable[[float], float | None] = lambda t: 500.0 + 528.0 * reported(t - T0)
    iterations: Callable[[float], float] = lambda t: 5 + math.floor(reported(t - T0) / 30)
    steps: Callable[[float], float] = lambda t: 2500 + 16.0 * reported(t - T0)
    iteration_s: float = 30.0
    rows_until: float = math.inf
    calls: Callable[[float], list[RayTask]] = lambda t: healthy_calls(t)
    actors: Callable[[float], list[RayActor]] | None = None
    dropped: Callable[[float], float | None] = lambda t: None
    row_extra: Callable[[float], dict[str, Any]] = lambda t: {}
    errors: Callable[[float], tuple[str, ...]] = lambda t: ()
    live: Callable[[float], RllibLive | None] = lambda t: None  # an RLlibProbe's reading

    def snapshot(self, t: float) -> RaySnapshot:
        counters = [runner_counters(n, self.sampled(n, t)) for n in range(self.runners)]
        counters += [learner_counters(self.trained(t), self.dropped(t)),
                     algo_counters(self.algo, self.iterations(t), self.steps(t))]
        last = min(t, self.rows_until)
        rows = tuple(row(i, T0 + i * self.iteration_s, **self.row_extra(T0 + i * self.iteration_s))
                     for i in range(1, int((last - T0) // self.iteration_s) + 1))[-3:]
        actors = (self.actors(t) if self.actors else
                  [actor(ActorRole.ENV_RUNNER, n) for n in range(self.runners)]
                  + [actor(ActorRole.LEARNER, 0)])
        return RaySnapshot(TARGET, t, JOB, DRIVER_PID if rows else None, tuple(actors),
                           tuple(self.calls(t)), tuple(counters), results=rows,
                           errors=self.errors(t), live=self.live(t))

    def history(self, until_s: float, from_s: float = 0.0) -> list[RaySnapshot]:
        n = int((until_s - from_s) / POLL_S)
        return [self.snapshot(T0 + from_s + i * POLL_S) for i in range(n + 1)]


def healthy_calls(t: float) -> list[RayTask]:
    """A short EnvRunner call caught at every poll, a new one each time."""
    return [call(ActorRole.ENV_RUNNER, int(t) % 2, 0.4, t)]


def judged(job: Job, until_s: float, th: Thresholds = TH, from_s: float = 0.0
           ) -> dict[Name, Finding]:
    history = job.history(until_s, from_s)
    found = judge_rllib(TARGET, history, th, history[-1].observed_at)
    assert len({f.kind for f in found}) == len(found)  # one per kind
    assert all(f.target == TARGET and f.table == f"job:{JOB}" for f in found)
    return {f.kind: f for f in found}


def hung_at(h: float) -> Callable[[float], float]:
    return lambda t: T0 + h if t > T0 + h else t


# -- healthy jobs are never flagged -----------------------------------------------------------

@pytest.mark.parametrize("until_s", [60.0, 180.0, 600.0])
def test_a_healthy_dqn_job_of_30_s_iterations_is_never_flagged(until_s: float) -> None:
    assert judged(Job(), until_s, from_s=max(0.0, until_s - 300.0)) == {}


@pytest.mark.parametrize("until_s", [60.0, 300.0])
def test_a_healthy_appo_job_of_10_s_iterations_is_never_flagged(until_s: float) -> None:
    appo = Job(algo="APPO", iteration_s=10.0,
               iterations=lambda t: 3 + math.floor(reported(t - T0) / 10),
               steps=lambda t: 18_000.0 * reported(t - T0) / 10,
               sampled=lambda n, t: 140.0 * reported(t - T0),
               trained=lambda t: 280.0 * reported(t - T0) + 1000.0)
    assert judged(appo, until_s) == {}


def test_a_healthy_job_whose_counters_rest_a_report_interval_is_not_stalled_unlearned() -> None:
    # One move seen: nothing learned, each counter rests 10 s between reports, and the
    # floor (3 x Ray's report interval) is what holds the verdict back, not luck.
    history = Job().history(14.0, 0.0)
    p = rllib_progress.progress(history, rllib_progress.counter_reader(
        "env_steps_sampled", ActorRole.ENV_RUNNER), "env steps sampled", TH,
        rllib_progress.counter_floor(TH))
    assert p is not None and not p.learned and p.window.seconds == 30.0
    assert "Ray reports a counter every 10 s" in p.window.why


# -- learner_stalled ---------------------------------------------------------------------------

def dqn_learner_hung(h: float = 200.0) -> Job:
    """DQN's learner hangs at `h`: every counter stops (sampling waits on training) and the
    Learner's call ages, both EnvRunners idle."""
    stop = hung_at(h)
    return Job(sampled=lambda n, t: 17.0 * reported(stop(t) - T0),
               trained=lambda t: 500.0 + 528.0 * reported(stop(t) - T0),
               iterations=lambda t: 5 + math.floor(reported(stop(t) - T0) / 30),
               steps=lambda t: 2500 + 16.0 * reported(stop(t) - T0),
               rows_until=T0 + h,
               calls=lambda t: ([call(ActorRole.LEARNER, 0, t - T0 - h, T0 + h)]
                                if t > T0 + h else healthy_calls(t)))


def test_a_hung_dqn_learner_call_is_learner_stalled_naming_its_pid_and_age() -> None:
    found = judged(dqn_learner_hung(), 300.0)
    f = found[Name.LEARNER_STALLED]
    assert f.severity is Severity.CRITICAL
    assert f.evidence["learner_pids"] == [6700]
    assert f.evidence["calls"][0]["call"] == "_WrappedExecutable.apply"
    assert f.evidence["calls"][0]["running_s"] == 100.0
    assert "py-spy dump --pid 6700" in f.fix
    assert f.since <= T0 + 200.0
    # A call is running, so the wait is not the driver's.
    assert Name.DRIVER_STALLED not in found and Name.ENV_RUNNER_STALLED not in found


def test_a_learner_call_within_its_window_is_not_yet_stalled() -> None:
    assert Name.LEARNER_STALLED not in judged(dqn_learner_hung(), 215.0)


def appo_learner_hung(h: float = 200.0, **kw: Any) -> Job:
    """APPO whose learner trains nothing from `h` on while iterations go on and EnvRunners
    sample."""
    return Job(algo="APPO", iteration_s=10.0,
               iterations=lambda t: math.floor(reported(t - T0) / 10),
               steps=lambda t: 1800.0 * reported(t - T0),
               sampled=lambda n, t: 140.0 * reported(t - T0),
               trained=lambda t: 280.0 * reported(min(t, T0 + h) - T0) + 1000,
               calls=lambda t: [], **kw)


def test_appo_samples_flowing_while_the_learner_trains_nothing_is_learner_stalled() -> None:
    # The APPO learner actor hangs: iterations and rows go on, EnvRunners sample, the
    # learner's counter stops and the learner group drops what it cannot send: nearly all.
    h = 200.0
    appo = appo_learner_hung(h, row_extra=lambda at: {"learner_group_ts_dropped_lifetime":
                                                      max(0.0, at - T0 - h) * 250.0})
    found = judged(appo, 320.0)
    f = found[Name.LEARNER_STALLED]
    assert f.severity is Severity.CRITICAL and f.evidence["calls"] == []
    assert "env steps are still sampled" in f.summary
    assert f.evidence["trained"]["last_moved_at"] == T0 + 200.0
    drop = found[Name.ENV_STEPS_DROPPED]
    assert drop.severity is Severity.WARNING
    assert drop.evidence["by_series"]["learner_group/learner_group_ts_dropped_lifetime"] > 0
    assert drop.evidence["share_of_sampled"] is not None
    assert Name.DRIVER_STALLED not in found


def appo_learner_stalled(live: RllibLive | None) -> Finding:
    return judged(appo_learner_hung(live=lambda t: live), 320.0)[Name.LEARNER_STALLED]


def test_an_rllib_probe_tells_a_starved_learner_thread_from_one_hung_in_its_update() -> None:
    # Without the probe: the counters alone, and the stack to tell (unchanged).
    plain = appo_learner_stalled(None)
    assert "learner_queue" not in plain.evidence and "RLlibProbe" not in plain.summary
    # Blocked on an empty in-queue when polled: starved, so the fix looks upstream.
    starved = appo_learner_stalled(RllibLive(0.0, "APPO", queue_depth=0,
                                             learner_thread_alive=True, learner_waiting=True,
                                             learner_waited_s=118.0, learner_watched_s=120.0))
    assert "starved" in starved.summary and starved.fix.startswith("Look upstream")
    assert starved.evidence["learner_queue"]["waiting"] is True
    assert starved.severity is plain.severity  # sharper words, the same page
    # Not waiting for input with batches queued: it hangs inside an update.
    hung = appo_learner_stalled(RllibLive(0.0, "APPO", queue_depth=3,
                                          learner_thread_alive=True, learner_waiting=False))
    assert "hangs inside an update" in hung.summary and "3 batch(es)" in hung.summary
    assert hung.fix == plain.fix
    # The thread died: said, with where its exception is.
    dead = appo_learner_stalled(RllibLive(0.0, "APPO", learner_thread_alive=False))
    assert "dead" in dead.summary and "exception" in dead.fix
    # A probe in a DQN driver has no learner thread: nothing more is said.
    dqn = appo_learner_stalled(RllibLive(0.0, "DQN", env_steps_stored=900, capacity=50_000))
    assert dqn.summary == plain.summary and "learner_queue" not in dqn.evidence


# -- env_runner_stalled ------------------------------------------------------------------------

def dqn_env_hung(h: float = 200.0) -> Job:
    """Runner 1's env hangs at `h`: its call ages; sample_timeout_s lets runner 0's step
    through once a minute, with one update each time."""
    def trickle(t: float) -> float:
        return reported(min(t, T0 + h) - T0) + (max(0.0, t - T0 - h) // 60)

    return Job(sampled=lambda n, t: 17.0 * reported(min(t, T0 + h) - T0)
               + (max(0.0, t - T0 - h) // 60 if n == 0 else 0),
               trained=lambda t: 500.0 + 528.0 * reported(min(t, T0 + h) - T0)
               + 32 * (max(0.0, t - T0 - h) // 60),
               iterations=lambda t: 5 + math.floor(reported(min(t, T0 + h) - T0) / 30),
               steps=lambda t: 2500 + 16.0 * trickle(t),
               rows_until=T0 + h,
               calls=lambda t: ([call(ActorRole.ENV_RUNNER, 1, t - T0 - h, T0 + h)]
                                if t > T0 + h else healthy_calls(t)))


def test_a_hung_dqn_env_is_env_runner_stalled_saying_it_stops_the_whole_job() -> None:
    found = judged(dqn_env_hung(), 400.0)
    f = found[Name.ENV_RUNNER_STALLED]
    assert f.severity is Severity.CRITICAL
    assert f.evidence["runner_pids"] == [4801]
    assert f.evidence["calls"][0]["running_s"] == 200.0
    assert "DQN samples synchronously" in f.summary and "once a minute" in f.summary
    assert "py-spy dump --pid 4801" in f.fix
    assert f.since == T0 + 200.0
    assert set(found) == {Name.ENV_RUNNER_STALLED}  # not the learner, not the driver


def test_one_appo_runner_flat_while_the_other_samples_is_env_runner_stalled() -> None:
    h = 200.0
    appo = Job(algo="APPO", iteration_s=10.0,
               iterations=lambda t: math.floor(reported(t - T0) / 10),
               steps=lambda t: 1800.0 * reported(t - T0),
               sampled=lambda n, t: 140.0 * reported(min(t, T0 + h) - T0 if n == 1 else t - T0),
               trained=lambda t: 280.0 * reported(t - T0) + 1000, calls=lambda t: [])
    f = judged(appo, 320.0)[Name.ENV_RUNNER_STALLED]
    assert [r["pid"] for r in f.evidence["flat_runners"]] == [4801]
    assert f.evidence["flat_runners"][0]["others_moving"] == 1
    assert "APPO samples asynchronously" in f.summary


# -- driver_stalled ----------------------------------------------------------------------------

def driver_hung(h: float = 200.0, num_learners: int = 0) -> Job:
    """The learner inside the driver hangs: every counter flat, no row, no call."""
    stop = hung_at(h)
    return Job(algo="APPO", iteration_s=10.0, rows_until=T0 + h,
               iterations=lambda t: math.floor(reported(stop(t) - T0) / 10),
               steps=lambda t: 1800.0 * reported(stop(t) - T0),
               sampled=lambda n, t: 140.0 * reported(stop(t) - T0),
               trained=lambda t: 280.0 * reported(stop(t) - T0) + 1000,
               calls=lambda t: [] if t > T0 + h else healthy_calls(t),
               row_extra=lambda at: {"num_learners": num_learners})


def test_nothing_moving_and_no_call_running_is_driver_stalled_naming_the_driver() -> None:
    found = judged(driver_hung(), 320.0)
    f = found[Name.DRIVER_STALLED]
    assert f.severity is Severity.CRITICAL and f.evidence["driver_pid"] == DRIVER_PID
    assert "py-spy dump --pid 4500" in f.fix
    assert f.evidence["readings"][0].startswith("its learner (num_learners=0")
    assert "the user's loop" in f.summary
    assert set(f.evidence) >= {"env_steps_sampled", "env_steps_trained", "iterations",
                               "result_rows"}
    assert set(found) == {Name.DRIVER_STALLED}


def test_an_rllib_probe_says_which_of_the_two_a_stalled_driver_waits_in() -> None:
    # APPO's learner thread in the driver hung inside its update, three batches queued (as
    # a real job showed it, test_rllib_tier.py): the learner, not the loop.
    job = driver_hung()
    hung = dataclasses.replace(job, live=lambda t: RllibLive(
        t, "APPO", queue_depth=3, learner_thread_alive=True, learner_waiting=False))
    f = judged(hung, 320.0)[Name.DRIVER_STALLED]
    assert "waits on its learner" in f.summary and "3 batch(es)" in f.summary
    assert "user's loop" not in f.summary and "_LearnerThread" in f.fix
    assert f.evidence["readings"] == ["its learner thread, in the driver"]
    assert f.severity is Severity.CRITICAL
    # Its learner thread blocked on an empty queue: the driver waits elsewhere.
    starved = dataclasses.replace(job, live=lambda t: RllibLive(
        t, "APPO", queue_depth=0, learner_thread_alive=True, learner_waiting=True))
    g = judged(starved, 320.0)[Name.DRIVER_STALLED]
    assert "not in its learner" in g.summary and "main thread" in g.fix
    # A probe in a DQN driver (no learner thread): both readings, as without a probe.
    dqn = dataclasses.replace(job, live=lambda t: RllibLive(t, "DQN", env_steps_stored=5))
    assert judged(dqn, 320.0)[Name.DRIVER_STALLED].summary == judged(job, 320.0)[
        Name.DRIVER_STALLED].summary


def test_with_a_learner_actor_the_loop_is_named_first() -> None:
    f = judged(driver_hung(num_learners=1), 320.0)[Name.DRIVER_STALLED]
    assert f.evidence["readings"][0] == "the user's loop around algo.train()"


def test_without_rows_or_a_learner_actor_the_learner_in_the_driver_is_named_first() -> None:
    job = dataclasses.replace(driver_hung(), rows_until=T0,
                              actors=lambda t: [actor(ActorRole.ENV_RUNNER, n) for n in (0, 1)])
    f = judged(job, 320.0)[Name.DRIVER_STALLED]
    assert f.evidence["num_learners"] == 0 and f.evidence["learner_actors"] == 0
    assert f.evidence["readings"][0].startswith("its learner")
    assert f.evidence["driver_pid"] is None and "process calling algo.train()" in f.fix


def test_samples_flowing_to_a_learner_in_the_driver_name_the_driver_to_py_spy() -> None:
    job = dataclasses.replace(
        driver_hung(), steps=lambda t: 1800.0 * reported(t - T0),
        sampled=lambda n, t: 140.0 * reported(t - T0), rows_until=math.inf,
        actors=lambda t: [actor(ActorRole.ENV_RUNNER, n) for n in (0, 1)])
    f = judged(job, 320.0)[Name.LEARNER_STALLED]
    assert f.evidence["learner_pids"] == [DRIVER_PID]
    assert "py-spy dump --pid 4500` (the driver, where the learner runs)" in f.fix


def test_a_driver_stall_shorter_than_the_windows_is_not_named() -> None:
    assert judged(driver_hung(), 225.0) == {}


# -- pinned windows, start-up ------------------------------------------------------------------

def test_a_pinned_window_judges_the_call_by_stall_window_s_alone() -> None:
    pinned = Thresholds(stall_window_s=120.0, learned_windows=False)
    assert Name.LEARNER_STALLED not in judged(dqn_learner_hung(), 310.0, pinned)
    f = judged(dqn_learner_hung(), 330.0, pinned)[Name.LEARNER_STALLED]
    assert f.evidence["calls"][0]["window_s"] == 120.0
    assert f.evidence["calls"][0]["window_why"].startswith("pinned")


def first_update_hung() -> Job:
    """The learner's first update, after a warm-up of 200 steps, never returns: the trained
    counter is never exported, the call runs from 40 s in."""
    return Job(trained=lambda t: None, rows_until=T0 + 35, iteration_s=5.0,
               row_extra=lambda at: {"env_steps_sampled_lifetime": 34.0 * (at - T0),
                                     "num_steps_sampled_before_learning_starts": 100},
               calls=lambda t: ([call(ActorRole.LEARNER, 0, t - T0 - 40, T0 + 40)]
                                if t > T0 + 40 else []))


def test_a_first_update_that_hangs_is_start_up_until_the_grace_ends() -> None:
    f = judged(first_update_hung(), 120.0)[Name.LEARNER_STALLED]
    assert f.severity is Severity.INFO and f.evidence["would_be"] == "critical"
    assert f.summary.startswith("Start-up")
    assert f.evidence["grace_basis"] == "result rows (timestamp - time_total_s)"
    late = judged(first_update_hung(), 120.0, Thresholds(startup_grace_s=60.0))
    assert late[Name.LEARNER_STALLED].severity is Severity.CRITICAL


def test_a_stall_past_the_first_update_keeps_paging_once_it_outlasts_the_look_back() -> None:
    # Three minutes of look-back, the learner hung for ten: no rhythm is left in view, the
    # job is young, and still it pages: it trained before, so this is no first compile.
    f = judged(dqn_learner_hung(), 800.0, from_s=620.0)[Name.LEARNER_STALLED]
    assert f.severity is Severity.CRITICAL and f.evidence["calls"][0]["running_s"] == 600.0


def young_appo(call_from_s: float) -> Job:
    """A young APPO job of one EnvRunner, as a loaded host showed it: iterations of 2 s whose
    rows count no sampled or trained step for 11 iterations (the runner's first sample call
    runs that long), then 64 a row; no counter exported yet; one `apply` call of its runner
    listed from `call_from_s`."""
    def counted(at: float) -> dict[str, Any]:
        done = max(0.0, round((at - T0) / 2.0) - 11)
        return ({"env_steps_sampled_lifetime": 64.0 * done,
                 "env_steps_trained_lifetime": 67.0 * done} if done else {})
    return Job(algo="APPO", runners=1, iteration_s=2.0, sampled=lambda n, t: None,
               trained=lambda t: None, row_extra=counted,
               calls=lambda t: ([call(ActorRole.ENV_RUNNER, 0, t - T0 - call_from_s,
                                      T0 + call_from_s)] if t > T0 + call_from_s else []))


def test_a_first_sample_call_past_the_first_update_is_still_start_up() -> None:
    # The call began before any row counted a trained step: the runner's first sample call
    # on a loaded host, or its listing late. The rows counting steps since are the job
    # starting, not a runner hung after it had run.
    f = judged(young_appo(call_from_s=1.0), 35.0)[Name.ENV_RUNNER_STALLED]
    assert f.evidence["calls"][0]["running_s"] == 34.0
    assert f.evidence["calls"][0]["window_s"] == TH.stall_window_s
    assert f.severity is Severity.INFO and f.evidence["would_be"] == "critical"
    assert f.summary.startswith("Start-up")
    late = judged(young_appo(call_from_s=1.0), 35.0, Thresholds(startup_grace_s=30.0))
    assert late[Name.ENV_RUNNER_STALLED].severity is Severity.CRITICAL


def test_a_call_that_began_after_the_first_update_pages_on_an_unlearned_window() -> None:
    # Row 12 (24 s in) is the first to count trained steps, row 11 (22 s) the last that
    # counts none: a call begun at 25 s began in a job that had trained.
    f = judged(young_appo(call_from_s=25.0), 40.0)[Name.ENV_RUNNER_STALLED]
    assert f.severity is Severity.CRITICAL and f.evidence["calls"][0]["running_s"] == 15.0


# -- warm-up -----------------------------------------------------------------------------------

def test_sampling_below_learning_starts_is_warmup_not_a_stalled_learner() -> None:
    warm = Job(trained=lambda t: None, calls=lambda t: [],
               row_extra=lambda at: {"env_steps_sampled_lifetime": 34.0 * (at - T0),
                                     "num_steps_sampled_before_learning_starts": 50_000})
    found = judged(warm, 300.0)
    assert set(found) == {Name.WARMUP}
    f = found[Name.WARMUP]
    assert f.severity is Severity.INFO and f.evidence["told_by"] == "result row"
    assert f.evidence["env_steps_to_go"] == 50_000 - 34.0 * 300.0
    # The ETA is the steps to go over the rate the sampled counter rose at.
    rate = 17.0 * Job().runners  # each EnvRunner's sampled counter
    assert f.evidence["eta_s"] == pytest.approx(f.evidence["env_steps_to_go"] / rate, rel=0.1)
    assert "to go at" in f.summary and f.fix == "Nothing to fix: wait."


def test_a_few_steps_dropped_are_said_and_a_large_share_pages() -> None:
    # 100 steps once beside 34 a second sampled: what an asynchronous buffer overwrites.
    few = judged(Job(dropped=lambda t: 100.0 if t > T0 + 100 else None), 200.0)
    f = few[Name.ENV_STEPS_DROPPED]
    assert f.severity is Severity.INFO and f.evidence["share_of_sampled"] < 0.25
    assert "below the 25% that pages" in f.summary
    many = judged(Job(dropped=lambda t: 30.0 * (t - T0 - 100) if t > T0 + 100 else None),
                  200.0)[Name.ENV_STEPS_DROPPED]
    assert many.severity is Severity.WARNING and many.evidence["share_of_sampled"] > 0.25
    tolerant = judged(Job(dropped=lambda t: 30.0 * (t - T0 - 100) if t > T0 + 100 else None),
                      200.0, Thresholds(dropped_share=0.95))[Name.ENV_STEPS_DROPPED]
    assert tolerant.severity is Severity.INFO
    # Two stages' counters can count one step twice: the share is the larger's, not the sum.
    both = judged(Job(dropped=lambda t: 30.0 * (t - T0 - 100) if t > T0 + 100 else None,
                      row_extra=lambda at: {"learner_group_ts_dropped_lifetime":
                                            20.0 * (at - T0)}), 200.0)[Name.ENV_STEPS_DROPPED]
    assert len(both.evidence["by_series"]) == 2
    assert both.evidence["dropped"] == max(both.evidence["by_series"].values())
    # The same share over a start-up's first 40 s: not yet a ratio's window.
    early = judged(Job(dropped=lambda t: 30.0 * (t - T0 - 10) if t > T0 + 10 else None),
                   40.0)[Name.ENV_STEPS_DROPPED]
    assert early.severity is Severity.INFO and "not yet seen" in early.summary


def test_drops_that_began_late_are_judged_since_they_began_not_over_the_healthy_look_back(
        ) -> None:
    # 34 env steps a second sampled for 400 s; from 340 s, 12 a second dropped (35 %). Over
    # the whole look-back that is 5 %; since they began (a report before the first rise
    # seen), or over the last ratio window, it is the share lost now.
    late = Job(dropped=lambda t: 12.0 * reported(t - T0 - 340) if t > T0 + 350 else None)
    f = judged(late, 400.0)[Name.ENV_STEPS_DROPPED]
    assert f.severity is Severity.WARNING, f.summary
    assert f.evidence["look_back_s"] == 400.0 and 60.0 <= f.evidence["judged_over_s"] <= 70.0
    assert f.evidence["share_of_sampled"] == pytest.approx(
        f.evidence["dropped"] / (34.0 * f.evidence["judged_over_s"]), rel=0.2)
    assert f"in the last {f.evidence['judged_over_s']:.0f} s" in f.summary
    # Drops of that rate since the look-back began: judged over all of it, as before.
    early = Job(dropped=lambda t: 12.0 * reported(t - T0) if t > T0 + 10 else None)
    g = judged(early, 400.0)[Name.ENV_STEPS_DROPPED]
    assert g.severity is Severity.WARNING and g.evidence["judged_over_s"] >= 380.0


def test_a_warm_up_of_days_at_the_sampled_rate_says_so_in_its_fix() -> None:
    long = Job(trained=lambda t: None, calls=lambda t: [],
               row_extra=lambda at: {"env_steps_sampled_lifetime": 34.0 * (at - T0),
                                     "num_steps_sampled_before_learning_starts": 10**9})
    f = judged(long, 300.0)[Name.WARMUP]
    assert f.severity is Severity.INFO and f.evidence["eta_s"] > 86400
    assert "days" in f.summary and "lower num_steps_sampled_before_learning_starts" in f.fix


def test_without_rows_a_learner_that_never_trained_while_sampling_is_warmup() -> None:
    found = judged(Job(trained=lambda t: None, calls=lambda t: [], rows_until=T0), 200.0)
    assert set(found) == {Name.WARMUP}
    assert "never rose" in found[Name.WARMUP].evidence["told_by"]


# -- rllib_actor_down --------------------------------------------------------------------------

def with_actors(*down: RayActor) -> Job:
    def actors(t: float) -> list[RayActor]:
        live = {a.actor_id: a for a in [actor(ActorRole.ENV_RUNNER, 0),
                                        actor(ActorRole.ENV_RUNNER, 1),
                                        actor(ActorRole.LEARNER, 0)]}
        if t > T0 + 100:
            live.update({a.actor_id: a for a in down})
        return list(live.values())
    return Job(actors=actors)


def test_one_env_runner_of_two_dead_is_a_warning_saying_how_many() -> None:
    dead = actor(ActorRole.ENV_RUNNER, 1, "DEAD", cause="WORKER_DIED: exit code 1")
    f = judged(with_actors(dead), 200.0)[Name.RLLIB_ACTOR_DOWN]
    assert f.severity is Severity.WARNING and f.evidence["env_runners_down"] == "1 of 2"
    assert "WORKER_DIED: exit code 1" in f.summary and f.since == T0 + 105.0


def test_a_dead_learner_is_critical() -> None:
    dead = actor(ActorRole.LEARNER, 0, "DEAD", cause="WORKER_DIED: OOM")
    f = judged(with_actors(dead), 200.0)[Name.RLLIB_ACTOR_DOWN]
    assert f.severity is Severity.CRITICAL and f.evidence["learners_down"] == 1


def test_a_restart_within_the_look_back_is_named() -> None:
    f = judged(with_actors(actor(ActorRole.ENV_RUNNER, 0, restarts=1)), 200.0)[
        Name.RLLIB_ACTOR_DOWN]
    assert f.evidence["restarted"][0]["restarts_before"] == 0
    assert f.severity is Severity.WARNING


def test_a_job_stopped_by_algo_stop_is_not_down() -> None:
    # Recorded: the ended DQN job's EnvRunners killed by ray.kill, its Learner exited.
    ended = [a for a in parse_actors(load("actors.json"), 0.0) if a.job_id == "01000000"]
    snaps = [RaySnapshot(TARGET, T0 + i * 5, "01000000", None, tuple(ended)) for i in range(6)]
    assert judge_rllib(TARGET, snaps, TH, T0 + 25) == ()


REF_DELETED = ("REF_DELETED: The actor is dead because all references to the actor were "
               "removed including lineage ref count.")  # recorded: an APPO job's algo.stop()


def test_an_appo_job_stopping_pages_nothing_at_any_poll_of_its_stop() -> None:
    # Its EnvRunners let go (REF_DELETED) one poll, its Learner exits the next, as a
    # stop seen between two polls: neither poll is the job down.
    runners = [actor(ActorRole.ENV_RUNNER, n, "DEAD", cause=REF_DELETED) for n in (0, 1)]
    assert Name.RLLIB_ACTOR_DOWN not in judged(with_actors(*runners), 200.0)
    learner = actor(ActorRole.LEARNER, 0, "DEAD", cause="INTENDED_USER_EXIT: exit")
    history = with_actors(*runners, learner).history(200.0)
    assert rllib_actors.job_ended(history[-1])
    assert Name.RLLIB_ACTOR_DOWN not in judged(with_actors(*runners, learner), 200.0)
    # A runner that crashed beside them is down: letting go of the others proves nothing.
    crashed = actor(ActorRole.ENV_RUNNER, 1, "DEAD", cause="WORKER_DIED: exit code 1")
    f = judged(with_actors(runners[0], crashed), 200.0)[Name.RLLIB_ACTOR_DOWN]
    assert f.evidence["env_runners_down"] == "1 of 2" and "WORKER_DIED" in f.summary


def test_actors_ended_with_their_driver_are_the_jobs_end_and_another_owners_are_down() -> None:
    # Measured on Ray 2.60: the driver SIGKILLed, its EnvRunner's cause names it as owner.
    def owner_died(owner: str) -> str:
        return ("OWNER_DIED: The actor is dead because its owner has died. Owner Id: "
                f"{owner} Owner Ip address: 127.0.0.1 Owner worker exit type: SYSTEM_ERROR "
                "Worker exit detail: Owner's worker process has crashed.")
    with_driver = [actor(role, n, "DEAD", cause=owner_died(driver_worker_id(JOB)))
                   for role, n in ((ActorRole.ENV_RUNNER, 0), (ActorRole.ENV_RUNNER, 1),
                                   (ActorRole.LEARNER, 0))]
    assert Name.RLLIB_ACTOR_DOWN not in judged(with_actors(*with_driver), 200.0)
    # A runner whose owner was another actor (a restarted Learner's, say) died with it: down.
    orphan = actor(ActorRole.ENV_RUNNER, 1, "DEAD", cause=owner_died("ab" * 28))
    assert judged(with_actors(orphan), 200.0)[Name.RLLIB_ACTOR_DOWN].evidence[
        "env_runners_down"] == "1 of 2"


@pytest.mark.parametrize("ended", [True, False])
def test_a_stall_open_when_its_job_ended_closes_as_gone_never_as_resolved(ended: bool) -> None:
    # The hung runner's driver killed: its actors dead with their owner, the stall no longer
    # named. Nothing showed it fixed, so the incident closes as gone; a live job's stall that
    # is no longer named resolves.
    from replaywatch.diagnosis.cycle import Inputs, judge_cycle
    from tests.builders import polls, target_view

    cause = ("OWNER_DIED: The actor is dead because its owner has died. Owner Id: "
             f"{driver_worker_id(JOB)} Owner Ip address: 127.0.0.1")
    dead = [actor(role, n, "DEAD", cause=cause) for role, n in (
        (ActorRole.ENV_RUNNER, 0), (ActorRole.ENV_RUNNER, 1), (ActorRole.LEARNER, 0))]
    history = (with_actors(*dead) if ended else Job()).history(200.0)
    now = history[-1].observed_at
    stalled = Finding(Name("env_runner_stalled"), Severity.CRITICAL, TARGET, f"job:{JOB}",
                      "1 EnvRunner(s) hang", {}, "", since=T0 + 60.0, last_seen=now - POLL_S)
    view = target_view(target=TARGET, target_polls=polls([s.observed_at for s in history]))
    inputs = Inputs(view, now, TH, active_before=(stalled,), ray=tuple(history))
    verdict = judge_cycle({TARGET: inputs}, {stalled.key: stalled}, now)
    assert stalled.key not in verdict.active
    assert [t.kind for t in verdict.transitions if t.finding.key == stalled.key] == (
        ["gone"] if ended else ["resolved"])
    assert rllib_actors.job_ended(history[-1]) is ended


# -- env_steps_dropped -------------------------------------------------------------------------

def test_a_circular_buffer_drop_counter_first_exported_is_a_drop() -> None:
    # RLlib exports the counter only once something was dropped (recorded: 100 at once).
    job = Job(dropped=lambda t: 100.0 if t > T0 + 100 else None)
    f = judged(job, 200.0)[Name.ENV_STEPS_DROPPED]
    assert f.evidence["dropped"] == 100.0 and f.evidence["look_back_s"] == 200.0
    assert f.evidence["dropped_per_s"] == 0.5 and f.since == T0 + 105.0


# -- spi_drift: the replay ratio ---------------------------------------------------------------

def ratio_job(trained_per_sampled: float, **config: Any) -> Job:
    conf = {"training_intensity": 4.0, "train_batch_size_per_learner": 32, "num_learners": 0,
            "num_env_runners": 1, "num_envs_per_env_runner": 1,
            "rollout_fragment_length": 1, **config}
    return Job(runners=1, sampled=lambda n, t: 20.0 * reported(t - T0),
               trained=lambda t: 100.0 + trained_per_sampled * 20.0 * reported(t - T0),
               row_extra=lambda at: conf)


def test_a_job_training_at_twice_its_intensity_is_spi_drift_with_the_fix_that_works() -> None:
    # Recorded in bench/RESULTS.md: 1 EnvRunner, batch 32, training_intensity 4 trains at 8,
    # and training_intensity 2 trains at 4.
    f = judged(ratio_job(8.0), 300.0)[Name.SPI_DRIFT]
    assert f.severity is Severity.WARNING
    assert f.evidence["observed_trained_per_sampled"] == 8.0
    assert f.evidence["predicted"]["trained_per_sampled"] == 8.0
    assert "Set training_intensity to 2:" in f.fix


def test_a_job_training_as_asked_is_not_drift() -> None:
    assert Name.SPI_DRIFT not in judged(ratio_job(4.0), 300.0)


def test_the_ratio_allows_each_counter_a_report_late_and_says_how_much() -> None:
    # Over 290 s at 20 sampled a second, each counter may be read a report (10 s) late: at 8
    # trained per sampled against the 4 asked, (46,400 + 4 x 5,800) / 290 x 10 = 2,400 steps
    # allowed, and 23,200 steps off 4 x 5,800 is past it.
    ev = judged(ratio_job(8.0), 300.0)[Name.SPI_DRIFT].evidence
    assert (ev["env_steps_trained"], ev["env_steps_sampled"], ev["over_s"]) == (
        46_400.0, 5_800.0, 290.0)
    assert ev["allowed_error_steps"] == late_reads_allow(46_400.0, 5_800.0, 4.0, 290.0) == 2400
    # 4.3 is 7.5 % off 4: within the tolerance, not drift.
    assert Name.SPI_DRIFT not in judged(ratio_job(4.3), 300.0)


def test_steps_sampled_in_a_warm_up_that_ends_in_view_do_not_count_in_the_ratio() -> None:
    # Learning starts 150 s in at 4 trained per sampled, as asked: counted from the first
    # poll the warm-up's 3000 steps would make it 2.5.
    job = dataclasses.replace(ratio_job(4.0), trained=lambda t: None if t < T0 + 150 else
                              4.0 * 20.0 * (reported(t - T0) - 150.0) + 64.0)
    assert judged(job, 400.0) == {}
    drifting = dataclasses.replace(job, trained=lambda t: None if t < T0 + 150 else
                                   8.0 * 20.0 * (reported(t - T0) - 150.0) + 64.0)
    assert judged(drifting, 400.0)[Name.SPI_DRIFT].evidence[
        "observed_trained_per_sampled"] == 8.0


def test_an_auto_fragment_is_dqns_n_step_from_the_rows_config() -> None:
    # Seen on a real DQN (make test-ray): rollout_fragment_length "auto", n_step 1 in the row.
    f = judged(ratio_job(8.0, rollout_fragment_length=None, rollout_fragment_length_auto=True,
                         n_step=1), 300.0)[Name.SPI_DRIFT]
    assert f.evidence["predicted"]["trained_per_sampled"] == 8.0
    assert "Set training_intensity to 2:" in f.fix


def test_an_auto_fragment_of_an_unknown_n_step_gives_the_measurement_without_a_guess() -> None:
    # n_step a range (min, max): the fragment is not known, so no intensity is printed.
    f = judged(ratio_job(8.0, rollout_fragment_length=None, rollout_fragment_length_auto=True),
               300.0)[Name.SPI_DRIFT]
    assert f.evidence["predicted"] is None and "replaywatch predict --rllib" in f.fix


def test_no_training_intensity_says_nothing_of_the_ratio() -> None:
    assert Name.SPI_DRIFT not in judged(ratio_job(8.0, training_intensity=None), 300.0)


# -- unknown is never zero ---------------------------------------------------------------------

def test_a_metrics_part_not_read_this_poll_names_no_stall() -> None:
    failing = driver_hung()
    failing.errors = lambda t: (("metrics: 10.0.0.1:48903/metrics: timed out",)
                                if t > T0 + 300 else ())
    assert Name.DRIVER_STALLED not in judged(failing, 320.0)
    assert Name.DRIVER_STALLED in judged(driver_hung(), 320.0)


def test_a_state_api_not_read_this_poll_names_no_hung_call() -> None:
    # The source reads no actor and no call when the state API fails.
    history = dqn_env_hung().history(400.0)
    assert judge_rllib(TARGET, history, TH, T0 + 400.0)[0].kind == Name.ENV_RUNNER_STALLED
    failed = ("state API: x/api/v0/actors: HTTP 401 Unauthorized",)
    history[-2:] = [dataclasses.replace(s, actors=(), tasks=(), errors=failed)
                    for s in history[-2:]]
    assert judge_rllib(TARGET, history, TH, T0 + 400.0) == ()


def test_metrics_not_exported_are_unknown_not_zero() -> None:
    # No counter exported at all: nothing is read as a flat zero, so no stall is named.
    silent = Job(sampled=lambda n, t: None, trained=lambda t: None, calls=lambda t: [],
                 rows_until=T0)
    silent.iterations = lambda t: math.nan
    history = [dataclasses.replace(s, counters=()) for s in silent.history(300.0)]
    assert judge_rllib(TARGET, history, TH, history[-1].observed_at) == ()


def test_a_series_missing_from_a_poll_moves_by_its_rise_when_it_comes_back() -> None:
    # A scrape that missed one runner's series: not a drop to zero and back to its whole
    # value, or the ratio and the drops would count it again.
    job = Job(sampled=lambda n, t: None if n == 1 and T0 + 50 < t < T0 + 70
              else 17.0 * reported(t - T0))
    p = rllib_progress.progress(job.history(100.0), rllib_progress.counter_reader(
        "env_steps_sampled", ActorRole.ENV_RUNNER), "env steps sampled", TH)
    assert p is not None and p.gained == 2 * 17.0 * 100.0


def test_the_recorded_dqn_page_sums_both_runners_and_reads_the_learner() -> None:
    page = parse_metrics((FIXTURES / "metrics_dqn.txt").read_text())
    snaps = [RaySnapshot(TARGET, T0 + i * 5, "01000000", None, counters=page.counters)
             for i in range(3)]
    sampled = rllib_progress.progress(snaps, rllib_progress.counter_reader(
        "env_steps_sampled", ActorRole.ENV_RUNNER), "env steps sampled", TH)
    trained = rllib_progress.progress(snaps, rllib_progress.counter_reader(
        "env_steps_trained"), "env steps trained", TH)
    runners = [c.env_steps_sampled for c in page.counters
               if c.rllib == "SingleAgentEnvRunner"]
    assert sampled is not None and sampled.value == sum(r or 0.0 for r in runners) > 0
    assert trained is not None and trained.value > 0
    # The same page three times: nothing moved, and nothing is learned from it.
    assert sampled.gained == 0 and sampled.moved_at is None and not sampled.learned


def test_no_job_found_says_nothing() -> None:
    snap = RaySnapshot(TARGET, T0, None, None, errors=("state API: no job with a live RLlib "
                                                       "actor (name one to watch it)",))
    assert judge_rllib(TARGET, [snap], TH, T0) == ()


# -- the recorded documents --------------------------------------------------------------------

def load(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


def recorded(at: float, offset: float) -> RaySnapshot:
    """The APPO job's recorded documents as a poll `offset` s after they were recorded: the
    same answers, so its two EnvRunner calls age and its counters stand still."""
    actors = tuple(a for a in parse_actors(load("actors.json"), at + offset)
                   if a.job_id == JOB)
    tasks = parse_tasks(load("tasks.json"), at + offset)
    page = parse_metrics((FIXTURES / "metrics_appo.txt").read_text())
    live = {driver_worker_id(JOB)} | {t.worker_id for t in tasks if t.worker_id}
    counters, dropped = join_counters(page.counters, live, complete=False)
    rows = tuple(parse_result_row(json.loads(line))
                 for line in (FIXTURES / "result_appo.jsonl").read_text().splitlines())
    return RaySnapshot(TARGET, at + offset, JOB, rows[-1].pid, actors, tasks, counters,
                       page.actor_counts, rows, series_dropped=dropped,
                       errors=("metrics: 5 RLlib series kept unjoined: the state API named "
                               "the WorkerId of 2 of 4 live actors of job 02000000",))


RECORDED_AT = max(r["start_time_ms"] for r in load("tasks.json")["data"]["result"]["result"]
                  ) / 1e3 + 10


def test_the_recorded_appo_job_replayed_unchanged_names_its_runners_calls_as_hung() -> None:
    history = [recorded(RECORDED_AT, s) for s in range(0, 125, 5)]
    found = judge_rllib(TARGET, history, Thresholds(startup_grace_s=60.0),
                        history[-1].observed_at)
    f = {x.kind: x for x in found}[Name.ENV_RUNNER_STALLED]
    assert sorted(f.evidence["runner_pids"]) == [4824, 4834]
    assert f.severity is Severity.CRITICAL and "APPO samples asynchronously" in f.summary
    # The unjoined series (the ended DQN job's workers among them) stand still and say
    # nothing of their own; the learner is not in a call, and calls run: not the driver.
    assert {x.kind for x in found} == {Name.ENV_RUNNER_STALLED}


def test_the_recorded_appo_job_early_is_held_as_start_up() -> None:
    history = [recorded(RECORDED_AT, s) for s in range(0, 125, 5)]
    f = judge_rllib(TARGET, history, TH, history[-1].observed_at)[0]
    assert f.kind == Name.ENV_RUNNER_STALLED and f.severity is Severity.INFO


def test_one_recorded_poll_names_nothing() -> None:
    assert judge_rllib(TARGET, [recorded(RECORDED_AT, 0)], TH, RECORDED_AT) == ()


# -- the registry ------------------------------------------------------------------------------

def test_the_rllib_rules_are_registered_as_ray_job_rules_the_engine_never_runs() -> None:
    registered = {r.kind for r in rules.ALL if r.shape is Shape.RAY_JOB}
    assert registered == {kinds.RLLIB_ACTOR_DOWN, kinds.ENV_RUNNER_STALLED,
                          kinds.DRIVER_STALLED, kinds.ENV_STEPS_DROPPED}
    assert all(r.shape is Shape.RAY_JOB for r in rules_rllib.SHARED)
    # The shared kinds keep their Reverb rule as their registration.
    assert all(rules.BY_KIND[r.kind] is not r.judge for r in rules_rllib.SHARED)
    # A RAY_JOB rule may produce a kind that needs a probe on Reverb.
    Rule(kinds.LEARNER_STALLED, lambda *a: None, Shape.RAY_JOB)


# -- one case per kind the RLlib rules produce (tests/test_kinds.py reads the last column) -----

RLLIB_CASES: list[tuple[str, Job, float, str | None]] = [
    ("a healthy DQN job", Job(), 300.0, None),
    ("DQN's Learner call hangs", dqn_learner_hung(), 300.0, "learner_stalled"),
    ("DQN's env hangs in one runner", dqn_env_hung(), 400.0, "env_runner_stalled"),
    ("the learner in the driver hangs", driver_hung(), 320.0, "driver_stalled"),
    ("the Learner died", with_actors(actor(ActorRole.LEARNER, 0, "DEAD", cause="OOM")), 200.0,
     "rllib_actor_down"),
    ("the circular buffer dropped", Job(dropped=lambda t: 30.0 * (t - T0 - 100)
                                        if t > T0 + 100 else None), 200.0, "env_steps_dropped"),
    ("training_intensity 4 trains at 8", ratio_job(8.0), 300.0, "spi_drift"),
    ("sampling the warm-up", Job(trained=lambda t: None, calls=lambda t: [], rows_until=T0),
     200.0, "warmup"),
]


@pytest.mark.parametrize(("job", "until_s", "kind"), [c[1:] for c in RLLIB_CASES],
                         ids=[c[0] for c in RLLIB_CASES])
def test_each_rllib_case_produces_its_kind_at_its_declared_severity(
        job: Job, until_s: float, kind: str | None) -> None:
    found = judged(job, until_s)
    if kind is None:
        assert found == {}
        return
    f = found[Name(kind)]
    declared = kinds.BY_NAME[f.kind]
    assert f.severity is declared.severity
    assert [r.judge for r in (*rules_rllib.RULES, *rules_rllib.SHARED) if r.kind is declared]


def test_the_engine_never_runs_a_ray_job_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    from replaywatch.diagnosis.engine import diagnose
    from tests.builders import seconds, table_history, target_view

    def broken(*args: Any) -> None:
        raise AssertionError("the engine ran a RAY_JOB rule")

    monkeypatch.setattr(rules, "ALL", (*rules.ALL, Rule(kinds.DRIVER_STALLED, broken,
                                                         Shape.RAY_JOB)))
    view = target_view([table_history(seconds(20), 100, 50)])
    assert diagnose(view, TH, 1019.0).rule_errors == ()


# -- a bundle of an RLlib job's cycle ----------------------------------------------------------

def test_a_bundle_of_a_ray_target_replays_the_rllib_verdict_offline() -> None:
    # What the sidecar judged (the job's snapshots over the look-back) travels in the bundle:
    # `replaywatch analyze` on it names the same hung learner, not an empty verdict.
    from replaywatch import bundle as bd
    from replaywatch.diagnosis.cycle import Inputs
    from replaywatch.diagnosis.window import TargetView

    history = tuple(dqn_learner_hung().history(300.0))
    now = history[-1].observed_at
    inputs = Inputs(TargetView(TARGET, (), {}, {}, {}), now, TH, ray=history)
    live = bd.verdict(inputs)
    assert Name.LEARNER_STALLED in {f.kind for f in live}
    about = bd.About("opened critical x", now, "host", 1, "0", {})
    text = bd.fit(bd.build(inputs, live, about))
    back = bd.parse(text, "b.json")
    assert back.inputs.ray == history
    assert [f.to_document() for f in bd.verdict(back.inputs)] == [
        f.to_document() for f in live]
    # Over the size limit, the oldest snapshots go first, counted in `dropped`.
    small = bd.parse(bd.fit(bd.build(inputs, live, about), max_bytes=len(text) // 3), "b.json")
    kept = small.inputs.ray or ()
    assert 2 <= len(kept) < len(history) and kept == history[-len(kept):]
    assert small.doc["dropped"]["ray"] == len(history) - len(kept)
    # Its report shows the job, not a Reverb table: the actors, the hung call with its pid.
    from replaywatch import report
    text = report.render(back)
    assert "## RLlib job 02000000, last poll" in text and "rate limiter" not in text
    assert "| _WrappedExecutable.apply | 6700 | 100 |" in text, text


def test_a_critical_rllib_finding_asks_for_the_stacks_of_the_processes_it_names() -> None:
    # The hung Learner's pid, on the node its actor runs on: the dashboard's py-spy is asked
    # there, off the poller's thread, and what it says goes to the incident and the bundle.
    from replaywatch.diagnosis.cycle import Inputs
    from replaywatch.diagnosis.window import TargetView
    from replaywatch.evidence import _ray_workers
    from replaywatch.stack_taker import StackTaker

    history = tuple(dqn_learner_hung().history(300.0))
    f = judged(dqn_learner_hung(), 300.0)[Name.LEARNER_STALLED]
    last = {TARGET: (Inputs(TargetView(TARGET, (), {}, {}, {}), history[-1].observed_at, TH,
                            ray=history), (f,))}
    node = next(a.node_id for a in history[-1].actors if a.pid == 6700)
    assert _ray_workers(f, last) == [(6700, node)]
    assert _ray_workers(dataclasses.replace(f, target="other:8000"), last) is None
    asked, attached = [], []
    done = threading.Event()

    def stacks(target: str, workers: Any) -> dict[str, Any]:
        asked.append((target, list(workers)))
        return {"ray:6700": {"text": "Thread 6700 (idle): MainThread\n    compute_losses"}}

    def attach(finding_id: str, taken: dict[str, Any]) -> bool:
        attached.append((finding_id, taken))
        done.set()
        return True

    taker = StackTaker(ray=stacks)
    assert taker.will_capture_ray([(6700, node)]) and not StackTaker().will_capture_ray(
        [(6700, node)])
    taker.capture_ray(f.finding_id, TARGET, [(6700, node)], attach)
    assert done.wait(5.0)
    assert asked == [(TARGET, [(6700, node)])]
    assert attached[0][0] == f.finding_id and "compute_losses" in attached[0][1]["ray:6700"]["text"]


def dqn_env_hung_sampled_reported_late(h: float = 200.0, lag: float = 15.0,
                                       algo: str = "DQN") -> Job:
    """As seen on a loaded host: the env hangs at `h`, the learner's last update is reported
    at once but the runners' last env steps only `lag` s later (each process reports on its own
    10 s clock), so for a while env steps look sampled after training stopped."""
    return Job(algo=algo,
               sampled=lambda n, t: 17.0 * reported(min(t, T0 + h + lag) - T0),
               trained=lambda t: 500.0 + 528.0 * reported(min(t, T0 + h) - T0),
               iterations=lambda t: 5 + math.floor(reported(min(t, T0 + h) - T0) / 30),
               steps=lambda t: 2500 + 16.0 * reported(min(t, T0 + h) - T0),
               rows_until=T0 + h,
               calls=lambda t: ([call(ActorRole.ENV_RUNNER, 1, t - T0 - h, T0 + h)]
                                if t > T0 + h else healthy_calls(t)))


@pytest.mark.parametrize("algo", ["DQN", "SomeNewAlgo"])
def test_a_runners_report_arriving_after_the_learners_never_names_the_learner(
        algo: str) -> None:
    # make test's real DQN once named learner_stalled ("env steps are still sampled") a poll
    # before env_runner_stalled: DQN samples and trains in one loop, so steps sampled after
    # training stopped are a report's lag, never a learner that takes nothing. Where the
    # algorithm is not known, only sampling that goes on past two report intervals counts.
    job = dqn_env_hung_sampled_reported_late(algo=algo)
    for until in range(210, 400, 5):
        found = judged(job, float(until))
        assert Name.LEARNER_STALLED not in found, (until, found[Name.LEARNER_STALLED].summary)
    assert Name.ENV_RUNNER_STALLED in judged(job, 400.0)


# -- memory_exhaustion: the driver's replay buffer, from its RLlibProbe -----------------------

MIB = 2**20


def filling(per_step: int, limit: int, capacity: int = 8000, rate: float = 70.0,
            base: int = 600 * MIB, cgroup: bool = False) -> Callable[[float], RllibLive]:
    """A driver whose buffer fills at `rate` env steps/s, `per_step` bytes each, over `base`
    (its model and libraries), polled by its probe."""
    def live(t: float) -> RllibLive:
        stored = min(capacity, int(rate * (t - T0)))
        used = base + stored * per_step
        return RllibLive(t, "DQN", buffer_kind="EpisodeReplayBuffer", capacity=capacity,
                         env_steps_stored=stored, env_steps_added=stored, rss_bytes=used,
                         limit_bytes=limit, limit_from="cgroup v1" if cgroup else "host",
                         cgroup_usage_bytes=used + 300 * MIB if cgroup else None,
                         cgroup_anon_bytes=used + 100 * MIB if cgroup else None,
                         oom_kills=0 if cgroup else None)
    return live


def test_a_driver_whose_buffer_will_not_fit_is_memory_exhaustion_with_the_capacity_that_fits(
        ) -> None:
    # 84 KB a step (a real DQN with 64 KiB observations), 8000 steps: 600 MiB + 641 MiB at
    # capacity against a 1.25 GiB cgroup, whose anonymous memory also counts the cluster's
    # 100 MiB (and its usage 200 MiB of page cache more, which the kernel reclaims first).
    limit = int(1.25 * 2**30)
    job = Job(live=filling(84_000, limit, cgroup=True))
    f = judged(job, 40.0)[Name.MEMORY_EXHAUSTION]
    ev = f.evidence
    assert f.table == f"job:{JOB}" and ev["used_from"] == "cgroup anon"
    assert ev["bytes_per_env_step"] == 84_000.0
    assert ev["at_capacity_bytes"] == 700 * MIB + 8000 * 84_000
    fits = ev["capacity_that_fits"]
    assert 700 * MIB + fits * 84_000 <= 0.85 * limit < 700 * MIB + (fits + 1) * 84_000
    assert f"capacity'] to {fits} env steps" in f.fix
    assert ev["seconds_left"] is not None and ev["seconds_left"] > 0
    assert "kills a process of its memory cgroup" in f.summary and "limit reached in" in f.summary
    # At the limit the words say so, not a time.
    at_limit = judged(Job(live=filling(84_000, int(0.9 * 2**30), cgroup=True)), 40.0)
    assert "at its limit now" in at_limit[Name.MEMORY_EXHAUSTION].summary


def test_a_buffer_that_fits_a_full_one_and_a_job_without_the_probe_say_nothing() -> None:
    assert Name.MEMORY_EXHAUSTION not in judged(Job(live=filling(84_000, 8 << 30)), 40.0)
    # Full at 8000 (t > 114 s): what it holds is what it will hold.
    assert Name.MEMORY_EXHAUSTION not in judged(Job(live=filling(84_000, 1 << 30)), 320.0)
    assert Name.MEMORY_EXHAUSTION not in judged(Job(), 40.0)
    # A worker of its cgroup killed and restarted while the buffer fills: the projection
    # swings with the worker's memory, the kills say the limit is hit; it stays named.
    def killing(t: float) -> RllibLive:
        live = filling(84_000, int(1.25 * 2**30), cgroup=True)(t)
        kills = int(max(0.0, t - T0 - 20.0) // 5)
        return dataclasses.replace(live, oom_kills=kills, cgroup_anon_bytes=(
            live.cgroup_anon_bytes or 0) - (300 * MIB if kills % 2 else 0))
    swung = judged(Job(live=killing), 65.0)[Name.MEMORY_EXHAUSTION]
    assert swung.evidence["oom_kills_in_look_back"] == 9 and "OOM-killed 9" in swung.summary
    assert swung.evidence["at_capacity_bytes"] < swung.evidence["limit_bytes"]  # the swing
    # A step's bytes are the driver's own growth, which a worker's kill does not swing.
    def deeper(t: float) -> RllibLive:
        live = killing(t)
        return dataclasses.replace(live, cgroup_anon_bytes=(live.cgroup_anon_bytes or 0) - (
            400 * MIB if live.oom_kills and live.oom_kills % 2 else 0))
    deep = judged(Job(live=deeper), 65.0)[Name.MEMORY_EXHAUSTION]
    assert deep.evidence["bytes_per_env_step"] == 84_000.0 and "OOM-killed 9" in deep.summary
    assert deep.evidence["step_bytes_from"] == "driver rss"
    # Full, its group still killing the worker beside the driver: held, said as full.
    full = judged(Job(live=killing), 300.0)[Name.MEMORY_EXHAUSTION]
    assert full.evidence["full"] and "full at its capacity of 8000" in full.summary
    assert full.evidence["oom_kills_in_look_back"] > 0
    # Full with no kill in the look-back: it fits; nothing.
    def stopped(t: float) -> RllibLive:
        return dataclasses.replace(killing(t), oom_kills=3)
    assert Name.MEMORY_EXHAUSTION not in judged(Job(live=stopped), 300.0)
    # Too short a fill to measure a step's bytes: 5 % of the capacity stored, 5 % more.
    assert Name.MEMORY_EXHAUSTION not in judged(Job(live=filling(84_000, 1 << 30)), 8.0)


# -- wasted_experience: what the driver's replay buffer evicts never sampled -------------------

def buffer_at(spi: float, capacity: int = 2000, rate: float = 400.0,
              kind: str = "EpisodeReplayBuffer") -> Callable[[float], RllibLive]:
    """A buffer filled at `rate` env steps/s, `spi` sampled per step added, read by its probe."""
    def live(t: float) -> RllibLive:
        added = int(rate * (t - T0))
        return RllibLive(t, "DQN", buffer_kind=kind, capacity=capacity,
                         env_steps_stored=min(capacity, added), env_steps_added=added,
                         env_steps_sampled=int(spi * added))
    return live


CONF = {"train_batch_size_per_learner": 32, "num_learners": 0, "num_env_runners": 1,
        "num_envs_per_env_runner": 1, "rollout_fragment_length": 8}


def test_a_full_buffer_sampled_a_quarter_per_step_added_wastes_three_quarters() -> None:
    job = Job(live=buffer_at(0.25), row_extra=lambda at: {**CONF, "training_intensity": 0.25})
    f = judged(job, 120.0)[Name.WASTED_EXPERIENCE]
    ev = f.evidence
    assert ev["sampled_per_added"] == 0.25 and ev["never_sampled_share"] == round(
        math.exp(-0.25), 4)
    assert "78% of its env steps never sampled" in f.summary and "estimate" in f.summary
    # rllib_ratio's weights for 0.92 with batch 32, fragment 8: 1 train of 32 per 4 stores
    # of 8 samples 1.0 per step added, which RLlib's count of one sampler more calls 0.5
    assert ev["training_intensity_fix"] == pytest.approx(0.5)
    assert f.fix.startswith("Set training_intensity to 0.5: RLlib's rounded weights then "
                            "sample 1 env steps per env step added, which leaves about 37%")
    # A prioritized buffer wastes at least that: a floor
    prio = judged(Job(live=buffer_at(0.25, kind="PrioritizedEpisodeReplayBuffer")), 120.0)
    assert "at least 78%" in prio[Name.WASTED_EXPERIENCE].summary
    # Without the configuration in a row, the ratio to reach
    assert "at least 0.92 env steps per env step added" in prio[Name.WASTED_EXPERIENCE].fix


@pytest.mark.parametrize("what,live,until", [
    ("sampled once per step added: e^-1 = 37 %, under half", buffer_at(1.0), 120.0),
    ("still filling", buffer_at(0.25, capacity=100_000), 120.0),
    ("full for less than the SPI window", buffer_at(0.25, rate=40.0), 70.0),
])
def test_a_buffer_that_wastes_less_than_half_or_cannot_say_is_not_named(
        what: str, live: Callable[[float], RllibLive], until: float) -> None:
    assert Name.WASTED_EXPERIENCE not in judged(Job(live=live), until), what
