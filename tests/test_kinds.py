"""The finding-kind declaration: complete, consistent, and the one ordering of findings."""

from __future__ import annotations

from replaywatch.diagnosis import kinds
from replaywatch.diagnosis.kinds import ALL, BY_NAME, worst_first
from replaywatch.model import Finding, Severity
from tests import test_rules_actors as ac
from tests import test_rules_checkpoint as ck
from tests import test_rules_config as cf
from tests import test_rules_health as h
from tests import test_rules_learner as lr
from tests import test_rules_liveness as lv
from tests import test_rules_memory as mm
from tests import test_rules_queue as q
from tests import test_rules_rllib as rl
from tests import test_rules_shards as sh
from tests import test_rules_stalls as st
from tests import test_rules_startup as s
from tests import test_rules_throughput as tp
from tests import test_rules_windows as w


def _finding(kind: str, severity: Severity, since: float = 0.0, table: str = "t") -> Finding:
    return Finding(kind, severity, "host:1", table, "s", {"n": 1}, "f", since=since,
                   last_seen=since)


def test_precedence_never_puts_a_milder_kind_before_a_worse_one() -> None:
    severities = [k.severity for k in ALL]
    assert severities == sorted(severities, reverse=True)


def test_a_kind_comes_before_the_kinds_of_its_severity_it_supersedes() -> None:
    # Across severities the order is by severity (learner_starting, info, supersedes critical
    # stalls during start-up); the engine's supersession is by presence, not by order.
    for k in ALL:
        for loser in k.supersedes:
            if BY_NAME[loser].severity == k.severity:
                assert kinds.precedence(k.name) < kinds.precedence(loser), (k.name, loser)
            assert k.name in kinds.superseded_by(loser)


def test_names_are_unique_and_every_declared_constant_is_listed() -> None:
    assert len(BY_NAME) == len(ALL)
    constants = {v for v in vars(kinds).values() if isinstance(v, kinds.Kind)}
    assert constants == set(ALL)


def test_worst_first_orders_by_severity_then_precedence_then_age() -> None:
    found = [_finding("warmup", Severity.INFO), _finding("spi_drift", Severity.WARNING, 5.0),
             _finding("sample_blocked", Severity.CRITICAL, 9.0),
             _finding("worker_starvation", Severity.CRITICAL, 9.0, table="u"),
             _finding("spi_drift", Severity.WARNING, 1.0, table="u"),
             _finding("gone_kind", Severity.WARNING, 0.0)]
    assert [(f.kind, f.since) for f in worst_first(found)] == [
        ("worker_starvation", 9.0), ("sample_blocked", 9.0), ("spi_drift", 1.0),
        ("spi_drift", 5.0), ("gone_kind", 0.0), ("warmup", 0.0)]


def test_a_finding_document_has_its_id_and_severity_by_name() -> None:
    doc = _finding("sample_blocked", Severity.CRITICAL, 3.0).to_document()
    assert doc == {"id": "sample_blocked:host:1:t", "kind": "sample_blocked",
                   "severity": "critical", "target": "host:1", "table": "t", "summary": "s",
                   "evidence": {"n": 1}, "fix": "f", "since": 3.0, "last_seen": 3.0,
                   "resolved_at": None}


def test_the_markdown_table_has_one_row_per_kind_in_precedence_order() -> None:
    rows = kinds.markdown_table().splitlines()[2:]
    assert [r.split("`")[1] for r in rows] == [k.name for k in ALL]
    assert rows[0].startswith("| `worker_starvation` | critical | ")
    assert all(r.count(" | ") == 3 for r in rows)


def test_every_declared_kind_is_produced_by_some_rule_case() -> None:
    expected = {c[-1] for c in [*st.TABLE_CASES, *st.SPI_CASES, *ac.STARVATION_CASES,
                                *lr.PROBE_CASES, *cf.PROBE_CASES, *lv.VIEW_CASES,
                                *ac.WRITER_CASES,
                                *s.STARTUP_CASES, *s.STARTUP_VIEW_CASES,
                                *q.QUEUE_CASES, *tp.THROUGHPUT_CASES, *w.WINDOW_CASES,
                                *mm.MEMORY_CASES, *mm.LEAK_CASES, *h.HEALTH_CASES,
                                *rl.RLLIB_CASES, *ck.CHECKPOINT_CASES,
                                *sh.SHARD_CASES]}
    assert expected - {None} == set(BY_NAME)


def test_every_kind_is_named_by_the_enum_and_every_name_declared() -> None:
    assert [k.name for k in ALL] and {k.name for k in ALL} == set(kinds.Name)
    assert all(isinstance(k.name, kinds.Name) for k in ALL)
    assert all(isinstance(s, kinds.Name) for k in ALL for s in k.supersedes)
    assert kinds.Name.SAMPLE_BLOCKED == "sample_blocked"  # findings and the log keep strings
