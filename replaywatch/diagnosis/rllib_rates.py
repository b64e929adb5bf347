"""An RLlib job's rates against each other: env steps dropped beside those sampled, and the
replay ratio it trains at against the one its configuration asks (rllib_ratio.py).

Both are counted from the counters' rises over the look-back, independent of RLlib's own
figures; the result rows add what only they say (the learner group's and the aggregators'
dropped steps, the configuration). Each counter is read up to one report interval late
(rllib_progress.REPORT_S), and two counters of two processes need not be read together, so
a ratio of two is allowed that much error on top of the tolerance.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from replaywatch.diagnosis import kinds
from replaywatch.diagnosis import rllib_job as rj
from replaywatch.diagnosis import rllib_progress as rp
from replaywatch.diagnosis import rllib_ratio as rr
from replaywatch.diagnosis.rllib_job import RllibJob
from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.model import Finding, Severity
from replaywatch.ray_model import ResultRow

# (RllibCounters field, the series it reads)
DROP_COUNTERS = (
    ("circular_buffer_dropped", "ray_rllib_utils_circular_buffer_put_ts_dropped_counter"),
    ("env_steps_dropped", "ray_rllib_algorithms_impala_training_step_env_steps_dropped_counter"),
)
# (ResultRow field, the row's key)
DROP_ROWS = (
    ("learner_group_ts_dropped_lifetime", "learner_group/learner_group_ts_dropped_lifetime"),
    ("aggregator_env_steps_dropped_lifetime",
     "aggregator_actors/num_env_steps_dropped_lifetime"),
)


# -- env_steps_dropped -------------------------------------------------------------------------

def is_env_steps_dropped(job: RllibJob, th: Thresholds) -> Finding | None:
    """Sampled env steps were dropped before a learner took them: sampling outruns learning
    (a stalled learner, or a learner slower than its EnvRunners)."""
    rises: list[tuple[str, float, float]] = []  # (series, how many, first seen rising)
    for field, name in DROP_COUNTERS:
        p = rp.progress(job.history, rp.counter_reader(field), name, th)
        if p is not None and p.gained > 0 and p.first_moved_at is not None:
            rises.append((name, p.gained, p.first_moved_at))
    for field, name in DROP_ROWS:
        rise = _row_rise(job, field)
        if rise is not None:
            rises.append((name, *rise))
    if not rises:
        return None
    # The series count at different stages (the driver's hand-off, the learner's circular
    # buffer, which may drop a batch it already trained on) and can count one step twice: a
    # slow APPO learner's two summed to 107 % of what was sampled. The largest is the share
    # known lost; the others are in the evidence.
    dropped = max(n for _, n, _ in rises)
    span = job.latest.observed_at - job.history[0].observed_at
    # The share is of what was sampled since the drops began (a report interval before the
    # first rise seen), or over the last ratio window where they began within it: a healthy
    # phase the look-back still holds (several of a slow job's iterations) would dilute the
    # share that is lost now.
    began = min(at for _, _, at in rises) - rp.REPORT_S
    judged_from = max(job.history[0].observed_at,
                      min(began, job.latest.observed_at - th.spi_window_s))
    judged_s = job.latest.observed_at - judged_from
    sampled = _rise_since(job.sampled, judged_from) if job.sampled is not None else None
    evidence: dict[str, Any] = {
        "dropped": dropped, "by_series": {name: n for name, n, _ in rises},
        "look_back_s": round(span, 1),
        "dropped_per_s": round(dropped / span, 2) if span > 0 else None,
        "judged_over_s": round(judged_s, 1),
        "env_steps_sampled": sampled,
        "share_of_sampled": round(dropped / sampled, 4) if sampled else None}
    share = f", {dropped / sampled:.0%} of the {sampled:.0f} sampled" if sampled else ""
    summary = (f"RLlib job {job.job_id} dropped {dropped:.0f} sampled env steps in the last "
               f"{judged_s:.0f} s{share}: the learner takes less than is sampled.")
    fix = ("If learner_stalled is open for this job, that is the cause. Otherwise the learner "
           "is slower than the EnvRunners: fewer EnvRunners or more learners (num_learners).")
    evidence["page_share"] = th.dropped_share
    f = job.finding(kinds.ENV_STEPS_DROPPED, summary, evidence, fix,
                    since=min(at for _, _, at in rises))
    if not sampled or span < th.spi_window_s:
        # A share is judged over a ratio's window, like spi_drift: a start-up's first seconds
        # (a few dozen steps, half of them dropped) prove nothing.
        return dataclasses.replace(
            f, severity=Severity.INFO,
            summary=f"{summary[:-1]}; the share is judged over {th.spi_window_s:g} s of "
                    "steps sampled, not yet seen.",
            fix=f"Wait for the share. {fix}")
    if dropped / sampled < th.dropped_share:
        # What an asynchronous learner's buffer overwrites by design: said, not paged.
        return dataclasses.replace(
            f, severity=Severity.INFO,
            summary=f"{summary[:-1]}, below the {th.dropped_share:.0%} that pages.",
            fix=f"Nothing, at this share. {fix}")
    return f


def _rise_since(p: rp.Progress, since: float) -> float:
    """How much a counter rose over the polls after `since`."""
    before = [total for at, total in p.points if at <= since]
    return p.gained - (before[-1] if before else 0.0)


def _row_rise(job: RllibJob, field: str) -> tuple[float, float] | None:
    """(how much a lifetime count of the newest rows rose, when first seen rising)."""
    points = [(s.observed_at, v) for s in job.history if s.results
              and (v := getattr(s.results[-1], field)) is not None]
    if len(points) < 2 or points[-1][1] <= points[0][1]:
        return None
    first = next(at for at, v in points if v > points[0][1])
    return points[-1][1] - points[0][1], first


# -- spi_drift: the replay ratio ---------------------------------------------------------------

def is_ratio_off(job: RllibJob, th: Thresholds) -> Finding | None:
    """The job trains more or fewer env steps per sampled env step than its
    `training_intensity` asks, past warm-up, by more than rllib_ratio's tolerance (RLlib
    rounds its store and train rounds to whole numbers, and counts one sampler more)."""
    row = job.row()
    if row is None or row.training_intensity is None or rj.warming_up(job) is not None:
        return None
    measured = _measured(job, th)
    if measured is None:
        return None
    trained, sampled, span = measured
    asked = row.training_intensity
    observed = trained / sampled
    allowance = late_reads_allow(trained, sampled, asked, span)
    if abs(observed / asked - 1) <= rr.TOLERANCE or abs(trained - asked * sampled) <= allowance:
        return None
    config = replay_config(row)
    predicted = None if config is None else rr.ratio(config)
    evidence: dict[str, Any] = {
        "observed_trained_per_sampled": round(observed, 4), "training_intensity": asked,
        "env_steps_trained": trained, "env_steps_sampled": sampled, "over_s": round(span, 1),
        "allowed_error_steps": round(allowance, 1), "tolerance_rate": rr.TOLERANCE,
        "predicted": None if predicted is None else {
            "trained_per_sampled": predicted.trained_per_sampled,
            "store_rounds": predicted.store_rounds, "train_rounds": predicted.train_rounds},
        "config": None if config is None else _config_doc(config)}
    summary = (f"RLlib job {job.job_id} trains {observed:.3g} env steps per env step sampled, "
               f"not the {asked:g} its training_intensity asks"
               + ("" if predicted is None else
                  f" (RLlib's rounding predicts {predicted.trained_per_sampled:.3g})") + ".")
    return job.finding(kinds.SPI_DRIFT, summary, evidence, _ratio_fix(config, asked),
                       since=job.now - span)


def late_reads_allow(trained: float, sampled: float, ratio: float, span_s: float) -> float:
    """How far `trained` may stand from `ratio` x `sampled`, in env steps, with each counter
    read up to one report interval late (rllib_progress.REPORT_S): a report's worth of each
    counter's rate over `span_s`."""
    return (trained + ratio * sampled) / span_s * rp.REPORT_S


