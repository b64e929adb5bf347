"""Progress over a window: when a counter last moved, and what the window covers.

A stall is judged by progress, never by waiting time: a healthy synchronous
loop keeps Reverb's table worker `waiting_for_inserts` ~98% of the time and
parks the cursor at `min_diff` between inserts. So "stalled" here means a
counter has not moved across the whole window, proven by snapshots at both ends.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from replaywatch.diagnosis.rates import counter_increase, last_reset_index
from replaywatch.model import ProbeSnapshot, TableSnapshot

T = TypeVar("T", TableSnapshot, ProbeSnapshot)


def since_last_reset(snapshots: Sequence[TableSnapshot]) -> tuple[TableSnapshot, ...]:
    """The snapshots after the newest counter reset (a Reverb restart zeroes them)."""
    return tuple(snapshots[last_reset_index(snapshots):])


def since_last_restart(snapshots: Sequence[ProbeSnapshot]) -> tuple[ProbeSnapshot, ...]:
    """The probe's snapshots since the trainer last (re)started: new pid, or counters dropped."""
    start = 0
    for i in range(1, len(snapshots)):
        a, b = snapshots[i - 1], snapshots[i]
        if (
            b.pid != a.pid
            or b.started_at != a.started_at
            or b.batches_retrieved < a.batches_retrieved
            or b.learner_steps < a.learner_steps
        ):
            start = i
    return tuple(snapshots[start:])


def idle_since(points: Sequence[T], *values: Callable[[T], float]) -> float:
    """When the newest value of every counter was first seen: the onset of "no progress".

    Progress happened somewhere between the previous poll and this one; the
    first poll that saw the final value is the latest time we can prove it.
    """
    onset = points[0].observed_at
    for value in values:
        final = value(points[-1])
        first_seen = points[-1].observed_at
        for p in reversed(points):
            if value(p) != final:
                break
            first_seen = p.observed_at
        onset = max(onset, first_seen)
    return onset


def idle_for(points: Sequence[T], *values: Callable[[T], float]) -> float:
    """Seconds, between the onset and the newest snapshot, that no counter moved."""
    return points[-1].observed_at - idle_since(points, *values)


def window(points: Sequence[T], start: float) -> tuple[T, ...]:
    """The snapshots from the last one at or before `start` to the newest.

    Starting one point early lets a counter's increase be measured over the
    whole window rather than from its first poll inside it.
    """
    first = 0
    for i, p in enumerate(points):
        if p.observed_at <= start:
            first = i
    return tuple(points[first:])


def covers(points: Sequence[T], start: float) -> bool:
    """Whether the history reaches back to `start`, so a window claim is proven."""
    return bool(points) and points[0].observed_at <= start


def increase(points: Sequence[T], value: Callable[[T], float]) -> float:
    """Reset-aware increase of a cumulative counter over the points."""
    return counter_increase([(p.observed_at, float(value(p))) for p in points])


def span(points: Sequence[T]) -> float:
    """Seconds between the first and the newest snapshot."""
    return points[-1].observed_at - points[0].observed_at if points else 0.0
