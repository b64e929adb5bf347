"""Which layout a table's job runs: declared, proven by the loop's writer or the actors'
probes, or unknown; and the probe documents that carry it."""

from __future__ import annotations

import dataclasses

import pytest

from replaywatch.diagnosis import layout as lay
from replaywatch.diagnosis.actors import Actor
from replaywatch.errors import SourceProtocolError
from replaywatch.model import FLOAT_MAX
from replaywatch.probe import TrainerProbe
from replaywatch.sources.probe_http import actor_from_probe, snapshot_from_probe
from tests.builders import ACTOR, actor_snapshot, polls, probe_snapshot, table_snapshot

FINITE = table_snapshot(1000.0, 10, 5)
DISABLED = table_snapshot(1000.0, 10, 5, max_diff=FLOAT_MAX)


def actor(**kw: object) -> Actor:
    return Actor(ACTOR, (dataclasses.replace(actor_snapshot(1000.0, 5), **kw),),
                 polls([1000.0]))


@pytest.mark.parametrize("name,table,probe,actors,declared,expected", [
    ("nothing_known_is_unknown_whatever_max_diff", FINITE, {}, (), None, (None, None)),
    ("max_diff_at_float_max_alone_is_still_unknown", DISABLED, {}, (), None, (None, None)),
    ("a_probe_declares_it", FINITE, {"layout": "async"}, (), None, ("async", "declared")),
    ("the_sidecar_setting_declares_it", FINITE, {}, (), "sync-ratio",
     ("sync-ratio", "declared")),
    ("a_loop_writer_with_a_finite_max_diff_is_a_sync_loop_its_gate_unknown", FINITE,
     {"items_inserted": 3}, (), None, ("sync", "loop writer")),
    ("a_wrapped_writer_proves_it_before_the_first_insert", FINITE,
     {"writers_wrapped": 1}, (), None, ("sync", "loop writer")),
    ("the_loop_writer_wins_over_an_actor_probe_on_the_same_loop", DISABLED,
     {"writers_wrapped": 1}, (actor(),), None, ("sync", "loop writer")),
    ("a_loop_writer_with_blocking_disabled_is_sync", DISABLED,
     {"items_inserted": 3, "inserts_on_next_thread": True}, (), None, ("sync", "loop writer")),
    ("a_writer_on_another_thread_than_next_proves_nothing", FINITE,
     {"items_inserted": 3, "inserts_on_next_thread": False}, (), None, (None, None)),
    ("actors_with_a_lag_bound_are_async_lag", FINITE, {},
     (actor(max_policy_lag=5), actor(max_policy_lag=3)), None, ("async-lag", "actor probes")),
    ("actors_that_never_waited_are_async", FINITE, {}, (actor(),), None,
     ("async", "actor probes")),
    ("actors_that_waited_without_a_bound_are_unknown", FINITE, {}, (actor(waits_total=2),),
     None, (None, None)),
])
def test_resolve(name: str, table: object, probe: dict, actors: tuple, declared: str | None,
                 expected: tuple) -> None:
    known = lay.resolve(table, (probe_snapshot(1000.0, 0, **probe),), actors, declared)
    assert (known.kind, known.basis) == expected


def test_a_declared_async_lag_takes_the_smallest_bound_the_actors_declare() -> None:
    known = lay.resolve(FINITE, (), (actor(max_policy_lag=4), actor(max_policy_lag=2)),
                        "async-lag")
    assert known.max_policy_lag == 2 and known.model() is not None


def test_the_probe_and_the_model_name_the_same_layouts() -> None:
    from replaywatch import model
    from replaywatch.probe import protocol
    assert model.Layout is protocol.Layout and model.Gate is protocol.Gate
    assert TrainerProbe(layout=protocol.Layout.ASYNC_LAG).snapshot()["layout"] == "async-lag"
    with pytest.raises(ValueError, match="sync, sync-ratio, async, async-lag"):
        TrainerProbe(layout="synchronous")


def test_the_trainer_document_carries_the_dataset_and_the_loop() -> None:
    probe = TrainerProbe(batch_size=256, num_parallel_calls=12, max_in_flight=512,
                         iterators_per_worker=3, item_bytes=63504, layout="sync")
    snap = snapshot_from_probe(probe.snapshot(), "http://p", 1000.0)
    s = snap.pipeline
    assert (s.max_in_flight, s.iterators_per_worker, s.item_bytes, snap.layout) == (
        512, 3, 63504, "sync")
    assert snap.items_inserted == 0 and snap.inserts_on_next_thread is None


def test_a_document_with_an_unknown_layout_is_a_protocol_error() -> None:
    doc = TrainerProbe(batch_size=4).snapshot() | {"layout": "pipelined"}
    with pytest.raises(SourceProtocolError, match="pipelined"):
        snapshot_from_probe(doc, "http://p", 1000.0)


def test_the_actor_document_carries_its_lag_bound() -> None:
    from replaywatch.probe import ActorProbe
    snap = actor_from_probe(ActorProbe(max_policy_lag=3).snapshot(), "http://a", 1000.0)
    assert snap.max_policy_lag == 3


def test_the_layout_setting_comes_from_the_flag_or_the_config_file(tmp_path: object) -> None:
    from pathlib import Path

    from replaywatch.cli import build_parser, config_from_args
    from replaywatch.errors import ConfigError

    f = Path(str(tmp_path)) / "job.toml"
    f.write_text('layout = "sync-ratio"\n[thresholds]\nstall_window_s = 20\n')
    parse = build_parser().parse_args
    from_file = config_from_args(parse(["check", "--reverb", "127.0.0.1:1", "--config",
                                        str(f)]), {})
    assert from_file.layout == "sync-ratio" and from_file.thresholds.stall_window_s == 20
    flag = config_from_args(parse(["check", "--reverb", "127.0.0.1:1", "--config", str(f),
                                   "--layout", "async"]), {})
    assert flag.layout == "async"  # the flag wins over the file
    f.write_text('layout = "pipelined"\n')
    with pytest.raises(ConfigError, match="layout 'pipelined' must be one of"):
        config_from_args(parse(["check", "--reverb", "127.0.0.1:1", "--config", str(f)]), {})


def test_the_declared_setting_reaches_the_rules() -> None:
    from replaywatch.diagnosis.engine import diagnose
    from tests.builders import DEFAULT, probe_history, seconds, table_history, target_view

    times = seconds(5)
    # A finite max_diff and nothing declared: unknown, nothing predicted; declared sync-ratio:
    # error_buffer 101 (spi 1, min_size 1, min_diff -100) is below a batch of 256.
    view = target_view([table_history(times, 0, 0)], [probe_history(times, 0)])
    assert [f.kind for f in diagnose(view, DEFAULT, 1004.0).findings] == []
    declared = diagnose(view, DEFAULT, 1004.0, layout="sync-ratio").findings
    assert [f.kind for f in declared] == ["batch_exceeds_headroom"]
    assert declared[0].evidence["layout_basis"] == "declared"
