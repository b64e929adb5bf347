"""The fleet: targets grouped into jobs by their `job` label (a targets file's), a Ray job
found by discovery and an unlabelled target each a job of its own, the worst job first, and
the same rows over the real API."""

from __future__ import annotations

from fastapi.testclient import TestClient

from replaywatch.api import create_app
from replaywatch.fleet import fleet
from replaywatch.history import History
from replaywatch.metrics import make_registry
from replaywatch.model import Finding, Severity, SourceKind
from replaywatch.state import Published, SourceStatus, StateStore


def status(name: str, target: str, up: bool = True, job: str | None = None,
           kind: SourceKind = SourceKind.REVERB) -> SourceStatus:
    return SourceStatus(name, kind, target, up, 10.0, 10.0 if up else 1.0,
                        None if up else "unreachable", 0.01, 0 if up else 3, 10, 0, 0,
                        labels=(("job", job),) if job else ())


def finding(kind: str, target: str, severity: Severity, since: float = 5.0) -> Finding:
    return Finding(kind, severity, target, "replay", f"{kind} on {target}", {}, "fix",
                   since=since, last_seen=10.0)


RAY = "http://127.0.0.1:8265 job 02000000"
STATE = Published(
    at=10.0, cycle=3, tables={}, probes={},
    sources={s.name: s for s in (
        # a job sharding its experience over two servers, one probe on the first
        status("r0:8000", "r0:8000", job="pong"), status("r1:8000", "r1:8000", job="pong"),
        status("http://l:8001", "r0:8000", job="pong", kind=SourceKind.PROBE),
        # a healthy job, one whose server is down, a Ray job found by discovery
        status("q0:8000", "q0:8000", job="quiet"),
        status("d0:8000", "d0:8000", up=False, job="dark"),
        status(RAY, RAY, kind=SourceKind.RAY),
        status("solo:8000", "solo:8000"))},
    findings=(finding("worker_starvation", "r1:8000", Severity.CRITICAL),
              finding("spi_drift", "r0:8000", Severity.WARNING),
              finding("warmup", "solo:8000", Severity.INFO),
              finding("env_runner_stalled", RAY, Severity.WARNING, since=2.0)))


def test_jobs_group_their_targets_and_the_worst_comes_first() -> None:
    rows = [j.document() for j in fleet(STATE)]
    assert [(r["job"], r["health"]) for r in rows] == [
        ("pong", "critical"), (RAY, "warning"), ("dark", "down"), ("solo:8000", "info"),
        ("quiet", "ok")]
    pong = rows[0]
    assert pong["targets"] == ["r0:8000", "r1:8000"] and pong["sources"] == 3
    assert pong["findings"] == {"critical": 1, "warning": 1}
    assert pong["worst"]["kind"] == "worker_starvation" and pong["worst"]["target"] == "r1:8000"
    assert rows[2]["down"] == ["d0:8000"] and rows[2]["worst"] is None


def test_the_fleet_over_the_api() -> None:
    store = StateStore()
    store.publish(STATE)
    with TestClient(create_app(store, make_registry(store.current), History())) as client:
        got = client.get("/api/v1/fleet")
    assert got.status_code == 200
    assert [j["job"] for j in got.json()["jobs"]] == ["pong", RAY, "dark", "solo:8000",
                                                      "quiet"]
