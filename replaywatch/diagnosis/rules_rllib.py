"""RLlib jobs on a Ray cluster, read from outside: hung calls, a stalled learner or driver,
actors down, dropped env steps, and the replay ratio against the one asked.

    rllib_actor_down    an EnvRunner, Learner or aggregator is DEAD or RESTARTING, or restarted
    env_runner_stalled  an EnvRunner's call runs past its window, or (APPO) it alone samples nothing
    driver_stalled      nothing moves and no actor call runs: the driver's learner or loop
    learner_stalled     the trained counter rests while a Learner call runs on or samples flow
    env_steps_dropped   drop counters rose (circular buffer, training step, learner group)
    spi_drift           env steps trained per sampled off `training_intensity` (rllib_rates)
    warmup              learning has not started yet

`judge_rllib(target, history, th, now)` judges one target's snapshots; the rules are
registered with `Shape.RAY_JOB`, which the engine never runs. learner_stalled, spi_drift and
warmup mean here what they mean on Reverb, so their Reverb rules stay their registrations
and the RLlib ones are listed in `SHARED`. A part a poll could not read is unknown, never
empty: no stall is named from it (rllib_progress.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from replaywatch.diagnosis import kinds, rllib_actors, rllib_memory, rllib_rates, rllib_waste
from replaywatch.diagnosis import rllib_job as rj
from replaywatch.diagnosis import rllib_progress as rp
from replaywatch.diagnosis.registry import Rule, Shape
from replaywatch.diagnosis.rllib_job import RllibJob
from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.model import Finding, Name
from replaywatch.ray_model import ActorRole, RaySnapshot, RayTask, RllibLive

WORKERS = rllib_actors.WORKERS


def judge_rllib(target: str, history: Sequence[RaySnapshot], th: Thresholds,
                now: float) -> tuple[Finding, ...]:
    """history: this target's snapshots, oldest first, over the look-back the keeper gives
    (several stall windows). One finding per kind for the newest snapshot's job, worst
    first, the kinds another explains left out (`Kind.supersedes`)."""
    job = rj.read_job(target, history, th, now)
    if job is None:
        return ()
    found = [f for rule in (*RULES, *SHARED) if (f := rule.judge(job, th)) is not None]
    names = {f.kind for f in found}
    if Name.LEARNER_STALLED in names:  # a learner hung at its first update is no warm-up
        found = [f for f in found if f.kind != Name.WARMUP]
    return kinds.worst_first(f for f in found
                             if not any(w in names for w in kinds.superseded_by(f.kind)))


# -- learner_stalled ---------------------------------------------------------------------------

def is_learner_stalled(job: RllibJob, th: Thresholds) -> Finding | None:
    """The learner takes no batch: its trained counter rests past its window while its call
    runs on (DQN: the whole job waits on it) or while env steps are still sampled (APPO: the
    samples go nowhere)."""
    if rj.rows_warm_up(job) and rj.warming_up(job):
        return None
    hung = _hung_calls(job, ActorRole.LEARNER, TRAINED, "Learner")
    trained = job.trained
    if trained is not None and not trained.stalled(job.now):
        return None
    flowing = _sampled_without_training(job, trained)
    if not hung and not flowing:
        return None
    learners = [a for a in job.latest.actors if a.role is ActorRole.LEARNER and a.alive]
    # No Learner actor: it trains inside the driver (num_learners=0).
    where = "the Learner actor" if hung or learners else "the driver, where the learner runs"
    pids = [t.worker_pid for t, _ in hung] or [a.pid for a in learners] or [_driver_pid(job)]
    evidence: dict[str, Any] = {
        "trained": None if trained is None else trained.evidence(job.now),
        "sampled": None if job.sampled is None else job.sampled.evidence(job.now),
        "calls": [_call(t, w) for t, w in hung], "learner_pids": pids,
        "learner_actors": [a.actor_id for a in learners]}
    how = ("its call has run for " + ", ".join(f"{t.running_for_s:.0f} s" for t, _ in hung)
           if hung else "env steps are still sampled and none is trained")
    rest = ("" if trained is None
            else f", its trained counter resting {trained.rested_s(job.now):.0f} s")
    summary = f"The learner of RLlib job {job.job_id} trains nothing: {how}{rest}."
    fix = (f"`py-spy dump --pid {_one(pids)}` ({where}): the stack shows where its "
           "update waits; RLlib times none of it out.")
    said = _learner_queue_says(job.latest.live)
    if said is not None:
        evidence["learner_queue"], sentence = said[0], said[1]
        fix = " ".join(part for part in (said[2], fix) if part)
        summary = f"{summary} {sentence}"
    begins = ([job.now - (t.running_for_s or 0.0) for t, _ in hung]
              + ([trained.since] if trained is not None else []))
    learned = trained is not None and trained.learned
    return rj.held(job.finding(kinds.LEARNER_STALLED, summary, evidence, fix, min(begins)),
                   rj.grace(job, learned, max(begins)), th, job.now)


def learner_thread(live: RllibLive | None) -> tuple[str, dict[str, Any]] | None:
    """What the RLlibProbe in the driver saw of the learner thread when polled: "starved"
    (blocked on its empty in-queue: no batch reaches it), "hung" (not waiting for input:
    inside an update) or "dead", with its evidence. None without a probe, or where no learner
    thread runs in the driver (DQN; learners in Ray actors): then the stack alone tells."""
    if live is None or live.learner_thread_alive is None:
        return None
    evidence = {"depth": live.queue_depth, "maxsize": live.queue_maxsize,
                "thread_alive": live.learner_thread_alive, "waiting": live.learner_waiting,
                "waited_s": live.learner_waited_s, "watched_s": live.learner_watched_s,
                "told_by": "RLlibProbe in the driver"}
    if not live.learner_thread_alive:
        return "dead", evidence
    if live.learner_waiting and not live.queue_depth:
        return "starved", evidence
    if live.learner_waiting is False:
        return "hung", evidence
    return None


def _queued(live: RllibLive) -> str:
    return (f"with {live.queue_depth} batch(es) in its queue" if live.queue_depth
            else "its queue empty")


DEAD_FIX = "Its learner thread ended: the driver's log has its exception; restart the job."


def _learner_queue_says(live: RllibLive | None
                        ) -> tuple[dict[str, Any], str, str] | None:
    """learner_thread's reading as learner_stalled words it: (evidence, sentence, fix first)."""
    read = learner_thread(live)
    if read is None or live is None:
        return None
    state, evidence = read
    if state == "dead":
        return evidence, "The RLlibProbe says its learner thread is dead.", DEAD_FIX
    if state == "starved":
        return (evidence, "The RLlibProbe says its learner thread is blocked on an empty "
                "in-queue: it is starved (no batch reaches it), not hung in an update.",
                "Look upstream of the learner: the EnvRunners' and aggregators' calls and "
                "the LearnerGroup's update in the driver.")
    return (evidence, "The RLlibProbe says its learner thread was not waiting for input "
            f"when polled, {_queued(live)}: it hangs inside an update.", "")


