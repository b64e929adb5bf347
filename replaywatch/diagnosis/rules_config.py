"""Configuration that will hang: batch_exceeds_headroom, deadlock_risk.

These judge settings (the limiter from Reverb, the batching layout from the trainer probe),
which one snapshot proves; no stall has to be seen. Each rule is a predicate on the
arithmetic, then its explanation (summary, evidence, fix).
"""

from __future__ import annotations

from replaywatch.diagnosis import actors as act
from replaywatch.diagnosis import kinds
from replaywatch.diagnosis import ratelimiter as lim
from replaywatch.diagnosis.case import Probe, TableCase, limiter_evidence
from replaywatch.diagnosis.ratelimiter import is_insert_blocking_disabled, limiter_slack
from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.model import Finding


def is_batch_exceeds_headroom(case: TableCase, probe: Probe, th: Thresholds) -> Finding | None:
    """The limiter's slack cannot hold one batch: once warm-up credit is spent, batches stall.

    Inserts stop once `cursor + spi > max_diff`, so the cursor may rest up to
    `spi` below max_diff and only `slack - spi` samples are sure to be drawable
    before an insert is needed: a batch needs `slack >= batch_size + spi`.
    """
    t, p = case.latest, probe[-1]
    if p.batch_size is None or is_insert_blocking_disabled(t) or not lim.is_sample_limited(t):
        return None
    if limiter_slack(t) >= p.batch_size + t.rate_limiter.samples_per_insert:
        return None
    return _batch_exceeds_headroom(case, probe, p.batch_size)


def _batch_exceeds_headroom(case: TableCase, probe: Probe, batch: int) -> Finding:
    t, p = case.latest, probe[-1]
    spi, slack = t.rate_limiter.samples_per_insert, limiter_slack(t)
    need = batch + spi
    evidence = {**limiter_evidence(t), "slack": slack, "batch_size": batch,
                "required_slack": need, "probe": p.probe}
    summary = (f"The rate limiter of '{t.name}' allows {slack:g} samples of slack, less than "
               f"a batch of {batch} plus {spi:g} samples per insert.")
    fix = (f"Raise the slack (max_diff - min_diff) to at least {need:g}: error_buffer >= "
           f"{lim.error_buffer_for(need)} for SampleToInsertRatio, or lower batch_size.")
    return case.finding(kinds.BATCH_EXCEEDS_HEADROOM, summary, evidence, fix,
                        since=max(case.history[0].observed_at, probe[0].observed_at))


def is_deadlock_risk(case: TableCase, probe: Probe, th: Thresholds) -> Finding | None:
    """This layout can strand a batch across parallel workers and hang (predicted, not seen).

    Synchronous (insert blocking disabled): the table gains sample credit only
    after a learner step, and Acme calls next() once one batch is sampleable;
    two or more workers can split that batch so none completes: risk when
    `workers > 1`. Blocking: risk when `slack < workers * (batch_size - 1) + spi`
    (see ratelimiter.required_slack) and actor probes show actors that wait on the
    learner: only then does a stranded batch hang (dead-end actors that never wait
    keep inserting and free the samples).
    """
    t, p = case.latest, probe[-1]
    w, b, spi = p.num_parallel_calls, p.batch_size, t.rate_limiter.samples_per_insert
    if w is None or b is None or not lim.is_sample_limited(t):
        return None
    if is_insert_blocking_disabled(t):
        return _deadlock_risk_synchronous(case, probe, w, b) if w > 1 else None
    if limiter_slack(t) >= lim.required_slack(w, b, spi) or not act.known_to_wait(case.actors):
        return None
    return _deadlock_risk_blocking(case, probe, w, b)


def _deadlock_risk_synchronous(case: TableCase, probe: Probe, w: int, b: int) -> Finding:
    t = case.latest
    summary = (f"'{t.name}' uses a synchronous layout (inserts never block) and {w} parallel "
               f"batching workers (up to ~{w * lim.ITERATORS_PER_WORKER_UP_TO} sampling iterators "
               "behind Acme's interleave): they can split the samples of one batch and hang the "
               "loop in next().")
    fix = f"Set num_parallel_calls=1 in make_reverb_dataset (now {w})."
    return _deadlock_risk(case, probe, w, b, summary, fix, {})


def _deadlock_risk_blocking(case: TableCase, probe: Probe, w: int, b: int) -> Finding:
    t = case.latest
    spi = t.rate_limiter.samples_per_insert
    need, slack = lim.required_slack(w, b, spi), limiter_slack(t)
    summary = (f"The slack of '{t.name}' ({slack:g}) is less than {w} workers x "
               f"({b} - 1) + {spi:g} and actors wait on the learner: parallel batching workers "
               "can strand a batch.")
    fix = (f"Raise error_buffer to at least {lim.error_buffer_for(need)} (slack {need:g}) "
           f"or set num_parallel_calls={lim.workers_within(slack, b, spi)}.")
    return _deadlock_risk(case, probe, w, b, summary, fix,
                          {"slack": slack, "required_slack": need})


def _deadlock_risk(case: TableCase, probe: Probe, w: int, b: int, summary: str, fix: str,
                   extra: dict[str, float]) -> Finding:
    # Acme's make_reverb_dataset (before acme dea9307) runs ~3 sampling iterators per
    # requested worker, so up to 3x as many samples can be stranded.
    up_to = w * lim.ITERATORS_PER_WORKER_UP_TO
    evidence = {**limiter_evidence(case.latest), "workers": w, "batch_size": b,
                "strandable_samples": w * (b - 1), "sampling_iterators_up_to": up_to,
                "strandable_samples_up_to": up_to * (b - 1), "probe": probe[-1].probe, **extra}
    return case.finding(kinds.DEADLOCK_RISK, summary, evidence, fix,
                        since=max(case.history[0].observed_at, probe[0].observed_at))
