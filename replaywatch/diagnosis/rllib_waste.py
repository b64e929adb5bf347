"""Experience an RLlib replay buffer evicts before it is ever sampled: wasted_experience,
from the RLlibProbe's buffer counters.

RLlib's buffers keep no count of the env steps they sampled at least once (a Reverb table's
`num_unique_samples`), so the share is estimated, as waste.py explains it for a uniform,
oldest-first table: while the buffer stays full, every env step added evicts one, each lives
`capacity` adds, and the s x capacity draws meanwhile (s = env steps sampled per env step
added) each pick it with chance 1/capacity: it is never drawn with chance e^-s.
RLlib's EpisodeReplayBuffer draws its batches' starts uniformly over every env step it holds
and evicts the oldest episode first; a prioritized buffer draws some steps more than others,
which can only waste more (Jensen), so there the estimate is a floor. `make bench-rllib-waste`
runs real DQN jobs whose buffer counts, for the bench only, the evicted steps never drawn.

RLlib trains at the replay ratio its rounded weights give (rllib_ratio.py), so the fix is the
training_intensity whose weights give the samples per env step that wastes under 40 %
(intensity_for), or, without the configuration in a row, that ratio itself.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from replaywatch.diagnosis import kinds
from replaywatch.diagnosis import rllib_ratio as rr
from replaywatch.diagnosis.rllib_job import RllibJob
from replaywatch.diagnosis.rllib_rates import replay_config
from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.diagnosis.waste import MIN_INSERTS, TARGET_SHARE, WASTED_SHARE, spi_for
from replaywatch.model import Finding
from replaywatch.ray_model import RllibLive

# Full: RLlib evicts whole episodes while it holds more than its capacity, so a full buffer
# holds the capacity less up to one episode.
FULL_SHARE = 0.9


def _prioritized(kind: str | None) -> bool:
    """RLlib's prioritized buffers say so in their class names (PrioritizedEpisodeReplayBuffer,
    MultiAgentPrioritizedEpisodeReplayBuffer); the others sample uniformly."""
    return "Prioritized" in (kind or "")


def _counted(live: RllibLive | None) -> bool:
    return (live is not None and bool(live.capacity) and live.env_steps_stored is not None
            and live.env_steps_added is not None and live.env_steps_sampled is not None)


def buffer_waste(job: RllibJob, th: Thresholds) -> dict[str, Any] | None:
    """The estimate over the newest stretch the buffer stayed full, once it spans the SPI
    window and MIN_INSERTS adds; None before. RLlib's ratio is its weights' (constant once
    learning started), so a stretch shorter than a turnover of a large buffer measures it: a
    million-step buffer turns over in hours, beyond any look-back."""
    full: list[RllibLive] = []
    for s in job.history:
        live = s.live
        if not _counted(live):
            continue
        assert live is not None
        capacity = int(live.capacity or 0)
        same = not full or full[-1].capacity == live.capacity
        growing = not full or (live.env_steps_added or 0) >= (full[-1].env_steps_added or 0)
        if (live.env_steps_stored or 0) >= FULL_SHARE * capacity and same and growing:
            full.append(live)
        else:
            full = []  # not full, another buffer, or a new one: the stretch starts again
    if len(full) < 2:
        return None
    first, last = full[0], full[-1]
    capacity = int(last.capacity or 0)
    added = int(last.env_steps_added or 0) - int(first.env_steps_added or 0)
    sampled = int(last.env_steps_sampled or 0) - int(first.env_steps_sampled or 0)
    if added < MIN_INSERTS or last.observed_at - first.observed_at < th.spi_window_s:
        return None
    spi = sampled / added
    uniform = not _prioritized(last.buffer_kind)
    return {"capacity": capacity, "env_steps_added": added, "env_steps_sampled": sampled,
            "sampled_per_added": round(spi, 4), "never_sampled_share": round(math.exp(-spi), 4),
            "estimated": "e^-s, uniform sampling" if uniform else
            "at least e^-s: a prioritized buffer wastes more than a uniform one",
            "buffer_kind": last.buffer_kind, "over_s": round(last.observed_at
                                                             - first.observed_at, 1),
            "since": first.observed_at, "told_by": "RLlibProbe in the driver"}


def is_buffer_wasted(job: RllibJob, th: Thresholds) -> Finding | None:
    """More than half of what the full buffer evicts was never sampled, by the estimate."""
    said = buffer_waste(job, th)
    if said is None or said["never_sampled_share"] <= WASTED_SHARE:
        return None
    wanted = spi_for(TARGET_SHARE)
    row = job.row()
    config = replay_config(row) if row is not None else None
    fixed = rr.intensity_for(config, wanted) if config is not None else None
    # What RLlib's rounded weights sample at that training_intensity, not what was wanted
    got = (rr.ratio(dataclasses.replace(config, training_intensity=fixed)).trained_per_sampled
           if config is not None and fixed is not None else None)
    said = {**said, "wanted_sampled_per_added": round(wanted, 3),
            "training_intensity": None if row is None else row.training_intensity,
            "training_intensity_fix": None if fixed is None else round(fixed, 6),
            "fix_sampled_per_added": None if got is None else round(got, 4)}
    floor = "at least " if _prioritized(said["buffer_kind"]) else ""
    summary = (f"RLlib job {job.job_id}'s replay buffer ({said['buffer_kind']}, "
               f"{said['capacity']:,} env steps, full) evicts {floor}"
               f"{said['never_sampled_share']:.0%} of its env steps never sampled: "
               f"{said['sampled_per_added']:.3g} env steps sampled per env step added over "
               f"the last {said['env_steps_added']:,} added, and a step that lives "
               f"{said['capacity']:,} adds is never drawn with chance e^-s (RLlib counts no "
               "step's draws: an estimate).")
    if fixed is not None and got is not None:
        fix = (f"Set training_intensity to {fixed:.6g}: RLlib's rounded weights then sample "
               f"{got:.3g} env steps per env step added, which leaves about "
               f"{math.exp(-got):.0%} never sampled; a larger capacity does not change the "
               "share.")
    else:
        fix = (f"Sample at least {wanted:.2f} env steps per env step added (training_intensity; "
               "`replaywatch predict --rllib` gives the value RLlib's rounding needs for this "
               "configuration), or add fewer; a larger capacity does not change the share.")
    return job.finding(kinds.WASTED_EXPERIENCE, summary, said, fix, float(said["since"]))
