"""Each rule, on constructed histories: one table row per case, each with why.

Times are 1 s polls from t=1000 unless a case says otherwise; `now` is the
newest poll. The stall window is the default 10 s.
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from replaywatch.diagnosis import (
    kinds,
    rules,
    rules_actors,
    rules_config,
    rules_learner,
    rules_liveness,
    rules_stalls,
)
from replaywatch.diagnosis.actors import Actor
from replaywatch.diagnosis.case import TableCase
from replaywatch.diagnosis.engine import diagnose
from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.diagnosis.window import TargetView
from replaywatch.model import (
    FLOAT_MAX,
    ActorSnapshot,
    Finding,
    PipelineShape,
    ProbeSnapshot,
    Severity,
    TableSnapshot,
)
from tests.builders import (
    ACTOR,
    DEFAULT,
    SEED_BATCHES,
    SEED_BLOCKING_LIMITER,
    SEED_FROZEN_INSERTS,
    SEED_FROZEN_SAMPLES,
    SEED_LIMITER,
    T20,
    actor,
    actor_snapshot,
    assert_as_declared,
    async_hung_table,
    case,
    dead_actor,
    in_writer,
    polls,
    probe_history,
    probe_snapshot,
    seconds,
    seed_healthy,
    seed_hung_probe,
    seed_hung_table,
    silent_actor,
    table_history,
    target_view,
    waiting,
)

FROZEN = [5] * 20


# -- table rules ---------------------------------------------------------------------------------

Scenario = Callable[[], TableCase]

TABLE_CASES: list[tuple[str, Callable[[TableCase, Any], Finding | None], Scenario,
                        str | None]] = [
    # Nothing moved for 19 s, the cursor sits at min_diff and the worker waits for inserts.
    ("sample_blocked_when_nothing_moves_and_worker_waits_for_inserts",
     rules_stalls.is_sample_blocked,
     lambda: case(seed_hung_table()), "sample_blocked"),
    # The same table with no pending sample request (nobody waits): an idle table, not a stall.
    ("no_sample_blocked_when_nobody_waits", rules_stalls.is_sample_blocked,
     lambda: case(table_history(T20, SEED_FROZEN_INSERTS, SEED_FROZEN_SAMPLES, **SEED_LIMITER)),
     None),
    # Inserts keep coming: the limiter will soon allow samples again.
    ("no_sample_blocked_while_inserts_progress", rules_stalls.is_sample_blocked,
     lambda: case(table_history(T20, list(range(100, 120)), 50, spi=1.0, min_diff=70.0,
                                waiting_for_inserts_ms=waiting())), None),
    # A healthy synchronous loop: cursor at min_diff between inserts, worker waits 98%.
    ("no_sample_blocked_in_a_healthy_synchronous_loop", rules_stalls.is_sample_blocked,
     lambda: case(seed_healthy()[0]), None),
    # Only 5 s without progress: shorter than the stall window.
    ("no_sample_blocked_before_the_stall_window", rules_stalls.is_sample_blocked,
     lambda: case(seed_hung_table()[-6:]), None),
    # Distributed start-up: no actor has inserted yet while the learner already waits.
    # Seen as a false alarm on real distributed runs before this case was added.
    ("no_sample_blocked_before_the_first_insert", rules_stalls.is_sample_blocked,
     lambda: case(table_history(T20, 0, 0, min_size=100, waiting_for_inserts_ms=waiting())),
     None),
    # Warm-up stalled: below min_size_to_sample, actors stopped, the learner waits.
    ("sample_blocked_when_warmup_inserts_stop", rules_stalls.is_sample_blocked,
     lambda: case(table_history(T20, 10, 0, min_size=100, waiting_for_inserts_ms=waiting())),
     "sample_blocked"),
    # Blocking limiter at max_diff (cursor 100), nothing moves, actors wait for sampling.
    ("insert_blocked_when_waiting_for_sampling_grows", rules_stalls.is_insert_blocked,
     lambda: case(table_history(T20, 200, 100, waiting_for_sampling_ms=waiting())),
     "insert_blocked"),
    # At max_diff but the worker holds no queued insert: nobody is trying to insert.
    ("no_insert_blocked_when_no_insert_waits", rules_stalls.is_insert_blocked,
     lambda: case(table_history(T20, 200, 100)), None),
    # The learner keeps sampling: inserts will pass again.
    ("no_insert_blocked_while_samples_progress", rules_stalls.is_insert_blocked,
     lambda: case(table_history(T20, 200, list(range(100, 120)),
                                waiting_for_sampling_ms=waiting())), None),
    # Synchronous layout: insert blocking is disabled, inserts can never block.
    ("no_insert_blocked_when_insert_blocking_is_disabled", rules_stalls.is_insert_blocked,
     lambda: case(table_history(T20, 200, 100, max_diff=FLOAT_MAX,
                                waiting_for_sampling_ms=waiting())), None),
    # 40 of 100 items and 5 inserts/s: filling up by design.
    ("warmup_while_below_min_size_and_inserting", rules_stalls.is_warmup,
     lambda: case(table_history(T20, [40 + 5 * i for i in range(20)], 0, min_size=200)),
     "warmup"),
    # Below min size with inserts stopped: not warm-up (sample_blocked's business).
    ("no_warmup_when_inserts_stopped", rules_stalls.is_warmup,
     lambda: case(table_history(T20, 40, 0, min_size=200)), None),
    # Past min size: no warm-up.
    ("no_warmup_past_min_size", rules_stalls.is_warmup,
     lambda: case(table_history(T20, list(range(300, 320)), 0, min_size=200)), None),
]


@pytest.mark.parametrize("name,rule,scenario,expected", TABLE_CASES,
                         ids=[c[0] for c in TABLE_CASES])
def test_table_rule(name: str, rule: Callable, scenario: Scenario, expected: str | None) -> None:
    finding = rule(scenario(), DEFAULT)
    assert (finding.kind if finding else None) == expected
    assert_as_declared(finding, rule)


def test_sample_blocked_evidence_counts_the_inserts_needed_and_onset() -> None:
    # Inserts stopped at t=1000: the onset is the first poll that saw the final values.
    finding = rules_stalls.is_sample_blocked(case(seed_hung_table()), DEFAULT)
    assert finding is not None
    assert finding.severity is Severity.CRITICAL
    assert finding.since == 1000.0 and finding.last_seen == 1019.0
    assert finding.evidence["sample_headroom"] == 0
    assert finding.evidence["inserts_needed"] == 1  # one insert of 128 credit allows a sample
    assert "attach the trainer probe" in finding.summary


def test_insert_blocked_evidence_counts_the_samples_needed() -> None:
    # cursor 100 = max_diff: one insert needs cursor + 1 <= 100, so one sample.
    finding = rules_stalls.is_insert_blocked(
        case(table_history(T20, 200, 100, waiting_for_sampling_ms=waiting())), DEFAULT)
    assert finding is not None and finding.evidence["samples_needed"] == 1


# -- spi drift: 70 polls so the 60 s window is covered -------------------------------------------

T70 = seconds(70)


def seed_rates(samples_per_s: float, extra: int = 0) -> TableCase:
    """Seed limiter, 100 inserts/s, past warm-up; `extra` samples drawn at the first poll."""
    inserts = [100_000 + 100 * i for i in range(70)]
    samples = [int(inserts[0] * 128 - 230_400 - 25_600 + samples_per_s * i + (extra if i else 0))
               for i in range(70)]
    return case(table_history(T70, inserts, samples, **SEED_LIMITER))


SPI_CASES = [
    # 10240 samples/s against 100 inserts/s * 128: 20% under, 153600 behind > 25600 buffer.
    ("spi_drift_when_the_learner_samples_20_percent_less", seed_rates(10_240), "spi_drift"),
    # Exactly the configured ratio.
    ("no_spi_drift_at_the_configured_ratio", seed_rates(12_800), None),
    # 5% under: inside the 10% tolerance.
    ("no_spi_drift_within_tolerance", seed_rates(12_160), None),
    # Post-warm-up catch-up: the learner spends its 25600 error buffer once.
    ("no_spi_drift_for_a_one_off_catch_up", seed_rates(12_800, extra=25_600), None),
    # Only 30 s of history: the 60 s window is not covered.
    ("no_spi_drift_before_the_window_is_covered",
     case(seed_rates(10_240).history[-30:]), None),
]


@pytest.mark.parametrize("name,scenario,expected", SPI_CASES, ids=[c[0] for c in SPI_CASES])
def test_spi_drift(name: str, scenario: TableCase, expected: str | None) -> None:
    finding = rules_stalls.is_spi_drift(scenario, DEFAULT)
    assert (finding.kind if finding else None) == expected
    assert_as_declared(finding, rules_stalls.is_spi_drift)


def with_learner(scenario: TableCase, batches_per_s: float) -> TableCase:
    """The same table, its learner's trainer probe taking batches of 256 at `batches_per_s`,
    each probe poll 50 ms after the table's in the same cycle, as the poller reads them."""
    times = [s.observed_at + 0.05 for s in scenario.history]
    probe = tuple(probe_snapshot(t, int(batches_per_s * (t - times[0])), table=scenario.latest.name)
                  for t in times)
    return dataclasses.replace(scenario, probes=(probe,))