def _measured(job: RllibJob, th: Thresholds) -> tuple[float, float, float] | None:
    """(trained, sampled, seconds) over the look-back past warm-up: from the first rise of
    the trained counter in view, so that no step sampled before learning began counts (the
    first rise costs a report interval of a job that trained before the look-back; a total
    that stood above 0 may be a dead worker's series, which says nothing of warm-up)."""
    tr, sa = job.trained, job.sampled
    if tr is None or sa is None or not tr.current or not sa.current:
        return None
    start = tr.first_moved_at
    if start is None:
        return None
    tp, sp = dict(tr.points), dict(sa.points)
    common = sorted(t for t in tp if t in sp and t >= start)
    if len(common) < 2:
        return None
    t0, t1 = common[0], common[-1]
    trained, sampled = tp[t1] - tp[t0], sp[t1] - sp[t0]
    if t1 - t0 < th.spi_window_s or sampled < th.spi_min_inserts:
        return None
    return trained, sampled, t1 - t0


def replay_config(row: ResultRow) -> rr.RllibReplay | None:
    """The configuration rllib_ratio reads, where the row says all of it; None where it
    does not (`rollout_fragment_length` "auto" is DQN's n_step: a range of n_step leaves
    the fragment unknown)."""
    if row.train_batch_size_per_learner is not None:
        if row.num_learners is None:
            return None
        batch: int | None = row.train_batch_size_per_learner * max(row.num_learners, 1)
    else:
        batch = row.train_batch_size
    auto = row.rollout_fragment_length is None and row.rollout_fragment_length_auto
    if (batch is None or row.num_env_runners is None or row.num_envs_per_env_runner is None
            or (row.rollout_fragment_length is None and not (auto and row.n_step))):
        return None
    return rr.RllibReplay(train_batch_size=batch, num_env_runners=row.num_env_runners,
                          num_envs_per_env_runner=row.num_envs_per_env_runner,
                          rollout_fragment_length=row.rollout_fragment_length,
                          n_step=row.n_step or 1, training_intensity=row.training_intensity)


def _config_doc(r: rr.RllibReplay) -> dict[str, Any]:
    return {"train_batch_size": r.train_batch_size, "num_env_runners": r.num_env_runners,
            "num_envs_per_env_runner": r.num_envs_per_env_runner,
            "rollout_fragment_length": r.rollout_fragment_length}


def _ratio_fix(config: rr.RllibReplay | None, asked: float) -> str:
    if config is None:
        return ("`replaywatch predict --rllib` with the job's settings (its n_step where "
                "rollout_fragment_length is auto) gives the training_intensity that trains at "
                f"{asked:g}.")
    fixed = rr.intensity_for(config, asked)
    if fixed is None:
        return (f"No training_intensity trains at {asked:g} in whole rounds with this "
                "configuration: change train_batch_size or rollout_fragment_length.")
    return (f"Set training_intensity to {fixed:.6g}: RLlib's rounded weights then train at "
            f"{asked:g} (`replaywatch predict --rllib` shows the arithmetic).")
