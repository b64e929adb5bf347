"""An RLlib driver whose replay buffer will not fit: memory_exhaustion, from its RLlibProbe.

RLlib keeps a DQN-family replay buffer in the driver (`algo.local_replay_buffer`): every env
step stored is the driver's memory, until `replay_buffer_config["capacity"]` is reached and
the oldest episodes are evicted. An image agent's buffer of a million steps is tens of GiB,
and the kernel kills the driver, the whole job, once the buffer takes it past its limit,
hours in. The probe serves the buffer's env steps stored and the driver's memory as it
fills; the bytes one env step costs are measured from them, as a Reverb table's item is
(memory.py), and the driver at capacity is projected:

    per step    (memory now - memory then) / (steps stored now - steps stored then), over the
                fill since the buffer held MIN_SHARE of its capacity (start-up allocations,
                the model and the first episodes, are not the buffer's)
    at capacity memory now + (capacity - stored now) x per step
    fits        stored now + (85 % of the limit - memory now) / per step, in env steps

An env step's bytes are the driver's resident memory's growth: the buffer is the driver's.
What is weighed against the limit is the cgroup's anonymous memory where the driver runs under
a memory cgroup's limit (a local cluster's processes share the driver's group, and the
kernel's OOM killer picks among them: in a real run it killed the EnvRunner, again and again,
not the driver), else the driver's resident memory against the host's memory. The group's
memory is no measure of a step: a killed worker's memory leaves it and comes back when Ray
restarts the worker (a real run measured 100 to 650 KiB a step from it for 80). While the
group OOM-kills (a kill within the look-back), the finding holds whatever the projection
says, the buffer filling or full: a full buffer whose group keeps killing the workers beside
the driver is the same memory that does not fit. A real DQN with 64 KiB observations
(bench/RESULTS.md, "An RLlib driver's replay buffer") grew 70 to 82 KB a step, linearly; its
projection from a quarter of the fill was 4.1 to 5.8 % under what it used once full, and 2.4
to 4.6 % with 16 KiB observations.
"""

from __future__ import annotations

from typing import Any

from replaywatch.diagnosis import kinds
from replaywatch.diagnosis.rllib_job import RllibJob
from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.model import Finding
from replaywatch.ray_model import RllibLive

MIN_SHARE = 0.05  # of the capacity stored before the fill is measured from
MIN_GROWTH_SHARE = 0.05  # ... and this much more stored since: a span a slope holds over
# The capacity printed keeps the driver under this share of its limit as projected: real
# fills ended 2 to 6 % above their projection (bench/RESULTS.md), so under 90 % of it then.
FITS_SHARE = 0.85


def _in_cgroup(live: RllibLive) -> bool:
    return live.limit_from is not None and live.limit_from.startswith("cgroup")


def _used(live: RllibLive) -> int | None:
    """What the limit is weighed against: the cgroup's anonymous memory (its page cache is
    reclaimed before anything is killed, and near the limit it shrinks as the buffer grows:
    a real job's usage then gave 40 to 260 KiB a step for 82), else its usage, else the
    driver's resident memory against the host's."""
    if _in_cgroup(live):
        return live.cgroup_anon_bytes if live.cgroup_anon_bytes is not None \
            else live.cgroup_usage_bytes
    return live.rss_bytes


def _step_bytes(live: RllibLive) -> int | None:
    """What an env step's bytes are measured from: the driver's resident memory, where the
    buffer lives (else what the limit is weighed against)."""
    return live.rss_bytes if live.rss_bytes is not None else _used(live)


def _readings(job: RllibJob) -> list[RllibLive]:
    out = []
    for s in job.history:
        live = s.live
        if (live is not None and live.env_steps_stored is not None and live.capacity
                and live.limit_bytes and _used(live) is not None):
            out.append(live)
    return out


