"""rules_shards: a job sharded over several servers, each server judged against the others.

Each case is a job of two or three servers (views built from snapshot histories), given
their peers as the findings keeper gives them (peers.with_peers), then diagnosed one by one
by the engine: the kind the first server shows, or None. The real-Reverb reproductions are in
tests/test_repro_shards.py.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from replaywatch.diagnosis import peers, rules_shards
from replaywatch.diagnosis.engine import diagnose
from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.diagnosis.window import TargetView
from replaywatch.model import Name, Severity, TableSnapshot
from tests.builders import T20, assert_as_declared, table_history, target_view, waiting

TH = Thresholds(stall_window_s=10.0, min_history_s=2.0)
A, B, C = "shard-a:8000", "shard-b:8000", "shard-c:8000"
RISING = [10 * i for i in range(20)]


def blocked(target: str = A, samples: int = 100, **config: float) -> tuple[TableSnapshot, ...]:
    """Sampled (unless `samples` is 0) until 1004, then at max_diff (spi 1, cursor 100),
    nothing moving, inserts queued behind the worker."""
    drawn = [max(0, samples - 10 * max(0, 4 - i)) for i in range(len(T20))]
    return table_history(T20, [100 + x for x in drawn], drawn, target=target,
                         waiting_for_sampling_ms=waiting(), **config)


def sampled(target: str = B, **config: float) -> tuple[TableSnapshot, ...]:
    """A server that goes on being fed and sampled."""
    return table_history(T20, [200 + x for x in RISING], [100 + x for x in RISING],
                         target=target, **config)


def starved(target: str = B) -> tuple[TableSnapshot, ...]:
    """A server whose actors stopped: its cursor at min_diff (-100), nothing moves."""
    return table_history(T20, 100, 200, target=target, waiting_for_inserts_ms=waiting())


def job(*histories: tuple[TableSnapshot, ...], label: str | None = "pong"
        ) -> dict[str, TargetView]:
    views = {h[0].target: target_view([h], target=h[0].target) for h in histories}
    return peers.with_peers(views, {t: label for t in views} if label else {})


# (what, the job's views, the kind its first server shows or None)
SHARD_CASES: list[tuple[str, Callable[[], dict[str, TargetView]], str | None]] = [
    ("at max_diff, never sampled, its peer sampled: shard_not_sampled",
     lambda: job(blocked(samples=0), sampled()), "shard_not_sampled"),
    ("at max_diff after it was sampled, its peer sampled: shard_not_sampled",
     lambda: job(blocked(), sampled()), "shard_not_sampled"),
    ("at max_diff, its peer at min_diff and unfed, nothing sampled: waits_on_shard",
     lambda: job(blocked(), starved()), "waits_on_shard"),
    ("at max_diff, its peer able to sample but not sampled either: the learner stopped",
     lambda: job(blocked(), blocked(B)), "insert_blocked"),
    ("at max_diff, alone in its job: insert_blocked as before",
     lambda: job(blocked(), sampled(), label=None), "insert_blocked"),
    ("both sampled: nothing",
     lambda: job(sampled(A), sampled()), None),
    ("samples_per_insert 2 here, 1 on both others: shard_config_differs",
     lambda: job(sampled(A, spi=2.0), sampled(), sampled(C)), "shard_config_differs"),
    ("the two that agree are not named",
     lambda: {A: job(sampled(A), sampled(B), sampled(C, spi=2.0))[A]}, None),
]
KINDS = {Name.SHARD_NOT_SAMPLED, Name.WAITS_ON_SHARD, Name.SHARD_CONFIG_DIFFERS,
         Name.INSERT_BLOCKED}


@pytest.mark.parametrize("what,views,kind", SHARD_CASES, ids=[c[0] for c in SHARD_CASES])
def test_each_shard_case_shows_its_kind(what: str, views: Callable[[], dict[str, TargetView]],
                                        kind: str | None) -> None:
    view = next(iter(views().values()))
    found = {f.kind for f in diagnose(view, TH, T20[-1]).findings if f.kind in KINDS}
    assert found == ({kind} if kind else set()), what


def test_a_shard_not_sampled_names_its_peers_samples_over_the_span_it_rested() -> None:
    view = job(blocked(), sampled())[A]
    f = next(f for f in diagnose(view, TH, T20[-1]).findings)
    assert f.kind == Name.SHARD_NOT_SAMPLED and f.severity is Severity.CRITICAL
    assert f.since == T20[4]  # its counters last moved there
    # counted from the first poll at or after it: 15 intervals of 10
    assert f.evidence["peers_sampled"] == {B: 150}
    assert f.evidence["job"] == "pong" and f.evidence["never_sampled"] is False
    assert "It was sampled before (100 samples)" in f.summary


def test_a_peer_down_or_not_yet_polled_over_the_span_proves_nothing() -> None:
    late = sampled()[6:]  # polled only since 1006: it cannot say what it drew before
    view = job(blocked(), late)[A]
    kinds = {f.kind for f in diagnose(view, TH, T20[-1]).findings}
    assert kinds == {Name.INSERT_BLOCKED}
    stale = sampled()[:5]  # last answered at 1004: older than the stall window
    assert Name.SHARD_NOT_SAMPLED not in {f.kind for f in diagnose(
        job(blocked(), stale)[A], TH, T20[-1]).findings}


def test_waits_on_shard_says_both_readings_and_when_its_peer_stopped() -> None:
    view = job(blocked(), starved())[A]
    f = next(f for f in diagnose(view, TH, T20[-1]).findings)
    assert f.kind == Name.WAITS_ON_SHARD and f.severity is Severity.WARNING
    assert f.evidence["waits_on"] == [B] and f.evidence["waits_on_cursor"] == -100
    assert "a learner that stopped reads the same" in f.summary
    assert B in f.fix


def test_with_no_majority_every_shard_is_named_with_the_others_values() -> None:
    views = job(sampled(A), sampled(spi=2.0))
    for target, other, mine in ((A, B, 1.0), (B, A, 2.0)):
        f = next(f for f in diagnose(views[target], TH, T20[-1]).findings
                 if f.kind == Name.SHARD_CONFIG_DIFFERS)
        assert f.evidence["here"]["samples_per_insert"] == mine
        assert set(f.evidence["peers"]["samples_per_insert"]) == {other}
        assert f"on '{other}'" in f.summary


def test_peers_are_only_tables_of_the_same_name_in_the_same_job() -> None:
    other = table_history(T20, 0, 0, name="other", target=B)
    views = {A: target_view([sampled(A)], target=A), B: target_view([other], target=B),
             C: target_view([sampled(C)], target=C)}
    out = peers.with_peers(views, {A: "pong", B: "pong", C: "breakout"})
    assert out[A].job == "pong" and out[A].peers == ()  # B has no 'replay'
    assert out[C] is views[C]  # alone in its job


@pytest.mark.parametrize("rule", [rules_shards.is_shard_not_sampled,
                                  rules_shards.is_waits_on_shard])
def test_the_stall_readings_only_refine_an_insert_blocked(rule: Callable) -> None:
    from tests.builders import case
    c = case(blocked())
    assert rule(c, TH, ()) is None  # nothing proved a stall: nothing to refine


def test_each_rule_produces_its_declared_kind() -> None:
    for views, _ in ((job(blocked(), sampled()), None), (job(blocked(), starved()), None),
                     (job(sampled(A, spi=2.0), sampled(), sampled(C)), None)):
        for f in diagnose(views[A], TH, T20[-1]).findings:
            if f.kind in KINDS - {Name.INSERT_BLOCKED}:
                rule = {Name.SHARD_NOT_SAMPLED: rules_shards.is_shard_not_sampled,
                        Name.WAITS_ON_SHARD: rules_shards.is_waits_on_shard,
                        Name.SHARD_CONFIG_DIFFERS: rules_shards.is_shard_config_differs}[f.kind]
                assert_as_declared(f, rule)