def _sampled_without_training(job: RllibJob, trained: rp.Progress | None) -> bool:
    """Env steps still sampled while the trained counter rests: an asynchronous algorithm's
    samples going nowhere. A synchronous one (DQN) samples and trains in one loop, so what it
    sampled after its last update is a report's lag (each process reports on its own 10 s
    clock: a DQN whose env hung showed env steps 15 s after its last update on a loaded
    host), never a learner taking nothing; where the algorithm is not known, only sampling
    that went on past two report intervals after training stopped counts."""
    sampled = job.sampled
    if sampled is None or trained is None or not sampled.moving(job.now):
        return False
    algo = job.algorithm()
    if algo in rj.SYNCHRONOUS:
        return False
    if algo in rj.ASYNCHRONOUS:
        return True
    return sampled.moved_at is not None and sampled.moved_at - trained.since > 2 * rp.REPORT_S


# The counter whose rhythm, before a call began, bounds how long the call may run.
SAMPLED = (rp.counter_reader("env_steps_sampled", ActorRole.ENV_RUNNER), "env steps sampled")
TRAINED = (rp.counter_reader("env_steps_trained"), "env steps trained")


def _hung_calls(job: RllibJob, role: ActorRole, counter: tuple[rp.Reader, str], what: str
                ) -> list[tuple[RayTask, rp.Window]]:
    """The newest poll's calls of `role` running past their window (its earlier calls', or
    the counter's learned from the polls before the call began)."""
    if not rp.known(job.latest, rp.Part.STATE):
        return []
    out = []
    read, said = counter
    for t in rp.tasks_of(job.latest, (role,)):
        age = t.running_for_s or 0.0
        before = rp.progress(job.history, read, said, job.th, rp.counter_floor(job.th),
                             until=job.now - age)
        window = rp.call_window(job.history, role, job.th, before, what)
        if age > window.seconds:
            out.append((t, window))
    return out


