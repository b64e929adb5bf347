"""A job sharded over several real Reverb servers, each judged against the others
(rules_shards.py): shard_not_sampled, waits_on_shard and shard_config_differs.

The servers are listed in one targets file under one `job` label, as a user shards them;
actors are threads inserting into their own server, the learner a thread that samples the
servers in turn (zipped datasets do the same). A real sidecar core is ticked every 0.2 s
with a 1.5 s stall window, and every cycle whose findings change is replayed from its bundle
(the peers' tables travel in each server's view). Judged alone, each of these servers gets
the verdict of a learner that stopped (insert_blocked, critical); judged with its job it
gets its cause.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import reverb

from replaywatch.config import PollConfig, WatchConfig
from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.model import Finding, Name, Severity
from replaywatch.state import Published
from replaywatch.wiring import Sidecar, build_sidecar
from tests.support.repro import (
    DEADLINE_S,
    POLL_S,
    SLACK_S,
    WINDOW_S,
    Loop,
    actor,
    alarms,
    table,
    tick_until,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

# Sampling waits at min_diff once an actor stops, and inserts at max_diff once the learner
# stops sampling a server: both within a second.
LIMITER = dict(samples_per_insert=4.0, min_size_to_sample=20, error_buffer=40.0)


def limiter(**changed: float) -> reverb.rate_limiters.RateLimiter:
    return reverb.rate_limiters.SampleToInsertRatio(**{**LIMITER, **changed})


@pytest.fixture
def servers() -> Iterator[list[reverb.Server]]:
    started: list[reverb.Server] = []
    yield started
    for server in started:
        server.stop()


def sharded(servers: list[reverb.Server], tmp_path: Path, *limiters: reverb.rate_limiters
            .RateLimiter) -> tuple[Sidecar, list[reverb.Client], list[str]]:
    """One server per limiter, one job in a targets file, and a sidecar core over them."""
    servers += [reverb.Server([table(lim)]) for lim in limiters]
    addresses = [f"127.0.0.1:{s.port}" for s in servers]
    listed = tmp_path / "targets.json"
    listed.write_text(json.dumps([{"targets": addresses, "labels": {"job": "pong"}}]))
    th = Thresholds(stall_window_s=WINDOW_S, min_history_s=0.5)
    sidecar = build_sidecar(WatchConfig(targets=(), targets_file=str(listed), poll=PollConfig(
        interval_s=POLL_S, history_s=300.0), thresholds=th), incidents_path=":memory:")
    return sidecar, [reverb.Client(a) for a in addresses], addresses


def reader(clients: list[reverb.Client]) -> Loop:
    """A learner that samples each of its servers in turn, as zipped datasets do."""
    return Loop(lambda: [None for c in clients for _ in c.sample("replay", num_samples=4)])


def named(state: Published, kind: str) -> list[Finding]:
    return [f for f in state.findings if f.kind == kind]


def run_until(sidecar: Sidecar, loops: list[Loop], *kinds: str
              ) -> tuple[float | None, Published]:
    """Ticks until every kind is named (10 s at most), then stops the job's loops: the
    seconds it took (None: never) and the last picture."""
    took = tick_until(sidecar, lambda s: all(named(s, k) for k in kinds), 10.0)
    state = sidecar.store.current()
    for loop in loops:
        loop.stop()
    return took, state


def healthy_then(sidecar: Sidecar, loops: list[Loop]) -> None:
    """Two seconds (past the 1.5 s window) of the job training on every shard: nothing is
    paged."""
    for loop in loops:
        loop.start()
    seen: list[Published] = []
    tick_until(sidecar, lambda s: False, 2.0, seen)
    assert not set().union(*(alarms(s) for s in seen)), [alarms(s) for s in seen][-1]


def test_a_shard_the_learner_stops_reading_is_shard_not_sampled(servers, tmp_path) -> None:
    sidecar, clients, addresses = sharded(servers, tmp_path, limiter(), limiter())
    with sidecar:
        both = reader(clients)
        loops = [actor(c) for c in clients] + [both]
        healthy_then(sidecar, loops)
        both.stop()  # the learner's dataset on the second server is gone; the first goes on
        loops.append(one := reader(clients[:1]))
        one.start()
        took, state = run_until(sidecar, loops, Name.SHARD_NOT_SAMPLED)
    assert took is not None, [(f.target, f.kind) for f in state.findings]
    print(f"\nshard_not_sampled named {took:.2f} s after the learner stopped reading it")
    assert took <= DEADLINE_S + SLACK_S + 1.0  # + the second its actor takes to max_diff
    f = named(state, Name.SHARD_NOT_SAMPLED)[0]
    assert f.target == addresses[1] and f.severity == Severity.CRITICAL
    assert not named(state, Name.INSERT_BLOCKED)  # the more specific cause replaces it
    assert f.evidence["job"] == "pong" and f.evidence["never_sampled"] is False
    assert f.evidence["peers_sampled"][addresses[0]] > 0
    assert "hangs or died" in f.summary and "stack" in f.fix


def test_a_shard_never_read_says_the_learner_does_not_read_it(servers, tmp_path) -> None:
    sidecar, clients, addresses = sharded(servers, tmp_path, limiter(), limiter())
    with sidecar:
        loops = [actor(c) for c in clients] + [reader(clients[:1])]
        for loop in loops:
            loop.start()
        took, state = run_until(sidecar, loops, Name.SHARD_NOT_SAMPLED)
    assert took is not None, [(f.target, f.kind) for f in state.findings]
    f = named(state, Name.SHARD_NOT_SAMPLED)[0]
    assert f.target == addresses[1] and f.evidence["never_sampled"] is True
    assert "do not read this server" in f.summary and addresses[1] in f.fix
    assert {g.target for g in state.findings if g.severity >= Severity.WARNING} == {
        addresses[1]}


def test_a_shard_whose_actors_stop_holds_the_others_as_waits_on_shard(servers, tmp_path
                                                                       ) -> None:
    sidecar, clients, addresses = sharded(servers, tmp_path, limiter(), limiter())
    with sidecar:
        feeding = [actor(c) for c in clients]
        loops = [*feeding, reader(clients)]
        healthy_then(sidecar, loops)
        feeding[1].stop()  # the second server's actors die: the learner waits on it
        took, state = run_until(sidecar, loops, Name.WAITS_ON_SHARD, Name.SAMPLE_BLOCKED)
    assert took is not None, [(f.target, f.kind) for f in state.findings]
    print(f"\nwaits_on_shard named {took:.2f} s after the second server's actor stopped")
    assert took <= DEADLINE_S + SLACK_S + 1.0
    held = named(state, Name.WAITS_ON_SHARD)[0]
    assert held.target == addresses[0] and held.severity == Severity.WARNING
    assert held.evidence["waits_on"] == [addresses[1]]
    assert named(state, Name.SAMPLE_BLOCKED)[0].target == addresses[1]
    # the first server's learner did not stop: it is not told so
    assert not named(state, Name.INSERT_BLOCKED)
    assert "a learner that stopped reads the same" in held.summary


def test_a_shard_started_with_another_ratio_is_shard_config_differs(servers, tmp_path
                                                                   ) -> None:
    sidecar, clients, addresses = sharded(servers, tmp_path, limiter(), limiter(),
                                          limiter(samples_per_insert=8.0))
    with sidecar:
        took = tick_until(sidecar, lambda s: bool(named(s, Name.SHARD_CONFIG_DIFFERS)), 5.0)
        state = sidecar.store.current()
    assert took is not None
    found = named(state, Name.SHARD_CONFIG_DIFFERS)
    # the one the two others disagree with, not they
    assert [f.target for f in found] == [addresses[2]]
    f = found[0]
    assert "samples_per_insert" in f.evidence["differ"] and "min_diff" in f.evidence["differ"]
    assert f.evidence["here"]["samples_per_insert"] == 8.0
    assert f.evidence["peers"]["samples_per_insert"] == {a: 4.0 for a in addresses[:2]}
