"""Rates read off a window of polls, and the immutable view the rules judge.

Reverb's counters are cumulative and restart from zero when the server
restarts, so every rate here treats a decrease as a reset (as Prometheus's
`rate()` does): the increase across a reset is the new value itself, never a
negative number. Time always comes from the snapshots, never from a clock.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence

from replaywatch.model import ProbeSnapshot, TableSnapshot


@dataclasses.dataclass(frozen=True)
class PollRecord:
    """The bare fact of one poll: when, whether it worked, and why not."""

    at: float
    ok: bool
    duration_s: float
    error: str | None = None


@dataclasses.dataclass(frozen=True)
class TargetView:
    """An immutable slice of one Reverb target's history for the diagnosis."""

    target: str
    polls: tuple[PollRecord, ...]
    tables: dict[str, tuple[TableSnapshot, ...]]
    probes: dict[str, tuple[ProbeSnapshot, ...]]
    probe_polls: dict[str, tuple[PollRecord, ...]]


def counter_increase(points: Sequence[tuple[float, float]]) -> float:
    """Sum of increases of a cumulative counter; a drop counts as a reset."""
    total = 0.0
    for (_, prev), (_, cur) in zip(points, points[1:]):
        total += cur - prev if cur >= prev else cur
    return total


def rate(points: Sequence[tuple[float, float]]) -> float | None:
    """Per-second increase over the points' time span; None below two points."""
    if len(points) < 2:
        return None
    span = points[-1][0] - points[0][0]
    if span <= 0:
        return None
    return counter_increase(points) / span


def series(
    snapshots: Iterable[TableSnapshot], value: Callable[[TableSnapshot], float]
) -> list[tuple[float, float]]:
    return [(s.observed_at, float(value(s))) for s in snapshots]


def since(snapshots: Sequence[TableSnapshot], start: float) -> list[TableSnapshot]:
    """The snapshots taken at or after `start` (the input is time-ordered)."""
    return [s for s in snapshots if s.observed_at >= start]


def inserts_of(s: TableSnapshot) -> float:
    return s.rate_limiter.inserts


def samples_of(s: TableSnapshot) -> float:
    return s.rate_limiter.samples


def insert_rate(snapshots: Sequence[TableSnapshot]) -> float | None:
    """Items inserted per second over the given snapshots."""
    return rate(series(snapshots, inserts_of))


def sample_rate(snapshots: Sequence[TableSnapshot]) -> float | None:
    """Items sampled per second over the given snapshots."""
    return rate(series(snapshots, samples_of))


def observed_samples_per_insert(snapshots: Sequence[TableSnapshot]) -> float | None:
    """Samples drawn per item inserted over the window; None without inserts."""
    if len(snapshots) < 2:
        return None
    inserted = counter_increase(series(snapshots, inserts_of))
    if inserted <= 0:
        return None
    return counter_increase(series(snapshots, samples_of)) / inserted


def waiting_growth(snapshots: Sequence[TableSnapshot], state: str) -> float | None:
    """Milliseconds per second the table worker spent in `state` (e.g.
    `waiting_for_inserts`) over the window. Healthy runs wait too, so this
    says which side waits, never whether the job is stalled."""
    return rate(series(snapshots, lambda s: s.worker_time.ms(state)))


def last_reset_index(snapshots: Sequence[TableSnapshot]) -> int:
    """Index of the first snapshot after the newest counter reset (0 if none)."""
    start = 0
    for i in range(1, len(snapshots)):
        prev, cur = snapshots[i - 1].rate_limiter, snapshots[i].rate_limiter
        if cur.inserts < prev.inserts or cur.samples < prev.samples:
            start = i
    return start