def test_spi_drift_judges_the_samples_the_learner_took_where_its_probe_counts_them() -> None:
    # Both 20% under: the learner takes 40 batches of 256 a second (10,240) as the server
    # draws them. Drift, counted by the learner.
    finding = rules_stalls.is_spi_drift(with_learner(seed_rates(10_240), 40), DEFAULT)
    assert finding is not None
    assert finding.evidence["samples_counted_by"] == "the learner's batches (trainer probe)"
    assert abs(finding.evidence["observed_samples_per_insert"] - 102.4) < 0.5
    assert finding.evidence["pipeline_swing"] < 256 * 2
    # The learner at the ratio while the server's count runs 20% under: no drift.
    assert rules_stalls.is_spi_drift(with_learner(seed_rates(10_240), 50), DEFAULT) is None
    # Without a probe the server's count is all there is.
    finding = rules_stalls.is_spi_drift(seed_rates(10_240), DEFAULT)
    assert finding is not None
    assert finding.evidence["samples_counted_by"] == "the server (its prefetch included)"
    assert finding.evidence["pipeline_swing"] is None


def test_the_learners_pipeline_filling_is_not_drift() -> None:
    # make bench-long's healthy async run: spi 128, slack 2048, the server at its ratio to
    # within 226 samples over the window, the learner 10 batches (2,560 samples) ahead of it
    # as its prefetch drained: the learner's count is 1% off, beyond the slack, and healthy.
    min_diff = 128 * 4000 - 1024.0
    inserts = [10_000 + 3 * i for i in range(70)]
    samples = [int(10_000 * 128 - min_diff - 100 + 128 * 3 * i) for i in range(70)]
    table = case(table_history(T70, inserts, samples, spi=128.0, min_diff=min_diff,
                               max_diff=min_diff + 2048, min_size=4000, size=5000))
    start = samples[0] // 256
    # One batch of 256 per 2/3 s ... plus the 10 prefetched batches taken over the window.
    batches = [start + int((samples[i] - samples[0]) / 256 + 10 * i / 69) for i in range(70)]
    probe = tuple(probe_snapshot(s.observed_at + 0.05, b, table=table.latest.name)
                  for s, b in zip(table.history, batches))
    assert rules_stalls.is_spi_drift(dataclasses.replace(table, probes=(probe,)),
                                     DEFAULT) is None


