"""A rate against its own past: the robust baseline throughput_drop judges by.

A job's rates are not normally distributed (evaluation pauses, checkpoints, bursts), so the
baseline is the median of the rates between consecutive coarse snapshots (~10 s each) over
the look-back, and its spread the median absolute deviation, as robust Prometheus anomaly
rules do (median +- 2 MAD), with a minimum band of +-50 % of the median so a steady job is
not flagged for noise. Buckets in which nothing moved are left out of the baseline: a pause
or a stall is the stall rules' business, not a slower rate.

A drop is judged on the span just before `now`, which the baseline never includes:

    below half the baseline (or the band's low edge, if wider) for `drop_for_s`
    below a fifth of it for `drop_for_s / 5`

"below" for a span: the median of its moving buckets under the line (at least half of
the time it moved, it moved that slowly) and its overall rate under it too, and something
moved in it (a full stop is a stall). The median, not "nearly every bucket": a rate that fell
to 0.48 of its baseline has about half its noisy buckets above the half line, and asking four
in five below never named it (make bench-long: a 2x drop unnamed for 11 minutes). Buckets
where nothing moved are left out of the median, so an evaluation pause is not a drop. Pure:
time is an argument.

An open drop keeps the baseline it opened with (`held`, the keeper's memory of the open
finding): judged against the look-back alone, a drop that outlasts half of it becomes its own
median and is forgotten, and a job ten times slower all night would be named for 15 minutes.
It stays named while the rate stays under the held line raised by `HOLD_MARGIN` (a drop to
just under half whose noise crosses the line would otherwise open and resolve by turns), and
resolves once a span shows it above that. A restart of the server or the actor starts the
series, and its baseline, anew.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")

MIN_BAND = 0.5  # the band's half-width is at least this share of the median
MAD_BAND = 3.0  # else this many scaled MADs (1.4826 MAD is a standard deviation if normal)
SEVERE = 0.2  # below a fifth of the baseline ...
SEVERE_SPAN = 0.2  # ... for a fifth of drop_for_s
HOLD_MARGIN = 1.2  # an open drop resolves once its span is this far above the line


@dataclasses.dataclass(frozen=True)
class Bucket:
    """The rate between two coarse snapshots, stamped at the later one."""

    start: float
    end: float
    rate: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclasses.dataclass(frozen=True)
class Baseline:
    median: float
    mad: float
    seconds: float  # of moving buckets behind it
    low: float  # the band's low edge

    @classmethod
    def of(cls, buckets: Sequence[Bucket]) -> Baseline:
        rates = [b.rate for b in buckets]
        median = statistics.median(rates)
        mad = statistics.median(abs(r - median) for r in rates)
        low = median - max(MIN_BAND * median, MAD_BAND * 1.4826 * mad)
        return cls(median, mad, sum(b.seconds for b in buckets), max(low, 0.0))


@dataclasses.dataclass(frozen=True)
class Drop:
    """A series below its baseline for long enough."""

    baseline: Baseline
    rate: float  # over the span judged
    span_s: float
    line: float  # the rate it stayed under
    severe: bool  # below a fifth

    @property
    def ratio(self) -> float:
        return self.rate / self.baseline.median if self.baseline.median else 0.0


def buckets(points: Sequence[T], at: Callable[[T], float], value: Callable[[T], float]
            ) -> list[Bucket]:
    """Rates between consecutive points of one counter (no resets inside: callers cut there)."""
    out = []
    for a, b in zip(points, points[1:]):
        dt = at(b) - at(a)
        if dt > 0 and value(b) >= value(a):
            out.append(Bucket(at(a), at(b), (value(b) - value(a)) / dt))
    return out


def merged(buckets: Sequence[Bucket], min_span_s: float) -> list[Bucket]:
    """Consecutive buckets joined until each spans at least `min_span_s`: a job whose
    inserts come in bursts every 40 s has a burst in one 10 s bucket of four, so its moving
    buckets read four times its rate and the rate of any span judged looks a quarter of
    it. Joined over the job's rhythm (two of its longest normal gaps), each bucket holds
    whole cycles. A trailing remainder shorter than the span is kept as it is."""
    if min_span_s <= 0 or not buckets:
        return list(buckets)
    out: list[Bucket] = []
    start, moved = buckets[0].start, 0.0
    for b in buckets:
        moved += b.rate * b.seconds
        if b.end - start >= min_span_s:
            out.append(Bucket(start, b.end, moved / (b.end - start)))
            start, moved = b.end, 0.0
    if start < buckets[-1].end:
        out.append(Bucket(start, buckets[-1].end, moved / (buckets[-1].end - start)))
    return out


def judge(series: Sequence[Bucket], now: float, drop_for_s: float, lookback_s: float,
          min_baseline_s: float, held: Baseline | None = None) -> Drop | None:
    """The deeper of the two drops `series` shows at `now`, if any; against `held`, the
    baseline of a drop already open, when there is one."""
    for severe, span in ((True, SEVERE_SPAN * drop_for_s), (False, drop_for_s)):
        base = held if held is not None else current(series, now, span, lookback_s,
                                                      min_baseline_s)
        found = _below(series, now, span, base, severe, HOLD_MARGIN if held else 1.0)
        if found is not None:
            return found
    return None


def current(series: Sequence[Bucket], now: float, drop_for_s: float, lookback_s: float,
            min_baseline_s: float) -> Baseline | None:
    """The baseline a `drop_for_s` span ending now is judged against (the dashboard's band);
    None until `min_baseline_s` of moving buckets precede that span."""
    cut = now - drop_for_s
    past = [b for b in series if b.end <= cut and b.start >= cut - lookback_s and b.rate > 0]
    if not past:
        return None
    base = Baseline.of(past)
    return base if base.seconds >= min_baseline_s and base.median > 0 else None


def _below(series: Sequence[Bucket], now: float, span: float, base: Baseline | None,
           severe: bool, margin: float) -> Drop | None:
    cut = now - span
    recent = [b for b in series if b.end > cut]
    if not recent or recent[0].start > cut + _longest(recent):
        return None  # the span is not covered yet
    if base is None:
        return None
    line = (SEVERE * base.median if severe else base.low) * margin
    seconds = sum(b.seconds for b in recent)
    rate = sum(b.rate * b.seconds for b in recent) / seconds
    moving = [b.rate for b in recent if b.rate > 0]
    if rate <= 0 or rate >= line or statistics.median(moving) >= line:
        return None
    return Drop(base, rate, seconds, line, severe)


def _longest(buckets: Sequence[Bucket]) -> float:
    return max(b.seconds for b in buckets)
