"""The start-up and restart rules (warmup_impossible, learner_starting, server_restarted) and
stale_data, the stall they are most often confused with. One table row per case, each with
why, as in tests/test_rules_stalls.py; then engine scenarios where they interact with other kinds
(supersession across severities, restarts).

Times are 1 s polls from t=1000 unless a case says otherwise; the stall window is 10 s. The
server's uptime is the sum of the table worker's time (rules_startup.uptime_s); `uptime`
below sets it through `sleeping_ms`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from replaywatch.diagnosis import rules_stalls, rules_startup
from replaywatch.diagnosis.case import TableCase
from replaywatch.diagnosis.engine import diagnose, stall_findings
from replaywatch.diagnosis.ratelimiter import derive
from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.history import History
from replaywatch.model import FLOAT_MAX, Finding, PollOutcome, Severity, TableSnapshot
from tests.builders import (
    DEFAULT,
    T20,
    assert_as_declared,
    case,
    probe_history,
    table_history,
    target_view,
    waiting,
)

MIN_SIZE = dict(min_diff=-FLOAT_MAX, max_diff=FLOAT_MAX)
WIDE = dict(min_diff=-1e6, max_diff=1e6)


def uptime(history: tuple[TableSnapshot, ...], seconds_up: list[float]
           ) -> tuple[TableSnapshot, ...]:
    """The same snapshots with the table worker's total time (the server's uptime) set."""
    return tuple(dataclasses.replace(
        s, worker_time=dataclasses.replace(
            s.worker_time, sleeping_ms=int(1000 * up) - s.worker_time.waiting_for_inserts_ms
            - s.worker_time.waiting_for_sampling_ms))
        for s, up in zip(history, seconds_up, strict=True))


# Actors at max_diff (cursor 100), nothing sampled yet: the learner compiles its first step.
def insert_blocked_at_start(**kw: Any) -> tuple[TableSnapshot, ...]:
    return table_history(T20, 100, 0, waiting_for_sampling_ms=waiting(), **kw)


# A probe whose learner took its first batch at t=1000 and is compiling (not in next()).
def compiling(steps: int = 0, batches: int = 1, started_at: float = 995.0):
    return probe_history(T20, batches, steps=steps, started_at=started_at, ready=True,
                         gate="can_sample")


CAN_SAMPLE = table_history(T20, 1000, 256, min_diff=0.0, max_diff=FLOAT_MAX)

Rule = Callable[..., "Finding | None"]
STARTUP_CASES: list[tuple[str, Rule, Callable[[], Any], str | None]] = [
    # -- warmup_impossible: max_size below min_size_to_sample, from one snapshot --------------
    # alf PR#1737: max_size 10 < min_size_to_sample 20; inserts flow, size stays at 10.
    ("warmup_impossible_when_max_size_is_below_min_size", rules_startup.is_warmup_impossible,
     lambda: case(table_history([1000.0], 30, 0, max_size=10, min_size=20)),
     "warmup_impossible"),
    # Exactly min_size_to_sample items fit: warm-up can end.
    ("no_warmup_impossible_when_max_size_holds_min_size", rules_startup.is_warmup_impossible,
     lambda: case(table_history([1000.0], 30, 0, max_size=20, min_size=20)), None),
    # -- stale_data: inserts stopped, sampling continues --------------------------------------
    # MinSize limiter, 500 items, no insert since t=1000, 100 samples/s.
    ("stale_data_when_a_min_size_table_is_sampled_without_inserts", rules_stalls.is_stale_data,
     lambda: case(table_history(T20, 500, [100 * i for i in range(20)], **MIN_SIZE)),
     "stale_data"),
    # A wide SampleToInsertRatio window (slack 2e6) lets the learner go on for hours.
    ("stale_data_with_a_wide_sample_to_insert_ratio_window", rules_stalls.is_stale_data,
     lambda: case(table_history(T20, 500, [100 * i for i in range(20)], **WIDE)),
     "stale_data"),
    # A healthy MinSize job: inserts progress.
    ("no_stale_data_while_inserts_progress", rules_stalls.is_stale_data,
     lambda: case(table_history(T20, [500 + i for i in range(20)],
                                [100 * i for i in range(20)], **MIN_SIZE)), None),
    # Inserts stopped only 5 s ago.
    ("no_stale_data_before_the_stall_window", rules_stalls.is_stale_data,
     lambda: case(table_history(T20, [500 + min(i, 14) for i in range(20)],
                                [100 * i for i in range(20)], **MIN_SIZE)), None),
    # Sampling stopped too: a blocked table, sample_blocked's business.
    ("no_stale_data_when_sampling_stopped_too", rules_stalls.is_stale_data,
     lambda: case(table_history(T20, 500, 1900, **MIN_SIZE)), None),
    # Actors died under a ratio limiter: the learner drained the credit (cursor 0 = min_diff
    # at t=1012) and stopped 7 s ago; sample_blocked opens a window later, no warning first.
    ("no_stale_data_once_the_limiter_refuses_samples", rules_stalls.is_stale_data,
     lambda: case(table_history(T20, 500, [min(440 + 5 * i, 500) for i in range(20)],
                                min_diff=0.0, max_diff=100.0)), None),
    # Both counters rested (a synchronous loop's 15 s first step), then sampling resumed 4 s
    # ago before the next insert: the loop spends its credit, the data is not stale.
    ("no_stale_data_when_sampling_resumed_only_lately", rules_stalls.is_stale_data,
     lambda: case(table_history(T20, 500, [400] * 16 + [500, 600, 700, 800], **MIN_SIZE)),
     None),
    # Warm-up: below min_size_to_sample nothing can be sampled (and nothing was).
    ("no_stale_data_during_warmup", rules_stalls.is_stale_data,
     lambda: case(table_history(T20, 50, 0, min_size=100, **MIN_SIZE)), None),
    # -- learner_starting: before the first step, within the grace ----------------------------
    # Reverb alone: actors at max_diff, nothing sampled, the server up ~19 s.
    ("learner_starting_when_inserts_block_before_any_sample", rules_startup.is_learner_starting,
     lambda: case(insert_blocked_at_start()), "learner_starting"),
    # The server has been up 1000 s and nothing was ever sampled: past the 900 s grace.
    ("no_learner_starting_after_the_grace", rules_startup.is_learner_starting,
     lambda: case(uptime(insert_blocked_at_start(), [981.0 + i for i in range(20)])), None),
    # Reverb alone, actors at max_diff (cursor 100) after the pipeline's first fill (30
    # samples in one poll, then none): the learner compiles its first step, as the bench's
    # first_step_60s run showed (768 samples prefetched, then insert_blocked paged for 61 s).
    ("learner_starting_when_only_a_first_fill_was_sampled", rules_startup.is_learner_starting,
     lambda: case(table_history(T20, [100] + [130] * 19, [0] + [30] * 19,
                                waiting_for_sampling_ms=waiting())), "learner_starting"),
    # Sampling moved for 12 s (a whole stall window) before it stopped: the learner trained;
    # a stall now is a stall.
    ("no_learner_starting_once_samples_flowed_for_a_window", rules_startup.is_learner_starting,
     lambda: case(table_history(T20, [100 + min(10 * i, 120) for i in range(20)],
                                [min(10 * i, 120) for i in range(20)],
                                waiting_for_sampling_ms=waiting())), None),
    # Reverb alone: the learner trained for 5 s, drawing 10 samples a poll with credit to
    # spare (actors at max_diff, cursor 100), then stopped asking: it stepped, so the stall
    # is judged as one (it was learner_starting for the whole grace).
    ("no_learner_starting_after_five_polls_of_learner_paced_sampling",
     rules_startup.is_learner_starting,
     lambda: case(table_history(T20, [100 + min(10 * i, 50) for i in range(20)],
                                [min(10 * i, 50) for i in range(20)],
                                waiting_for_sampling_ms=waiting())), None),
    # The same 50 samples drawn over 5 polls as the actors' inserts released them (cursor at
    # min_diff 0 after every draw), then the actors ran on to max_diff: a first fill paced by
    # the limiter, not by a learner, so still start-up.
    ("learner_starting_after_a_first_fill_the_limiter_paced", rules_startup.is_learner_starting,
     lambda: case(table_history(T20, [min(10 * i, 50) + max(0, min(50 * (i - 5), 100))
                                      for i in range(20)],
                                [min(10 * i, 50) for i in range(20)], min_diff=0.0,
                                waiting_for_sampling_ms=waiting())), "learner_starting"),
    # -- reconnecting: the server came back, its clients are not yet talking to it --------
    # Inserts stopped since t=1000 with the learner waiting (sample_blocked), and the server
    # answered again at t=1010 after an outage: 9 s ago, within a stall window (10 s), which
    # still spans the dark time.
    ("reconnecting_when_a_stall_follows_an_outage", rules_startup.is_reconnecting,
     lambda: case(table_history(T20, 100, 100, min_diff=0.0, waiting_for_inserts_ms=waiting()),
                  came_back=(1010.0, "outage")), "reconnecting"),
    # 14 s after the same server answered again: its clients never had to reconnect (their
    # calls go on at once after a freeze), so a whole window without progress is the stall.
    ("no_reconnecting_a_stall_window_after_an_outage", rules_startup.is_reconnecting,
     lambda: case(table_history(T20, 100, 100, min_diff=0.0, waiting_for_inserts_ms=waiting()),
                  came_back=(1005.0, "outage")), None),
    # 14 s after a new server came back its clients may still be reconnecting (about 12 s
    # after a stop on Reverb 0.14): within reconnect_grace_s (30 s).
    ("reconnecting_fourteen_seconds_after_a_restart", rules_startup.is_reconnecting,
     lambda: case(table_history(T20, 100, 100, min_diff=0.0, waiting_for_inserts_ms=waiting()),
                  came_back=(1005.0, "restart")), "reconnecting"),
    # The same stall 40 s after the server came back: past the grace, the usual finding.
    ("no_reconnecting_after_the_grace", rules_startup.is_reconnecting,
     lambda: case(table_history(T20, 100, 100, min_diff=0.0, waiting_for_inserts_ms=waiting()),
                  came_back=(979.0, "outage")), None),
    # The server came back but nothing is stalled: nothing to explain.
    ("no_reconnecting_when_nothing_stalls", rules_startup.is_reconnecting,
     lambda: case(table_history(T20, [100 + i for i in range(20)], [100 + i for i in range(20)],
                                min_diff=0.0), came_back=(1010.0, "restart")), None),
    # A synchronous loop that drew samples and stopped inserting: from Reverb alone the
    # seed's stranded workers or a first compile; the one that must page does
    # (sample_blocked names both), so no grace.
    ("no_learner_starting_in_a_synchronous_loop_that_sampled", rules_startup.is_learner_starting,
     lambda: case(table_history(T20, 100, 100, min_diff=0.0, max_diff=FLOAT_MAX,
                                waiting_for_inserts_ms=waiting())), None),
    # Healthy start: inserts flow below max_diff, nothing blocked, nothing to explain.
    ("no_learner_starting_when_nothing_is_blocked", rules_startup.is_learner_starting,
     lambda: case(table_history(T20, list(range(20)), 0, waiting_for_sampling_ms=waiting())),
     None),
    # Probe: one batch taken, no step, not in next(), the table can sample: compiling.
    ("learner_starting_when_the_probe_shows_no_first_step", rules_startup.is_learner_starting,
     lambda: case(CAN_SAMPLE, compiling()), "learner_starting"),
    # Probe: the first step finished (steps 1): a stall now is learner_stalled.
    ("no_learner_starting_after_the_first_step", rules_startup.is_learner_starting,
     lambda: case(CAN_SAMPLE, compiling(steps=1)), None),
    # Probe: no step marked, but a second batch was taken: the first step ended.
    ("no_learner_starting_after_a_second_batch", rules_startup.is_learner_starting,
     lambda: case(CAN_SAMPLE, compiling(batches=2)), None),
    # Probe: the trainer started 1000 s ago (its started_at) and never stepped: hung.
    ("no_learner_starting_when_the_trainer_started_before_the_grace",
     rules_startup.is_learner_starting,
     lambda: case(CAN_SAMPLE, compiling(started_at=19.0)), None),
]


@pytest.mark.parametrize("name,rule,scenario,expected", STARTUP_CASES,
                         ids=[c[0] for c in STARTUP_CASES])
def test_startup_rule(name: str, rule: Rule, scenario: Callable[[], Any],
                      expected: str | None) -> None:
    finding = judge(rule, scenario())
    assert (finding.kind if finding else None) == expected
    assert_as_declared(finding, rule)


def judge(rule: Rule, c: TableCase) -> Finding | None:
    """A table rule as the engine runs it: an after-stalls rule is handed the stalls."""
    if rule in (rules_startup.is_learner_starting, rules_startup.is_reconnecting):
        return rule(c, DEFAULT, tuple(stall_findings(c, DEFAULT, [])))
    return rule(c, DEFAULT)


def test_warmup_impossible_names_which_number_to_change_to_what() -> None:
    finding = rules_startup.is_warmup_impossible(
        case(table_history([1000.0], 30, 0, max_size=10, min_size=20)), DEFAULT)
    assert finding is not None and finding.severity is Severity.CRITICAL
    assert (finding.evidence["max_size"], finding.evidence["min_size_to_sample"],
            finding.evidence["current_size"]) == (10, 20, 10)
    assert "Raise max_size of 'replay' to at least 20" in finding.fix
    assert "min_replay_size) to at most 10" in finding.fix


def test_stale_data_evidence_counts_the_samples_since_the_last_insert() -> None:
    # Last insert seen at t=1000; 1900 samples since over 500 items: 3.8 times each.
    finding = rules_stalls.is_stale_data(
        case(table_history(T20, 500, [100 * i for i in range(20)], **MIN_SIZE)), DEFAULT)
    assert finding is not None and finding.severity is Severity.WARNING
    assert finding.since == 1000.0
    assert finding.evidence["seconds_since_last_insert"] == 19.0
    assert finding.evidence["samples_since_last_insert"] == 1900
    assert finding.evidence["times_each_item_sampled_since"] == pytest.approx(3.8)
    assert finding.evidence["limiter"] == "MinSize"
    assert "Restart the actors" in finding.fix


def test_learner_starting_says_when_its_grace_began_and_why() -> None:
    finding = judge(rules_startup.is_learner_starting, case(CAN_SAMPLE, compiling()))
    assert finding is not None and finding.severity is Severity.INFO
    assert finding.evidence["grace_basis"] == "probe started_at"
    assert finding.since == 995.0 and finding.evidence["grace_left_s"] == 900 - 24
    assert finding.evidence["would_be"] == ["learner_stalled"]
    alone = judge(rules_startup.is_learner_starting, case(insert_blocked_at_start()))
    assert alone is not None
    assert alone.evidence["grace_basis"] == "server uptime (table worker time)"
    assert alone.evidence["would_be"] == ["insert_blocked"]


# -- engine: supersession across severities ------------------------------------------------------

def kinds_of(view: Any, th: Thresholds = DEFAULT, now: float = 1019.0) -> list[str]:
    return [f.kind for f in diagnose(view, th, now).findings]


def test_learner_starting_stands_down_insert_blocked_until_the_grace_ends() -> None:
    view = target_view([insert_blocked_at_start()])
    assert kinds_of(view) == ["learner_starting"]
    # The same table with a 15 s grace: the server has been up ~19 s, so it is a stall.
    assert kinds_of(view, Thresholds(startup_grace_s=15.0)) == ["insert_blocked"]


def test_learner_starting_stands_down_learner_stalled_and_a_hang_is_caught_after_it() -> None:
    view = target_view([CAN_SAMPLE], [compiling()])
    found = diagnose(view, DEFAULT, 1019.0).findings
    assert [(f.kind, f.severity) for f in found] == [("learner_starting", Severity.INFO)]
    assert kinds_of(view, Thresholds(startup_grace_s=20.0)) == ["learner_stalled"]


def test_a_synchronous_loop_compiling_its_first_step_is_starting_not_sample_blocked() -> None:
    # The loop took its first batch (cursor at min_diff, inserts stopped: the loop is in the
    # learner step); the probe shows it outside next() with no step yet.
    table = table_history(T20, 100, 101, min_diff=-1.0, max_diff=FLOAT_MAX,
                          waiting_for_inserts_ms=waiting())
    probe = probe_history(T20, 1, steps=0, started_at=995.0, gate="can_sample")
    assert kinds_of(target_view([table], [probe])) == ["learner_starting"]
    assert kinds_of(target_view([table], [probe]), Thresholds(startup_grace_s=20.0)) == [
        "sample_blocked"]


def first_draw_then_rest(step_ends_at: int | None = None) -> tuple[TableSnapshot, ...]:
    """Reverb alone, a synchronous loop seen from its fill: 100 items inserted by the
    third poll, 64 samples drawn at the fourth, then nothing; or, `step_ends_at`, a step
    that ends there (10 inserts) and a second batch drawn, then nothing."""
    inserts = [0, 50, 100] + [100] * 17
    samples = [0, 0, 0] + [64] * 17  # the cursor (36) at min_diff: one insert per sample
    if step_ends_at is not None:
        inserts = inserts[:step_ends_at] + [110] * (20 - step_ends_at)
        samples = samples[:step_ends_at] + [74] * (20 - step_ends_at)
    return table_history(T20, inserts, samples, min_diff=36.0, max_diff=FLOAT_MAX,
                         waiting_for_inserts_ms=waiting())


def test_reverb_alone_a_synchronous_loops_first_rest_is_named_but_pages_only_after_the_grace(
        ) -> None:
    # A first step and a hang in the first next() are the same counters on the server.
    view = target_view([first_draw_then_rest()])
    th = Thresholds(stall_window_s=5.0)
    [f] = diagnose(view, th, 1019.0).findings
    assert (f.kind, f.severity) == ("sample_blocked", Severity.INFO)
    assert f.evidence["first_step_or_hang"] is True
    assert f.evidence["first_draw_at"] == T20[3]
    assert f.evidence["pages_in_s"] == pytest.approx(th.startup_grace_s - (1019.0 - T20[3]))
    assert "look the same" in f.summary
    # The grace spent: it pages as before.
    [f] = diagnose(view, dataclasses.replace(th, startup_grace_s=10.0), 1019.0).findings
    assert (f.kind, f.severity) == ("sample_blocked", Severity.CRITICAL)
    # A sidecar that came after the first draw cannot say a step is pending: it pages.
    late = target_view([first_draw_then_rest()[4:]])
    assert [(f.kind, f.severity) for f in diagnose(late, th, 1019.0).findings] == [
        ("sample_blocked", Severity.CRITICAL)]


def test_a_synchronous_loop_seen_inserting_after_its_first_draw_is_judged_by_its_rhythm(
        ) -> None:
    # It inserted after the draw (a step ended), so the rest that follows is judged as a
    # stall of a job seen stepping, and pages.
    view = target_view([first_draw_then_rest(step_ends_at=6)])
    [f] = diagnose(view, Thresholds(stall_window_s=5.0), 1019.0).findings
    assert (f.kind, f.severity) == ("sample_blocked", Severity.CRITICAL)
    assert "first_step_or_hang" not in f.evidence


# The bench's healthy first_step_60s run (probe sidecar), in its numbers: the pipeline drew
# 768 samples (12 batches of 64) before the first step; 846 inserts * spi 8 - 768 = 6000 =
# max_diff, so the actors rest at max_diff; nothing moved for the whole first step.
def resting_through_start_up() -> tuple[TableSnapshot, ...]:
    return table_history(T20, 846, 768, spi=8.0, min_diff=2000.0, max_diff=6000.0,
                         min_size=500, waiting_for_sampling_ms=waiting())


def first_step_at(index: int) -> tuple[Any, ...]:
    """A learner that took one batch at start and is seen through its first step from
    the poll at T20[index] on (12 batches: it takes the ones it buffered)."""
    return probe_history(T20, [1] * index + [12] * (20 - index),
                         steps=[0] * index + [1] * (20 - index), started_at=995.0)


def test_the_poll_that_first_shows_the_first_step_is_still_start_up_not_insert_blocked() -> None:
    # It paged insert_blocked (critical) for one poll in `make bench` before this hand-off.
    view = target_view([resting_through_start_up()], [first_step_at(19)])
    found = diagnose(view, DEFAULT, 1019.0).findings
    assert [(f.kind, f.severity) for f in found] == [("learner_starting", Severity.INFO)]
    [finding] = found
    assert finding.evidence["first_step_seen_at"] == 1019.0
    assert finding.evidence["would_be"] == ["insert_blocked"]
    assert finding.evidence["stall_clock_starts_in_s"] == DEFAULT.stall_window_s
    assert "timed from the first step" in finding.summary


def test_nothing_moving_for_a_stall_window_after_the_first_step_is_insert_blocked() -> None:
    # First step seen at t=1009, 10 s (one stall window) before now, and still nothing moves
    # (the learner's step counter neither: it is stalled too).
    assert kinds_of(target_view([resting_through_start_up()], [first_step_at(9)])) == [
        "learner_stalled", "insert_blocked"]
    # 9 s after it: still the hand-off.
    assert kinds_of(target_view([resting_through_start_up()], [first_step_at(10)])) == [
        "learner_starting"]


def test_a_learner_past_its_first_step_before_the_view_gets_no_hand_off() -> None:
    always = probe_history(T20, 12, steps=1, started_at=995.0)
    assert kinds_of(target_view([resting_through_start_up()], [always])) == [
        "learner_stalled", "insert_blocked"]


def test_actors_dead_before_the_first_sample_stay_sample_blocked() -> None:
    # Reverb alone: 10 of 100 items, inserts stopped, nothing ever sampled: the actors, not
    # the learner's start-up, hold the job.
    table = table_history(T20, 10, 0, min_size=100, waiting_for_inserts_ms=waiting())
    assert kinds_of(target_view([table])) == ["sample_blocked"]
    # Same with a learner that waits in next() for its first batch.
    waiting_learner = probe_history(T20, 0, steps=0, blocked_for=[1.0 + i for i in range(20)],
                                    started_at=995.0)
    assert "learner_starting" not in kinds_of(target_view([table], [waiting_learner]))


def test_warmup_impossible_on_the_first_poll_and_it_supersedes_warmup() -> None:
    first = diagnose(target_view([table_history([1000.0], 10, 0, max_size=10, min_size=20)]),
                     DEFAULT, 1000.0)
    assert [f.kind for f in first.findings] == ["warmup_impossible"]
    assert first.insufficient == ("table:replay",)
    filling = table_history(T20, [10 + 5 * i for i in range(20)], 0, max_size=10, min_size=20)
    assert kinds_of(target_view([filling])) == ["warmup_impossible"]


# -- restarts and restores -------------------------------------------------------------------------

def restarted_table() -> tuple[TableSnapshot, ...]:
    """Healthy to t=1014 on a server up an hour; a fresh server from t=1015 (up 0.5 s)."""
    inserts = [1000 + 2 * i for i in range(15)] + [2 * i for i in range(5)]
    samples = [900 + 2 * i for i in range(15)] + [2 * i for i in range(5)]
    ups = [3600.0 + i for i in range(15)] + [0.5 + i for i in range(5)]
    return uptime(table_history(T20, inserts, samples), ups)


def test_a_replaced_server_is_server_restarted_with_counters_not_a_stall() -> None:
    table = restarted_table()
    found = diagnose(target_view([table]), DEFAULT, 1019.0).findings
    assert [(f.kind, f.severity, f.table) for f in found] == [
        ("server_restarted", Severity.INFO, "")]
    tables = found[0].evidence["tables"]
    assert tables["replay"]["before"]["inserts"] == 1028
    assert tables["replay"]["after"]["inserts"] == 0
    assert tables["replay"]["restored_from_checkpoint"] is False
    assert found[0].since == 1015.0
    derived = derive(table)
    assert derived.insert_rate == 2.0 and derived.sample_rate == 2.0


STARTUP_VIEW_CASES: list[tuple[str, Rule, Callable[[], Any], str | None]] = [
    # Counters and uptime went back at t=1015: a new server under the same address.
    ("server_restarted_when_counters_go_back", rules_startup.is_server_restarted,
     lambda: target_view([restarted_table()]), "server_restarted"),
    # The same server all along (uptime grows with the polls).
    ("no_server_restarted_on_one_server", rules_startup.is_server_restarted,
     lambda: target_view([uptime(table_history(T20, list(range(20)), 0),
                                 [50.0 + i for i in range(20)])]), None),
]


@pytest.mark.parametrize("name,rule,scenario,expected", STARTUP_VIEW_CASES,
                         ids=[c[0] for c in STARTUP_VIEW_CASES])
def test_startup_view_rule(name: str, rule: Rule, scenario: Callable[[], Any],
                             expected: str | None) -> None:
    finding = rule(scenario(), DEFAULT, 1019.0)
    assert (finding.kind if finding else None) == expected
    assert_as_declared(finding, rule)


def test_server_restarted_ends_after_the_startup_grace() -> None:
    table = restarted_table()
    th = Thresholds(startup_grace_s=4.0)  # the restart at t=1015 is 4 s old at t=1019
    assert rules_startup.is_server_restarted(target_view([table]), th, 1019.0) is None


# reverb#118: spi 256, min_size 500 and tolerance 0.1 give error_buffer 12800, so
# min_diff = 256 * 500 - 12800 = 115200 and max_diff = 140800. Restored counters: inserts
# 100073, samples 25,503,488, so cursor = 100073 * 256 - 25,503,488 = 115200 = min_diff:
# a sample needs cursor - 1 >= min_diff, and one insert (+256) allows it.
RESTORE_LIMITER = dict(spi=256.0, min_diff=115_200.0, max_diff=140_800.0, min_size=500,
                       size=100_000)


def restored_table(before_inserts: int = 100_500) -> tuple[TableSnapshot, ...]:
    """Up ten hours to t=1004; restored from the checkpoint at t=1005; the learner waits."""
    inserts = [before_inserts] * 5 + [100_073] * 15
    samples = [before_inserts * 256 - 115_200] * 5 + [25_503_488] * 15
    table = table_history(T20, inserts, samples, waiting_for_inserts_ms=waiting(),
                          **RESTORE_LIMITER)
    return uptime(table, [36_000.0 + i for i in range(5)] + [1.0 + i for i in range(15)])


def test_reverb_118_restore_is_named_and_says_one_insert_unblocks_sampling() -> None:
    assert 100_073 * 256 - 25_503_488 == 115_200
    # 14 s after the restore the actors may still be reconnecting: not a page yet.
    waiting_clients = {f.kind: f for f in diagnose(target_view([restored_table()]), DEFAULT,
                                                   1019.0).findings}
    assert set(waiting_clients) == {"server_restarted", "reconnecting"}
    assert waiting_clients["reconnecting"].evidence["would_be"] == ["sample_blocked"]
    assert waiting_clients["reconnecting"].since == 1005.0
    # Past the reconnect grace nobody inserted: reverb#118's hang, named with its fix.
    th = Thresholds(reconnect_grace_s=10.0)
    found = {f.kind: f for f in diagnose(target_view([restored_table()]), th,
                                         1019.0).findings}
    assert set(found) == {"server_restarted", "sample_blocked"}
    restart = found["server_restarted"].evidence["tables"]["replay"]
    assert restart["restored_from_checkpoint"] is True
    assert restart["after"] == {"inserts": 100_073, "samples": 25_503_488,
                                "current_size": 100_000, "cursor": 115_200.0,
                                "observed_at": 1005.0}
    assert restart["inserts_to_unblock"] == 1
    assert "replay gets 1 more insert(s)" in found["server_restarted"].fix
    blocked = found["sample_blocked"].evidence
    assert blocked["inserts_to_unblock"] == 1 and blocked["restored_from_checkpoint"] is True
    assert found["sample_blocked"].since == 1005.0  # judged from the restore on


def test_a_restore_whose_counters_did_not_go_back_is_seen_by_the_server_uptime() -> None:
    # The checkpoint was written at shutdown: the same counters, a server up 1 s.
    table = restored_table(before_inserts=100_073)
    restart = rules_startup.is_server_restarted(target_view([table]), DEFAULT, 1019.0)
    assert restart is not None
    assert restart.evidence["tables"]["replay"]["restored_from_checkpoint"] is True
    assert diagnose(target_view([table]), DEFAULT, 1019.0).findings[0].since >= 1005.0


def test_a_restore_polled_in_its_first_second_after_a_young_server_is_a_restore() -> None:
    # A server up 8 s inserting 100/s (800 items), checkpointed, stopped 4 s, restored: the
    # first poll is 0.9 s after the restore. Its lifetime rate (100/s) times ten times 0.9 s
    # covered the 800 restored inserts, so a fresh server was said; the actors' own rate
    # cannot insert 800 in 0.9 s.
    times = [1000.0 + i for i in range(8)] + [1012.0, 1013.0]
    table = uptime(table_history(times, [100 * (i + 1) for i in range(8)] + [800, 800], 0),
                   [1.0 + i for i in range(8)] + [0.9, 1.9])
    restart = rules_startup.is_server_restarted(target_view([table]), DEFAULT, 1013.0)
    assert restart is not None
    assert restart.evidence["tables"]["replay"]["restored_from_checkpoint"] is True
    assert "restored from a checkpoint" in restart.summary
    # A fresh server under the same job inserting at three times the old pace is no restore.
    fresh = uptime(table_history(times, [100 * (i + 1) for i in range(8)] + [270, 570], 0),
                   [1.0 + i for i in range(8)] + [0.9, 1.9])
    replaced = rules_startup.is_server_restarted(target_view([fresh]), DEFAULT, 1013.0)
    assert replaced is not None
    assert replaced.evidence["tables"]["replay"]["restored_from_checkpoint"] is False


def test_a_restore_longer_than_the_view_is_still_a_restart_and_an_outage_is_not() -> None:
    # A server up 8 s (800 items), checkpointed and stopped; its restore keeps the port shut
    # for 90 s, longer than the cycle's look-back (60 s here): the view since then would hold
    # only the new server, and the restart, with its "restored from a checkpoint", was lost.
    old = uptime(table_history([1000.0 + i for i in range(8)], [100 * (i + 1) for i in
                                                                 range(8)], 0),
                 [1.0 + i for i in range(8)])
    restored = uptime(table_history([1097.0, 1098.0], [800, 800], 0), [0.9, 1.9])
    history = History()
    for s in (*old, *restored):
        history.record(PollOutcome(s.target, "reverb", s.observed_at, 0.001, tables=(s,)))
    view = history.view(old[0].target, [], start=1098.0 - 60.0)
    assert [s.observed_at for s in view.tables["replay"]] == [1007.0, 1097.0, 1098.0]
    restart = rules_startup.is_server_restarted(view, DEFAULT, 1098.0)
    assert restart is not None
    assert restart.evidence["tables"]["replay"]["restored_from_checkpoint"] is True
    # The same server silent for 90 s (a network cut): its uptime went on, nothing restarted,
    # and the view is what it always was.
    same = uptime(table_history([1097.0, 1098.0], [800, 800], 0), [97.0, 98.0])
    history = History()
    for s in (*old, *same):
        history.record(PollOutcome(s.target, "reverb", s.observed_at, 0.001, tables=(s,)))
    view = history.view(old[0].target, [], start=1098.0 - 60.0)
    assert [s.observed_at for s in view.tables["replay"]] == [1097.0, 1098.0]
    assert rules_startup.is_server_restarted(view, DEFAULT, 1098.0) is None


# -- the threshold: a flag and a TOML key like the others ---------------------------------------

def test_startup_grace_has_its_flag_and_is_validated() -> None:
    from replaywatch.cli import build_parser, config_from_args

    args = build_parser().parse_args(["watch", "--reverb", "h:1", "--startup-grace-s", "45"])
    assert config_from_args(args, {}).thresholds.startup_grace_s == 45.0
    default = build_parser().parse_args(["watch", "--reverb", "h:1"])
    assert config_from_args(default, {}).thresholds.startup_grace_s == 900.0
    with pytest.raises(ValueError, match=r"startup_grace_s \(0\) must be > 0"):
        Thresholds(startup_grace_s=0)