def test_a_blocking_limiter_may_roam_its_whole_slack_before_it_is_spi_drift() -> None:
    # The bench's healthy async run: spi 128, tolerance 0.2% (error_buffer 1024, slack 2048),
    # one insert a second. Over 60 s the learner drew 1500 more than 128 per insert: 19% off
    # the ratio, beyond the error_buffer, but inside the slack the blocking limiter enforces.
    min_diff = 128 * 4000 - 1024.0
    def table(max_diff: float) -> TableCase:
        inserts = [10_000 + i for i in range(70)]
        samples = [int(10_000 * 128 - min_diff - 100 + 128 * i + 1500 * i / 60)
                   for i in range(70)]
        return case(table_history(T70, inserts, samples, spi=128.0, min_diff=min_diff,
                                  max_diff=max_diff, min_size=4000, size=5000))
    assert rules_stalls.is_spi_drift(table(min_diff + 2048), DEFAULT) is None
    # Where inserts never block, the error_buffer is the configured tolerance: drift.
    finding = rules_stalls.is_spi_drift(table(FLOAT_MAX), DEFAULT)
    assert finding is not None and "0.2%" in finding.summary
    assert finding.evidence["drift_allowed"] == 1024


def test_no_spi_drift_with_a_min_size_limiter_that_targets_no_ratio() -> None:
    # MinSize: min_diff = -float max; any ratio is healthy.
    table = table_history(T70, [100 * i for i in range(70)], [10 * i for i in range(70)],
                          min_diff=-FLOAT_MAX, max_diff=FLOAT_MAX)
    assert rules_stalls.is_spi_drift(case(table), DEFAULT) is None


# -- rules that need the probe --------------------------------------------------------------------

ProbeScenario = Callable[[], tuple[TableCase, tuple[ProbeSnapshot, ...]]]


def with_probe(table: tuple[TableSnapshot, ...], probe: tuple[ProbeSnapshot, ...]
               ) -> tuple[TableCase, tuple[ProbeSnapshot, ...]]:
    return case(table, probe), probe


def with_waiting_actor(table: tuple[TableSnapshot, ...], probe: tuple[ProbeSnapshot, ...]
                       ) -> tuple[TableCase, tuple[ProbeSnapshot, ...]]:
    """An actor probe that has waited on the learner (a policy-lag bound) at times."""
    waited = Actor(ACTOR, tuple(dataclasses.replace(actor_snapshot(t, 500), waits_total=3)
                                for t in T20), polls(T20))
    return case(table, probe, actors=(waited,)), probe


# -- worker_starvation: a proven circular wait --------------------------------------------------

StarvationScenario = Callable[[], TableCase]

