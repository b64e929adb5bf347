"""The settings rules of diagnosis/rules_config.py (settings that will hang):
batch_exceeds_headroom, deadlock_risk and declared_pipeline_differs, one table row per case,
each with why; then the fixes deadlock_risk proves and what the declared pipeline is held to.

Times are 1 s polls from t=1000 (T20 = 1000 .. 1019); one snapshot proves a setting.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from replaywatch.diagnosis import rules_config
from replaywatch.diagnosis.actors import Actor
from replaywatch.diagnosis.case import TableCase
from replaywatch.model import FLOAT_MAX, PipelineShape, ProbeSnapshot, Severity, TableSnapshot
from tests.builders import (
    ACTOR,
    DEFAULT,
    SEED_BLOCKING_LIMITER,
    T20,
    ProbeScenario,
    actor_snapshot,
    assert_as_declared,
    case,
    polls,
    probe_history,
    probe_snapshot,
    seed_healthy,
    seed_hung_table,
    table_history,
    with_probe,
)


def with_waiting_actor(table: tuple[TableSnapshot, ...], probe: tuple[ProbeSnapshot, ...]
                       ) -> tuple[TableCase, tuple[ProbeSnapshot, ...]]:
    """An actor probe that has waited on the learner (a policy-lag bound) at times."""
    waited = Actor(ACTOR, tuple(dataclasses.replace(actor_snapshot(t, 500), waits_total=3)
                                for t in T20), polls(T20))
    return case(table, probe, actors=(waited,)), probe


# -- rules that need the probe --------------------------------------------------------------------

# TF-Agents' as_dataset of 64 as the probe reads it: 32 datasets of 6, 3 threads, one batch.
READ_3_OF_32 = PipelineShape(64, 3, False, 6, 1, 1, True, 32, 16, 3, "replay")

PROBE_CASES: list[tuple[str, Callable, ProbeScenario, str | None]] = [
    # Slack 200 (max_diff 100, min_diff -100) < batch 256 + spi 1.
    ("batch_exceeds_headroom_when_slack_is_below_a_batch", rules_config.is_batch_exceeds_headroom,
     lambda: with_probe(table_history(T20, 100, 50), probe_history(T20, 0, layout="sync-ratio")),
     "batch_exceeds_headroom"),
    # The same below an unknown layout: deadlock_risk names the synchronous reading instead.
    ("no_batch_exceeds_headroom_while_the_layout_is_unknown",
     rules_config.is_batch_exceeds_headroom,
     lambda: with_probe(table_history(T20, 100, 50), probe_history(T20, 0)), None),
    # Slack 2000 holds a batch of 256 plus 1.
    ("no_batch_exceeds_headroom_with_enough_slack", rules_config.is_batch_exceeds_headroom,
     lambda: with_probe(table_history(T20, 100, 50, min_diff=-1000.0, max_diff=1000.0),
                        probe_history(T20, 0)), None),
    # Synchronous layout: unbounded slack.
    ("no_batch_exceeds_headroom_when_inserts_never_block", rules_config.is_batch_exceeds_headroom,
     lambda: with_probe(seed_hung_table(), probe_history(T20, 0)), None),
    # The seed: synchronous, 12 workers.
    # The seed's numbers on Acme's repeat-interleave (3 iterators per worker): can hang.
    ("deadlock_risk_on_the_seed_configuration", rules_config.is_deadlock_risk,
     lambda: with_probe(seed_healthy(workers=12)[0],
                        probe_history(T20, 0, workers=12, iterators_per_worker=3)),
     "deadlock_risk"),
    # The same numbers with one iterator per worker: 25600 released > 3060 strandable.
    ("no_deadlock_risk_on_the_seed_with_one_iterator_per_worker", rules_config.is_deadlock_risk,
     lambda: with_probe(*seed_healthy(workers=12, item_bytes=16)), None),
    # No signature, no declared size: frames would answer thinner than a batch.
    ("deadlock_risk_on_the_seed_when_no_signature_tells_the_item_size",
     rules_config.is_deadlock_risk, lambda: with_probe(*seed_healthy(workers=12)),
     "deadlock_risk"),
    # The seed's fix: one worker.
    ("no_deadlock_risk_on_the_seed_with_one_worker", rules_config.is_deadlock_risk,
     lambda: with_probe(*seed_healthy(workers=1)), None),
    # Blocking seed limiter: slack 51200 >= 12 * 255 + 128 = 3188.
    ("no_deadlock_risk_when_blocking_slack_covers_the_workers", rules_config.is_deadlock_risk,
     lambda: with_probe(table_history(T20, 12_000, 1_305_600, **SEED_BLOCKING_LIMITER),
                        probe_history(T20, 0, workers=12)), None),
    # A declared synchronous loop with a finite max_diff: 1128 released < 3060 strandable.
    ("deadlock_risk_when_blocking_slack_is_below_the_workers_need", rules_config.is_deadlock_risk,
     lambda: with_probe(table_history(T20, 100, 50, spi=128.0, min_diff=-1000.0,
                                      max_diff=1000.0),
                        probe_history(T20, 0, workers=12, layout="sync-ratio")),
     "deadlock_risk"),
    # The same slack with actor probes that never waited and declare no lag bound: the
    # layout is async, and free-running actors free what the workers hold.
    ("no_deadlock_risk_when_blocking_and_no_actor_waits_on_the_learner",
     rules_config.is_deadlock_risk,
     lambda: (case(table_history(T20, 100, 50, spi=128.0, min_diff=-1000.0, max_diff=1000.0),
                   probe_history(T20, 0, workers=12),
                   actors=(Actor(ACTOR, tuple(actor_snapshot(t, 500) for t in T20), polls(T20)),)),
              probe_history(T20, 0, workers=12)),
     None),
    # MinSize limiter: sampling is never held back, nothing can strand.
    ("no_deadlock_risk_with_a_min_size_limiter", rules_config.is_deadlock_risk,
     lambda: with_probe(table_history(T20, 100, 50, min_diff=-FLOAT_MAX, max_diff=FLOAT_MAX),
                        probe_history(T20, 0, workers=12)), None),
    # The probe does not know num_parallel_calls: no guess.
    ("no_deadlock_risk_when_workers_are_unknown", rules_config.is_deadlock_risk,
     lambda: with_probe(seed_healthy()[0], probe_history(T20, 0, workers=None)), None),
    # Declared 12 workers, read 3 interleave threads of 32 datasets: shown beside the read.
    ("declared_pipeline_differs_when_the_graph_says_otherwise",
     rules_config.is_declared_pipeline_differs,
     lambda: with_probe(seed_healthy()[0], probe_history(T20, 0, workers=12,
                                                         batch_size=64, pipeline=READ_3_OF_32)),
     "declared_pipeline_differs"),
    # The same pipeline declared as it is, or not declared at all: nothing to show.
    ("no_declared_pipeline_differs_when_they_agree", rules_config.is_declared_pipeline_differs,
     lambda: with_probe(seed_healthy()[0], probe_history(T20, 0, workers=3, batch_size=64,
                                                         pipeline=READ_3_OF_32)), None),
    ("no_declared_pipeline_differs_when_nothing_is_declared",
     rules_config.is_declared_pipeline_differs,
     lambda: with_probe(seed_healthy()[0], probe_history(T20, 0, workers=None,
                                                         batch_size=None,
                                                         pipeline=READ_3_OF_32)), None),
]


@pytest.mark.parametrize("name,rule,scenario,expected", PROBE_CASES,
                         ids=[c[0] for c in PROBE_CASES])
def test_probe_rule(name: str, rule: Callable, scenario: ProbeScenario,
                    expected: str | None) -> None:
    table_case, probe = scenario()
    finding = rule(table_case, probe, DEFAULT)
    assert (finding.kind if finding else None) == expected
    assert_as_declared(finding, rule)


def test_deadlock_risk_on_a_loop_with_a_finite_max_diff_gives_proven_fixes() -> None:
    # spi 128, min_size 1, min_diff -1000: error_buffer 1128 is released at each step of a
    # synchronous loop; 12 workers of 256 can hold 12 x 255 = 3060 without a batch. The
    # loop's writer is wrapped by its trainer probe: the layout is known, whatever max_diff,
    # and the probe says the loop steps on a schedule.
    table = table_history(T20, 100, 50, spi=128.0, min_diff=-1000.0, max_diff=1000.0)
    probe = probe_history(T20, 0, workers=12, writers_wrapped=1, gate="schedule")
    finding = rules_config.is_deadlock_risk(*with_probe(table, probe), DEFAULT)
    assert finding is not None
    assert finding.evidence["layout"] == "sync"
    assert (finding.evidence["gate"], finding.evidence["gate_basis"]) == ("schedule", "declared")
    assert finding.evidence["layout_basis"] == "loop writer"
    assert finding.evidence["released_samples"] == 1128
    assert finding.evidence["strandable_samples"] == 3060
    # 4 x 255 = 1020 < 1128; error_buffer 3061 > 3060; 12 x (94 - 1) = 1116 < 1128.
    assert "num_parallel_calls=4 " in finding.fix and "error_buffer=3061 " in finding.fix
    assert "batch_size=94 " in finding.fix
    # The gate not declared: a loop that waits on can_sample, its items' size unknown, may be
    # dealt thin answers, so the one fix that holds under both readings is one worker; and
    # with max_diff finite a scheduled loop runs only at the 2 inserts a step its ratio
    # pays for, which nobody said: so the fix sets that too (one worker alone hangs a loop
    # of 1 insert a step, whose credit falls by 128 a step).
    undeclared = probe_history(T20, 0, workers=12, writers_wrapped=1)
    finding = rules_config.is_deadlock_risk(*with_probe(table, undeclared), DEFAULT)
    assert finding is not None and finding.evidence["gate"] == "unknown"
    assert finding.evidence["released_samples"] == 1128
    assert [(f["knob"], f["value"], f["was"], f["together_with"]["knob"],
             f["together_with"]["value"]) for f in finding.evidence["fixes"]] == [
        ("inserts_per_step", 2, None, "num_parallel_calls", 1)]


def test_no_prediction_while_the_layout_is_unknown_and_max_diff_finite() -> None:
    # The same numbers with an actor that waited on the learner but declared no bound:
    # asynchronous or synchronous, nobody can tell, so nothing is predicted.
    table_case, probe = with_waiting_actor(
        table_history(T20, 100, 50, spi=128.0, min_diff=-1000.0, max_diff=1000.0),
        probe_history(T20, 0, workers=12))
    assert rules_config.is_deadlock_risk(table_case, probe, DEFAULT) is None


def test_deadlock_risk_with_blocking_disabled_and_no_layout_gives_both_readings() -> None:
    table, _ = seed_healthy(workers=12)
    probe = probe_history(T20, 0, workers=12, iterators_per_worker=3)
    finding = rules_config.is_deadlock_risk(*with_probe(table, probe), DEFAULT)
    assert finding is not None and finding.evidence["layout"] == "unknown"
    assert finding.evidence["judged_as"] == "sync"
    assert "If this is a synchronous loop" in finding.summary and "--layout" in finding.fix
    # What keeps it from safe: the layout first (asynchronous actors could not hang it), then
    # what predict says of the synchronous reading (its races), each with what settles it.
    assert finding.evidence["conservative"] == ["layout_unknown", "worker_split",
                                                "unread_samplers"]
    why = finding.evidence["conservative_why"]
    assert "settled by declaring the layout" in why["layout_unknown"]
    assert "can hold 39900 so, against 25600 released" in why["worker_split"]
    assert why["unread_samplers"].endswith("settled by a change: num_parallel_calls=1 (now 12)")


def test_deadlock_risk_on_the_seed_with_acme_interleave_gives_the_models_fixes() -> None:
    table, _ = seed_healthy(workers=12)
    probe = probe_history(T20, 0, workers=12, iterators_per_worker=3, layout="sync")
    finding = rules_config.is_deadlock_risk(*with_probe(table, probe), DEFAULT)
    assert finding is not None and finding.severity is Severity.WARNING
    assert finding.evidence["verdict"] == "can_hang" and finding.evidence["layout"] == "sync"
    # 12 x 255 + 24 x (512 + 4 x 256 - 1) = 39900 can be held, 25600 is released.
    assert finding.evidence["strandable_samples"] == 39900
    # The size unknown (no signature): only the fix that holds for frames too.
    assert finding.fix.startswith("Any one of: num_parallel_calls=1 ")
    assert "error_buffer=" not in finding.fix and finding.evidence["item_bytes"] is None
    # Small items by the signature: the warm-up fixes, in multiples of the granularity.
    table, _ = seed_healthy(workers=12, item_bytes=16)
    finding = rules_config.is_deadlock_risk(*with_probe(table, probe), DEFAULT)
    assert finding is not None and finding.evidence["item_bytes_from"] == "signature"
    assert "num_parallel_calls=7 " in finding.fix and "error_buffer=39900 " in finding.fix


def test_a_declared_cycle_is_tf_agents_most_not_a_contradiction_of_a_smaller_batch() -> None:
    # The README's TF-Agents recipe declares cycle_length=max_cycle_length (32); a batch of 8
    # opens min(8, 32) = 8 datasets, which the graph reads: nothing the user said was wrong.
    read = PipelineShape(8, 3, False, 3, 1, 1, True, 8, None, 3, "uniform_table")
    said = probe_snapshot(1000.0, 0, batch_size=8, workers=3, batch_after_interleave=True,
                          cycle_length=32, pipeline=read, pipeline_read=True)
    assert rules_config.declared_differs(said) == {}
    wrong = dataclasses.replace(said, declared=dataclasses.replace(said.declared, cycle_length=4))
    assert rules_config.declared_differs(wrong) == {
        "cycle_length": {"declared": 4, "read": 8}}
