"""A synchronous loop's gate, learned from its own next() calls (diagnosis/layout.py): the
strides of a schedule, the bursts of a loop that waits on can_sample, and a loop inside next()
for a batch its limiter never released."""

from __future__ import annotations

import dataclasses

import pytest

from replaywatch.diagnosis import budget
from replaywatch.diagnosis import layout as lay
from replaywatch.diagnosis.budget import CAN_SAMPLE, SCHEDULE
from replaywatch.model import FLOAT_MAX, NextStrides
from tests.builders import probe_snapshot, table_history

# (name, strides, gate learned, inserts_per_step)
STRIDES = [
    ("too_few_calls_say_nothing", NextStrides(1000, 1028, 7, 4, 4), None, None),
    ("a_schedule_of_4_moves_in_4s", NextStrides(1000, 1032, 8, 4, 4), SCHEDULE, 4.0),
    ("a_schedule_of_2_5_moves_in_2s_and_3s", NextStrides(200, 225, 10, 2, 3), SCHEDULE, 2.5),
    ("several_steps_an_insert_move_in_0s_and_1s", NextStrides(200, 204, 12, 0, 1), SCHEDULE,
     1 / 3),
    ("a_burst_and_wide_strides_wait_on_can_sample", NextStrides(1000, 1600, 20, 0, 256),
     CAN_SAMPLE, None),
    ("wide_strides_never_zero_are_neither", NextStrides(1000, 1100, 20, 2, 9), None, None),
]


@pytest.mark.parametrize("name,strides,gate,k", STRIDES, ids=[s[0] for s in STRIDES])
def test_learned_gate(name: str, strides: NextStrides, gate: str | None, k: float | None
                      ) -> None:
    learned = lay.learned_gate(strides)
    assert (learned or {}).get("gate") == gate
    if k is not None:
        assert learned is not None and learned["inserts_per_step"] == pytest.approx(k)
        assert "first_step_at" not in learned  # the loop's count overstates the table's


def sync_table(inserts: int, e: float = 100.0):
    # spi 1, min_size 1000, insert blocking disabled: released = inserts - 1000 + e.
    return table_history([1000.0], inserts, 0, size=min(inserts, 5000), spi=1.0,
                         min_size=1000, min_diff=1000.0 - e, max_diff=FLOAT_MAX)[-1]


def loop_probe(blocked_for: float, batches: int = 0, **declared):
    return probe_snapshot(1000.0, batches, blocked_for=blocked_for, batch_size=256,
                          writers_wrapped=1, items_inserted=1000,
                          next_strides=NextStrides(1000, 1000, 0, 0, 0), **declared)


def test_a_loop_inside_next_for_a_batch_never_released_steps_on_a_schedule() -> None:
    # 100 released and none consumed, the loop asks for 256: no can_sample loop does that.
    known = lay.resolve(sync_table(1000), (loop_probe(3.0),), ())
    assert (known.kind, known.gate, known.first_step_at) == ("sync", SCHEDULE, 1000)
    assert "100 released and unconsumed" in str(known.gate_basis)
    # A moment inside next() may be compared with counters from before its last inserts.
    assert lay.resolve(sync_table(1000), (loop_probe(0.5),), ()).gate is None
    # A batch's worth released: a loop that waits on can_sample may be inside next() too.
    assert lay.resolve(sync_table(1156), (loop_probe(3.0),), ()).gate is None


def test_a_declared_gate_wins_and_a_probe_without_the_loop_writer_learns_nothing() -> None:
    declared = loop_probe(3.0, gate=CAN_SAMPLE)
    known = lay.resolve(sync_table(1000), (declared,), ())
    assert (known.gate, known.gate_basis) == (CAN_SAMPLE, "declared")
    # Its inserts not counted, the probe's strides say nothing of the loop's gate.
    unwrapped = probe_snapshot(1000.0, 0, blocked_for=3.0, batch_size=256,
                               next_strides=NextStrides(0, 0, 20, 0, 0))
    assert lay.synchronous_reading(sync_table(1000), (unwrapped,)).gate is None


def test_the_sidecars_gate_flags_make_one_declared_spec(tmp_path: object) -> None:
    from pathlib import Path

    from replaywatch.cli import build_parser, config_from_args
    from replaywatch.errors import ConfigError

    parse = build_parser().parse_args
    base = ["check", "--reverb", "127.0.0.1:1"]
    got = config_from_args(parse([*base, "--layout", "sync", "--gate", "schedule",
                                  "--inserts-per-step", "4", "--first-step-at", "1000"]), {})
    assert got.layout == "sync gate=schedule inserts_per_step=4 first_step_at=1000"
    assert config_from_args(parse([*base, "--gate", "can-sample"]), {}).layout == (
        "gate=can_sample")
    with pytest.raises(ConfigError, match="go with --gate schedule"):
        config_from_args(parse([*base, "--first-step-at", "10"]), {})
    with pytest.raises(ConfigError, match="go with gate=schedule"):
        config_from_args(parse([*base, "--gate", "can-sample", "--inserts-per-step", "2"]), {})
    f = Path(str(tmp_path)) / "job.toml"
    f.write_text('layout = "sync gate=schedule inserts_per_step=2"\n')
    assert config_from_args(parse([*base, "--config", str(f)]), {}).layout == (
        "sync gate=schedule inserts_per_step=2")
    f.write_text('layout = "sync gate=sometimes"\n')
    with pytest.raises(ConfigError, match="gate 'sometimes' must be one of"):
        config_from_args(parse([*base, "--config", str(f)]), {})


