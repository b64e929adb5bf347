"""The collector renders the published picture; our fast renderer matches client_python."""

from __future__ import annotations

import dataclasses

from prometheus_client import generate_latest

from replaywatch.diagnosis.ratelimiter import derive
from replaywatch.metrics import make_registry, render
from replaywatch.model import Finding, ProbeSnapshot, Severity
from replaywatch.state import Published, SourceStatus
from tests.builders import table_history


def _published() -> Published:
    weird = 'we"ird\\table\nname'
    history = table_history([0.0, 1.0, 2.0], [10, 20, 30], [5, 15, 25], target="127.0.0.1:1",
                            name=weird)
    tables = {("127.0.0.1:1", weird): history[-1]}
    sync = dataclasses.replace(history[-1], name="sync",
                               rate_limiter=dataclasses.replace(history[-1].rate_limiter,
                                                                max_diff=1.7976931348623157e308))
    tables[("127.0.0.1:1", "sync")] = sync
    derived = {k: derive([v]) for k, v in tables.items()}
    sources = {
        "127.0.0.1:1": SourceStatus("127.0.0.1:1", "reverb", "127.0.0.1:1", True, 2.0, 2.0,
                                    None, 0.001, 0, 3, 0, 0),
        "127.0.0.1:2": SourceStatus("127.0.0.1:2", "reverb", "127.0.0.1:2", False, 2.0, None,
                                    "unreachable", 0.001, 3, 3, 3, 1),
        "http://p:1": SourceStatus("http://p:1", "probe", "127.0.0.1:1", True, 2.0, 2.0, None,
                                   0.002, 0, 3, 0, 0),
    }
    probe = ProbeSnapshot("http://p:1", 2.0, 7, "learner", 256, 12, 2, 40, True, 1.0, 1.0, 3.5,
                          1.0, None, 40, 1.0, 600, 0.0)
    finding = Finding("worker_starvation", Severity.CRITICAL, "127.0.0.1:1", weird, "s", {},
                      "f", 1.0, 2.0)
    return Published(at=2.0, cycle=3, sources=sources, tables=tables, derived=derived,
                     probes={"http://p:1": probe}, findings=(finding,))


def test_fast_render_equals_client_python_byte_for_byte() -> None:
    registry = make_registry(_published)
    assert render(registry) == generate_latest(registry)


def test_values_read_back_through_the_registry() -> None:
    registry = make_registry(_published)
    labels = {"target": "127.0.0.1:1", "table": "sync"}
    assert registry.get_sample_value("replaywatch_table_insert_blocking_disabled", labels) == 1.0
    assert registry.get_sample_value("replaywatch_table_inserts_total", labels) == 30
    assert registry.get_sample_value("replaywatch_target_up", {"target": "127.0.0.1:2"}) == 0.0
    assert registry.get_sample_value("replaywatch_late_polls_total",
                                     {"target": "127.0.0.1:2", "source": "127.0.0.1:2"}) == 1
    assert registry.get_sample_value(
        "replaywatch_probe_blocked_in_next", {"target": "127.0.0.1:1", "probe": "http://p:1"}
    ) == 1.0
    assert registry.get_sample_value(
        "replaywatch_finding_active",
        {"kind": "worker_starvation", "severity": "critical", "target": "127.0.0.1:1",
         "table": 'we"ird\\table\nname'}) == 1.0
    assert registry.get_sample_value(
        "replaywatch_table_worker_seconds_total",
        {**labels, "state": "waiting_for_inserts"}) is not None


def test_late_cycles_and_dropped_incident_writes_are_exported() -> None:
    state = dataclasses.replace(_published(), late_cycles=4, incident_log_dropped=2)
    registry = make_registry(lambda: state)
    assert registry.get_sample_value("replaywatch_late_poll_cycles_total") == 4
    assert registry.get_sample_value("replaywatch_incident_log_dropped_total") == 2
    assert render(registry) == generate_latest(registry)
