"""A checkpoint being written, as the replay probe reports it, and the memory it keeps alive.

Reverb copies a table's items under the table lock, then writes them while the server goes on
serving; each copied item holds its chunks until the write ends. An item removed meanwhile
(by the remover, as inserts arrive at a full table, or by max_times_sampled) is gone from the
table but not from memory: the process grows by every removed item's bytes for as long as the
write lasts, and keeps the pages afterwards (measured on Reverb 0.14: a full 400 MiB table,
800 items of 256 KiB inserted during a 7.6 s write, +210 MiB resident by its end, still
resident after it). Acme's replay checkpoints take up to ten minutes: at a steady insert rate
that is a second table's worth of memory, and an OOM kill mid-write.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from replaywatch.diagnosis import memory as mem
from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.diagnosis.window import TargetView, since_last_reset
from replaywatch.model import CheckpointCall, MemorySnapshot, ReplayCode


def checkpoint_running(view: TargetView, th: Thresholds, now: float
                       ) -> tuple[CheckpointCall, float, ReplayCode] | None:
    """The checkpoint call the replay probe reports in progress, with its start on the
    sidecar's clock (None: no probe handed the server, or no call running)."""
    read = view.replay_code(now, th.stall_window_s)
    if read is None:
        return None
    m, code = read
    running = [c for c in code.checkpoints if c.ended_at is None]
    if not running:
        return None
    return running[-1], code.on_sidecar_clock(running[-1].started_at, m.observed_at), code


def previous_writes_s(code: ReplayCode) -> list[float]:
    """The durations of the checkpoints that completed, oldest first."""
    return [round(c.ended_at - c.started_at, 1) for c in code.checkpoints
            if c.ended_at is not None and c.error is None]


@dataclasses.dataclass(frozen=True)
class KeptAlive:
    """What one running write keeps alive: the items removed since it began, their bytes, the
    rate they are removed at, and where the process ends up if the write lasts as long as the
    longest of the last three (None: the first write, or no memory reading)."""

    table: str  # the table that removed the most items
    items: int
    bytes_per_item: float
    bytes_per_item_from: str
    measured: bool  # bytes per item read off the process (this write's growth or the fill)
    items_per_s: float
    over_s: float  # the stretch the removals were counted over
    write_for_s: float
    expected_write_s: float | None
    memory_bytes: int | None
    limit_bytes: int | None
    limit_from: str | None

    @property
    def bytes(self) -> float:
        return self.items * self.bytes_per_item

    @property
    def bytes_per_s(self) -> float:
        return self.items_per_s * self.bytes_per_item

    @property
    def peak_bytes(self) -> float | None:
        """The process at the write's end, if it lasts `expected_write_s`."""
        if self.memory_bytes is None or self.expected_write_s is None:
            return None
        return self.memory_bytes + self.bytes_per_s * max(
            0.0, self.expected_write_s - self.write_for_s)

    @property
    def over_limit(self) -> bool:
        peak = self.peak_bytes
        return peak is not None and self.limit_bytes is not None and peak > self.limit_bytes

    def evidence(self) -> dict[str, object]:
        peak = self.peak_bytes
        return {"kept_alive_items": self.items, "kept_alive_bytes": round(self.bytes),
                "kept_alive_bytes_per_item": round(self.bytes_per_item),
                "kept_alive_bytes_per_item_from": self.bytes_per_item_from,
                "kept_alive_bytes_per_s": round(self.bytes_per_s),
                "kept_alive_over_s": round(self.over_s, 1),
                "expected_write_s": self.expected_write_s,
                "memory_bytes": self.memory_bytes, "limit_bytes": self.limit_bytes,
                "limit_from": self.limit_from,
                "peak_bytes": None if peak is None else round(peak)}


def kept_alive(view: TargetView, th: Thresholds, now: float) -> KeptAlive | None:
    """The memory the running write keeps alive: the items removed since it began (inserted
    minus grown, every table) at the bytes an item costs. That is read off the process where
    it can be: its growth since the write began over the items removed meanwhile (at least
    `MIN_READINGS` readings and `MIN_BYTES`), else the fill's measurement, else the
    signature's upper bound (said, never paged on). None: no write running, or no table read
    on both sides of the write's start."""
    running = checkpoint_running(view, th, now)
    if running is None:
        return None
    call, began, code = running
    by_table = _removed_by_poll(view, began)
    # Each table's newest poll: its removals since the write began, and over how long.
    newest = {name: polls[-1] for name, polls in by_table.items() if polls}
    if not newest:
        return None
    items = sum(n for _, n, _ in newest.values())
    over = max(span for _, _, span in newest.values())
    table = max(newest, key=lambda name: (newest[name][1], name))
    per = _bytes_per_removed(view, by_table, items, table)
    if per is None:
        return None
    took = previous_writes_s(code)
    m = _memory(view.memory)
    return KeptAlive(table, items, per[0], per[1], per[2], items / over if over > 0 else 0.0,
                     over, round(max(0.0, code.probe_now - call.started_at), 1),
                     max(took[-3:]) if took else None,
                     None if m is None else m.counted_bytes,
                     None if m is None else m.limit_bytes, None if m is None else m.limit_from)


def _bytes_per_removed(view: TargetView, by_table: dict[str, list[tuple[float, int, float]]],
                       items: int, table: str) -> tuple[float, str, bool] | None:
    """An item's bytes as the write keeps it: the slope of the process's memory against the
    items removed since the write began, poll by poll (its high end: the allocator's free
    lists absorb the first removals, so the growth so far over the items so far reads low;
    measured on Reverb 0.14 at 0.8 of the slope 4 s into a write), else the fill's."""
    totals: dict[float, int] = {}  # every table's removals at each poll time
    for polls in by_table.values():
        for at, n, _ in polls:
            totals[at] = totals.get(at, 0) + n
    times = [m.observed_at for m in view.memory]
    pairs = [(float(n), float(b)) for at, n in sorted(totals.items())
             if (b := mem.read_with(at, times, view.memory)) is not None]
    if len(pairs) >= mem.MIN_READINGS and items >= mem.MIN_ITEMS:
        fit = mem.fit_line(pairs)
        grown = max(b for _, b in pairs) - min(b for _, b in pairs)
        if (fit is not None and fit.se is not None and fit.r2 >= mem.MIN_R2
                and grown >= mem.MIN_BYTES):
            return (fit.range()[1], f"measured: the process's growth over the {items:,} items "
                    f"removed since the write began ({len(pairs)} readings, the slope's high "
                    "end)", True)
    tm = view.table_memories.get(table)
    if tm is None:
        return None
    return tm.bytes_per_item_high or tm.bytes_per_item, tm.source, tm.measured


def _removed_by_poll(view: TargetView, began: float
                     ) -> dict[str, list[tuple[float, int, float]]]:
    """By table, each poll since the write began: (its time, the items removed since then:
    inserted minus grown, the seconds since the table's last poll before the write)."""
    out: dict[str, list[tuple[float, int, float]]] = {}
    for name, history in view.tables.items():
        points = since_last_reset(history)
        before = [p for p in points if p.observed_at <= began]
        if not before:
            continue
        start = before[-1]
        out[name] = [(p.observed_at, max(0, p.rate_limiter.inserts - start.rate_limiter.inserts
                                         - (p.current_size - start.current_size)),
                      p.observed_at - start.observed_at)
                     for p in points if p.observed_at > began]
    return out


def _memory(memory: Sequence[MemorySnapshot]) -> MemorySnapshot | None:
    return next((x for x in reversed(memory) if x.counted_bytes is not None), None)
