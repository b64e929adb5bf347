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
from replaywatch.bearer import token_ok as _token_ok
from replaywatch.diagnosis.figures import TableFigures
from replaywatch.diagnosis.ratelimiter import derive
from replaywatch.history import History
from replaywatch.incidents import IncidentLog
from replaywatch.metrics import make_registry
from replaywatch.model import Finding, MemorySnapshot, PollOutcome, Severity
from replaywatch.state import Published, SourceStatus, StateStore
from tests.builders import actor_snapshot, probe_snapshot, table_history

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
        tables=tables, figures={k: TableFigures(*k, derive([v])) for k, v in tables.items()},
        probes={},
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
    assert not broken.connect()
    assert client_for(published(), broken).get("/readyz").status_code == 503
    # And before the first cycle, whatever the log says.
    assert client_for(published(cycle=0)).get("/readyz").json()["problems"] == [
        "no poll cycle has completed yet"]


def probe_status(url: str, up: bool = True) -> SourceStatus:
    return SourceStatus(url, "probe", T, up, 2.0, 2.0 if up else None,
                        None if up else "unreachable", 0.001, 0 if up else 3, 3, 0, 0)


def test_probes_list_both_roles_with_the_actor_step_rate(tmp_path: Path) -> None:
    actor, trainer, never = "http://actor:1", "http://learner:1", "http://never:1"
    history = History()
    # The actor restarted at t=3 (steps dropped): the rate counts only since then.
    for t, steps in [(0.0, 100), (1.0, 110), (3.0, 0), (4.0, 5), (5.0, 15)]:
        history.record(PollOutcome(actor, "probe", t, 0.001, actor=actor_snapshot(
            t, steps, url=actor, in_call="create_item", blocked_for=2.5, waiting_on="learner",
            waiting_for=1.5)))
    state = published(
        at=5.0,
        sources={T: status(T), actor: probe_status(actor), trainer: probe_status(trainer),
                 never: probe_status(never, up=False)},
        probes={trainer: probe_snapshot(5.0, 40, url=trainer)},
        actors={actor: history.actor(actor)[-1]})
    store = StateStore()
    store.publish(state)
    client = TestClient(create_app(store, make_registry(store.current), history, None))
    body = client.get("/api/v1/probes").json()["probes"]
    by_url = {p["probe"]: p for p in body}
    assert [p["probe"] for p in body] == sorted(by_url)
    assert {u: p["role"] for u, p in by_url.items()} == {
        actor: "actor", trainer: "trainer", never: "unknown"}
    a = by_url[actor]
    assert a["steps_per_s"] == pytest.approx(15 / 2)
    assert a["snapshot"]["in_call"] == "create_item" and a["snapshot"]["blocked_for_s"] == 2.5
    assert a["snapshot"]["waiting_on"] == "learner" and a["snapshot"]["steps_total"] == 15
    assert a["snapshot"]["calls"][0] == {"call": "append", "count": 15, "errors": 0,
                                        "seconds_total": 0.5, "last_at": None}
    # A trainer's entry keeps its fields, and gains only the role.
    t = by_url[trainer]
    assert t["snapshot"]["batches_retrieved"] == 40 and t["steps_per_s"] is None
    assert set(t) == {"probe", "target", "up", "last_error", "snapshot", "role", "steps_per_s"}
    assert by_url[never]["snapshot"] is None and by_url[never]["last_error"] == "unreachable"
    metrics = client.get("/metrics").text
    assert f'replaywatch_actor_in_writer_call{{call="create_item",probe="{actor}",target="{T}"}} ' \
           "1.0" in metrics
    assert f'replaywatch_probe_up{{probe="{never}",role="unknown",target="{T}"}} 0.0' in metrics


def test_the_replays_memory_is_served_with_what_counts_against_its_limit(
        client_for: Callable[..., TestClient]) -> None:
    m = MemorySnapshot(T, 2.0, 77, 600 << 20, 1 << 30, "cgroup v1", 700 << 20, 1,
                       "--reverb-pid", 500 << 20)
    client = client_for(published(memory={T: m}))
    (doc,) = client.get("/api/v1/memory").json()["memory"]
    assert (doc["target"], doc["counted_bytes"], doc["limit_from"]) == (T, 500 << 20,
                                                                       "cgroup v1")
    metrics = client.get("/metrics").text
    assert f'replaywatch_replay_memory_bytes{{target="{T}"}} 5.24288e+08' in metrics
    assert f'replaywatch_replay_oom_kills_total{{target="{T}"}} 1.0' in metrics
    assert client_for(published()).get("/api/v1/memory").json() == {"memory": [], "tables": []}


def test_token_comparison_accepts_only_the_exact_token() -> None:
    token = "s3cret-token-for-tests"
    expected = token.encode()
    assert _token_ok(f"Bearer {token}", expected)
    assert _token_ok(f"bearer {token}", expected)
    for header in ("", "Bearer", f"Basic {token}", f"Bearer {token}x", f"Bearer {token[:-1]}"):
        assert not _token_ok(header, expected), header