def _call(t: RayTask, w: rp.Window) -> dict[str, Any]:
    return {"call": t.name, "pid": t.worker_pid, "actor_id": t.actor_id,
            "running_s": None if t.running_for_s is None else round(t.running_for_s, 1),
            "window_s": round(w.seconds, 1), "window_why": w.why}


def _driver_pid(job: RllibJob) -> int | None:
    row = job.row()
    return job.latest.driver_pid or (row.pid if row is not None else None)


def _one(pids: Sequence[int | None]) -> str:
    known = [str(p) for p in pids if p]
    return known[0] if len(known) == 1 else ("<" + " or ".join(known) + ">" if known
                                             else "<its pid>")


# -- env_runner_stalled ------------------------------------------------------------------------

def is_env_runner_stalled(job: RllibJob, th: Thresholds) -> Finding | None:
    """An EnvRunner's env hangs: its call runs past its window, or its own sampled counter
    rests past its window while the other runners' move (asynchronous sampling)."""
    hung = _hung_calls(job, ActorRole.ENV_RUNNER, SAMPLED, "EnvRunner")
    flat = _flat_runners(job)
    named = {t.worker_pid for t, _ in hung}
    flat = [r for r in flat if r["pid"] is None or r["pid"] not in named]
    if not hung and not flat:
        return None
    algo = job.algorithm()
    pids = [t.worker_pid for t, _ in hung] + [r["pid"] for r in flat]
    evidence = {"calls": [_call(t, w) for t, w in hung], "flat_runners": flat,
                "runner_pids": pids, "algorithm": algo,
                "sampled": None if job.sampled is None else job.sampled.evidence(job.now)}
    summary = (f"{len(pids)} EnvRunner(s) of RLlib job {job.job_id} hang (pid "
               f"{', '.join(str(p) for p in pids)}): {_sync_words(algo)}")
    fix = (f"`py-spy dump --pid {_one(pids)}`: the stack shows the env call that hangs (a hang "
           "raises nothing, so RLlib restarts no runner for it).")
    begins = ([job.now - (t.running_for_s or 0.0) for t, _ in hung]
              + [r["resting_since"] for r in flat])
    learned = all(w.basis in (rp.Basis.LEARNED, rp.Basis.PAUSE) for _, w in hung) and all(
        r["window_learned"] for r in flat)
    return rj.held(job.finding(kinds.ENV_RUNNER_STALLED, summary, evidence, fix, min(begins)),
                   rj.grace(job, learned, max(begins)), th, job.now)


def _sync_words(algo: str | None) -> str:
    if algo in rj.SYNCHRONOUS:
        return (f"{algo} samples synchronously, so the whole job waits on it; RLlib's "
                "sample_timeout_s (60 s by default) lets the other runners' steps through "
                "once a minute, so every counter moves about once a minute.")
    if algo in rj.ASYNCHRONOUS:
        return f"{algo} samples asynchronously: the other runners go on without it."
    return ("the algorithm is not known here: a synchronous one (DQN) waits on it, an "
            "asynchronous one (APPO) goes on without it.")


