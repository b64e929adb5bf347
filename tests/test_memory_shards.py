"""A job's shards under one memory limit (one host's, one cgroup's) judged together by
memory_exhaustion: each table's item read from its own process's memory, the group's memory
counted once, the fix's max_sizes fitting together. Real servers in a real cgroup:
tests/test_memory_cgroup.py."""

from __future__ import annotations

import os
from pathlib import Path

from replaywatch.diagnosis import memory as mem
from replaywatch.diagnosis import peers
from replaywatch.diagnosis.engine import diagnose
from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.diagnosis.window import TargetView
from replaywatch.model import Finding, MemorySnapshot
from replaywatch.probe import process_memory as pm
from tests.builders import polls, table_snapshot

TH = Thresholds()
MIB, GIB = 1 << 20, 1 << 30
ITEM = 64 * 1024
BASE = 200 * MIB
A, B = "10.0.0.1:8000", "10.0.0.1:8001"
HOST = "boot-1 host"


def shards(max_sizes: dict[str, int], limit: int, scopes: dict[str, str | None],
           group: bool = False, seconds: int = 60, rate: float = 50.0
           ) -> tuple[dict[str, TargetView], float]:
    """Servers each filling a table at `rate` items/s of ITEM bytes from BASE; in one cgroup
    (`group`) every reading's counted memory is the group's: both processes' growth."""
    sizes = {t: [min(m, int(rate * i)) for i in range(seconds + 1)] for t, m in max_sizes.items()}
    views = {}
    for pid, (target, max_size) in enumerate(sorted(max_sizes.items()), start=70):
        tables, memory = [], []
        for i in range(seconds + 1):
            t = 1000.0 + i
            size = sizes[target][i]
            tables.append(table_snapshot(t, size, 0, max_size=max_size, size=size,
                                         target=target, name="replay"))
            rss = BASE + ITEM * size
            anon = (sum(BASE + ITEM * s[i] for s in sizes.values()) if group else None)
            memory.append(MemorySnapshot(target, t, pid, rss, limit,
                                         "cgroup v1" if group else "host", None, 0,
                                         "listening on port", anon,
                                         limit_scope=scopes[target]))
        views[target] = TargetView(target, polls([s.observed_at for s in tables]),
                                   {"replay": tuple(tables)}, {}, {},
                                   coarse_tables={"replay": tuple(tables[::10])},
                                   memory=tuple(memory))
    return views, 1000.0 + seconds


def exhaustion(views: dict[str, TargetView], now: float, job: str | None = "pong"
               ) -> dict[str, Finding]:
    joined = peers.with_peers(views, {t: job for t in views} if job else {})
    return {t: f for t, v in joined.items() for f in diagnose(v, TH, now).findings
            if f.kind == "memory_exhaustion"}


def test_two_shards_on_one_host_that_each_fit_alone_are_named_together() -> None:
    # Each: 200 MiB + 9,000 x 64 KiB = 762 MiB of a 1.25 GiB host; together 1.49 GiB.
    sizes = {A: 9_000, B: 9_000}
    views, now = shards(sizes, 1280 * MIB, {A: HOST, B: HOST})
    assert exhaustion(views, now, job=None) == {}  # alone, each fits
    found = exhaustion(views, now)
    assert set(found) == {A, B}
    ev = found[A].evidence
    assert ev["shares_limit_with"] == [B] and ev["limit_scope"] == HOST
    assert ev["memory_bytes"] == 2 * (BASE + 3000 * ITEM)  # both processes' resident memory
    assert abs(ev["projected_bytes"] - 2 * (BASE + 9000 * ITEM)) < 0.01 * GIB
    assert abs(ev["servers"][B]["tables"]["replay"]["bytes_per_item"] - ITEM) < 64
    assert "under the same host limit" in found[A].summary and B in found[A].summary
    # The fix's max_sizes fit together under 90% of the limit, at each one's own item.
    cuts = [ev["servers"][t]["tables"]["replay"]["fits_max_size"] for t in (A, B)]
    assert sum(BASE + ITEM * k for k in cuts) <= 0.9 * 1280 * MIB
    assert all(f"'replay' to {k:,}" in found[A].fix for k in cuts)


