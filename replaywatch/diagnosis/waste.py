"""Experience evicted before it was ever sampled: how much, and what would change it.

Read from ServerInfo: over a stretch where the table stays full, every insert evicts one item
(its Fifo remover, the oldest), and `num_unique_samples` grows by the items sampled for the
first time. In steady state the items inserted and never sampled are the items evicted never
sampled, so their share is 1 - (unique samples / inserts) over the stretch.

What sets it, for a table sampled uniformly and evicted oldest first (bench/waste.py checks
it on real tables; bench/RESULTS.md has the runs):

  * the samples per insert, s. An item lives `max_size` inserts, and the s x max_size samples
    drawn meanwhile each pick it with chance 1/max_size: it is never picked with chance
    (1 - 1/max_size)^(s max_size) ~ e^-s, whatever max_size is. A larger table does not help;
    more samples per insert do.
  * bursts. When the inserts come B at a time between the learner's samples (a collect loop
    that collects B steps per train step, actors inserting while the learner pauses) and B
    is over max_size, the burst's first B - max_size items are gone before any sample:
    share = 1 - (max_size / B)(1 - e^(-s B / max_size)). Here max_size >= B brings it back
    to e^-s.

A sampler that favours some items (prioritized) can only waste more than uniform at the same
s (Jensen: the mean of e^(-s w) over weights w of mean 1 is at least e^-s), so the excess over
e^-s is either bursts or the priorities; the batches' effective sample size tells them apart.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Sequence

from replaywatch.model import BatchStats, TableSnapshot

# Named when more than this share of the evicted items was never sampled.
WASTED_SHARE = 0.5
# The fixes aim below this share, so that a run at the printed value is clear of the line.
TARGET_SHARE = 0.4
# Judged once the table stayed full through this many turnovers (max_size inserts each):
# one turnover alone reads a burst's phase.
TURNOVERS = 2
# And at least this many inserts: fewer make the share noise.
MIN_INSERTS = 500
# The share over e^-s that bursts (or priorities) must explain before they are named: a
# uniform table's share is within a few points of e^-s (bench/RESULTS.md).
EXCESS = 0.1
# A prioritized table whose batches' effective sample size is at least this share of the
# table samples nearly uniformly: its priorities do not explain an excess.
NEAR_UNIFORM = 0.8


class BurstFrom(enum.Enum):
    """Which reading gave a burst (waste_words says each)."""

    PAUSE = enum.auto()  # the inserts over a pause in sampling the polls saw
    EXCESS = enum.auto()  # the burst that explains the share over e^-s
    LOOP = enum.auto()  # the loop's own inserts between next() calls, its probe's count


class Cause(enum.Enum):
    """What the waste is put down to."""

    RATIO = enum.auto()  # e^-s explains it: too few samples per insert
    BURSTS = enum.auto()  # inserts in bursts longer than the table
    BURSTS_OR_PRIORITIES = enum.auto()  # a prioritized table: bursts, or its priorities


def uniform_share(spi: float, max_size: int, burst: float = 1.0) -> float:
    """The share of items a uniform, oldest-first table evicts never sampled, at `spi`
    samples per insert with inserts `burst` at a time between samples."""
    if spi <= 0:
        return 1.0
    if burst <= max_size:
        return math.exp(-spi)
    kept = max_size / burst
    return 1.0 - kept * (1.0 - math.exp(-spi / kept))


def burst_for(share: float, spi: float, max_size: int) -> float | None:
    """The burst that explains `share` at `spi` (uniform_share solved for B by bisection:
    it grows with B past max_size); None when e^-s already explains it, or nothing does."""
    if share <= math.exp(-spi) or share >= 1.0:
        return None
    lo, hi = float(max_size), float(max_size)
    while uniform_share(spi, max_size, hi) < share:
        hi *= 2
        if hi > 1e12:
            return None
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if uniform_share(spi, max_size, mid) < share else (lo, mid)
    return hi


def spi_for(share: float) -> float:
    """The samples per insert at which a uniform table wastes `share`: -ln(share)."""
    return -math.log(share)


def round_up(x: float, digits: int = 2) -> int:
    """`x` rounded up to `digits` significant figures: a value to print."""
    if x <= 0:
        return 0
    step = 10 ** max(0, math.floor(math.log10(x)) + 1 - digits)
    return int(math.ceil(x / step) * step)


@dataclasses.dataclass(frozen=True)
class Waste:
    """One table's never-sampled share over a stretch where it stayed full."""

    since: float
    until: float
    inserts: int
    unique_samples: int
    samples: int
    max_size: int
    # The most items inserted over a pause in sampling that the polls saw (idle_burst).
    idle_burst: int = 0

    @property
    def share(self) -> float:
        return max(0.0, self.inserts - self.unique_samples) / self.inserts

    @property
    def never_sampled(self) -> int:
        return max(0, self.inserts - self.unique_samples)

    @property
    def spi(self) -> float:
        """The samples per insert the table served over the stretch."""
        return self.samples / self.inserts

    @property
    def uniform(self) -> float:
        """What a uniform table at this ratio, without bursts, would waste: e^-s."""
        return uniform_share(self.spi, self.max_size)

    @property
    def burst(self) -> float | None:
        """The burst behind the share over e^-s, when it is over by EXCESS: the larger of the
        one that explains the share and the one the polls saw (the share reads a long pause
        as a shorter burst: the learner catches up after it, over items the pause kept)."""
        if self.share - self.uniform <= EXCESS:
            return None
        explains = burst_for(self.share, self.spi, self.max_size)
        seen = float(self.idle_burst) if self.idle_burst > self.max_size else None
        return max((b for b in (explains, seen) if b is not None), default=None)

    @property
    def burst_from(self) -> BurstFrom | None:
        """Which reading gave `burst`."""
        if (burst := self.burst) is None:
            return None
        return BurstFrom.PAUSE if burst == float(self.idle_burst) else BurstFrom.EXCESS