def _flat_runners(job: RllibJob) -> list[dict[str, Any]]:
    """Live EnvRunners whose own sampled counter rests past its window while another's moves."""
    if not rp.actors_known(job.latest):
        return []
    runners = {a.worker_id: a for a in job.latest.actors
               if a.role is ActorRole.ENV_RUNNER and a.alive and a.worker_id}
    floor = rp.counter_floor(job.th)
    readers = rp.worker_readers(job.history, "env_steps_sampled", ActorRole.ENV_RUNNER)
    own = {w: p for w in runners if w in readers and (p := rp.progress(
        job.history, readers[w], "this runner's env steps", job.th, floor)) is not None}
    moving = [w for w, p in own.items() if p.moving(job.now)]
    return [{"pid": runners[w].pid, "actor_id": runners[w].actor_id, "worker_id": w,
             **p.evidence(job.now), "window_learned": p.learned,
             "others_moving": len(moving)}
            for w, p in own.items() if p.stalled(job.now) and moving]


# -- driver_stalled ----------------------------------------------------------------------------

def is_driver_stalled(job: RllibJob, th: Thresholds) -> Finding | None:
    """Nothing moves and no actor call runs: the driver waits, in its own learner (with
    `num_learners=0` it trains in the driver) or in the user's loop around `train()`."""
    latest = job.latest
    series = job.series()
    if (not series or not rp.known(latest, rp.Part.STATE)
            or not rp.known(latest, rp.Part.METRICS)
            or not any(p.current for p in series)
            or any(not p.stalled(job.now) for p in series if p.current)
            or rp.tasks_of(latest, WORKERS)
            or not any(a.alive for a in latest.actors if a.role in WORKERS)):
        return None
    row = job.row()
    pid = _driver_pid(job)
    learner_actors = sum(1 for a in latest.actors if a.role is ActorRole.LEARNER)
    learners = row.num_learners if row is not None and row.num_learners is not None else (
        learner_actors if rp.actors_known(latest) else None)
    readings = ["its learner (num_learners=0, RLlib's default, trains inside the driver)",
                "the user's loop around algo.train()"]
    if learners:
        readings = readings[::-1]
    evidence = {"driver_pid": pid, "num_learners": learners,
                "learner_actors": learner_actors, "readings": readings,
                "running_calls": 0, **{p.what.replace(" ", "_"): p.evidence(job.now)
                                       for p in series if p.current}}
    summary = (f"Nothing of RLlib job {job.job_id} moves and no actor call runs: the driver "
               f"(pid {pid or 'unknown'}) waits, in {readings[0]} or in {readings[1]}.")
    dump = f"`py-spy dump --pid {pid or '<the driver: the process calling algo.train()>'}`"
    fix = f"{dump}: a Learner's update on its stack is the learner, anything else the loop."
    said = learner_thread(latest.live)
    if said is not None and latest.live is not None:
        # The RLlibProbe saw the learner thread itself: which of the two readings it is.
        state, evidence["learner_queue"] = said
        head = (f"Nothing of RLlib job {job.job_id} moves and no actor call runs: the driver "
                f"(pid {pid or 'unknown'})")
        if state == "hung":
            evidence["readings"] = ["its learner thread, in the driver"]
            summary = (f"{head} waits on its learner: the RLlibProbe says its learner thread "
                       f"was not waiting for input when polled, {_queued(latest.live)}: it "
                       "hangs inside an update.")
            fix = (f"{dump}: the learner thread's stack (_LearnerThread) shows where its "
                   "update hangs; RLlib times none of it out.")
        elif state == "starved":
            evidence["readings"] = readings = ["the user's loop around algo.train(), or "
                                               "RLlib's code in the driver that feeds the "
                                               "learner"]
            summary = (f"{head} waits, not in its learner: the RLlibProbe says its learner "
                       "thread is blocked on an empty in-queue. The loop around "
                       "algo.train(), or RLlib's code in the driver that feeds the learner, "
                       "holds it.")
            fix = f"{dump}: the main thread's stack shows where the driver waits."
        else:
            summary = f"{head} waits: the RLlibProbe says its learner thread is dead."
            fix = DEAD_FIX
    since = max(p.since for p in series if p.current)
    learned = all(p.learned for p in series if p.current)
    return rj.held(job.finding(kinds.DRIVER_STALLED, summary, evidence, fix, since),
                   rj.grace(job, learned, since), th, job.now)


