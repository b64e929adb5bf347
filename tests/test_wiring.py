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
                         "actors"]
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
