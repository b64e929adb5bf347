"""Metric families of RLlib jobs read from outside (a Ray target's newest `RaySnapshot`).

The same conventions as metrics.py: built fresh from one `Published` per scrape, bounded
labels only. A job is labelled as its findings are, `table="job:<Ray's job id>"`, so a
dashboard's target and table selectors reach it; `role` is one of `ray_model.ActorRole`'s
four, `state` one of Ray's actor states. Counters are summed over the processes
of the job that RLlib's series were joined to; a job that exported none has no sample,
never a 0.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable

from replaywatch.metric_families import Group, Row, counter, gauge
from replaywatch.ray_model import ActorRole, RaySnapshot, RllibCounters
from replaywatch.state import Published

JOB = ("target", "table")
ROLE = (*JOB, "role")

ACTORS = gauge("rllib_actors", "The job's Ray actors by role and state (ALIVE, RESTARTING, "
               "DEAD, ...).", (*ROLE, "state"))
RESTARTS = gauge("rllib_actor_restarts", "Restarts of the job's actors, summed by role "
                 "(Ray's num_restarts).", ROLE)
LONGEST_CALL = gauge("rllib_longest_call_seconds", "The oldest running call of the job's "
                     "actors by role: a hung env or learner update ages here.", ROLE)
SAMPLED = counter("rllib_env_steps_sampled", "Env steps the job's EnvRunners sampled "
                  "(ray_rllib_env_runner_num_env_steps_sampled_counter).", JOB)
TRAINED = counter("rllib_env_steps_trained", "Env steps the job's learners trained on "
                  "(ray_rllib_learner_all_modules_num_env_steps_trained_counter).", JOB)
DROPPED = counter("rllib_env_steps_dropped", "Env steps dropped before training (the "
                  "circular buffer's and the learner queue's drop counters), once exported.",
                  JOB)


def _sum(counters: Iterable[RllibCounters], field: str, role: ActorRole | None) -> float | None:
    values = [getattr(c, field) for c in counters
              if c.joined and (role is None or c.role == role) and getattr(c, field) is not None]
    return float(sum(values)) if values else None


def _dropped(counters: Iterable[RllibCounters]) -> float | None:
    values = [v for c in counters if c.joined
              for v in (c.circular_buffer_dropped, c.env_steps_dropped) if v is not None]
    return float(sum(values)) if values else None


def ray_rows(state: Published) -> Group:
    actors: list[Row] = []
    restarts: list[Row] = []
    longest: list[Row] = []
    sampled: list[Row] = []
    trained: list[Row] = []
    dropped: list[Row] = []
    for target, snap in sorted(state.ray.items()):
        if snap.job_id is None:
            continue
        job = (target, f"job:{snap.job_id}")
        by_state = collections.Counter((a.role, a.state) for a in snap.actors)
        actors += [((*job, str(role), st), float(n)) for (role, st), n in sorted(by_state.items())]
        by_role: dict[str, float] = collections.defaultdict(float)
        for a in snap.actors:
            by_role[str(a.role)] += a.num_restarts
        restarts += [((*job, role), n) for role, n in sorted(by_role.items())]
        longest += _longest_calls(snap)
        for rows, value in ((sampled, _sum(snap.counters, "env_steps_sampled",
                                             ActorRole.ENV_RUNNER)),
                            (trained, _sum(snap.counters, "env_steps_trained", None)),
                            (dropped, _dropped(snap.counters))):
            if value is not None:
                rows.append((job, value))
    yield from zip((ACTORS, RESTARTS, LONGEST_CALL, SAMPLED, TRAINED, DROPPED),
                   (actors, restarts, longest, sampled, trained, dropped))


def _longest_calls(snap: RaySnapshot) -> list[Row]:
    oldest: dict[str, float] = {}
    for t in snap.tasks:
        if t.running_for_s is not None:
            role = str(t.role)
            oldest[role] = max(oldest.get(role, 0.0), t.running_for_s)
    assert snap.job_id is not None
    return [((snap.target, f"job:{snap.job_id}", role), s) for role, s in sorted(oldest.items())]
