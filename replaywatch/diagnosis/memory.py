"""The replay's memory: what an item costs, what the table will cost full, and whether the
process was killed at its limit.

An item's bytes in the server are its chunks', compressed (zstd) and shared between
overlapping items (reverb/cc/chunk_store.cc), so the table signature's size is an upper
bound, not the truth. So they are measured: the process's resident memory against the
table's `current_size` while it fills, a least-squares slope over the polls where both were
read in one poll cycle (a local server's are read by the same poll; a replay probe's beside
it, within `PAIR_WITHIN_S`) over the newest `MEASURE_SPAN_S`, once the table has grown by
`MIN_ITEMS` items and the memory by `MIN_BYTES` in step with it over `MIN_READINGS` readings
(r squared at least `MIN_R2`):

    bytes per item   = slope(rss, current_size)
    at max_size      = rss now + bytes per item x (max_size - current_size)
    fits             = current_size + (FIT_SHARE x limit - rss now) / bytes per item
    time left        = (limit - rss now) / (bytes per item x items per second)

The time left is a range, its soonest end said first: each slope SPREAD_SE standard errors
either side, the rate's range also taking in its newest RATE_RECENT_S (a writer speeding up):

    soonest          = (limit - rss now) / (bytes per item high x items per second high)
    latest           = (limit - rss now) / (bytes per item low x items per second low)

The rate is read from the table's first growth on: an actor that loads after the sidecar
starts leaves the table empty a while, and a rate averaged over that said 694 s where the
kernel killed the server 261 s later. Both slopes read every poll's snapshot the view holds
(`window.reach`), not the coarse copy's one per 10 s alone: the fill's first seconds count.

Freed items' memory is released later, on clients' insert calls (table.cc), so a full
table's memory moves in steps; none of this is judged once the table is full.

Once every table of the process is full, or its size flat, its memory has no items to grow
with: growth then is a leak (`steady_growth`). The delayed release makes a full table's
memory a saw whose teeth are one insert call apart, so growth is read from the lows: the
lowest reading of each third of the flat stretch (at least `LEAK_SPAN_S` long) rises above
the last third's by a quarter of the band, and the newest third's above the oldest's by the
band, max(`LEAK_MIN_BYTES`, `LEAK_LIMIT_SHARE` of the limit). A one-off step (a learner's
compile beside an in-process server) rises once, not in every third.

Pure: the snapshots are the only input.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Mapping, Sequence

from replaywatch.model import MemorySnapshot, TableSnapshot

MIB = float(1 << 20)
GIB = float(1 << 30)
MIN_ITEMS = 100  # the table's growth a measurement needs ...
MIN_BYTES = 4 << 20  # ... and the memory's: below, allocator noise is the slope
# ... and its readings: a slope's standard error from three is a guess (one degree of
# freedom); five come within a few percent of what the whole fill says (bench/RESULTS.md,
# "Replay memory against a real cgroup limit").
MIN_READINGS = 5
FIT_SHARE = 0.9  # a max_size that fits leaves a tenth of the limit to the rest
RATE_SPAN_S = 120.0  # the insert rate the time left is judged at, at most this far back
RATE_RECENT_S = 30.0  # ... and over its newest stretch alone
# A slope's range: this many standard errors either side (about 95% where the readings
# scatter at random about a line; fewer readings, or a worse fit, widen it).
SPREAD_SE = 2.0
# Measured over the newest stretch, and only where the memory follows the table: a process
# that also grows for its own reasons (a learner's first compile beside an in-process
# server) does not move in step with current_size, and its one-off growth ages out.
MEASURE_SPAN_S = 300.0
MIN_R2 = 0.9
PAIR_WITHIN_S = 0.5  # a table snapshot and a memory reading of one poll cycle
# An item costs at most its data (the signature's uncompressed size) and the chunk and
# item bookkeeping around it (about a fifth more for a frame: bench/RESULTS.md's bytes/item):
# a slope far above that is the process growing beside the table (a learner's JAX buffers
# in the same process as its server), not the items.
OVERHEAD_FACTOR = 2.0
ITEM_OVERHEAD_BYTES = 4096
# Leak: the flat stretch judged, and the growth that counts. A full table in steady state
# saws, but its lows stay within a few MiB; a writer that keeps its episodes alive grows
# the server by megabytes a second. The bound sits between the two (bench/RESULTS.md,
# "Replay memory against a real cgroup limit", has both).
LEAK_SPAN_S = 300.0
LEAK_MIN_BYTES = 64 << 20
LEAK_LIMIT_SHARE = 0.01
FLAT_SHARE = 0.01  # a table whose size stays within 1% of max_size is flat


@dataclasses.dataclass(frozen=True)
class ItemBytes:
    value: float
    source: str  # "measured over N items" or "the table's signature (an upper bound)"
    measured: bool
    low: float  # the range the readings allow (the signature's: the value itself)
    high: float


def item_bytes(table: Sequence[TableSnapshot], memory: Sequence[MemorySnapshot]
               ) -> ItemBytes | None:
    """Bytes an item costs the process: measured while the table filled, else its signature."""
    newest = table[-1].observed_at if table else 0.0
    times = [m.observed_at for m in memory]
    pairs = [(float(t.current_size), float(b)) for t in table
             if t.observed_at >= newest - MEASURE_SPAN_S
             and (b := read_with(t.observed_at, times, memory)) is not None]
    if pairs:
        sizes = [s for s, _ in pairs]
        grown = max(sizes) - min(sizes)
        fit = fit_line(pairs)
        signature = table[-1].item_bytes
        bound = (None if not signature
                 else OVERHEAD_FACTOR * signature + ITEM_OVERHEAD_BYTES)
        if (grown >= MIN_ITEMS and len(pairs) >= MIN_READINGS and fit is not None
                and fit.se is not None
                and fit.slope * grown >= MIN_BYTES and fit.r2 >= MIN_R2
                and (bound is None or fit.slope <= bound)):
            return ItemBytes(fit.slope, f"measured over {grown:.0f} items", True,
                             *fit.range())
    latest = table[-1] if table else None
    if latest is not None and latest.item_bytes:
        return ItemBytes(float(latest.item_bytes), "the table's signature (uncompressed: an "
                         "upper bound)", False, latest.item_bytes, latest.item_bytes)
    return None


@dataclasses.dataclass(frozen=True)
class TableMemory:
    """What one table costs its process: an item's bytes, and the process at max_size."""

    bytes_per_item: float
    source: str  # ItemBytes.source
    measured: bool
    memory_bytes: int | None  # the process now (None: its host not read)
    projected_bytes: float | None  # the process with this table at max_size
    limit_bytes: int | None
    fits_max_size: int | None  # the largest max_size under FIT_SHARE of the limit
    bytes_per_item_low: float = 0.0  # ItemBytes.low and .high
    bytes_per_item_high: float = 0.0


