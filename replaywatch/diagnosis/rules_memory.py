"""The replay's memory: memory_exhaustion.

    memory_exhaustion   filling towards max_size, the process will not fit under its limit:
                        named while the table fills, long before the kernel kills it

Read from the view's memory readings (the server's process, where its host can be read) and
the coarse copy of the table's snapshots, which reach back over the fill (diagnosis/memory.py
has the arithmetic). A table that fits is never named; a full one is not judged here.
"""

from __future__ import annotations

from replaywatch.diagnosis import kinds
from replaywatch.diagnosis import memory as mem
from replaywatch.diagnosis import window as win
from replaywatch.diagnosis.registry import Rule, Shape
from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.diagnosis.window import TargetView
from replaywatch.model import Finding

GIB = float(1 << 30)


def is_memory_exhaustion(view: TargetView, th: Thresholds, now: float) -> Finding | None:
    """The table that, filled to max_size, takes the process furthest past its limit."""
    m = view.memory[-1] if view.memory else None
    if m is None or m.rss_bytes is None or m.counted_bytes is None:
        return None
    rss = m.counted_bytes  # what counts against the limit (model.MemorySnapshot)
    if now - m.observed_at > th.stall_window_s:
        return None
    found = []
    for name in sorted(view.tables):
        points = win.since_last_reset(view.coarse_tables.get(name) or view.tables[name])
        latest = view.tables[name][-1]
        per_item = mem.item_bytes(points, [x for x in view.memory if x.pid == m.pid])
        if per_item is None or not per_item.measured:
            continue  # the signature overstates compressed chunks: measured only
        left = max(0, latest.max_size - latest.current_size)
        projected = rss + per_item.value * left
        if left > 0 and projected > m.limit_bytes:
            found.append((projected, name, latest, per_item, points))
    if not found:
        return None
    projected, name, t, per_item, points = max(found, key=lambda f: f[0])
    rate = mem.fill_rate(points, now)
    grows = per_item.value * rate if rate and rate > 0 else None
    seconds_left = (m.limit_bytes - rss) / grows if grows else None
    fits = mem.fitting_max_size(t.current_size, rss, m.limit_bytes, per_item.value)
    evidence = {"bytes_per_item": round(per_item.value), "bytes_per_item_from": per_item.source,
                "memory_bytes": rss, "projected_bytes": round(projected),
                "limit_bytes": m.limit_bytes, "limit_from": m.limit_from,
                "current_size": t.current_size, "max_size": t.max_size,
                "items_per_s": None if rate is None else round(rate, 1),
                "seconds_left": None if seconds_left is None else round(seconds_left),
                "fits_max_size": fits, "pid": m.pid, "found_by": m.found_by}
    when = (f"at {rate:.0f} items/s it reaches the limit in about {seconds_left:.0f} s"
            if seconds_left is not None else "it reaches the limit as the table fills")
    summary = (f"The replay server of '{view.target}' will not fit: table '{name}' full at "
               f"{t.max_size:,} items of {per_item.value:,.0f} bytes ({per_item.source}) takes "
               f"the process to {projected / GIB:.2f} GiB against its limit of "
               f"{m.limit_bytes / GIB:.2f} GiB ({m.limit_from}); {when}, then the kernel "
               "kills it.")
    fix = (f"Lower max_size of '{name}' to {fits:,} (it then fits under "
           f"{mem.FIT_SHARE:.0%} of the limit), or raise the memory limit to at least "
           f"{projected / mem.FIT_SHARE / GIB:.1f} GiB.")
    return kinds.MEMORY_EXHAUSTION.finding(view.target, name, summary, evidence, fix,
                                           since=m.observed_at, last_seen=now)


RULES = (
    Rule(kinds.MEMORY_EXHAUSTION, is_memory_exhaustion, Shape.VIEW),
)
