"""The collector renders the published picture; our fast renderer matches client_python."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess

import pytest
from prometheus_client import generate_latest

from replaywatch.diagnosis.figures import TableFigures
from replaywatch.diagnosis.ratelimiter import derive
from replaywatch.metrics import make_registry, render
from replaywatch.model import Finding, PipelineShape, ProbeSnapshot, Severity
from replaywatch.state import Published, SourceStatus
from tests.builders import actor_snapshot, table_history

ACTOR = "http://actor-0:1"


def _published() -> Published:
    weird = 'we"ird\\table\nname'
    history = table_history([0.0, 1.0, 2.0], [10, 20, 30], [5, 15, 25], target="127.0.0.1:1",
                            name=weird)
    tables = {("127.0.0.1:1", weird): history[-1]}
    sync = dataclasses.replace(history[-1], name="sync",
                               rate_limiter=dataclasses.replace(history[-1].rate_limiter,
                                                                max_diff=1.7976931348623157e308))
    tables[("127.0.0.1:1", "sync")] = sync
    figures = {k: TableFigures(*k, derive([v])) for k, v in tables.items()}
    sources = {
        "127.0.0.1:1": SourceStatus("127.0.0.1:1", "reverb", "127.0.0.1:1", True, 2.0, 2.0,
                                    None, 0.001, 0, 3, 0, 0),
        "127.0.0.1:2": SourceStatus("127.0.0.1:2", "reverb", "127.0.0.1:2", False, 2.0, None,
                                    "unreachable", 0.001, 3, 3, 3, 1),
        "http://p:1": SourceStatus("http://p:1", "probe", "127.0.0.1:1", True, 2.0, 2.0, None,
                                   0.002, 0, 3, 0, 0),
        ACTOR: SourceStatus(ACTOR, "probe", "127.0.0.1:1", False, 2.0, 1.0, "timeout", 0.002, 1,
                            3, 1, 0),
        "http://never:1": SourceStatus("http://never:1", "probe", "127.0.0.1:1", False, 2.0,
                                       None, "unreachable", 0.002, 3, 3, 3, 0),
    }
    probe = ProbeSnapshot("http://p:1", 2.0, 7, "learner", 40, True, 1.0, 1.0, 3.5,
                          1.0, None, 40, 1.0, 600, 0.0,
                          declared=PipelineShape(batch_size=256, num_parallel_calls=12,
                                                 prefetch_size=2))
    finding = Finding("worker_starvation", Severity.CRITICAL, "127.0.0.1:1", weird, "s", {},
                      "f", 1.0, 2.0)
    return Published(at=2.0, cycle=3, sources=sources, tables=tables, figures=figures,
                     probes={"http://p:1": probe}, findings=(finding,),
                     actors={ACTOR: actor_snapshot(2.0, 30, url=ACTOR, items=12, in_call="flush",
                                                   blocked_for=4.5, pending=3,
                                                   waiting_on='param"server\n')})


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


def test_actor_probes_have_their_families_with_bounded_labels() -> None:
    registry = make_registry(_published)
    who = {"target": "127.0.0.1:1", "probe": ACTOR}
    value = registry.get_sample_value
    # probe_up says the role its latest document had; "unknown" before any answered.
    assert value("replaywatch_probe_up", {**who, "role": "actor"}) == 0.0
    assert value("replaywatch_probe_up",
                 {"target": "127.0.0.1:1", "probe": "http://p:1", "role": "trainer"}) == 1.0
    assert value("replaywatch_probe_up",
                 {"target": "127.0.0.1:1", "probe": "http://never:1", "role": "unknown"}) == 0.0
    assert value("replaywatch_actor_steps_total", who) == 30
    assert value("replaywatch_actor_items_created_total", who) == 12
    assert value("replaywatch_actor_pending_items", who) == 3
    assert value("replaywatch_actor_writer_call_blocked_seconds", who) == 4.5
    assert value("replaywatch_actor_in_writer_call", {**who, "call": "flush"}) == 1.0
    assert value("replaywatch_actor_in_writer_call", {**who, "call": "create_item"}) == 0.0
    assert value("replaywatch_actor_writer_calls_total", {**who, "call": "append"}) == 30
    assert value("replaywatch_actor_waiting", who) == 1.0
    assert value("replaywatch_probe_os_threads", {**who, "role": "actor"}) == 7
    # What the actor waits on is free text: it never becomes a label.
    text = render(registry).decode()
    assert "param" not in text
    calls = {line.split('call="')[1].split('"')[0] for line in text.splitlines()
             if 'call="' in line}
    assert calls == {"append", "create_item", "flush", "end_episode", "close"}
    assert render(registry) == generate_latest(registry)


@pytest.mark.skipif(shutil.which("promtool") is None, reason="make test installs promtool")
def test_every_family_passes_promtool_check_metrics() -> None:
    done = subprocess.run(["promtool", "check", "metrics"],
                          input=render(make_registry(_published)).decode(), text=True,
                          capture_output=True, timeout=30)
    assert done.returncode == 0, done.stdout + done.stderr
