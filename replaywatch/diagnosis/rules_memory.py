"""The replay's memory: memory_exhaustion, memory_leak.

    memory_exhaustion   filling towards max_size, the process will not fit under its limit:
                        named while the table fills, long before the kernel kills it
    memory_leak         every table full (or its size flat), and the process's memory rose
                        through LEAK_SPAN_S all the same: an actor's writer keeping its
                        episode's chunks alive, or the server growing on its own

A job's shards under one limit (one host's memory, one cgroup's: the same limit scope) are
judged together: their memory now and what every table still filling adds, each table's
item read from its own process's memory.

Read from the view's memory readings (the server's process, where its host can be read) and
the coarse copy of the table's snapshots, which reach back over the fill (diagnosis/memory.py
has the arithmetic). A table that fits is never named; a full one is not judged here.
"""

from __future__ import annotations

import math

from replaywatch.diagnosis import checkpoint_write as cw
from replaywatch.diagnosis import kinds
from replaywatch.diagnosis import memory as mem
from replaywatch.diagnosis.registry import Rule, Shape
from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.diagnosis.window import PeerMemory, TargetView
from replaywatch.model import Finding, MemorySnapshot

GIB, MIB = mem.GIB, mem.MIB


def is_memory_exhaustion(view: TargetView, th: Thresholds, now: float) -> Finding | None:
    """The table that, filled to max_size, takes the process furthest past its limit; else a
    running checkpoint whose removed items, kept alive until it ends, will."""
    m = view.memory[-1] if view.memory else None
    if m is None or m.counted_bytes is None or now - m.observed_at > th.stall_window_s:
        return None
    shared = _sharing(view, th, now, m)
    return (_together(view, now, m, shared) if shared else _filling(view, th, now, m)
            ) or _writing(view, th, now)


def _sharing(view: TargetView, th: Thresholds, now: float, m: MemorySnapshot
             ) -> tuple[PeerMemory, ...]:
    """The job's other servers under this one's limit, read lately."""
    return tuple(p for p in view.memory_peers if m.limit_scope is not None
                 and p.reading.limit_scope == m.limit_scope
                 and p.reading.counted_bytes is not None
                 and now - p.reading.observed_at <= th.stall_window_s)


def _together(view: TargetView, now: float, m: MemorySnapshot,
              shared: tuple[PeerMemory, ...]) -> Finding | None:
    """This server and the job's others under one limit (one host's memory, or one cgroup's)
    filled to max_size together past it, each table's growth read from its own process's
    memory. Judged in place of the server alone: in one cgroup its counted memory is the
    group's, so an item's bytes read from it would count the other shards' fill as its own."""
    own = view.own_filling
    if not own:
        return None  # named where a table still fills
    members = [(view.target, m, own), *((p.target, p.reading, p.filling) for p in shared)]
    growth = sum(t.growth_bytes for _, _, fill in members for t in fill)
    in_group = m.cgroup_anon_bytes is not None
    # A cgroup counts every process in it already; a host's limit is each process's own.
    now_bytes = (m.counted_bytes or 0) if in_group else sum(r.counted_bytes or 0
                                                            for _, r, _ in members)
    combined = now_bytes + growth
    if combined <= m.limit_bytes:
        return None
    share = max(0.0, (mem.FIT_SHARE * m.limit_bytes - now_bytes) / growth)
    cuts = {target: {t.name: t.current_size + int(share * (t.max_size - t.current_size))
                     for t in fill} for target, _, fill in members if fill}
    table = max(own, key=lambda t: t.growth_bytes)
    others = [target for target, _, _ in members[1:]]
    where = "cgroup" if in_group else "host"
    evidence = {
        "shares_limit_with": others, "limit_scope": m.limit_scope,
        "memory_bytes": now_bytes,
        "memory_from": ("the cgroup's anonymous memory" if in_group
                        else "the servers' resident memory, summed"),
        "projected_bytes": round(combined), "limit_bytes": m.limit_bytes,
        "limit_from": m.limit_from,
        "servers": {target: {"memory_bytes": r.rss_bytes, "pid": r.pid, "tables": {
            t.name: {"current_size": t.current_size, "max_size": t.max_size,
                     "bytes_per_item": round(t.bytes_per_item),
                     "fits_max_size": cuts[target][t.name]} for t in fill}}
            for target, r, fill in members},
        "current_size": table.current_size, "max_size": table.max_size,
        "fits_max_size": cuts[view.target][table.name], "pid": m.pid, "found_by": m.found_by}
    filling = ", ".join(f"'{t.name}' on {target} ({t.current_size:,} of {t.max_size:,} items "
                        f"of {t.bytes_per_item:,.0f} bytes)"
                        for target, _, fill in members for t in fill)
    summary = (f"The replay server of '{view.target}' will not fit with the job's other "
               f"servers under the same {where} limit ({', '.join(others)}): they use "
               f"{now_bytes / GIB:.2f} GiB now, and the tables still filling ({filling}) take "
               f"them to {combined / GIB:.2f} GiB together against the {where}'s "
               f"{m.limit_bytes / GIB:.2f} GiB ({m.limit_from}); there the kernel's OOM "
               "killer ends the process under that limit that uses the most memory.")
    lowered = "; ".join(f"on {target}: " + ", ".join(f"'{n}' to {k:,}" for n, k in c.items())
                        for target, c in cuts.items())
    fix = (f"Lower max_size so that the servers fit together under {mem.FIT_SHARE:.0%} of "
           f"the limit ({lowered}), or give each server a limit of its own (its own cgroup, "
           f"pod or host), or raise the limit to at least "
           f"{combined / mem.FIT_SHARE / GIB:.1f} GiB.")
    return kinds.MEMORY_EXHAUSTION.finding(view.target, table.name, summary, evidence, fix,
                                           since=m.observed_at, last_seen=now)