@dataclasses.dataclass(frozen=True)
class Wasted:
    """A table's waste with what the learner's probe and the table's memory add: the burst
    and where it was read, and the numbers each fix is printed with."""

    table: str
    waste: Waste
    sampler: str  # the table's sampler: uniform or prioritized
    burst: float | None
    burst_from: BurstFrom | None
    batch_stats: bool  # the learner's probe reports its batches
    ess_share: float | None  # their effective sample size, a share of the table
    fits_max_size: int | None  # the most items the process's memory holds

    @property
    def spi_fix(self) -> float:
        """The samples per insert at which a uniform table wastes TARGET_SHARE, rounded up."""
        return math.ceil(spi_for(TARGET_SHARE) * 10) / 10

    @property
    def size_fix(self) -> int | None:
        """A max_size a burst fits in, with a fifth to spare."""
        return None if self.burst is None else round_up(1.2 * self.burst)

    @property
    def size_fits(self) -> bool:
        """The burst's max_size fits in memory (or the memory is not known)."""
        return not (self.fits_max_size and self.size_fix and self.fits_max_size < self.size_fix)

    @property
    def ratio_too(self) -> bool:
        """Without bursts the ratio alone would still waste more than TARGET_SHARE."""
        return self.waste.uniform > TARGET_SHARE

    @property
    def cause(self) -> Cause:
        if self.burst is None:
            return Cause.RATIO
        # Priorities can explain the excess too, unless the loop's own bursts are counted or
        # the batches show it samples nearly uniformly.
        if (self.sampler == "prioritized" and self.burst_from is not BurstFrom.LOOP
                and (self.ess_share is None or self.ess_share < NEAR_UNIFORM)):
            return Cause.BURSTS_OR_PRIORITIES
        return Cause.BURSTS

    @property
    def fix_samples_per_insert(self) -> float | None:
        return self.spi_fix if self.cause is Cause.RATIO or self.ratio_too else None

    @property
    def fix_max_size(self) -> int | None:
        return self.size_fix if self.size_fits else None


def wasted(table: str, w: Waste, sampler: str, loop_burst: int | None,
           stats: BatchStats | None, fits_max_size: int | None) -> Wasted:
    """`w` read with the learner's probe: the loop's inserts between next() calls
    (`loop_burst`, its strides) are the burst where the share says there is one and they
    are the larger (a dataset's prefetch samples through part of a stride); strides alone
    are no burst, as between next() calls the dataset may go on sampling."""
    inferred = w.burst
    loop = (loop_burst if inferred is not None and loop_burst and loop_burst > inferred
            else None)
    ess_share = (stats.effective_sample_size / stats.table_size
                 if stats and stats.effective_sample_size and stats.table_size else None)
    return Wasted(table, w, sampler, loop or inferred,
                  BurstFrom.LOOP if loop else w.burst_from, stats is not None, ess_share,
                  fits_max_size)


def _full(s: TableSnapshot) -> bool:
    return s.max_size > 0 and s.current_size >= s.max_size


def waste(points: Sequence[TableSnapshot], min_s: float) -> Waste | None:
    """Over the whole stretch to the newest of `points` (one table since its last reset,
    time-ordered) in which it stayed full: a long one averages over the job's rhythm (an
    evaluation every few minutes is a burst of its own). None until that stretch holds
    TURNOVERS x max_size inserts (MIN_INSERTS at least) over `min_s` seconds."""
    if len(points) < 2 or not _full(points[-1]):
        return None
    end = start = points[-1]
    for p in reversed(points[:-1]):
        if not _full(p) or p.max_size != end.max_size:
            break
        start = p
    inserts = end.rate_limiter.inserts - start.rate_limiter.inserts
    if (inserts < max(MIN_INSERTS, TURNOVERS * end.max_size)
            or end.observed_at - start.observed_at < min_s):
        return None
    stretch = [p for p in points if p.observed_at >= start.observed_at]
    return Waste(since=start.observed_at, until=end.observed_at, inserts=int(inserts),
                 unique_samples=end.num_unique_samples - start.num_unique_samples,
                 samples=int(end.rate_limiter.samples - start.rate_limiter.samples),
                 max_size=end.max_size, idle_burst=idle_burst(stretch))


def idle_burst(points: Sequence[TableSnapshot]) -> int:
    """The most items inserted over a pause in sampling the polls saw: a run of polls with
    no sample between them, and one poll interval more (a pause begins and ends somewhere
    between polls: on average half an interval either side of the run)."""
    most, first = 0, 0
    for i in range(1, len(points)):
        if points[i].rate_limiter.samples == points[i - 1].rate_limiter.samples:
            continue
        if i - 1 > first:  # points[first..i-1] saw no sample: a pause
            most = max(most, int(points[i].rate_limiter.inserts
                                 - points[first].rate_limiter.inserts))
        first = i
    if len(points) - 1 > first:  # a pause to the newest poll: what it saw so far
        most = max(most, int(points[-1].rate_limiter.inserts - points[first].rate_limiter.inserts))
    return most
