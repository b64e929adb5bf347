"""The SQLite incident log, on real files in tmp_path."""

from __future__ import annotations

import dataclasses
import sqlite3
from pathlib import Path

from replaywatch.diagnosis.lifecycle import Transition, reconcile
from replaywatch.incidents import IncidentLog
from replaywatch.model import Finding, Severity
from tests.builders import table_snapshot

T = "localhost:8000"


def finding(now: float = 100.0, kind: str = "worker_starvation", **kw) -> Finding:
    return Finding(kind, Severity.CRITICAL, T, "replay", "starved", {"stranded_samples": 1536},
                   "Set num_parallel_calls=1", since=100.0, last_seen=now, **kw)


def opened_log(path: Path) -> IncidentLog:
    log = IncidentLog(str(path))
    assert log.connect()
    return log


CONTEXT = {"tables": [table_snapshot(100.0, 12_000, 1_305_600)]}


def test_the_constructor_does_no_io(tmp_path: Path) -> None:
    IncidentLog(str(tmp_path / "incidents.db"))
    assert not (tmp_path / "incidents.db").exists()


def test_open_creates_the_schema_in_wal_mode(tmp_path: Path) -> None:
    opened_log(tmp_path / "incidents.db")
    with sqlite3.connect(tmp_path / "incidents.db") as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"incidents", "events"} <= names


def test_an_incident_opens_updates_and_resolves_in_one_row(tmp_path: Path) -> None:
    log = opened_log(tmp_path / "incidents.db")
    log.apply([Transition("opened", finding())], CONTEXT)
    log.apply([Transition("updated", finding(130.0))], CONTEXT)
    log.apply([Transition("resolved", finding(130.0, resolved_at=140.0))], {})
    (row,) = log.list("all")
    assert (row["state"], row["severity"], row["table"], row["since"], row["resolved_at"]) == (
        "resolved", "critical", "replay", 100.0, 140.0)
    detail = log.get(row["id"])
    assert detail is not None
    assert [(e["transition"], e["at"]) for e in detail["events"]] == [
        ("opened", 100.0), ("updated", 130.0), ("resolved", 140.0)]
    # The evidence and the surrounding snapshots are kept as JSON; severity as its label.
    first = detail["events"][0]
    assert first["finding"]["severity"] == "critical"
    assert first["finding"]["evidence"] == {"stranded_samples": 1536}
    assert first["context"]["tables"][0]["rate_limiter"]["samples"] == 1_305_600
    assert first["context"]["tables"][0]["sampler"]["kind"] == "uniform"


def test_an_incident_whose_target_left_the_watch_closes_as_gone_not_resolved(
        tmp_path: Path) -> None:
    log = opened_log(tmp_path / "incidents.db")
    fixed = dataclasses.replace(finding(kind="deadlock_risk"), target="10.0.0.2:8000")
    log.apply([Transition("opened", finding()), Transition("opened", fixed)], {})
    log.apply([Transition("gone", finding(130.0, resolved_at=140.0)),
               Transition("resolved", dataclasses.replace(fixed, resolved_at=141.0))], {})
    rows = {r["kind"]: r for r in log.list("resolved")}
    assert {k: (r["state"], r["closed_as"], r["resolved_at"]) for k, r in rows.items()} == {
        "worker_starvation": ("resolved", "gone", 140.0),
        "deadlock_risk": ("resolved", "resolved", 141.0)}
    detail = log.get(rows["worker_starvation"]["id"])
    assert detail is not None and detail["closed_as"] == "gone"
    assert [e["transition"] for e in detail["events"]] == ["opened", "gone"]
    assert log.list("open") == [] and log.open_findings() == []