def test_shards_on_two_hosts_or_of_two_jobs_are_each_judged_alone() -> None:
    sizes = {A: 9_000, B: 9_000}
    views, now = shards(sizes, 1280 * MIB, {A: HOST, B: "boot-2 host"})
    assert exhaustion(views, now) == {}
    views, now = shards(sizes, 1280 * MIB, {A: HOST, B: None})  # a scope not read: no claim
    assert exhaustion(views, now) == {}


def test_in_one_cgroup_the_group_is_counted_once_and_an_item_from_its_own_process() -> None:
    # Filling together, the group's memory grows 128 KiB for each item of either table: read
    # from it, A's item would cost twice its bytes. B's table is three times A's, so A alone,
    # at that doubled item, reads 200+200+375+375 MiB = 1.12 GiB under 1.25 GiB, while the two
    # reach 400 MiB + 24,000 x 64 KiB = 1.86 GiB.
    scope = "boot-1 cgroup v1 4242"
    sizes = {A: 6_000, B: 18_000}
    views, now = shards(sizes, 1280 * MIB, {A: scope, B: scope}, group=True)
    alone = exhaustion(views, now, job=None)
    assert set(alone) == {B} and alone[B].evidence["bytes_per_item"] > 1.9 * ITEM
    found = exhaustion(views, now)
    assert set(found) == {A, B}
    ev = found[A].evidence
    assert ev["memory_from"] == "the cgroup's anonymous memory"
    assert ev["memory_bytes"] == 2 * (BASE + 3000 * ITEM)  # the group's, not summed twice
    assert abs(ev["projected_bytes"] - (2 * BASE + 24_000 * ITEM)) < 0.01 * GIB
    assert abs(ev["servers"][A]["tables"]["replay"]["bytes_per_item"] - ITEM) < 64
    assert "under the same cgroup limit" in found[A].summary


def test_shards_that_fit_together_raise_nothing() -> None:
    scope = "boot-1 cgroup v1 4242"
    views, now = shards({A: 4_000, B: 4_000}, 1280 * MIB, {A: scope, B: scope}, group=True)
    assert exhaustion(views, now) == {}
    views, now = shards({A: 4_000, B: 4_000}, 1280 * MIB, {A: HOST, B: HOST})
    assert exhaustion(views, now) == {}


def test_a_server_whose_tables_are_full_is_not_named_its_filling_peer_is() -> None:
    views, now = shards({A: 2_000, B: 16_000}, 1280 * MIB, {A: HOST, B: HOST})
    found = exhaustion(views, now)
    assert set(found) == {B}
    assert found[B].evidence["servers"][A]["tables"] == {}  # full: adds nothing


def test_own_filling_reads_the_process_not_its_group() -> None:
    views, _ = shards({A: 6_000, B: 18_000}, 1280 * MIB, {A: "s", B: "s"}, group=True)
    (table,) = views[A].own_filling
    assert isinstance(table, mem.FillingTable)
    assert abs(table.bytes_per_item - ITEM) < 64 and table.max_size == 6_000


def test_the_limits_scope_is_the_kernels_boot_and_the_groups_inode(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    (proc / "sys" / "kernel" / "random").mkdir(parents=True)
    (proc / "sys" / "kernel" / "random" / "boot_id").write_text("b00t\n")
    one, other = tmp_path / "job", tmp_path / "other"
    one.mkdir()
    other.mkdir()
    scope = pm.scope_of(pm.Cgroup(1, one), "cgroup v1", proc)
    assert scope == f"b00t cgroup v1 {os.stat(one).st_ino}"
    assert pm.scope_of(pm.Cgroup(1, one), "cgroup v1", proc) == scope  # two processes in it
    assert pm.scope_of(pm.Cgroup(1, other), "cgroup v1", proc) != scope
    assert pm.scope_of(None, "host", proc) == "b00t host"
    assert pm.scope_of(None, "host", tmp_path / "nowhere") is None  # not read: no claim
