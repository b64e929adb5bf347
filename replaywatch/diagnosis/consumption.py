"""What the learner really trains on: samples consumed per insert, and the samples drawn from
the table that it has not taken yet.

The server's `sample_stats.completed` counts samples committed into a request, the client's
prefetch included (rate_limiter.cc; reverb#27: 64 counted for 2 consumed), so the ratio the
table reports is not the one the learner trains at. The trainer probe counts the batches the
learner took; with the batch size they are the samples consumed:

    consumed per insert   = sum over the table's probes of d(batches) x batch_size / d(inserts)
    server per insert     = d(samples) / d(inserts)                     (the same window)
    drawn, not consumed   = samples drawn since the first iterator started
                            - batches x batch_size                      (ratelimiter.py's
                                                                          stranded arithmetic,
                                                                          prefetch included)
    in seconds            = drawn, not consumed / consumed samples a second

Once sampling stops the last is exact: every sample drawn is either delivered or still in the
pipeline. Pure: the snapshots and the clock are the only inputs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from replaywatch.diagnosis import ratelimiter as lim
from replaywatch.diagnosis import window as win
from replaywatch.model import ProbeSnapshot, TableSnapshot

MIN_INSERTS = 1  # a window with no insert has no ratio


@dataclasses.dataclass(frozen=True)
class Consumption:
    """One table's ratios over `window_s`, and what is drawn and waiting for the learner."""

    configured_per_insert: float
    server_per_insert: float | None  # samples the server counted per insert
    consumed_per_insert: float | None  # samples the learner took per insert
    unconsumed_samples: float | None  # drawn from the table, not yet taken by the learner
    unconsumed_s: float | None  # that, in seconds of the learner's consumption
    window_s: float


def consumption(table: Sequence[TableSnapshot], probes: Sequence[Sequence[ProbeSnapshot]],
                now: float, window_s: float) -> Consumption | None:
    """The table's ratios over the newest `window_s`; what needs a probe is None without
    one (or without its batch size)."""
    if not table:
        return None
    points = win.window(table, now - window_s)
    inserted = win.increase(points, lambda s: float(s.rate_limiter.inserts))
    sampled = win.increase(points, lambda s: float(s.rate_limiter.samples))
    span = win.span(points)
    server = sampled / inserted if inserted >= MIN_INSERTS else None
    latest = [p[-1] for p in probes if p]
    sized = bool(latest) and all(p.batch_size for p in latest)
    consumed = rate = unconsumed = None
    if sized:
        took = sum(_taken(p, now - window_s) for p in probes if p)
        consumed = took / inserted if inserted >= MIN_INSERTS else None
        rate = took / span if span > 0 else None
        stranded = lim.stranded_samples(table, latest)
        unconsumed = None if stranded is None else max(0.0, stranded.drawn - stranded.delivered)
    seconds = unconsumed / rate if unconsumed is not None and rate else None
    return Consumption(table[-1].rate_limiter.samples_per_insert, server, consumed, unconsumed,
                       seconds, span)


def consumed_since(probes: Sequence[Sequence[ProbeSnapshot]], start: float) -> float | None:
    """Samples the table's learners took since `start`; None unless every probe says its batch
    size and its history reaches back to `start` (a count from later would be short)."""
    if not probes or not all(p and p[-1].batch_size and p[0].observed_at <= start
                             for p in probes):
        return None
    return sum(_taken(p, start) for p in probes)


def _taken(history: Sequence[ProbeSnapshot], start: float) -> float:
    """Samples one probe's learner took since `start` (its batches, counter resets read as
    restarts)."""
    points = win.window(win.since_last_restart(history), start)
    return win.increase(points, lambda p: float(p.batches_retrieved)) * float(
        points[-1].batch_size or 0) if points else 0.0