def _writing(view: TargetView, th: Thresholds, now: float) -> Finding | None:
    """A write that, lasting as long as the longest of the last three, keeps enough removed
    items alive to take the process past its limit (checkpoint_write.py)."""
    kept = cw.kept_alive(view, th, now)
    if kept is None or not kept.over_limit or kept.peak_bytes is None:
        return None
    if not kept.measured:  # the signature overstates compressed chunks: measured only
        return None
    limit = kept.limit_bytes or 0
    t = view.tables[kept.table][-1]
    tm = view.table_memories.get(kept.table)
    table_item = tm.bytes_per_item if tm is not None and tm.measured else kept.bytes_per_item
    # Each item off max_size frees its bytes for the whole write; the removals it keeps
    # alive stay (they follow the insert rate, not the table's size).
    over = kept.peak_bytes - mem.FIT_SHARE * limit
    fits = max(0, t.max_size - int(over / table_item) - 1)
    evidence = {**kept.evidence(), "table": kept.table, "max_size": t.max_size,
                "fits_max_size": fits, "cause": "checkpoint"}
    summary = (f"The replay server of '{view.target}' will not fit through its checkpoint: the "
               f"write ({kept.write_for_s:g} s so far; the longest of the last three took "
               f"{kept.expected_write_s:g} s) keeps every item removed meanwhile alive, "
               f"{kept.bytes / MIB:,.0f} MiB so far at {kept.bytes_per_s / MIB:,.1f} MiB/s, "
               f"which takes the process to {kept.peak_bytes / GIB:.2f} GiB by its end against "
               f"its limit of {limit / GIB:.2f} GiB ({kept.limit_from}); then the kernel "
               "kills it mid-write.")
    # Rounded up: a limit printed below the peak over 0.9 is one the write may not fit
    raise_to = math.ceil(kept.peak_bytes / mem.FIT_SHARE / GIB * 10) / 10
    fix = (f"Raise the memory limit to at least {raise_to:.1f} GiB "
           f"(the table and what a write keeps alive under {mem.FIT_SHARE:.0%} of it), or lower "
           f"max_size of '{kept.table}' to {fits:,}.")
    return kinds.MEMORY_EXHAUSTION.finding(view.target, kept.table, summary, evidence, fix,
                                           since=now - kept.write_for_s, last_seen=now)


