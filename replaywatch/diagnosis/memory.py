"""The replay's memory: what an item costs, what the table will cost full, and whether the
process was killed at its limit.

An item's bytes in the server are its chunks', compressed (zstd) and shared between
overlapping items (reverb/cc/chunk_store.cc), so the table signature's size is an upper
bound, not the truth. So they are measured: the process's resident memory against the
table's `current_size` while it fills, a least-squares slope over the polls where both were
read (the same poll reads both, so they pair exactly) over the newest `MEASURE_SPAN_S`, once
the table has grown by `MIN_ITEMS` items and the memory by `MIN_BYTES` in step with it
(r squared at least `MIN_R2`):

    bytes per item   = slope(rss, current_size)
    at max_size      = rss now + bytes per item x (max_size - current_size)
    fits             = current_size + (FIT_SHARE x limit - rss now) / bytes per item
    time left        = (limit - rss now) / (bytes per item x items per second)

Freed items' memory is released later, on clients' insert calls (table.cc), so a full
table's memory moves in steps; none of this is judged once the table is full.

Pure: the snapshots are the only input.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from replaywatch.model import MemorySnapshot, TableSnapshot

MIN_ITEMS = 100  # the table's growth a measurement needs ...
MIN_BYTES = 4 << 20  # ... and the memory's: below, allocator noise is the slope
FIT_SHARE = 0.9  # a max_size that fits leaves a tenth of the limit to the rest
RATE_SPAN_S = 120.0  # the insert rate the time left is judged at
# Measured over the newest stretch, and only where the memory follows the table: a process
# that also grows for its own reasons (a learner's first compile beside an in-process
# server) does not move in step with current_size, and its one-off growth ages out.
MEASURE_SPAN_S = 300.0
MIN_R2 = 0.9
# An item costs at most its data (the signature's uncompressed size) and the chunk and
# item bookkeeping around it (measured: 74,787 bytes for a 63,504-byte frame): a slope far
# above that is the process growing beside the table (a learner's JAX buffers in the same
# process, seen on the demo's healthy sync agent while its table filled), not the items.
OVERHEAD_FACTOR = 2.0
ITEM_OVERHEAD_BYTES = 4096


@dataclasses.dataclass(frozen=True)
class ItemBytes:
    value: float
    source: str  # "measured over N items" or "the table's signature (an upper bound)"
    measured: bool


def item_bytes(table: Sequence[TableSnapshot], memory: Sequence[MemorySnapshot]
               ) -> ItemBytes | None:
    """Bytes an item costs the process: measured while the table filled, else its signature."""
    rss = {m.observed_at: m.counted_bytes for m in memory if m.counted_bytes is not None}
    newest = table[-1].observed_at if table else 0.0
    pairs = [(float(t.current_size), float(rss[t.observed_at])) for t in table
             if t.observed_at in rss and t.observed_at >= newest - MEASURE_SPAN_S]
    if pairs:
        sizes = [s for s, _ in pairs]
        grown = max(sizes) - min(sizes)
        fit = _fit(pairs)
        signature = table[-1].item_bytes
        bound = (None if not signature
                 else OVERHEAD_FACTOR * signature + ITEM_OVERHEAD_BYTES)
        if (grown >= MIN_ITEMS and fit is not None and fit[0] * grown >= MIN_BYTES
                and fit[1] >= MIN_R2 and (bound is None or fit[0] <= bound)):
            return ItemBytes(fit[0], f"measured over {grown:.0f} items", True)
    latest = table[-1] if table else None
    if latest is not None and latest.item_bytes:
        return ItemBytes(float(latest.item_bytes), "the table's signature (uncompressed: an "
                         "upper bound)", False)
    return None


def _fit(pairs: Sequence[tuple[float, float]]) -> tuple[float, float] | None:
    """The least-squares slope and its r squared."""
    n = len(pairs)
    mx = sum(x for x, _ in pairs) / n
    my = sum(y for _, y in pairs) / n
    sxx = sum((x - mx) ** 2 for x, _ in pairs)
    syy = sum((y - my) ** 2 for _, y in pairs)
    if sxx == 0 or syy == 0:
        return None
    sxy = sum((x - mx) * (y - my) for x, y in pairs)
    return sxy / sxx, sxy * sxy / (sxx * syy)


def fill_rate(table: Sequence[TableSnapshot], now: float) -> float | None:
    """Items the table grew by per second over the last RATE_SPAN_S."""
    recent = [t for t in table if t.observed_at >= now - RATE_SPAN_S]
    if len(recent) < 2 or recent[-1].observed_at <= recent[0].observed_at:
        return None
    return ((recent[-1].current_size - recent[0].current_size)
            / (recent[-1].observed_at - recent[0].observed_at))


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