def table_memory(table: Sequence[TableSnapshot], memory: Sequence[MemorySnapshot]
                 ) -> TableMemory | None:
    """An item's bytes (measured, else the signature's) and where the table takes the
    process at max_size, against the newest reading of the process's memory."""
    m = next((x for x in reversed(memory) if x.counted_bytes is not None), None)
    per = item_bytes(table, [x for x in memory if m is not None and x.pid == m.pid])
    if per is None or not table:
        return None
    if m is None or m.counted_bytes is None:
        return TableMemory(per.value, per.source, per.measured, None, None, None, None,
                           per.low, per.high)
    latest = table[-1]
    projected = m.counted_bytes + per.value * max(0, latest.max_size - latest.current_size)
    fits = fitting_max_size(latest.current_size, m.counted_bytes, m.limit_bytes, per.value)
    return TableMemory(per.value, per.source, per.measured, m.counted_bytes, projected,
                       m.limit_bytes, fits, per.low, per.high)


@dataclasses.dataclass(frozen=True)
class FillingTable:
    """A table still filling, as its own process pays for it: an item's bytes read from the
    process's resident memory, not its cgroup's (which the group's other processes move too:
    two shards filling in one group would each read both fills as theirs)."""

    name: str
    current_size: int
    max_size: int
    bytes_per_item: float

    @property
    def growth_bytes(self) -> float:
        """What the table adds to its process by max_size."""
        return self.bytes_per_item * max(0, self.max_size - self.current_size)