STARVATION_CASES: list[tuple[str, StarvationScenario, str | None]] = [
    # The seed hang: synchronous, 12 workers, blocked 20 s, no samples, headroom 0, 1536 stranded.
    ("worker_starvation_when_12_workers_strand_a_batch",
     lambda: case(seed_hung_table(), seed_hung_probe()), "worker_starvation"),
    # One worker: at most 255 stranded, so fewer than a batch can be missing... here 0.
    ("no_worker_starvation_when_nothing_is_stranded",
     lambda: case(seed_hung_table(), seed_hung_probe(workers=1, batches=5100)), None),
    # Blocked only 9 s: shorter than the stall window.
    ("no_worker_starvation_before_the_stall_window",
     lambda: case(seed_hung_table(), probe_history(T20, SEED_BATCHES, blocked_for=9.0,
                                                   workers=12)), None),
    # The learner waits briefly in a healthy loop; samples keep flowing.
    ("no_worker_starvation_in_a_healthy_synchronous_loop",
     lambda: case(*seed_healthy(workers=12)), None),
    # 103,936 samples undelivered behind 12 workers of 256 (3072 in partial batches): more
    # than the requested workers hold. Acme's interleave runs ~3 iterators per worker and
    # each has a sampler queue (~32,000 on the seed's job): any number is evidence.
    ("worker_starvation_whatever_the_number_stranded",
     lambda: case(seed_hung_table(), seed_hung_probe(batches=SEED_BATCHES - 400)),
     "worker_starvation"),
    # The limiter allows samples (headroom 5000) and nobody waits for inserts.
    ("no_worker_starvation_when_the_limiter_allows_samples",
     lambda: case(table_history(T20, SEED_FROZEN_INSERTS,
                                [s - 5000 for s in SEED_FROZEN_SAMPLES], **SEED_LIMITER),
                  seed_hung_probe(batches=SEED_BATCHES - 20)), None),
    # Asynchronous, 4 workers, 1536 stranded, every actor alive and waiting on the learner
    # (a policy-lag bound) for the whole window: the asynchronous circular wait.
    ("worker_starvation_when_async_actors_all_wait_on_the_learner",
     lambda: case(async_hung_table(), seed_hung_probe(workers=4),
                  actors=(actor(waiting_on="learner"),
                          actor(url="http://a1", waiting_on="learner", name="actor-1"))),
     "worker_starvation"),
    # The reported wrong verdict: asynchronous, 4 workers, the actors died holding partial
    # batches. Dead actors are sample_blocked's (restart them), never num_parallel_calls=1.
    ("no_worker_starvation_when_async_actors_are_dead",
     lambda: case(async_hung_table(), seed_hung_probe(workers=4), actors=(dead_actor(),)),
     None),
    # Alive but silent: no step, no wait on the learner.
    ("no_worker_starvation_when_async_actors_are_silent",
     lambda: case(async_hung_table(), seed_hung_probe(workers=4), actors=(silent_actor(),)),
     None),
    # One waits on the learner, another is dead: not every actor is in the circle.
    ("no_worker_starvation_when_one_async_actor_is_dead",
     lambda: case(async_hung_table(), seed_hung_probe(workers=4),
                  actors=(actor(waiting_on="learner"), dead_actor(url="http://a1"))), None),
    # No actor information in an asynchronous layout: the cause is not proven.
    ("no_worker_starvation_when_async_without_actor_probes",
     lambda: case(async_hung_table(), seed_hung_probe(workers=4)), None),
    # Actors wait on the learner, but nothing is stranded: no batch split across workers.
    ("no_worker_starvation_when_async_actors_wait_but_nothing_is_stranded",
     lambda: case(async_hung_table(), seed_hung_probe(workers=4, batches=5100),
                  actors=(actor(waiting_on="learner"),)), None),
]


@pytest.mark.parametrize("name,scenario,expected", STARVATION_CASES,
                         ids=[c[0] for c in STARVATION_CASES])
def test_worker_starvation(name: str, scenario: StarvationScenario, expected: str | None
                           ) -> None:
    finding = rules_actors.is_worker_starvation(scenario(), DEFAULT)
    assert (finding.kind if finding else None) == expected
    assert_as_declared(finding, rules_actors.is_worker_starvation)


def test_async_dead_actors_with_partial_batches_are_sample_blocked_with_both_causes() -> None:
    # The reported case: 1536 stranded behind 4 workers, actors dead.
    table_case = case(async_hung_table(), seed_hung_probe(workers=4), actors=(dead_actor(),))
    finding = rules_stalls.is_sample_blocked(table_case, DEFAULT)
    assert finding is not None and finding.evidence["stranded_samples"] == 1536
    assert finding.evidence["actors"] == {"actor-0": "down"}
    # The actor probe makes the layout known: actors insert from their own processes.
    assert finding.evidence["layout"] == "async"
    assert finding.evidence["layout_basis"] == "actor probes"
    assert "restart or unblock the actors" in finding.fix.lower()
    assert "most likely" not in finding.fix.lower()
    assert "num_parallel_calls=1" not in finding.fix + finding.summary


def test_async_sample_blocked_without_actor_probes_says_what_settles_it() -> None:
    finding = rules_stalls.is_sample_blocked(case(async_hung_table(), seed_hung_probe(workers=4)),
                                      DEFAULT)
    assert finding is not None and finding.evidence["stranded_samples"] == 1536
    # No actor probe and a finite max_diff: the layout is unknown, both readings stand.
    assert finding.evidence["layout"] == "unknown"
    assert "Two readings" in finding.summary and "most likely" not in finding.fix.lower()
    assert "ActorProbe" in finding.fix and "--layout" in finding.fix
    assert "TrainerProbe" not in finding.fix  # it is attached


def test_sync_sample_blocked_speaks_of_the_loop_not_of_actors() -> None:
    with_trainer = rules_stalls.is_sample_blocked(
        case(seed_hung_table(), seed_hung_probe(workers=1, batches=5100)), DEFAULT)
    alone = rules_stalls.is_sample_blocked(case(seed_hung_table()), DEFAULT)
    assert with_trainer is not None and alone is not None
    for finding in (with_trainer, alone):
        assert "actor" not in (finding.summary + finding.fix).lower()
        assert "the loop" in finding.summary
        assert finding.evidence["layout"].startswith("synchronous")
    assert "TrainerProbe" not in with_trainer.fix  # attached: never suggest it again
    assert "TrainerProbe" in alone.fix and "--trainer-pid" in alone.fix