def _filling(view: TargetView, th: Thresholds, now: float, m: MemorySnapshot
             ) -> Finding | None:
    """The table that, filled to max_size, takes the process furthest past its limit."""
    rss = m.counted_bytes or 0  # what counts against the limit (model.MemorySnapshot)
    found = [(tm, name) for name, tm in view.table_memories.items()
             # the signature overstates compressed chunks: measured only
             if tm.measured and tm.projected_bytes is not None
             and view.tables[name][-1].current_size < view.tables[name][-1].max_size
             and tm.projected_bytes > m.limit_bytes]
    if not found:
        return None
    tm, name = max(found, key=lambda f: f[0].projected_bytes or 0.0)
    projected = tm.projected_bytes or 0.0
    t = view.tables[name][-1]
    rate = mem.fill_rate(view.fill_polls(name), now)
    left = (mem.time_left(m.limit_bytes - rss, tm.bytes_per_item_low, tm.bytes_per_item_high,
                          rate) if rate is not None else None)
    fits = tm.fits_max_size or 0
    evidence = {"bytes_per_item": round(tm.bytes_per_item), "bytes_per_item_from": tm.source,
                "bytes_per_item_range": [round(tm.bytes_per_item_low),
                                         round(tm.bytes_per_item_high)],
                "memory_bytes": rss, "projected_bytes": round(projected),
                "limit_bytes": m.limit_bytes, "limit_from": m.limit_from,
                "current_size": t.current_size, "max_size": t.max_size,
                "items_per_s": None if rate is None else round(rate.value, 1),
                "items_per_s_range": None if rate is None else [round(rate.low, 1),
                                                                round(rate.high, 1)],
                "items_per_s_over_s": None if rate is None else round(rate.over_s),
                # the soonest the readings allow: the time left is never said long
                "seconds_left": None if left is None else round(left.soonest),
                "seconds_left_range": None if left is None else [
                    round(left.soonest), None if left.latest is None else round(left.latest)],
                "fits_max_size": fits, "pid": m.pid, "found_by": m.found_by}
    when = (_when(rate, left, tm) if rate is not None and left is not None
            else "it reaches the limit as the table fills")
    summary = (f"The replay server of '{view.target}' will not fit: table '{name}' full at "
               f"{t.max_size:,} items of {tm.bytes_per_item:,.0f} bytes ({tm.source}) takes "
               f"the process to {projected / GIB:.2f} GiB against its limit of "
               f"{m.limit_bytes / GIB:.2f} GiB ({m.limit_from}); {when}, then the kernel "
               "kills it.")
    fix = (f"Lower max_size of '{name}' to {fits:,} (it then fits under "
           f"{mem.FIT_SHARE:.0%} of the limit), or raise the memory limit to at least "
           f"{projected / mem.FIT_SHARE / GIB:.1f} GiB.")
    return kinds.MEMORY_EXHAUSTION.finding(view.target, name, summary, evidence, fix,
                                           since=m.observed_at, last_seen=now)


def _when(rate: mem.FillRate, left: mem.TimeLeft, tm: mem.TableMemory) -> str:
    """The time left as the range the readings allow, soonest first, and what it is read
    from: the insert rate over the fill and an item's bytes."""
    seconds = (f"{left.soonest:.0f} s or later" if left.latest is None
               else f"{_span(left.soonest, left.latest, '.0f')} s")
    return (f"at {_span(rate.low, rate.high, '.0f')} items/s (read over {rate.over_s:.0f} s "
            f"of the fill) and {_span(tm.bytes_per_item_low, tm.bytes_per_item_high, ',.0f')} "
            f"bytes an item it reaches the limit in {seconds} (the soonest first: the range "
            "narrows as the table fills)")


def _span(low: float, high: float, spec: str) -> str:
    a, b = format(low, spec), format(high, spec)
    return a if a == b else f"{a} to {b}"


