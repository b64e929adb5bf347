"""The stall rules of diagnosis/rules_stalls.py (Reverb alone), on constructed histories:
sample_blocked, insert_blocked and warmup as table rows, spi_drift on 70 polls, one row per
case, each with why; then what sample_blocked says of the layout and the actors.

Times are 1 s polls from t=1000 unless a case says otherwise; `now` is the
newest poll. The stall window is the default 10 s.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from replaywatch.diagnosis import rules_stalls
from replaywatch.diagnosis.case import TableCase
from replaywatch.model import FLOAT_MAX, Finding, Severity
from tests.builders import (
    DEFAULT,
    SEED_FROZEN_INSERTS,
    SEED_FROZEN_SAMPLES,
    SEED_LIMITER,
    T20,
    assert_as_declared,
    async_hung_table,
    case,
    dead_actor,
    probe_snapshot,
    seconds,
    seed_healthy,
    seed_hung_probe,
    seed_hung_table,
    table_history,
    waiting,
)

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
