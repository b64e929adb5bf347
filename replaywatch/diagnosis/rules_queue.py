"""Queue tables (`reverb.Table.queue`): on-policy data every item of which is sampled once.

    drained     an empty queue its learner keeps emptying: the learner is faster than the
                actors, not warming up

The Queue limiter is `SampleToInsertRatio`'s corner: one sample per insert, `min_size` 1,
`min_diff` 0, `max_diff` the queue's size (`ratelimiter.is_queue`). So an empty queue is below
`min_size_to_sample`, which for a replay table is warm-up; for a queue drained by a faster
learner it is the steady state, and `warmup` showed for a whole healthy run. A full queue
whose learner stopped is `insert_blocked`, an empty one whose actors stopped `sample_blocked`,
as for any table: the items the learner's client drew and has not delivered (up to two
batches in flight) are not in the table's size, and sample_blocked counts them when a trainer
probe says how many batches arrived.
"""

from __future__ import annotations

from replaywatch.diagnosis import kinds
from replaywatch.diagnosis import window as win
from replaywatch.diagnosis.case import TableCase, limiter_evidence
from replaywatch.diagnosis.ratelimiter import is_queue
from replaywatch.diagnosis.registry import Rule, Shape
from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.diagnosis.window import inserts_of, samples_of
from replaywatch.model import Finding

# An empty queue at this share of the window's polls is one its learner keeps emptying.
EMPTY_SHARE = 0.5


def is_drained(case: TableCase, th: Thresholds) -> Finding | None:
    """A queue both sides move through, empty at most polls: the learner waits for actors."""
    t = case.latest
    if not is_queue(t):
        return None
    points = win.window(case.history, t.observed_at - th.stall_window_s)
    if win.increase(points, inserts_of) <= 0 or win.increase(points, samples_of) <= 0:
        return None
    empty = sum(1 for s in points if s.current_size == 0)
    if empty < EMPTY_SHARE * len(points):
        return None
    return _drained(case, points, empty)


def _drained(case: TableCase, points: tuple, empty: int) -> Finding:
    t, secs = case.latest, win.span(points)
    inserted, sampled = win.increase(points, inserts_of), win.increase(points, samples_of)
    waited = win.increase(points, lambda s: s.worker_time.ms("waiting_for_inserts"))
    # Reverb's table worker waits for inserts while sample requests are pending: the share of
    # the window the learner's requests waited on the actors.
    share = min(1.0, waited / (1000.0 * secs)) if secs > 0 else None
    capacity = (sampled / secs / (1.0 - share)
                if share is not None and secs > 0 and share < 1.0 else None)
    evidence = {**limiter_evidence(t), "queue_size": t.max_size,
                "empty_polls": empty, "polls": len(points),
                "insert_rate_per_s": inserted / secs if secs else None,
                "sample_rate_per_s": sampled / secs if secs else None,
                "learner_waiting_share": share,
                "learner_could_take_per_s": capacity}
    faster = (f" It waited on the actors {100 * share:.0f}% of the window, so it could "
              f"take about {capacity:.0f} items/s against the {inserted / secs:.0f}/s "
              "inserted." if share and capacity else "")
    summary = (f"Queue '{t.name}' is empty at {empty} of {len(points)} polls while items move "
               "through it: the learner takes them as fast as the actors insert them, so it "
               f"is faster than the actors, not warming up.{faster}")
    fix = ("Nothing is wrong. To train faster, add actors (or speed up their environment "
           "steps): the learner is waiting for data.")
    return case.finding(kinds.DRAINED, summary, evidence, fix, since=points[0].observed_at)


RULES = (
    Rule(kinds.DRAINED, is_drained, Shape.TABLE_STALL),
)