def test_list_filters_by_state_target_kind_and_severity(tmp_path: Path) -> None:
    log = opened_log(tmp_path / "incidents.db")
    warning = dataclasses.replace(finding(kind="deadlock_risk"), severity=Severity.WARNING)
    log.apply([Transition("opened", finding()), Transition("opened", warning)], {})
    log.apply([Transition("resolved", dataclasses.replace(warning, resolved_at=101.0))], {})
    assert [r["kind"] for r in log.list("open")] == ["worker_starvation"]
    assert [r["kind"] for r in log.list("resolved")] == ["deadlock_risk"]
    assert [r["kind"] for r in log.list("all", severity="warning")] == ["deadlock_risk"]
    assert log.list("all", target="elsewhere") == []
    assert [r["kind"] for r in log.list("all", kind="worker_starvation")] == ["worker_starvation"]
    assert len(log.list("all", limit=1)) == 1


def test_stacks_attach_to_the_open_incident(tmp_path: Path) -> None:
    log = opened_log(tmp_path / "incidents.db")
    log.apply([Transition("opened", finding())], {})
    stacks = {"pid": 7, "threads": [{"name": "MainThread", "frames": []}]}
    assert log.attach_stacks("worker_starvation:localhost:8000:replay", stacks)
    (row,) = log.list("open")
    assert row["has_stacks"] and log.get(row["id"])["stacks"] == stacks  # type: ignore[index]
    assert not log.attach_stacks("learner_stalled:localhost:8000:replay", stacks)


def test_reopening_after_a_crash_resumes_the_open_incident(tmp_path: Path) -> None:
    path = tmp_path / "incidents.db"
    first = opened_log(path)
    first.apply([Transition("opened", finding())], CONTEXT)
    # "Crash": no close; a new process opens the same file.
    second = opened_log(path)
    resumed = {f.key: f for f in second.open_findings()}
    assert list(resumed.values()) == [finding()]
    # The lifecycle continues it (no "opened") and keeps the original since.
    active, transitions = reconcile(resumed, [finding(105.0)], evaluated={T}, now=105.0)
    assert transitions == [] and active[finding().key].since == 100.0
    active, transitions = reconcile(active, [], evaluated={T}, now=140.0)
    second.apply(transitions, {})
    (row,) = second.list("all")
    assert row["state"] == "resolved" and row["resolved_at"] == 140.0


def test_an_opened_transition_for_an_open_incident_does_not_duplicate_it(tmp_path: Path) -> None:
    # A sidecar that lost its active map re-opens what the log still has open.
    path = tmp_path / "incidents.db"
    opened_log(path).apply([Transition("opened", finding())], {})
    log = opened_log(path)
    log.apply([Transition("opened", finding(200.0))], {})
    (row,) = log.list("all")
    assert row["last_seen"] == 200.0 and len(log.get(row["id"])["events"]) == 2  # type: ignore


def test_an_unwritable_log_sets_last_error_and_writes_once_it_can(tmp_path: Path) -> None:
    missing = tmp_path / "not-yet" / "incidents.db"
    log = IncidentLog(str(missing))
    assert log.connect() is False and log.last_error is not None
    log.apply([Transition("opened", finding())], CONTEXT)  # must not raise
    log.apply([Transition("updated", finding(130.0))], CONTEXT)
    assert log.last_error is not None and log.list("all") == []
    missing.parent.mkdir()
    log.apply([], {})  # the next poll's call retries the queued transitions
    assert log.last_error is None
    (row,) = log.list("all")
    assert [e["transition"] for e in log.get(row["id"])["events"]] == [  # type: ignore[index]
        "opened", "updated"]


def test_a_locked_database_sets_last_error_and_retries_next_call(tmp_path: Path) -> None:
    path = tmp_path / "incidents.db"
    log = IncidentLog(str(path), timeout_s=0.05)
    assert log.connect()
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")
    log.apply([Transition("opened", finding())], {})
    assert log.last_error is not None and "locked" in log.last_error
    blocker.execute("ROLLBACK")
    blocker.close()
    log.apply([], {})
    assert log.last_error is None and len(log.list("open")) == 1


def test_the_pending_queue_is_bounded(tmp_path: Path) -> None:
    log = IncidentLog(str(tmp_path / "missing" / "incidents.db"), max_pending=3)
    log.apply([Transition("opened", finding(float(i))) for i in range(5)], {})
    assert log.dropped == 2