def own_filling(fills: Mapping[str, Sequence[TableSnapshot]],
                memory: Sequence[MemorySnapshot]) -> tuple[FillingTable, ...]:
    """Each table of `fills` (its snapshots since its last reset) still short of max_size,
    whose item's bytes the process's own resident memory measures."""
    m = next((x for x in reversed(memory) if x.rss_bytes is not None), None)
    if m is None:
        return ()
    own = [x if x.cgroup_anon_bytes is None else dataclasses.replace(x, cgroup_anon_bytes=None)
           for x in memory if x.pid == m.pid]
    out = []
    for name, fill in sorted(fills.items()):
        if not fill or fill[-1].current_size >= fill[-1].max_size:
            continue
        per = item_bytes(fill, own)
        if per is not None and per.measured:
            out.append(FillingTable(name, fill[-1].current_size, fill[-1].max_size, per.value))
    return tuple(out)


def read_with(at: float, times: Sequence[float], memory: Sequence[MemorySnapshot]
               ) -> int | None:
    """The memory read in the same poll cycle as a table snapshot taken at `at`: the same
    poll (a local server's) or a replay probe's, polled beside it within PAIR_WITHIN_S."""
    i = bisect.bisect_left(times, at - PAIR_WITHIN_S)
    near = [m for m in memory[i:i + 3] if abs(m.observed_at - at) <= PAIR_WITHIN_S
            and m.counted_bytes is not None]
    best = min(near, key=lambda m: abs(m.observed_at - at), default=None)
    return None if best is None else best.counted_bytes


@dataclasses.dataclass(frozen=True)
class Fit:
    """A least-squares line: its slope, r squared, and the slope's standard error (None
    from two points, which always lie on a line)."""

    slope: float
    r2: float
    se: float | None

    def range(self) -> tuple[float, float]:
        """The slope SPREAD_SE standard errors either side (none known: the slope alone)."""
        spread = SPREAD_SE * (self.se or 0.0)
        return max(0.0, self.slope - spread), self.slope + spread


def fit_line(pairs: Sequence[tuple[float, float]]) -> Fit | None:
    """The least-squares line through the pairs."""
    n = len(pairs)
    mx = sum(x for x, _ in pairs) / n
    my = sum(y for _, y in pairs) / n
    sxx = sum((x - mx) ** 2 for x, _ in pairs)
    syy = sum((y - my) ** 2 for _, y in pairs)
    if sxx == 0 or syy == 0:
        return None
    sxy = sum((x - mx) * (y - my) for x, y in pairs)
    slope, r2 = sxy / sxx, sxy * sxy / (sxx * syy)
    unexplained = max(0.0, syy - slope * sxy)
    return Fit(slope, r2, None if n < 3 else (unexplained / (n - 2) / sxx) ** 0.5)


@dataclasses.dataclass(frozen=True)
class FillRate:
    """Items a table grows by per second while it fills: the slope since it began growing
    (at most RATE_SPAN_S back) and its range."""

    value: float
    low: float  # the slope's range, widened to take in the newest RATE_RECENT_S's rate
    high: float
    over_s: float  # the stretch it was read over


def fill_rate(table: Sequence[TableSnapshot], now: float) -> FillRate | None:
    """The table's growth in items per second since it began growing (module docstring)."""
    window = [t for t in table if t.observed_at >= now - RATE_SPAN_S]
    start = next((i for i, t in enumerate(window) if t.current_size != window[0].current_size),
                 len(window))
    # The size stood still over two readings or more before it grew: the fill began after
    # the last of them, at a moment no reading shows, so the stretch starts at its first
    # growth. One reading before the growth is the window's edge, not a standstill.
    points = window[start:] if start >= 2 else window
    if len(points) < 2 or points[-1].observed_at <= points[0].observed_at:
        return None
    t0 = points[0].observed_at
    fit = fit_line([(t.observed_at - t0, float(t.current_size)) for t in points])
    if fit is None:
        return None
    newest = [t for t in points if t.observed_at >= points[-1].observed_at - RATE_RECENT_S]
    recent = fit.slope if newest[-1].observed_at <= newest[0].observed_at else (
        (newest[-1].current_size - newest[0].current_size)
        / (newest[-1].observed_at - newest[0].observed_at))
    low, high = fit.range()
    return FillRate(fit.slope, max(0.0, min(low, recent)), max(high, recent),
                    points[-1].observed_at - t0)