def test_worker_starvation_evidence_says_how_many_iterators_can_sample() -> None:
    finding = rules_actors.is_worker_starvation(
        case(seed_hung_table(), seed_hung_probe(batches=SEED_BATCHES - 400)), DEFAULT)
    assert finding is not None
    assert finding.evidence["stranded_samples"] == 1536 + 400 * 256
    assert finding.evidence["stranded_beyond_requested_workers"] is True
    assert finding.evidence["sampling_iterators_up_to"] == 36
    # No signature: the items may be frames, so the one fix that holds either way.
    assert [(f["knob"], f["value"]) for f in finding.evidence["fixes"]] == [
        ("num_parallel_calls", 1)]
    # Small items by the signature: the declared dataset (one iterator per worker) cannot
    # strand this much, so the fixes are judged with Acme's three, in multiples of 16:
    # 7 x 240 + 14 x 1520 = 22960 < 25600; error_buffer 39900 and every value above it: 39900
    # (g = 4) against at most 12 x 252 + 24 x 1532 = 39792, from 39901 on more than the 39900
    # that g = 1 leaves. Not 39892, though safe itself (g = 4): 39893 is not (g = 1).
    finding = rules_actors.is_worker_starvation(
        case(seed_hung_table(item_bytes=16), seed_hung_probe(batches=SEED_BATCHES - 400)),
        DEFAULT)
    assert finding is not None
    assert "num_parallel_calls=7" in finding.fix and "error_buffer=39900" in finding.fix
    assert {f["knob"] for f in finding.evidence["fixes"]} >= {"num_parallel_calls",
                                                               "error_buffer"}


STALLED_READY = probe_history(T20, 300, ready=True)
# TF-Agents' as_dataset of 64 as the probe reads it: 32 datasets of 6, 3 threads, one batch.
READ_3_OF_32 = PipelineShape(64, 3, False, 6, 1, 1, True, 32, 16, 3, "replay")
CAN_SAMPLE_A_BATCH = table_history(T20, 1000, 100, min_diff=0.0, max_diff=FLOAT_MAX)