def driver_at_capacity(job: RllibJob) -> dict[str, Any] | None:
    """The projection's figures while the buffer fills, or None where they cannot be read
    (no probe, no buffer, a full buffer, a fill too short to measure)."""
    readings = _readings(job)
    if len(readings) < 2:
        return None
    now = readings[-1]
    capacity, stored = int(now.capacity or 0), int(now.env_steps_stored or 0)
    kills = [r.oom_kills for r in readings if r.oom_kills is not None]
    killed = kills[-1] - kills[0] if len(kills) >= 2 else 0
    full = stored >= capacity
    if full and not killed:
        return None  # full: it evicts; what it holds is what it will hold, and it fits
    fill = [r for r in readings if (r.env_steps_stored or 0) >= MIN_SHARE * capacity
            and r.env_steps_stored != capacity]
    if fill and fill[0].capacity != now.capacity:
        return None
    first = fill[0] if fill else now
    last = fill[-1] if fill else now
    grown = int(last.env_steps_stored or 0) - int(first.env_steps_stored or 0)
    used_now, then, later = _used(now), _step_bytes(first), _step_bytes(last)
    if used_now is None or (not killed and (
            grown < MIN_GROWTH_SHARE * capacity or then is None or later is None)):
        return None
    per_step = ((later - then) / grown if grown >= MIN_GROWTH_SHARE * capacity
                and then is not None and later is not None else 0.0)
    if per_step <= 0 and not killed:
        return None
    limit = int(now.limit_bytes or 0)
    if per_step <= 0:
        # Full before the look-back, or no fill long enough in it: no step's bytes now,
        # and the kills say the limit is hit.
        per_step = float("nan")
    measured = per_step == per_step  # not NaN
    at_capacity = used_now + max(0, capacity - stored) * per_step if measured else None
    span = last.observed_at - first.observed_at
    rate = grown / span if span > 0 else None
    seconds_left = (0.0 if used_now >= limit or killed else
                    (limit - used_now) / (per_step * rate) if rate and measured else None)
    return {"capacity": capacity, "env_steps_stored": stored, "full": full,
            "used_bytes": used_now,
            "used_from": ("driver rss" if not _in_cgroup(now) else "cgroup anon"
                          if now.cgroup_anon_bytes is not None else "cgroup usage"),
            "oom_kills": now.oom_kills,
            # The kernel killed in the group while the buffer filled: the limit is being hit
            # (a killed worker's memory, back when Ray restarts it, swings what is measured).
            "oom_kills_in_look_back": killed,
            "step_bytes_from": "driver rss" if now.rss_bytes is not None else "limit's",
            "measured_since": first.observed_at,
            "limit_bytes": limit, "limit_from": now.limit_from,
            "bytes_per_env_step": round(per_step, 1) if measured else None,
            "measured_over_env_steps": grown, "measured_from_stored": first.env_steps_stored,
            "at_capacity_bytes": None if at_capacity is None else int(at_capacity),
            "capacity_that_fits": None if not measured else max(
                0, int(stored + (FITS_SHARE * limit - used_now) / per_step)),
            "env_steps_added_per_s": None if rate is None else round(rate, 1),
            "seconds_left": None if seconds_left is None else round(seconds_left, 1),
            "buffer_kind": now.buffer_kind, "told_by": "RLlibProbe in the driver"}


def is_driver_memory_exhausted(job: RllibJob, th: Thresholds) -> Finding | None:
    """The driver's replay buffer, filled to its capacity, takes it past its limit; or its
    memory cgroup OOM-kills while the buffer fills or once it is full."""
    said = driver_at_capacity(job)
    killed = said["oom_kills_in_look_back"] if said is not None else 0
    if said is None or (not killed and said["at_capacity_bytes"] <= said["limit_bytes"]):
        return None
    where = ("the kernel then kills a process of its memory cgroup: the driver, and the job "
             "with it, or a worker beside it in the group, restarted again and again (an "
             "EnvRunner, in a real run)" if (said["limit_from"] or "").startswith("cgroup")
             else "the host then runs out of memory")
    if killed:
        span = job.now - job.history[0].observed_at
        where += f"; its cgroup OOM-killed {killed} time(s) in the last {span:.0f} s"
    gib = lambda b: f"{b / 2**30:.2f} GiB"  # noqa: E731
    left = said["seconds_left"]
    when = ("" if left is None else ", at its limit now" if left <= 0 else
            f", its limit reached in about {left / 60:.1f} min at "
            f"{said['env_steps_added_per_s']:.0f} env steps/s")
    at, fits = said["at_capacity_bytes"], said["capacity_that_fits"]
    step = ("" if said["bytes_per_env_step"] is None else
            f", {said['bytes_per_env_step'] / 1024:.1f} KiB a step as it filled")
    if said["full"]:
        projected = (f"full at its capacity of {said['capacity']} env steps, its group uses "
                     f"{gib(said['used_bytes'])} against its limit of "
                     f"{gib(said['limit_bytes'])} ({said['limit_from']}){step}; ")
    else:
        projected = ("" if at is None else
                     f"at its capacity of {said['capacity']} env steps it would use {gib(at)} "
                     f"against its limit of {gib(said['limit_bytes'])} "
                     f"({said['limit_from']}){step}{when}; ")
    summary = (f"The driver of RLlib job {job.job_id} will not hold its replay buffer: "
               f"{projected}{where}.")
    fix = (f"Lower replay_buffer_config['capacity'] to {fits} env steps (the driver then "
           f"stays under {FITS_SHARE:.0%} of its limit as projected), or raise the driver's "
           f"limit above {gib(max(at, said['limit_bytes']))}."
           if fits is not None and at is not None else
           "Lower replay_buffer_config['capacity'] or raise the group's memory limit: an env "
           "step's bytes were not measured over the look-back (the buffer filled before it); "
           "the capacity that fits is given while it fills.")
    since = float(said["measured_since"])
    return job.finding(kinds.MEMORY_EXHAUSTION, summary, said, fix, since)
