"""What the learner really trains on: samples consumed per insert, and the samples drawn from
the table that it has not taken yet.

The server's `sample_stats.completed` counts samples committed into a request, the client's
prefetch included (rate_limiter.cc: what a prefetching client holds is counted as served),
so the ratio the table reports is not the one the learner trains at. The trainer probe counts
the batches the learner took; with the batch size they are the samples consumed:

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
SAME_CYCLE_S = 0.5  # a probe's reading and the table's of one poll cycle


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
    consumed = rate = unconsumed = None
    # From the probes' readings of the poll cycle the table's window starts at, and only where
    # every probe has one: a probe that started inside the window (a restarted learner)
    # would count short.
    if (took := consumed_since(probes, points[0].observed_at)) is not None:
        consumed = took / inserted if inserted >= MIN_INSERTS else None
        rate = took / span if span > 0 else None
    stranded = lim.stranded_samples(table, [p[-1] for p in probes if p])
    if stranded is not None:
        unconsumed = max(0.0, stranded.drawn - stranded.delivered)
    seconds = unconsumed / rate if unconsumed is not None and rate else None
    return Consumption(table[-1].rate_limiter.samples_per_insert, server, consumed, unconsumed,
                       seconds, span)


def consumed_since(probes: Sequence[Sequence[ProbeSnapshot]], start: float) -> float | None:
    """Samples the table's learners took since the table's snapshot at `start`: from each
    probe's reading of that poll cycle (the nearest, within SAME_CYCLE_S: the probe and the
    server are polled side by side, not at one instant). None unless every probe says its
    batch size and has such a reading (a count from later would be short)."""
    taken = 0.0
    for history in probes:
        points = win.since_last_restart(history)
        if not points or not points[-1].pipeline.batch_size:
            return None
        first = min(range(len(points)), key=lambda i: abs(points[i].observed_at - start))
        if abs(points[first].observed_at - start) > SAME_CYCLE_S:
            return None
        taken += win.increase(points[first:], lambda p: float(p.batches_retrieved)) * float(
            points[-1].pipeline.batch_size)
    return taken if probes else None