PROBE_CASES: list[tuple[str, Callable, ProbeScenario, str | None]] = [
    # No batch or step for 19 s while the iterator says ready(): the update step hangs.
    ("learner_stalled_when_ready_but_no_step", rules_learner.is_learner_stalled,
     lambda: with_probe(CAN_SAMPLE_A_BATCH, STALLED_READY), "learner_stalled"),
    # ready() unknown, but the table can sample a batch of 256 (headroom 900).
    ("learner_stalled_when_the_table_can_sample_a_batch", rules_learner.is_learner_stalled,
     lambda: with_probe(CAN_SAMPLE_A_BATCH, probe_history(T20, 300)), "learner_stalled"),
    # No data anywhere: the learner waits for data, which is another rule's business.
    ("no_learner_stalled_without_data", rules_learner.is_learner_stalled,
     lambda: with_probe(seed_hung_table(), probe_history(T20, 300, ready=False)), None),
    # Blocked in next(): it is not stuck in its update step.
    ("no_learner_stalled_while_blocked_in_next", rules_learner.is_learner_stalled,
     lambda: with_probe(CAN_SAMPLE_A_BATCH, probe_history(T20, 300, ready=True,
                                                          blocked_for=15.0)), None),
    # Steps advance even though no batch was taken in the window (multi-step updates).
    ("no_learner_stalled_while_steps_advance", rules_learner.is_learner_stalled,
     lambda: with_probe(CAN_SAMPLE_A_BATCH, probe_history(T20, 300, ready=True,
                                                          steps=list(range(20)))), None),
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


def test_worker_starvation_evidence_shows_the_stranded_arithmetic() -> None:
    # drawn 1,305,600 - 5094 batches * 256 = 1536 stranded; the probe is blocked so 0 prefetched.
    finding = rules_actors.is_worker_starvation(case(seed_hung_table(), seed_hung_probe()), DEFAULT)
    assert finding is not None
    assert finding.evidence["stranded_samples"] == 1536
    assert finding.evidence["prefetched"] == 0
    assert finding.evidence["workers"] == 12 and finding.evidence["batch_size"] == 256
    assert "num_parallel_calls=1" in finding.fix and "now 12" in finding.fix
    assert finding.since == 1000.0


def test_worker_starvation_after_the_interleave_names_the_datasets_not_batching_workers(
) -> None:
    # TF-Agents' as_dataset: no worker batches on its own; the datasets no thread reads hold
    # the samples, and Acme's repeat-interleave is no part of it.
    probe = seed_hung_probe(batch_after_interleave=True, cycle_length=32)
    finding = rules_actors.is_worker_starvation(case(seed_hung_table(), probe), DEFAULT)
    assert finding is not None
    assert "32 Reverb datasets read by 12 interleave thread(s)" in finding.summary
    assert "Acme" not in finding.summary and "batching workers" not in finding.summary


def test_worker_starvation_counts_from_the_iterator_start_when_history_reaches_it() -> None:
    # The probe started at t=1005; the table had drawn 1,300,000 by then. Since then 5600
    # were drawn and the (new) learner got 20 batches = 5120: 480 stranded.
    samples = [1_300_000] * 5 + [1_305_600] * 15  # then the cursor reaches min_diff
    table = table_history(T20, 12_000, samples, waiting_for_inserts_ms=waiting(), **SEED_LIMITER)
    probe = probe_history(T20[5:], 20, blocked_for=[12.0 + i for i in range(15)], workers=12,
                          started_at=1004.5)
    finding = rules_actors.is_worker_starvation(case(table, probe), DEFAULT)
    assert finding is not None
    assert finding.evidence["stranded_basis"] == "since_iterator_start"
    assert finding.evidence["stranded_samples"] == 480


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


# -- reachability and threads ---------------------------------------------------------------------

T5 = seconds(5)
T9 = seconds(9, start=996.0)
BUSY = "h:1: ServerInfo did not answer within 0.8s (connected, no answer)"
PROBE_BUSY = "http://p/probe: did not answer within 0.8s"
VIEW_CASES = [
    # Three failed polls in a row: more than down_polls (2).
    ("target_down_after_three_failed_polls", rules_liveness.is_target_down,
     target_view(target_polls=polls(T5, ok=[True, True, False, False, False])), "target_down"),
    # Two failures are not yet "more than 2 polls".
    ("no_target_down_after_two_failed_polls", rules_liveness.is_target_down,
     target_view(target_polls=polls(T5, ok=[True, True, True, False, False])), None),
    # A failure in the past, answering again.
    ("no_target_down_once_it_answers_again", rules_liveness.is_target_down,
     target_view(target_polls=polls(T5, ok=[False, False, False, False, True])), None),
    # Three polls the server took and did not answer (its table lock held): busy, 2 s in.
    ("checkpointing_when_the_server_takes_calls_but_answers_none",
     rules_liveness.is_checkpointing,
     target_view(target_polls=polls(T5, ok=[True, True, False, False, False],
                                    error=BUSY)), "checkpointing"),
    # Refused connections are a server gone, not a busy one.
    ("no_checkpointing_when_the_server_refuses_connections", rules_liveness.is_checkpointing,
     target_view(target_polls=polls(T5, ok=[True, True, False, False, False])), None),
    # A probe whose last three polls failed.
    ("probe_down_after_three_failed_polls", rules_liveness.is_probe_down,
     target_view(probe_polls={"http://p": polls(T5, ok=[True, True, False, False, False])}),
     "probe_down"),
    # The server paused (a checkpoint holds its table lock) and a probe went unanswered with
    # it, never refused: the same pause holds it (a sync loop's probe in the checkpointing
    # process), not a probe down, while the pause is within its grace.
    ("no_probe_down_while_its_server_pauses_with_it", rules_liveness.is_probe_down,
     target_view(target_polls=polls(T5, ok=[True, True, False, False, False], error=BUSY),
                 probe_polls={"http://p": polls(T5, ok=[True, True, False, False, False],
                                                error=PROBE_BUSY)}), None),
    # The pause landed between the two polls of one cycle: the probe failed a cycle before
    # its server (and a little more, as cycles jitter); the same pause holds it.
    ("no_probe_down_when_the_pause_split_a_cycle", rules_liveness.is_probe_down,
     target_view(target_polls=polls(T5, ok=[True, True, False, False, False], error=BUSY),
                 probe_polls={"http://p": polls([t - 0.1 for t in T5],
                                                ok=[True, False, False, False, False],
                                                error=PROBE_BUSY)}), None),
    # ... but a probe that refuses connections is down, pause or not (a dead process).
    ("probe_down_refused_while_its_server_pauses", rules_liveness.is_probe_down,
     target_view(target_polls=polls(T5, ok=[True, True, False, False, False], error=BUSY),
                 probe_polls={"http://p": polls(T5, ok=[True, True, False, False, False])}),
     "probe_down"),
    # ... and so is one that stopped answering well before the server paused.
    ("probe_down_silent_before_its_server_paused", rules_liveness.is_probe_down,
     target_view(target_polls=polls(T5, ok=[True, True, False, False, False], error=BUSY),
                 probe_polls={"http://p": polls(T5, ok=[False] * 5, error=PROBE_BUSY)}),
     "probe_down"),
    # The server answers again; its probe, polled the same cycle, not yet: still the pause.
    ("no_probe_down_the_cycle_its_server_answers_again", rules_liveness.is_probe_down,
     target_view(target_polls=polls(T5, ok=[True, False, False, False, True], error=BUSY),
                 probe_polls={"http://p": polls(T5, ok=[True, False, False, False, False],
                                                error=PROBE_BUSY)}), None),
    # ... but three polls after its server is back, a silent probe is down.
    ("probe_down_three_polls_after_its_server_is_back", rules_liveness.is_probe_down,
     target_view(target_polls=polls(T9, ok=[True, False, False, False] + [True] * 5,
                                    error=BUSY),
                 probe_polls={"http://p": polls(T9, ok=[True] + [False] * 8,
                                                error=PROBE_BUSY)}), "probe_down"),
    ("no_probe_down_while_it_answers", rules_liveness.is_probe_down,
     target_view(probe_polls={"http://p": polls(T5)}), None),
    # 600 threads, like the seed's job (over 500).
    ("too_many_threads_above_the_threshold", rules_liveness.is_too_many_threads,
     target_view(probes=[probe_history(T5, 0, threads=600)]), "too_many_threads"),
    ("no_too_many_threads_below_the_threshold", rules_liveness.is_too_many_threads,
     target_view(probes=[probe_history(T5, 0, threads=120)]), None),
]


@pytest.mark.parametrize("name,rule,view,expected", VIEW_CASES, ids=[c[0] for c in VIEW_CASES])
def test_view_rule(name: str, rule: Callable, view: Any, expected: str | None) -> None:
    finding = rule(view, DEFAULT, 1004.0)
    assert (finding.kind if finding else None) == expected
    assert_as_declared(finding, rule)


def test_a_busy_server_is_checkpointing_then_target_down_after_the_grace() -> None:
    view = target_view(target_polls=polls(T5, ok=[True, True, False, False, False],
                                          error=BUSY))
    found = [f.kind for f in diagnose(view, DEFAULT, 1004.0).findings]
    assert found == ["checkpointing"]  # target_down stands down while the grace lasts
    later = [f.kind for f in diagnose(view, Thresholds(checkpoint_grace_s=1.0), 1004.0).findings]
    assert later == ["target_down"]


def test_target_down_since_is_the_first_failed_poll() -> None:
    view = target_view(target_polls=polls(T5, ok=[True, False, False, False, False]))
    finding = rules_liveness.is_target_down(view, DEFAULT, 1004.0)
    assert finding is not None and finding.since == 1001.0 and finding.last_seen == 1004.0


def test_too_many_threads_since_is_the_start_of_the_run_above_the_threshold() -> None:
    view = target_view(probes=[probe_history(T5, 0, threads=[100, 600, 100, 600, 700])])
    finding = rules_liveness.is_too_many_threads(view, DEFAULT, 1004.0)
    assert finding is not None and finding.since == 1003.0


def test_too_many_threads_counts_the_os_threads_python_cannot_see() -> None:
    # A hung Acme process: 8 Python threads, 600 OS threads (tf.data, Reverb samplers, gRPC).
    history = tuple(dataclasses.replace(s, os_threads=600)
                    for s in probe_history(T5, 0, threads=8))
    finding = rules_liveness.is_too_many_threads(target_view(probes=[history]), DEFAULT, 1004.0)
    assert finding is not None and finding.kind == "too_many_threads"
    url = history[0].probe
    assert finding.evidence["threads"] == {url: 600}
    assert finding.evidence["python_threads"] == {url: 8}
    # Many Python threads but few OS threads cannot be: the OS count is the one judged.
    few = tuple(dataclasses.replace(s, os_threads=120) for s in probe_history(T5, 0, threads=8))
    assert rules_liveness.is_too_many_threads(target_view(probes=[few]), DEFAULT, 1004.0) is None


def test_probe_down_names_the_role_the_url_last_answered_as() -> None:
    actor_polls = polls(T5, ok=[True, True, False, False, False])
    view = dataclasses.replace(
        target_view(probe_polls={ACTOR: actor_polls}),
        actors={ACTOR: tuple(actor_snapshot(t, 10) for t in T5[:2])})
    finding = rules_liveness.is_probe_down(view, DEFAULT, 1004.0)
    assert finding is not None and "1 actor probe(s)" in finding.summary
    assert finding.evidence["roles"] == {ACTOR: "actor"}
    never = target_view(probe_polls={"http://p": polls(T5, ok=[False] * 5)})
    finding = rules_liveness.is_probe_down(never, DEFAULT, 1004.0)
    assert finding is not None and "trainer or actor probe(s)" in finding.summary


# -- writer_stalled: an actor stuck inside its writer, not throttled -----------------------------

def writer_view(table: tuple[TableSnapshot, ...], *actors: tuple[ActorSnapshot, ...],
                target_ok: list[bool] | None = None, error: str = "unreachable") -> TargetView:
    view = target_view([table], target_polls=polls(T20, ok=target_ok or True, error=error))
    return dataclasses.replace(view, actors={h[0].probe: h for h in actors},
                               probe_polls={h[0].probe: polls([a.observed_at for a in h])
                                            for h in actors})


# The seed's blocking limiter with the cursor at min_diff: inserts would pass (max_diff 281600).
INSERTS_WOULD_PASS = table_history(T20, SEED_FROZEN_INSERTS, SEED_FROZEN_SAMPLES,
                                   waiting_for_inserts_ms=waiting(), **SEED_BLOCKING_LIMITER)
# cursor 100 = max_diff: the limiter holds inserts back, so a blocked flush is by design.
INSERTS_HELD = table_history(T20, 200, 100, waiting_for_sampling_ms=waiting())

WRITER_CASES: list[tuple[str, TargetView, str | None]] = [
    # In flush() for 15 s while the limiter would have let every insert in (reverb#4's hang).
    ("writer_stalled_in_flush_while_the_limiter_accepts_inserts",
     writer_view(INSERTS_WOULD_PASS, in_writer("flush", 1004.0)), "writer_stalled"),
    # end_episode() hanging silently (reverb#144).
    ("writer_stalled_in_end_episode", writer_view(INSERTS_WOULD_PASS,
                                                   in_writer("end_episode", 1002.0)),
     "writer_stalled"),
    # The server went away at t=1005 (target down), an actor sits in create_item since.
    ("writer_stalled_when_the_server_is_down",
     writer_view(INSERTS_WOULD_PASS[:6], in_writer("create_item", 1006.0),
                 target_ok=[True] * 6 + [False] * 14), "writer_stalled"),
    # The server answers no poll in time (and refuses none) for 14 s: paused, as by a
    # checkpoint, which holds every writer by design (checkpointing, within its grace).
    ("no_writer_stalled_while_the_server_is_paused",
     writer_view(INSERTS_WOULD_PASS[:6], in_writer("create_item", 1002.0),
                 target_ok=[True] * 6 + [False] * 14,
                 error="127.0.0.1:1: ServerInfo did not answer within 0.8s"), None),
    # In flush() since the limiter held inserts (a 10-minute first compile), then the
    # server went away: the limiter holds it, not the outage.
    ("no_writer_stalled_when_the_limiter_held_it_before_the_server_went",
     writer_view(INSERTS_HELD[:6], in_writer("flush", 1002.0),
                 target_ok=[True] * 6 + [False] * 14), None),
    # Held at max_diff: actors waiting for the learner to sample are insert_blocked's.
    ("no_writer_stalled_when_the_limiter_holds_inserts",
     writer_view(INSERTS_HELD, in_writer("flush", 1004.0)), None),
    # Only 6 s inside flush: shorter than the stall window.
    ("no_writer_stalled_before_the_stall_window",
     writer_view(INSERTS_WOULD_PASS, in_writer("flush", 1013.0)), None),
    # A healthy actor: steps, no writer call in progress.
    ("no_writer_stalled_for_a_stepping_actor",
     writer_view(INSERTS_WOULD_PASS, tuple(actor_snapshot(t, int(t)) for t in T20)), None),
    # The actor's probe stopped answering at t=1005: nothing fresh says where it is now.
    ("no_writer_stalled_from_a_stale_actor_probe",
     writer_view(INSERTS_WOULD_PASS, in_writer("flush", 1000.0, times=T20[:6])), None),
]


@pytest.mark.parametrize("name,view,expected", WRITER_CASES, ids=[c[0] for c in WRITER_CASES])
def test_writer_stalled(name: str, view: TargetView, expected: str | None) -> None:
    finding = rules_actors.is_writer_stalled(view, DEFAULT, 1019.0)
    assert (finding.kind if finding else None) == expected
    assert_as_declared(finding, rules_actors.is_writer_stalled)


def test_writer_stalled_evidence_names_the_call_its_duration_and_pending_items() -> None:
    finding = rules_actors.is_writer_stalled(
        writer_view(INSERTS_WOULD_PASS, in_writer("flush", 1004.0)), DEFAULT, 1019.0)
    assert finding is not None and finding.table == "replay"
    assert (finding.evidence["call"], finding.evidence["blocked_for_s"],
            finding.evidence["pending_items"], finding.evidence["server_down"]) == (
                "flush", 15.0, 3, False)
    assert finding.evidence["actors"][0]["name"] == "actor-0"
    assert finding.since == 1004.0
    assert "reverb#4" in finding.fix and "timeout_ms" in finding.fix


# -- the declaration and the rules agree --------------------------------------------------------

def test_every_declared_kind_has_a_rule_and_every_rule_a_declared_kind() -> None:
    assert set(rules.BY_KIND) == set(kinds.ALL)


RULE_MODULES = sorted((Path(rules.__file__).parent).glob("rules_*.py"))


@pytest.mark.parametrize("path", RULE_MODULES, ids=[p.name for p in RULE_MODULES])
def test_rules_name_kinds_by_their_declaration_not_by_string(path: Path) -> None:
    calls = [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Call)]
    assert not [n for n in calls if getattr(n.func, "id", None) == "Finding"]
    named = [n.args[0] for n in calls if getattr(n.func, "attr", None) == "finding"
             and n.args and isinstance(n.args[0], ast.Constant)]
    assert named == []


