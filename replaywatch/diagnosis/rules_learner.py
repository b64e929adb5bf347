"""Stalls that need the trainer probe: learner_stalled (worker_starvation: rules_actors).

The probe says what Reverb cannot: whether the learner waits in the iterator's next(), how
many batches it received and steps it took, and its batching layout. Each rule is a predicate
in Reverb's and Acme's words, then its explanation (summary, evidence, fix).
"""

from __future__ import annotations

from replaywatch.diagnosis import kinds
from replaywatch.diagnosis import window as win
from replaywatch.diagnosis.case import Probe, TableCase
from replaywatch.diagnosis.ratelimiter import can_sample, sample_headroom
from replaywatch.diagnosis.registry import Rule, Shape
from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.model import Finding


def is_learner_stalled(case: TableCase, probe: Probe, th: Thresholds) -> Finding | None:
    """The iterator has data but the learner takes no batch and no step: its update hangs.

    Has data: the iterator says `ready()`, or the table `can_sample` a batch.
    The learner is not in next(), so it is stuck elsewhere (a pmap deadlock).
    """
    t, p = case.latest, probe[-1]
    idle = win.idle_for(probe, lambda s: s.batches_retrieved, lambda s: s.learner_steps)
    has_data = p.ready is True or can_sample(t, p.pipeline.batch_size or 1)
    if p.blocked_in_next or idle < th.stall_window_s or not has_data:
        return None
    return _learner_stalled(case, probe, idle)


def _learner_stalled(case: TableCase, probe: Probe, idle: float) -> Finding:
    t, p = case.latest, probe[-1]
    evidence = {"seconds_without_batch_or_step": idle, "batches_retrieved": p.batches_retrieved,
                "learner_steps": p.learner_steps, "ready": p.ready,
                "table_can_sample_batch": can_sample(t, p.pipeline.batch_size or 1),
                "batch_size": p.pipeline.batch_size, "sample_headroom": sample_headroom(t),
                "probe": p.probe}
    summary = (f"The learner '{p.name}' has taken no batch and no step while its iterator on "
               f"'{t.name}' has data: its update step is hung.")
    fix = (f"Read the learner's stacks (GET {p.probe}/stacks, kept with this incident) to see "
           "where it waits: a pmap or collective deadlock, a stuck device transfer, a lock.")
    return case.finding(kinds.LEARNER_STALLED, summary, evidence, fix,
                        since=p.observed_at - idle)


RULES = (
    Rule(kinds.LEARNER_STALLED, is_learner_stalled, Shape.PROBE_STALL),
)
