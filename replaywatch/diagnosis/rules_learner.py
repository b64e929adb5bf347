"""Stalls that need the trainer probe: worker_starvation, learner_stalled.

The probe says what Reverb cannot: whether the learner waits in the iterator's next(), how
many batches it received and steps it took, and its batching layout. Each rule is a predicate
in Reverb's and Acme's words, then its explanation (summary, evidence, fix).
"""

from __future__ import annotations

from replaywatch.diagnosis import kinds
from replaywatch.diagnosis import ratelimiter as lim
from replaywatch.diagnosis import window as win
from replaywatch.diagnosis.case import Probe, TableCase, limiter_evidence, worker_waited
from replaywatch.diagnosis.ratelimiter import (
    Stranded,
    can_sample,
    is_insert_blocking_disabled,
    limiter_slack,
    sample_headroom,
)
from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.diagnosis.window import samples_of
from replaywatch.model import Finding


def is_worker_starvation(case: TableCase, probe: Probe, th: Thresholds) -> Finding | None:
    """Parallel batching workers each hold part of a batch; none completes, next() blocks.

    Holds when next() has blocked for the stall window, the table has drawn no
    sample for as long, the limiter allows no more (`sample_headroom < 1`, or
    the table worker keeps waiting for inserts), and the stranded samples
    (drawn - batches * batch_size - prefetched) reach one batch.
    """
    t, p = case.latest, probe[-1]
    idle = win.idle_for(case.history, samples_of)
    if not p.blocked_in_next or p.blocked_for_s < th.stall_window_s or idle < th.stall_window_s:
        return None
    if sample_headroom(t) >= 1 and not worker_waited(case, "waiting_for_inserts", th):
        return None
    stranded = lim.stranded_samples(case.history, [h[-1] for h in case.probes])
    if stranded is None or p.batch_size is None or stranded.samples < p.batch_size:
        return None
    return _worker_starvation(case, probe, stranded, idle)


def _worker_starvation(case: TableCase, probe: Probe, stranded: Stranded,
                       idle: float) -> Finding:
    t, p = case.latest, probe[-1]
    workers, batch, spi = p.num_parallel_calls, p.batch_size, t.rate_limiter.samples_per_insert
    evidence = {**limiter_evidence(t), "stranded_samples": stranded.samples,
                "drawn": stranded.drawn, "delivered": stranded.delivered,
                "prefetched": stranded.held, "stranded_basis": stranded.basis,
                "workers": workers, "batch_size": batch, "sample_headroom": sample_headroom(t),
                "blocked_for_s": p.blocked_for_s, "probe": p.probe}
    summary = (f"The learner '{p.name}' is blocked in next() while {workers or 'several'} "
               f"batching workers hold samples from '{t.name}' that no batch of {batch} "
               "completes: parallel batching workers starve one another.")
    if is_insert_blocking_disabled(t) or workers is None or batch is None:
        fix = (f"Set num_parallel_calls=1 in make_reverb_dataset (now {workers}): in a "
               "synchronous loop the table only gains sample credit after a learner step.")
    else:
        need = lim.required_slack(workers, batch, spi)
        fix = (f"Give the limiter at least {need:g} slack (max_diff - min_diff, now "
               f"{limiter_slack(t):g}; error_buffer >= {lim.error_buffer_for(need)}), or set "
               f"num_parallel_calls={lim.workers_within(limiter_slack(t), batch, spi)}.")
    return case.finding(kinds.WORKER_STARVATION, summary, evidence, fix,
                        since=t.observed_at - idle)


def is_learner_stalled(case: TableCase, probe: Probe, th: Thresholds) -> Finding | None:
    """The iterator has data but the learner takes no batch and no step: its update hangs.

    Has data: the iterator says `ready()`, or the table `can_sample` a batch.
    The learner is not in next(), so it is stuck elsewhere (a pmap deadlock).
    """
    t, p = case.latest, probe[-1]
    idle = win.idle_for(probe, lambda s: s.batches_retrieved, lambda s: s.learner_steps)
    has_data = p.ready is True or can_sample(t, p.batch_size or 1)
    if p.blocked_in_next or idle < th.stall_window_s or not has_data:
        return None
    return _learner_stalled(case, probe, idle)


def _learner_stalled(case: TableCase, probe: Probe, idle: float) -> Finding:
    t, p = case.latest, probe[-1]
    evidence = {"seconds_without_batch_or_step": idle, "batches_retrieved": p.batches_retrieved,
                "learner_steps": p.learner_steps, "ready": p.ready,
                "table_can_sample_batch": can_sample(t, p.batch_size or 1),
                "batch_size": p.batch_size, "sample_headroom": sample_headroom(t),
                "probe": p.probe}
    summary = (f"The learner '{p.name}' has taken no batch and no step while its iterator on "
               f"'{t.name}' has data: its update step is hung.")
    fix = (f"Read the learner's stacks (GET {p.probe}/stacks, kept with this incident) to see "
           "where it waits: a pmap or collective deadlock, a stuck device transfer, a lock.")
    return case.finding(kinds.LEARNER_STALLED, summary, evidence, fix,
                        since=p.observed_at - idle)