def test_async_starvation_under_a_lag_bound_is_fixed_by_the_lag_not_the_configured_values(
) -> None:
    # A grid cell whose old fix did not hold: 4 workers of 16, spi 4, error_buffer 32,
    # actors held at a lag of 3.
    # Each learner step frees 12 < 16 samples, so neither error_buffer 32 nor 4 workers (the
    # values configured, once suggested) is a fix; the model proves a longer lag or a
    # smaller batch. 1000 inserts x 4 = 4000 credit, min_diff 3968: 32 + 12 x k released.
    # The actor inserted 1003 items (4012 credit); the workers drew 4012 - 3968 = 44, the
    # learner got 1 batch: 28 held by 4 workers of 16, none complete.
    table = table_history(T20, 1003, 44, spi=4.0, min_diff=3968.0, max_diff=4032.0,
                          min_size=1000, waiting_for_inserts_ms=waiting())
    probe = probe_history(T20, 1, blocked_for=[1.0 + i for i in range(20)], workers=4,
                          batch_size=16)
    waited = actor(waiting_on="learner")
    lagged = Actor(waited.url, tuple(dataclasses.replace(s, max_policy_lag=3, waits_total=5)
                                     for s in waited.history), waited.polls)
    finding = rules_actors.is_worker_starvation(case(table, probe, actors=(lagged,)), DEFAULT)
    assert finding is not None
    knobs = {f["knob"]: f["value"] for f in finding.evidence["fixes"]}
    assert "error_buffer" not in knobs and "num_parallel_calls" not in knobs
    assert knobs["max_policy_lag"] == 16 and "max_policy_lag=16 (now 3" in finding.fix


def test_a_declared_cycle_is_tf_agents_most_not_a_contradiction_of_a_smaller_batch() -> None:
    # The README's TF-Agents recipe declares cycle_length=max_cycle_length (32); a batch of 8
    # opens min(8, 32) = 8 datasets, which the graph reads: nothing the user said was wrong.
    read = PipelineShape(8, 3, False, 3, 1, 1, True, 8, None, 3, "uniform_table")
    said = probe_snapshot(1000.0, 0, batch_size=8, workers=3, batch_after_interleave=True,
                          cycle_length=32, pipeline=read, pipeline_read=True)
    assert rules_config.declared_differs(said) == {}
    wrong = dataclasses.replace(said, cycle_length=4)
    assert rules_config.declared_differs(wrong) == {
        "cycle_length": {"declared": 4, "read": 8}}