@dataclasses.dataclass(frozen=True)
class TimeLeft:
    """Seconds until the process reaches its limit: the soonest the readings allow (the
    items' cost and the fill rate at the high ends of their ranges), and the latest (None:
    a range reaching down to no growth)."""

    soonest: float
    latest: float | None


def time_left(headroom: float, low: float, high: float, rate: FillRate) -> TimeLeft | None:
    """`headroom` bytes used up by items of `low` to `high` bytes at the fill rate."""
    fastest, slowest = high * rate.high, low * rate.low
    if fastest <= 0:
        return None
    return TimeLeft(max(0.0, headroom) / fastest,
                    max(0.0, headroom) / slowest if slowest > 0 else None)


def fitting_max_size(current_size: int, rss: int, limit: int, per_item: float) -> int:
    """The largest max_size whose table leaves the process under FIT_SHARE of its limit."""
    return max(0, current_size + int((FIT_SHARE * limit - rss) // per_item))


def killed_at_limit(memory: Sequence[MemorySnapshot]) -> MemorySnapshot | None:
    """The newest reading when the process is gone and its cgroup counted an OOM kill since
    it was last seen alive: the kernel killed it at its limit."""
    if not memory or memory[-1].pid is not None or memory[-1].oom_kills is None:
        return None
    alive = [m for m in memory if m.pid is not None]
    before = alive[-1].oom_kills if alive and alive[-1].oom_kills is not None else None
    if before is None or memory[-1].oom_kills <= before:
        return None
    return memory[-1]


@dataclasses.dataclass(frozen=True)
class Growth:
    """Memory that rose through a stretch in which no table grew."""

    since: float  # the flat stretch's first reading
    span_s: float
    lows: tuple[int, int, int]  # the lowest reading of each third, oldest first
    rate: float  # bytes per second, least squares over the stretch
    now_bytes: int


def flat_since(tables: Sequence[Sequence[TableSnapshot]], now: float) -> float | None:
    """When the newest stretch began over which every table stayed within FLAT_SHARE of
    its max_size of its newest size (full, or not inserted into); None: one is growing now."""
    since = float("-inf")
    for points in tables:
        if not points:
            continue
        newest = points[-1]
        band = max(1.0, FLAT_SHARE * newest.max_size)
        start = newest.observed_at
        for t in reversed(points):
            if abs(t.current_size - newest.current_size) > band:
                break
            start = t.observed_at
        if start >= now:
            return None
        since = max(since, start)
    return None if since == float("-inf") else since


def steady_growth(memory: Sequence[MemorySnapshot], since: float, limit: int
                  ) -> Growth | None:
    """The process's growth since `since` (module docstring), when it rose in every third."""
    pid = memory[-1].pid if memory else None
    points = [(m.observed_at, m.counted_bytes) for m in memory
              if m.pid == pid and m.counted_bytes is not None and m.observed_at >= since]
    if pid is None or len(points) < 6 or points[-1][0] - points[0][0] < LEAK_SPAN_S:
        return None
    start, end = points[0][0], points[-1][0]
    third = (end - start) / 3
    lows = tuple(min(b for t, b in points if start + i * third <= t <= start + (i + 1) * third)
                 for i in range(3))
    band = max(LEAK_MIN_BYTES, LEAK_LIMIT_SHARE * limit)
    if lows[1] - lows[0] < band / 4 or lows[2] - lows[1] < band / 4 or lows[2] - lows[0] < band:
        return None
    fit = fit_line([(t - start, float(b)) for t, b in points])
    if fit is None or fit.slope <= 0:
        return None
    return Growth(start, end - start, (lows[0], lows[1], lows[2]), fit.slope, points[-1][1])