# -- warmup ------------------------------------------------------------------------------------

def is_warmup(job: RllibJob, th: Thresholds) -> Finding | None:
    """Learning has not started: DQN samples its warm-up before the first update."""
    said = rj.warming_up(job)
    if said is None or job.sampled is None or not job.sampled.moving(job.now):
        return None
    eta = _warm_up_eta(job, said)
    summary = (f"RLlib job {job.job_id} is sampling its warm-up: learning has not started "
               f"({said['told_by']}){eta[1]}; not a stall.")
    since = job.sampled.first_moved_at or job.history[0].observed_at
    fix = "Nothing to fix: wait."
    if eta[0] is not None and eta[0] > WARM_UP_SAID_LONG_S:
        fix = ("Wait, or lower num_steps_sampled_before_learning_starts: at this sampling rate "
               "(while sampling flows RLlib's warm-up always ends; it counts steps sampled, not "
               "stored) it ends only after the time given.")
    evidence = {**said, "sampled": job.sampled.evidence(job.now), "eta_s": eta[0]}
    live = job.latest.live
    if live is not None and live.env_steps_stored is not None:
        # What the buffer holds now, from the RLlibProbe: the rows' figure is a mean.
        evidence["buffer"] = {"env_steps_stored": live.env_steps_stored,
                              "capacity": live.capacity, "kind": live.buffer_kind,
                              "told_by": "RLlibProbe in the driver"}
    return job.finding(kinds.WARMUP, summary, evidence, fix, since)


# A warm-up this long is said in the fix: a value typed with a zero too many, or a rate far
# below the one the value was chosen for.
WARM_UP_SAID_LONG_S = 3600.0


def _warm_up_eta(job: RllibJob, said: dict[str, Any]) -> tuple[float | None, str]:
    """(seconds until learning starts at the rate sampled over the look-back, its words)."""
    to_go = said.get("env_steps_to_go")
    points = job.sampled.points if job.sampled is not None else ()
    if to_go is None or len(points) < 2 or points[-1][0] <= points[0][0]:
        return None, ""
    rate = (points[-1][1] - points[0][1]) / (points[-1][0] - points[0][0])
    if rate <= 0:
        return None, ""
    eta = to_go / rate
    return eta, f", {to_go:.0f} env steps to go at {rate:.0f}/s: about {_duration(eta)}"


def _duration(seconds: float) -> str:
    for unit, size in (("days", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.0f} s"


# The kinds whose meaning on Ray is their meaning on Reverb: registered with their Reverb
# rules, run here by judge_rllib.
SHARED = (
    Rule(kinds.LEARNER_STALLED, is_learner_stalled, Shape.RAY_JOB),
    Rule(kinds.SPI_DRIFT, rllib_rates.is_ratio_off, Shape.RAY_JOB),
    Rule(kinds.WARMUP, is_warmup, Shape.RAY_JOB),
    Rule(kinds.MEMORY_EXHAUSTION, rllib_memory.is_driver_memory_exhausted, Shape.RAY_JOB),
    Rule(kinds.WASTED_EXPERIENCE, rllib_waste.is_buffer_wasted, Shape.RAY_JOB),
)

RULES = (
    Rule(kinds.RLLIB_ACTOR_DOWN, rllib_actors.is_rllib_actor_down, Shape.RAY_JOB),
    Rule(kinds.ENV_RUNNER_STALLED, is_env_runner_stalled, Shape.RAY_JOB),
    Rule(kinds.DRIVER_STALLED, is_driver_stalled, Shape.RAY_JOB),
    Rule(kinds.ENV_STEPS_DROPPED, rllib_rates.is_env_steps_dropped, Shape.RAY_JOB),
)
