"""`--shard I/N`: sidecars given the same list poll every target exactly once between them.

The ownership arithmetic on its own (stable, balanced, exact), the flag's bad values as one
line and exit 2, and real sidecars over real Reverb servers in a targets file: two shards
poll disjoint halves whose union is the list, export what they own and leave to the other,
and both follow an edit of the file.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from replaywatch.config import PollConfig, WatchConfig
from replaywatch.errors import ConfigError
from replaywatch.metrics import render_published
from replaywatch.model import SourceKind
from replaywatch.shards import Shard, Sharding, owner, parse_shard
from replaywatch.wiring import build_sidecar


def test_each_target_has_one_owner_the_same_everywhere_and_the_shards_balance() -> None:
    targets = [f"10.0.{i // 250}.{i % 250}:8000" for i in range(2000)]
    for n in (1, 2, 3, 8):
        shards = [Shard(i, n) for i in range(n)]
        owners = [[s.index for s in shards if s.owns(t)] for t in targets]
        assert all(len(o) == 1 for o in owners)
        sizes = [sum(1 for o in owners if o == [i]) for i in range(n)]
        # as a fair die would: within 4 standard deviations of the mean share
        mean = len(targets) / n
        assert all(abs(k - mean) <= 4 * (mean * (1 - 1 / n)) ** 0.5 for k in sizes), (n, sizes)
    # MD5, not Python's per-process hash(): pinned, so two hosts agree.
    assert [owner("127.0.0.1:8000", 2), owner("127.0.0.1:8001", 2),
            owner("replay-0.pong:8000", 3)] == [1, 0, 0]


def test_sharding_keeps_the_owned_targets_and_counts_both_sides() -> None:
    sharding = Sharding(Shard(1, 2))
    targets = {f"h:{p}" for p in range(8000, 8010)}
    kept = sharding.keep({t: t for t in targets})
    assert kept == {t for t in targets if owner(t, 2) == 1}
    assert (sharding.counts.owned, sharding.counts.others) == (len(kept), 10 - len(kept))


def test_a_jobs_servers_are_owned_together_by_the_shard_its_job_hashes_to() -> None:
    # a job sharded over ten servers is judged as one (rules_shards): one sidecar polls all
    jobs = {f"h:{p}": "pong" if p < 8010 else f"h:{p}" for p in range(8000, 8020)}
    kept = [Sharding(Shard(i, 2)).keep(jobs) for i in (0, 1)]
    pong = {t for t, j in jobs.items() if j == "pong"}
    mine = owner("pong", 2)
    assert pong <= kept[mine] and not pong & kept[1 - mine]
    assert kept[0] | kept[1] == set(jobs) and not kept[0] & kept[1]


@pytest.mark.parametrize("spec", ["2/2", "1/0", "-1/2", "a/b", "1", "1/2/3", ""])
def test_a_bad_shard_is_one_line(spec: str) -> None:
    with pytest.raises(ConfigError, match="--shard"):
        parse_shard(spec)


def test_the_flag_refuses_a_bad_shard_with_one_line_and_exit_2(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "replaywatch", "watch", "--reverb",
                           "127.0.0.1:1", "--shard", "3/3", "--db", str(tmp_path / "i.db")],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "--shard '3/3'" in lines[0], done.stderr


def polled(config: WatchConfig, tmp_path: Path, name: str,
           expected: set[str]) -> tuple[set[str], bytes]:
    """The Reverb targets one sidecar has polled, and its /metrics text.

    Ticks until it has polled `expected` or ten cycles have passed: on a loaded host a
    server's first answer can miss its cycle's deadline (it counts as late, not polled), and
    ownership is about which targets a shard ever polls, not how fast.
    """
    with build_sidecar(config, incidents_path=str(tmp_path / f"{name}.db")) as car:
        for _ in range(10):
            state = car.poller.tick()
            done = {s.target for s in state.sources.values() if s.kind == SourceKind.REVERB
                    and s.polls_total}
            if done >= expected:
                break
    return done, render_published(state)


def test_two_shards_poll_every_target_of_a_file_once_and_follow_its_edits(
        reverb_servers: Callable[[int], list[str]], tmp_path: Path) -> None:
    servers = reverb_servers(12)
    listed = tmp_path / "targets.json"
    listed.write_text(json.dumps([{"targets": servers[:8]}]))

    def shard(i: int) -> WatchConfig:
        return WatchConfig(targets=(), targets_file=str(listed), shard=Shard(i, 2),
                           poll=PollConfig(interval_s=0.5))

    seen = [polled(shard(i), tmp_path, f"s{i}", {t for t in servers[:8] if owner(t, 2) == i})
            for i in (0, 1)]
    (a, text_a), (b, text_b) = seen
    assert a | b == set(servers[:8]) and not a & b, (a, b)
    assert a == {t for t in servers[:8] if owner(t, 2) == 0}
    for text, mine in ((text_a, a), (text_b, b)):
        assert f'replaywatch_targets{{state="owned"}} {len(mine)}'.encode() in text
        assert f'replaywatch_targets{{state="others"}} {8 - len(mine)}'.encode() in text
    assert b"replaywatch_shard_count 2" in text_a and b"replaywatch_shard_index 1" in text_b
    # The file edited: each shard takes its part of the new list at its next cycle.
    with build_sidecar(shard(0), incidents_path=str(tmp_path / "r0.db")) as s0, \
            build_sidecar(shard(1), incidents_path=str(tmp_path / "r1.db")) as s1:
        s0.poller.tick()
        s1.poller.tick()
        listed.write_text(json.dumps([{"targets": servers[4:]}]))
        now = [{b.target for b in car.poller.bindings
                if b.source.kind == SourceKind.REVERB} for car in (s0, s1)]
        for _ in range(20):
            now = [{b.target for b in car.poller.bindings
                    if b.source.kind == SourceKind.REVERB}
                   for car in (s0, s1) if car.poller.tick() is not None]
            if now[0] | now[1] == set(servers[4:]):
                break
    assert now[0] | now[1] == set(servers[4:]) and not now[0] & now[1], now
