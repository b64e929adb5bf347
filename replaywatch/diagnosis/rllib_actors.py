"""rllib_actor_down: an RLlib job's actors that sample, learn or aggregate, dead, restarting
or restarted, from Ray's state API.

A job that ends as `algo.stop()` ends it (recorded on Ray 2.60: a DQN's EnvRunners killed
by `ray.kill`, its Learner exiting with INTENDED_USER_EXIT; an APPO job's EnvRunner
REF_DELETED, its driver having let go of every handle to it) is not down, nor one whose driver
ended, however (its actors die with it, OWNER_DIED naming the driver: measured on Ray 2.60
with the driver SIGKILLed): that is the job's end, and the sidecar keeps watching it until a
newer one starts (or, with `--ray-job all`, for its TTL), so its end is seen. Each of those
actors is ended by its owner, never down, even while the rest of the job is still stopping:
a poll between `algo.stop()`'s first and last actor pages nothing.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from replaywatch.diagnosis import kinds
from replaywatch.diagnosis import rllib_progress as rp
from replaywatch.diagnosis.rllib_job import RllibJob
from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.model import Finding, Severity
from replaywatch.ray_model import ActorRole, RayActor, RaySnapshot, driver_worker_id

WORKERS = (ActorRole.ENV_RUNNER, ActorRole.LEARNER, ActorRole.AGGREGATOR)
DOWN_STATES = frozenset({"DEAD", "RESTARTING"})


# -- rllib_actor_down --------------------------------------------------------------------------

def ended_on_purpose(a: RayActor) -> bool:
    """How `algo.stop()` ends its actors (recorded): EnvRunners by `ray.kill` or by their
    handles let go (REF_DELETED: Ray ends an actor no one refers to, which a crash never
    says), the Learner by exiting; or the job's end: its driver, their owner, gone (Ray says
    "Owner Id" and the driver's WorkerId). An actor another actor owns, dead with its owner,
    is still down."""
    cause = a.death_cause or ""
    return a.state == "DEAD" and (
        cause.startswith(("RAY_KILL", "REF_DELETED")) or "INTENDED_USER_EXIT" in cause
        or cause.startswith("OWNER_DIED") and f"Owner Id: {driver_worker_id(a.job_id)}" in cause)


def job_ended(latest: RaySnapshot) -> bool:
    """The job has ended: every actor of it that samples, learns or aggregates is dead, each
    as `algo.stop()` or its driver's end leaves it."""
    if not rp.actors_known(latest):
        return False
    mine = [a for a in latest.actors if a.role in WORKERS]
    return bool(mine) and all(ended_on_purpose(a) for a in mine)


def is_rllib_actor_down(job: RllibJob, th: Thresholds) -> Finding | None:
    """An actor that samples, learns or aggregates is dead, restarting, or restarted."""
    latest = job.latest
    if not rp.actors_known(latest):
        return None
    mine = [a for a in latest.actors if a.role in WORKERS]
    if not mine or job_ended(latest):
        return None  # an ended job (algo.stop()), or none to judge
    first: dict[str, tuple[int, float]] = {}
    for s in job.history:
        if rp.actors_known(s):
            for a in s.actors:
                first.setdefault(a.actor_id, (a.num_restarts, s.observed_at))
    down = [a for a in mine if a.state in DOWN_STATES and not ended_on_purpose(a)]
    restarted = [a for a in mine if a.actor_id in first and a.num_restarts > first[a.actor_id][0]]
    if not down and not restarted:
        return None
    runners = [a for a in mine if a.role is ActorRole.ENV_RUNNER]
    runners_down = [a for a in down if a.role is ActorRole.ENV_RUNNER]
    learner_down = [a for a in down if a.role is ActorRole.LEARNER]
    critical = bool(learner_down) or bool(runners) and len(runners_down) == len(runners)
    evidence = {"down": [_actor(a) for a in down], "restarted": [
        {**_actor(a), "restarts_before": first[a.actor_id][0]} for a in restarted],
        "env_runners_down": f"{len(runners_down)} of {len(runners)}",
        "learners_down": len(learner_down), "actors_known": len(mine)}
    what = "; ".join(f"{a.role} {a.actor_id[:8]} (pid {a.pid}) {a.state}"
                     + (f": {a.death_cause}" if a.death_cause else "") for a in down)
    summary = (f"RLlib job {job.job_id}: {len(runners_down)} of {len(runners)} EnvRunners "
               f"down, {len(learner_down)} Learner(s) down, {len(restarted)} restarted. {what}")
    fix = ("Read the death cause given, then the dead actor's log (the Ray session's logs/ "
           "files named with its pid) for the exception.")
    since = min((at for a in down + restarted
                 if (at := _first_seen_down(job, a)) is not None), default=latest.observed_at)
    f = job.finding(kinds.RLLIB_ACTOR_DOWN, summary, evidence, fix, since)
    return f if critical else dataclasses.replace(f, severity=Severity.WARNING)


def _actor(a: RayActor) -> dict[str, Any]:
    return {"role": str(a.role), "actor_id": a.actor_id, "pid": a.pid, "state": a.state,
            "num_restarts": a.num_restarts, "death_cause": a.death_cause}


def _first_seen_down(job: RllibJob, a: RayActor) -> float | None:
    for s in job.history:
        for b in s.actors:
            if b.actor_id == a.actor_id and (b.state in DOWN_STATES
                                             or b.num_restarts >= a.num_restarts > 0):
                return s.observed_at
    return None
