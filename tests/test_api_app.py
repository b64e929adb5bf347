"""The API through `create_app` over a hand-built published state (no server, no poller).

fastapi's TestClient drives the real app in-process: routes, error rendering,
the render cache and readiness, all read from a StateStore the test fills.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from replaywatch.api import create_app
from replaywatch.api.routes_health import METRICS_CACHE_KEY
from replaywatch.diagnosis.ratelimiter import derive
from replaywatch.history import History
from replaywatch.incidents import IncidentLog
from replaywatch.metrics import make_registry
from replaywatch.model import Finding, Severity
from replaywatch.state import Published, SourceStatus, StateStore
from tests.builders import table_history

T = "127.0.0.1:1"


def status(name: str, up: bool = True) -> SourceStatus:
    return SourceStatus(name, "reverb", name, up, 2.0, 2.0 if up else None,
                        None if up else "unreachable", 0.001, 0 if up else 3, 3, 0 if up else 3,
                        0)


def finding(kind: str, severity: Severity, since: float) -> Finding:
    return Finding(kind, severity, T, "replay", f"{kind} summary", {"n": 1}, "fix", since, 2.0)


def published(**changes: object) -> Published:
    history = table_history([0.0, 1.0, 2.0], [10, 20, 30], [5, 15, 25], target=T, name="replay")
    tables = {(T, "replay"): history[-1],
              (T, "aux"): dataclasses.replace(history[-1], name="aux")}
    state = Published(
        at=2.0, cycle=3, sources={T: status(T), "127.0.0.1:2": status("127.0.0.1:2", up=False)},
        tables=tables, derived={k: derive([v]) for k, v in tables.items()}, probes={},
        findings=(finding("spi_drift", Severity.WARNING, 1.0),
                  finding("sample_blocked", Severity.CRITICAL, 1.5),
                  finding("warmup", Severity.INFO, 0.5)),
        incident_ids={f"sample_blocked:{T}:replay": 7},
    )
    return dataclasses.replace(state, **changes)  # type: ignore[arg-type]


@pytest.fixture
def client_for(tmp_path: Path) -> Callable[..., TestClient]:
    def make(state: Published, incidents: IncidentLog | None = None) -> TestClient:
        store = StateStore()
        store.publish(state)
        app = create_app(store, make_registry(store.current), History(), incidents)
        return TestClient(app)

    return make


def test_tables_are_listed_sorted_with_their_derived_values(
        client_for: Callable[..., TestClient]) -> None:
    response = client_for(published()).get("/api/v1/tables")
    assert response.status_code == 200
    tables = response.json()["tables"]
    assert [(t["target"], t["name"]) for t in tables] == [(T, "aux"), (T, "replay")]
    assert tables[1]["rate_limiter"]["inserts"] == 30
    assert tables[1]["derived"]["cursor"] == 5.0  # 30 inserts x 1.0 - 25 samples


def test_findings_come_worst_first_with_their_incident_ids(
        client_for: Callable[..., TestClient]) -> None:
    body = client_for(published()).get("/api/v1/findings").json()
    assert [(f["kind"], f["severity"]) for f in body["findings"]] == [
        ("sample_blocked", "critical"), ("spi_drift", "warning"), ("warmup", "info")]
    assert body["findings"][0]["incident_id"] == 7
    assert body["findings"][0]["id"] == f"sample_blocked:{T}:replay"
    only = client_for(published()).get("/api/v1/findings", params={"severity": "warning"})
    assert [f["kind"] for f in only.json()["findings"]] == ["spi_drift"]


def test_an_unknown_target_or_table_is_a_404_json_error(
        client_for: Callable[..., TestClient]) -> None:
    client = client_for(published())
    for path, message in [
        ("/api/v1/tables?target=nope:1", "unknown target 'nope:1'"),
        ("/api/v1/tables/nope:1/replay/history", "unknown target 'nope:1'"),
        (f"/api/v1/tables/{T}/nope/history", f"unknown table 'nope' on target '{T}'"),
        ("/api/v1/nowhere", "no such endpoint '/api/v1/nowhere'"),
    ]:
        response = client.get(path)
        assert (response.status_code, response.json()) == (404, {"error": message}), path
        assert response.headers["content-type"] == "application/json"


def test_metrics_are_served_from_the_cached_body_of_the_cycle(
        client_for: Callable[..., TestClient]) -> None:
    client = client_for(published())
    fresh = client.get("/metrics")
    assert fresh.status_code == 200
    assert f'replaywatch_target_up{{target="{T}"}} 1.0' in fresh.text
    # What the poller's warm-up put in the cache for this cycle is what a scrape gets.
    app = client.app
    app.state.cache = type(app.state.cache)()  # type: ignore[attr-defined]
    app.state.cache.get(METRICS_CACHE_KEY, 3, lambda: b"# warmed by the poller\n")  # type: ignore[attr-defined]
    assert client.get("/metrics").text == "# warmed by the poller\n"


def test_readyz_is_503_while_the_incident_log_fails(
        client_for: Callable[..., TestClient], tmp_path: Path) -> None:
    assert client_for(published()).get("/readyz").status_code == 200
    failing = client_for(published(incident_log_error="OperationalError: disk I/O error"))
    response = failing.get("/readyz")
    assert response.status_code == 503
    assert response.json()["problems"] == ["incident log: OperationalError: disk I/O error"]
    # Also when the log itself reports it (a reader saw it before the next cycle).
    broken = IncidentLog(str(tmp_path / "missing-dir" / "incidents.db"))
    assert not broken.open()
    assert client_for(published(), broken).get("/readyz").status_code == 503
    # And before the first cycle, whatever the log says.
    assert client_for(published(cycle=0)).get("/readyz").json()["problems"] == [
        "no poll cycle has completed yet"]
