"""reconcile(): findings open, continue, update and resolve across evaluations."""

from __future__ import annotations

import dataclasses

import pytest

from replaywatch.diagnosis.lifecycle import reconcile
from replaywatch.model import Finding, Severity

T = "localhost:8000"


def finding(kind: str = "sample_blocked", since: float = 100.0, now: float = 100.0,
            target: str = T, summary: str = "blocked", severity: Severity = Severity.CRITICAL
            ) -> Finding:
    return Finding(kind, severity, target, "replay", summary, {"n": now}, "fix it",
                   since=since, last_seen=now)


def step(active, found, now, evaluated=(T,)):
    return reconcile(active, found, evaluated=set(evaluated), now=now)


def test_a_new_finding_opens() -> None:
    active, transitions = step({}, [finding()], 100.0)
    assert [t.kind for t in transitions] == ["opened"]
    assert list(active.values()) == [finding()]


def test_a_continuing_finding_keeps_its_first_since_and_writes_nothing_within_30_s() -> None:
    active, _ = step({}, [finding()], 100.0)
    # The rule now reports a later onset (its history window moved): the first one stays.
    active, transitions = step(active, [finding(since=105.0, now=110.0)], 110.0)
    assert transitions == []
    (current,) = active.values()
    assert current.since == 100.0 and current.last_seen == 110.0


def test_a_continuing_finding_is_updated_once_per_30_s() -> None:
    active, _ = step({}, [finding()], 100.0)
    written = []
    for now in range(101, 161):
        active, transitions = step(active, [finding(now=now)], float(now))
        written += [(now, t.kind) for t in transitions]
    # Slots of 30 s from since=100: entered at 130 and 160.
    assert written == [(130, "updated"), (160, "updated")]


@pytest.mark.parametrize("change", [
    {"summary": "blocked, differently"},  # the summary changed
    {"severity": Severity.WARNING},  # the severity changed
])
def test_a_changed_summary_or_severity_is_updated_at_once(change: dict) -> None:
    active, _ = step({}, [finding()], 100.0)
    changed = dataclasses.replace(finding(now=101.0), **change)
    active, transitions = step(active, [changed], 101.0)
    assert [t.kind for t in transitions] == ["updated"]
    assert transitions[0].finding.since == 100.0


def test_a_finding_no_longer_found_resolves_at_now() -> None:
    active, _ = step({}, [finding()], 100.0)
    active, transitions = step(active, [], 120.0)
    assert active == {}
    assert [(t.kind, t.finding.resolved_at, t.finding.since) for t in transitions] == [
        ("resolved", 120.0, 100.0)]


def test_findings_of_a_target_not_evaluated_stay_open() -> None:
    other = finding(target="other:8000")
    active, _ = step({}, [finding(), other], 100.0, evaluated=(T, "other:8000"))
    active, transitions = step(active, [], 101.0, evaluated=(T,))
    assert [t.finding.target for t in transitions] == [T]
    assert list(active.values()) == [other]


def test_a_finding_found_again_after_resolving_opens_anew() -> None:
    active, _ = step({}, [finding()], 100.0)
    active, _ = step(active, [], 101.0)
    active, transitions = step(active, [finding(since=150.0, now=150.0)], 150.0)
    assert [(t.kind, t.finding.since) for t in transitions] == [("opened", 150.0)]


def test_transitions_are_ordered_by_key() -> None:
    _, transitions = step({}, [finding("warmup"), finding("insert_blocked")], 100.0)
    assert [t.finding.kind for t in transitions] == ["insert_blocked", "warmup"]


def test_update_every_s_must_be_positive() -> None:
    with pytest.raises(ValueError, match=r"update_every_s \(0\)"):
        reconcile({}, [], evaluated={T}, now=1.0, update_every_s=0)


def _cycle_after(error: str | None):
    """judge_cycle on a target whose worker_starvation was open (named from stack dumps the
    cycle no longer has), its last poll failed with `error` (or answered, for None)."""
    from replaywatch.diagnosis.cycle import Inputs, judge_cycle
    from tests.builders import DEFAULT, TARGET, polls, seconds, seed_hung_table, target_view

    times = seconds(20)
    ok = [True] * 19 + [error is None]
    view = target_view([seed_hung_table()[:19]] if error else [seed_hung_table()],
                       target_polls=polls(times, ok=ok, error=error or ""))
    open_before = dataclasses.replace(finding("worker_starvation", since=1005.0, now=1018.0),
                                      target=TARGET)
    inputs = Inputs(view, 1019.0, DEFAULT, active_before=(open_before,))
    return open_before, judge_cycle({TARGET: inputs}, {open_before.key: open_before}, 1019.0)


def test_a_table_finding_is_carried_over_a_poll_the_server_did_not_answer_in_time() -> None:
    before, verdict = _cycle_after("127.0.0.1:1: ServerInfo did not answer within 0.16s")
    assert before.key in verdict.active, verdict.transitions
    assert [t for t in verdict.transitions if t.kind == "resolved"] == []


@pytest.mark.parametrize("error", ["127.0.0.1:1: connection refused", None])
def test_an_answered_or_refused_poll_carries_nothing(error: str | None) -> None:
    before, verdict = _cycle_after(error)
    assert before.key not in verdict.active
    assert [t.finding.key for t in verdict.transitions if t.kind == "resolved"] == [before.key]


def test_a_stall_open_before_an_outage_is_carried_while_reconnecting_holds_it_back() -> None:
    from replaywatch.diagnosis.cycle import Inputs, judge_cycle
    from tests.builders import (
        DEFAULT,
        SEED_LIMITER,
        TARGET,
        polls,
        seconds,
        seed_counters,
        table_history,
        target_view,
    )

    times = seconds(40)
    ok = [i < 20 or i >= 36 for i in range(40)]  # 16 polls unanswered, then 4 answered
    inserts, samples = seed_counters([12_000] * 40)
    table = tuple(s for s, good in zip(table_history(
        times, inserts, samples, waiting_for_inserts_ms=[980 * i for i in range(40)],
        **SEED_LIMITER), ok) if good)
    view = target_view([table], target_polls=polls(
        times, ok=ok, error="127.0.0.1:1: ServerInfo did not answer within 0.8s"))
    before = dataclasses.replace(finding(since=1005.0, now=1018.0), target=TARGET)
    inputs = Inputs(view, 1039.5, DEFAULT, active_before=(before,))
    verdict = judge_cycle({TARGET: inputs}, {before.key: before}, 1039.5)
    assert before.key in verdict.active
    assert [t.kind for t in verdict.transitions if t.finding.key == before.key] != ["resolved"]
    assert all(f.kind != "reconnecting" for f in verdict.findings), verdict.findings


def test_an_open_finding_of_a_target_no_longer_watched_closes_as_gone() -> None:
    # A targets file or discovery dropped the target: nothing showed its stall fixed.
    from replaywatch.diagnosis.cycle import judge_cycle
    before = dataclasses.replace(finding(), since=1000.0, last_seen=1010.0)
    verdict = judge_cycle({}, {before.key: before}, 1020.0)
    assert verdict.active == {}
    assert [(t.kind, t.finding.resolved_at) for t in verdict.transitions] == [("gone", 1020.0)]
