"""The composition root: a config becomes a sidecar that owns and closes its parts.

The target is a closed local port: its polls fail at once (connection refused),
which is all these tests need; no Reverb server runs.
"""

from __future__ import annotations

import io
import json
import threading
from pathlib import Path

import pytest

from replaywatch.check import run_check
from replaywatch.config import PollConfig, ProbeTarget, WatchConfig
from replaywatch.errors import ConfigError
from replaywatch.sources.probe_http import HttpProbeSource
from replaywatch.sources.reverb import ReverbSource
from replaywatch.wiring import build_sidecar

CLOSED = "127.0.0.1:1"  # nothing listens on port 1


def config(tmp_path: Path, **kw: object) -> WatchConfig:
    return WatchConfig(targets=(CLOSED,), poll=PollConfig(interval_s=0.2),
                       db_path=str(tmp_path / "state" / "incidents.db"), **kw)  # type: ignore[arg-type]


def test_the_sidecar_is_wired_from_the_config(tmp_path: Path) -> None:
    cfg = config(tmp_path, probes=(), trainer_pid=None)
    with build_sidecar(cfg) as sidecar:
        kinds = [(type(b.source), b.source.name, b.target) for b in sidecar.poller.bindings]
        assert kinds == [(ReverbSource, CLOSED, CLOSED)]
        state = sidecar.poller.tick()
        assert sidecar.store.current() is state
        assert not state.sources[CLOSED].up
        assert (tmp_path / "state").is_dir()  # the log's directory is made on build
    assert sidecar.incidents._conn is None  # closed by leaving the `with`
    sidecar.close()  # a second close is harmless


def test_probes_and_a_targets_file_become_bindings(tmp_path: Path) -> None:
    targets = tmp_path / "targets.json"
    targets.write_text(json.dumps([{"targets": ["127.0.0.1:2"],
                                    "labels": {"job": "a",
                                               "__probe_url__": "http://127.0.0.1:3"}}]))
    cfg = config(tmp_path, probes=(ProbeTarget("http://127.0.0.1:4", None),),
                 targets_file=str(targets))
    with build_sidecar(cfg, incidents_path=":memory:") as sidecar:
        got = sorted((type(b.source).__name__, b.source.name, b.target)
                     for b in sidecar.poller.bindings)
    assert got == [
        ("HttpProbeSource", "http://127.0.0.1:3", "127.0.0.1:2"),
        ("HttpProbeSource", "http://127.0.0.1:4", CLOSED),
        ("ReverbSource", "127.0.0.1:1", CLOSED),
        ("ReverbSource", "127.0.0.1:2", "127.0.0.1:2"),
    ]
    assert HttpProbeSource.kind == "probe"


def test_an_unreadable_targets_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="targets file"):
        build_sidecar(config(tmp_path, targets_file=str(tmp_path / "none.json")))


def test_start_polls_in_the_background_and_close_stops_it(tmp_path: Path) -> None:
    sidecar = build_sidecar(config(tmp_path))
    sidecar.start()
    try:
        cycle_seen = threading.Event()
        for _ in range(100):
            if sidecar.store.current().cycle >= 2:
                cycle_seen.set()
                break
            threading.Event().wait(0.05)
        assert cycle_seen.is_set()
    finally:
        sidecar.close()
    assert not any(t.name == "replaywatch-poller" and t.is_alive()
                   for t in threading.enumerate())


def test_check_json_keeps_its_shape(tmp_path: Path) -> None:
    out = io.StringIO()
    assert run_check(config(tmp_path), 0.7, as_json=True, out=out) == 0  # down is a warning
    doc = json.loads(out.getvalue())
    assert list(doc) == ["at", "targets", "probes", "tables", "findings", "insufficient_data",
                         "actors", "rule_errors", "ray"]
    assert doc["ray"] == {}  # no --ray
    (target,) = doc["targets"]
    assert list(target) == ["name", "kind", "target", "up", "last_poll_at", "last_ok_at",
                            "last_error", "last_duration_s", "consecutive_failures",
                            "polls_total", "failures_total", "late_polls_total", "labels"]
    assert target["up"] is False
    (down,) = doc["findings"]  # four failed polls at 0.2 s: target_down
    assert (down["kind"], down["severity"], down["id"]) == ("target_down", "warning",
                                                            f"target_down:{CLOSED}:")
    assert set(down) == {"id", "kind", "severity", "target", "table", "summary", "evidence",
                         "fix", "since", "last_seen", "resolved_at"}
    # check keeps its incidents in memory: nothing is written beside a running watch.
    assert not (tmp_path / "state").exists()


def test_a_rule_that_raises_is_said_in_the_state_the_api_the_metrics_and_check(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Its finding is missing: the list of findings is not the whole picture, and a user who
    # reads "findings: none" or an empty API answer must be told so.
    from fastapi.testclient import TestClient

    from replaywatch.api import create_app
    from replaywatch.diagnosis import kinds, rules
    from replaywatch.diagnosis.registry import Rule, Shape
    from replaywatch.metrics import make_registry, render

    def broken(view, th, now):
        raise KeyError("evidence")

    monkeypatch.setattr(rules, "ALL", (*rules.ALL, Rule(kinds.SPI_DRIFT, broken, Shape.VIEW)))
    with build_sidecar(config(tmp_path), incidents_path=":memory:") as sidecar:
        state = sidecar.poller.tick()
        (error,) = state.rule_errors
        assert error.startswith(f"{CLOSED}: ") and "broken: KeyError: 'evidence'" in error
        assert "replaywatch_rule_errors 1.0" in render(make_registry(sidecar.store.current)
                                                       ).decode()
        app = create_app(sidecar.store, make_registry(sidecar.store.current), sidecar.history,
                         None)
        body = TestClient(app).get("/api/v1/findings").json()
        assert body["rule_errors"] == [error]
    text, doc = io.StringIO(), io.StringIO()
    run_check(config(tmp_path), 0.3, as_json=False, out=text)
    run_check(config(tmp_path), 0.3, as_json=True, out=doc)
    assert "rule error, its finding is missing (a replaywatch bug): " in text.getvalue()
    assert json.loads(doc.getvalue())["rule_errors"] == [error]
    monkeypatch.undo()
    with build_sidecar(config(tmp_path), incidents_path=":memory:") as sidecar:
        assert sidecar.poller.tick().rule_errors == ()
        assert "replaywatch_rule_errors 0.0" in render(make_registry(sidecar.store.current)
                                                       ).decode()