def test_a_gate_the_sidecar_is_told_reaches_the_model() -> None:
    from replaywatch.diagnosis.engine import diagnose
    from tests.builders import DEFAULT, probe_history, seconds, target_view

    times = seconds(5)
    # Insert blocking disabled, spi 1, error_buffer 100, batches of 256: safe for a loop that
    # waits on can_sample, a hang for one on a schedule.
    table = table_history(times, 0, 0, spi=1.0, min_size=1000, min_diff=900.0,
                          max_diff=FLOAT_MAX)
    view = target_view([table], [probe_history(times, 0, item_bytes=16)])

    def risk(layout: str | None) -> dict | None:
        found = [f for f in diagnose(view, DEFAULT, 1004.0, layout=layout).findings
                 if f.kind in ("deadlock_risk", "batch_exceeds_headroom")]
        return found[0].evidence if found else None

    unknown = risk(None)
    assert unknown is not None and unknown["judged_gate"] == SCHEDULE
    assert risk("gate=can_sample") is None
    told = risk("sync gate=schedule")
    assert told is not None and (told["gate"], told["gate_basis"]) == (SCHEDULE, "declared")


def test_the_documents_carry_the_gate_the_pipeline_and_the_actors_bound() -> None:
    from replaywatch.probe import ActorProbe, TrainerProbe
    from replaywatch.sources.probe_http import actor_from_probe, snapshot_from_probe

    probe = TrainerProbe(batch_size=64, num_parallel_calls=3, batch_after_interleave=True,
                         cycle_length=32, gate="schedule", inserts_per_step=4,
                         first_step_at=202)
    snap = snapshot_from_probe(probe.snapshot(), "http://p", 1000.0)
    assert (snap.gate, snap.inserts_per_step, snap.first_step_at) == (SCHEDULE, 4.0, 202)
    assert (snap.pipeline.batch_after_interleave, snap.pipeline.cycle_length) == (True, 32)
    assert snap.next_strides is None  # no next() yet
    it = probe.wrap(iter(range(3)))
    next(it), next(it)
    assert snapshot_from_probe(probe.snapshot(), "http://p", 1.0).next_strides == NextStrides(
        0, 0, 1, 0, 0)
    actor = actor_from_probe(ActorProbe(max_items_ahead=8).snapshot(), "http://a", 1000.0)
    assert (actor.max_items_ahead, actor.max_policy_lag) == (8, None)
    for bad in ({"gate": "sometimes"}, {"inserts_per_step": 0}, {"cycle_length": -1}):
        with pytest.raises(ValueError):
            TrainerProbe(batch_size=4, **bad)
    with pytest.raises(ValueError, match="one bound"):
        ActorProbe(max_policy_lag=2, max_items_ahead=2)


def test_actors_bounded_by_items_ahead_are_async_lag_with_that_bound() -> None:
    from replaywatch.diagnosis.actors import Actor
    from tests.builders import actor_snapshot

    finite = table_history([1000.0], 2000, 100, spi=4.0, min_size=200, min_diff=760.0,
                           max_diff=840.0)[-1]
    ahead = Actor("http://a", (dataclasses.replace(actor_snapshot(1000.0, 5),
                                                   max_items_ahead=8),), ())
    known = lay.resolve(finite, (), (ahead,))
    assert (known.kind, known.max_items_ahead, known.basis) == ("async-lag", 8, "actor probes")
    model = known.model()
    assert model is not None and model.max_items_ahead == 8 and model.max_policy_lag is None


def test_a_bundle_carries_the_gate_the_strides_and_the_read_pipeline() -> None:
    from replaywatch.codec import decode, encode
    from replaywatch.model import PipelineShape, ProbeSnapshot
    from tests.builders import probe_snapshot

    snap = probe_snapshot(
        1.0, 3, gate=SCHEDULE, inserts_per_step=4.0, first_step_at=202,
        next_strides=NextStrides(204, 216, 3, 4, 4), pipeline_read=True,
        pipeline=PipelineShape(64, 3, False, 6, 1, 1, True, 32, 16, 3, "experience"))
    assert decode(ProbeSnapshot, encode(snap)) == snap  # analyze replays what was judged


def test_a_trainer_without_tensorflow_is_told_so_and_never_imports_it() -> None:
    import subprocess
    import sys

    code = ("import sys, time; from replaywatch.probe import TrainerProbe; p = TrainerProbe(); "
            "it = p.wrap(iter([1, 2])); next(it); time.sleep(0.3); "
            "print(p.snapshot()['pipeline'], 'tensorflow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60).stdout.strip()
    assert out == ("{'read': False, 'reason': 'TensorFlow is not imported in this process'} "
                   "False")


def test_an_early_ask_proves_the_gate_not_the_stride_and_fixes_forget_what_it_read() -> None:
    known = lay.resolve(sync_table(1000), (loop_probe(3.0),), ())
    assert (known.gate, known.stride_known, known.inserts_per_step) == (SCHEDULE, False, None)
    model = known.model()
    assert model is not None and not model.stride_known and model.first_step_at == 1000
    # The fixed run is judged from its first poll: gate unknown, first step at min_size.
    fixing = known.fix_model(budget.Limiter.ratio(1, 1000, 100))
    assert fixing is not None
    assert (fixing.gate, fixing.first_step_at, fixing.stride_known) == (None, None, False)
    # A gate learned from enough strides is the loop's own, and its K with it.
    learned = lay.resolve(sync_table(1156), (dataclasses.replace(
        loop_probe(0.0), next_strides=NextStrides(1000, 1032, 8, 4, 4)),), ())
    assert (learned.gate, learned.stride_known, learned.inserts_per_step) == (SCHEDULE, True, 4)
    assert learned.fix_model(budget.Limiter.ratio(1, 1000, 100)) == learned.model()