def is_memory_leak(view: TargetView, th: Thresholds, now: float) -> Finding | None:
    """The process's memory rose through a stretch in which no table grew (memory.py). Not
    while a checkpoint is written: the write keeps the items removed meanwhile alive, growth
    that memory_exhaustion judges against the limit."""
    m = view.memory[-1] if view.memory else None
    if m is None or m.counted_bytes is None or now - m.observed_at > th.stall_window_s:
        return None
    if cw.checkpoint_running(view, th, now) is not None:
        return None
    tables = {name: view.fill(name) for name in view.tables}
    since = mem.flat_since(list(tables.values()), now)
    if since is None:
        return None
    growth = mem.steady_growth(view.memory, since, m.limit_bytes)
    if growth is None:
        return None
    rss = m.counted_bytes
    seconds_left = max(0.0, (m.limit_bytes - rss) / growth.rate)
    writers = _writers(view, growth.since)
    holding = [w for w in writers if w["holds_episode"]]
    evidence = {"growth_bytes": growth.lows[2] - growth.lows[0], "over_s": round(growth.span_s),
                "lows_bytes": list(growth.lows), "bytes_per_s": round(growth.rate),
                "memory_bytes": rss, "limit_bytes": m.limit_bytes, "limit_from": m.limit_from,
                "seconds_to_limit": round(seconds_left),
                "tables": {n: {"current_size": p[-1].current_size, "max_size": p[-1].max_size}
                           for n, p in sorted(tables.items()) if p},
                "writers": writers, "pid": m.pid, "found_by": m.found_by}
    rose = (f"The replay server of '{view.target}' grew by "
            f"{(growth.lows[2] - growth.lows[0]) / MIB:,.0f} MiB over {growth.span_s:.0f} s "
            f"({growth.rate / MIB:.2f} MiB/s, its lows rising in every third) while no table "
            f"grew; at this rate it reaches its limit of {m.limit_bytes / GIB:.2f} GiB "
            f"({m.limit_from}) in about {seconds_left:.0f} s.")
    if holding:
        named = "; ".join(
            f"{w['actor']} has appended {w['episode_appends']:,} steps without end_episode"
            + (f" under num_keep_alive_refs {w['keep_alive_refs']:,}"
               if w["keep_alive_refs"] else "") for w in holding)
        summary = (f"{rose} An actor's writer keeps its episode's chunks alive in the server: "
                   f"{named}.")
        fix = ("End the episodes (a continuing task: call writer.end_episode() every N steps), "
               "or make the writer keep no more steps alive than its longest item needs "
               "(client.trajectory_writer(num_keep_alive_refs=<the longest item's length>)).")
        cause = "writer"
    elif writers:
        summary = (f"{rose} The server grows on its own: no probed actor's writer keeps its "
                   f"episode alive ({len(writers)} probed, each ended its episode or keeps "
                   "few steps alive).")
        fix = (f"Checkpoint and restart the replay before it reaches the limit (about "
               f"{seconds_left:.0f} s at this rate); the growth is not the items nor a writer "
               "(report it with the Reverb version).")
        cause = "server"
    else:
        summary = (f"{rose} Two causes read the same from the server alone: an actor's writer "
                   "keeping its episode's chunks alive (an episode that never ends under a "
                   "large num_keep_alive_refs), or the server growing on its own.")
        fix = ("Attach an ActorProbe to each actor (probe.wrap_client(client)): it reports each "
               "writer's episode length and keep-alive, which tells the two apart. If an "
               "episode never ends, end it every N steps or lower num_keep_alive_refs to the "
               "longest item's length.")
        cause = "writer or server"
    evidence["cause"] = cause
    return kinds.MEMORY_LEAK.finding(view.target, "", summary, evidence, fix,
                                     since=growth.since, last_seen=now)


def _writers(view: TargetView, since: float) -> list[dict[str, object]]:
    """Each probed actor's writer: whether the steps it keeps alive grew all stretch long
    (no end_episode since `since`, and a keep-alive longer than what it appended since)."""
    out = []
    for url, points in sorted(view.actors.items()):
        newest = points[-1] if points else None
        if newest is None or newest.episode_appends is None:
            continue
        appended = newest.appends_total - min(
            (p.appends_total for p in points if p.observed_at >= since),
            default=newest.appends_total)
        keep = newest.keep_alive_refs
        holds = (appended > 0 and newest.episode_appends >= appended
                 and (keep is None or keep > appended))
        out.append({"actor": newest.name or url, "episode_appends": newest.episode_appends,
                    "keep_alive_refs": keep, "appended_in_stretch": appended,
                    "holds_episode": holds})
    return out


RULES = (
    Rule(kinds.MEMORY_EXHAUSTION, is_memory_exhaustion, Shape.VIEW),
    Rule(kinds.MEMORY_LEAK, is_memory_leak, Shape.VIEW),
)
