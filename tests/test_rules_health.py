"""Replay health, judged from the learner's probe and ServerInfo: priorities_ignored,
priority_collapse, repeated_batches and wasted_experience cases. Real Reverb and a real
learner: tests/test_priorities.py, tests/test_waste.py."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

from replaywatch.diagnosis import rules_health
from replaywatch.diagnosis import waste as ws
from replaywatch.diagnosis.case import TableCase
from replaywatch.diagnosis.engine import diagnose
from replaywatch.diagnosis.window import TargetView
from replaywatch.model import (
    BatchStats,
    KeyDistributionOptions,
    NextStrides,
    PriorityUpdates,
    Severity,
)
from tests.builders import DEFAULT, TARGET, polls, probe_snapshot, table_history

T = [1000.0 + i for i in range(5)]


def learner(keys: int, table: str = "replay", calls: int = 3) -> tuple:
    sent = (PriorityUpdates(table, calls, keys, 0.25, 0, 0, 0),) if keys else ()
    return tuple(dataclasses.replace(probe_snapshot(t, 10 + i, table="replay"),
                                     priority_updates=sent if i >= 3 else ())
                 for i, t in enumerate(T))


def view(sampler: str, remover: str, probe: tuple) -> tuple[TargetView, float]:
    tables = tuple(dataclasses.replace(s, sampler=KeyDistributionOptions(sampler),
                                       remover=KeyDistributionOptions(remover))
                   for s in table_history(T, [500 + i for i in range(5)],
                                          [400 + i for i in range(5)], size=500))
    return TargetView(TARGET, polls(T), {"replay": tables}, {probe[-1].probe: probe},
                      {probe[-1].probe: polls(T)}), T[-1]


# (what, the view, the kind it shows or None)
PRIORITY_CASES = [
    ("updates to a Uniform/Fifo table: ignored", view("uniform", "fifo", learner(96)),
     "priorities_ignored"),
    ("updates to a Prioritized table: read", view("prioritized", "fifo", learner(96)), None),
    ("updates to a table that removes by a min-heap: read", view("uniform", "heap", learner(96)),
     None),
    ("a Uniform table no update was sent to", view("uniform", "fifo", learner(0)), None),
    ("updates to another table", view("uniform", "fifo", learner(96, table="other")), None),
]


def test_each_health_case_shows_its_kind() -> None:
    for what, (v, now), kind in PRIORITY_CASES:
        found = [f.kind for f in diagnose(v, DEFAULT, now).findings
                 if f.kind == "priorities_ignored"]
        assert found == ([kind] if kind else []), what


def test_ignored_priorities_say_what_was_sent_and_since_when() -> None:
    v, now = view("uniform", "fifo", learner(96))
    probe = next(iter(v.probes.values()))
    case = TableCase(TARGET, v.tables["replay"], (probe,), now)
    f = rules_health.is_priorities_ignored(case, probe, DEFAULT)
    assert f is not None and f.severity is Severity.WARNING
    assert (f.evidence["sampler"], f.evidence["keys_updated"], f.evidence["update_calls"]) == (
        "uniform", 96, 3)
    assert f.since == T[3]  # the first poll that saw an update
    assert "Prioritized" in f.fix


def batches(share: float, repeated: list[int], infinite: list[int] | None = None,
            n: int = 30) -> tuple:
    """A learner's probe over `n` s on a table of 100,000: its batches' effective sample size
    a `share` of the table, `repeated[i]` batches repeated and `infinite[i]` infinite
    priorities seen by second i."""
    infinite = infinite or [0] * n
    return tuple(dataclasses.replace(
        probe_snapshot(1000.0 + i, 40 * i, table="replay"),
        batch_stats=BatchStats(40 * i + 1, 256 * (40 * i + 1), 0, repeated[i], infinite[i],
                               share * 100_000, 100_000, 1.0, 1.0, 3))
        for i in range(n))


def table_of(sampler: str, n: int = 30) -> tuple:
    times = [1000.0 + i for i in range(n)]
    return tuple(dataclasses.replace(s, sampler=KeyDistributionOptions(sampler, 0.8))
                 for s in table_history(times, [100_000 + i for i in range(n)],
                                        [50_000 + 256 * i for i in range(n)], size=100_000,
                                        max_size=100_000))


def probed(sampler: str, probe: tuple) -> tuple[TargetView, float]:
    times = [p.observed_at for p in probe]
    return TargetView(TARGET, polls(times), {"replay": table_of(sampler, len(probe))},
                      {probe[-1].probe: probe}, {probe[-1].probe: polls(times)}), times[-1]


BATCH_CASES = [
    ("a healthy prioritized learner", probed("prioritized", batches(0.4, [0] * 30)), None),
    ("its sampler on 0.5% of the table for 30 s: collapse",
     probed("prioritized", batches(0.005, [0] * 30)), "priority_collapse"),
    ("the same share on a uniform table cannot be a priority's doing",
     probed("uniform", batches(0.005, [0] * 30)), None),
    ("an infinite priority in a batch 5 s ago",
     probed("prioritized", batches(0.4, [0] * 30, [0] * 25 + [2] * 5)), "priority_collapse"),
    ("an infinite priority 25 s ago, none since (capped): resolved",
     probed("prioritized", batches(0.4, [0] * 30, [0] * 5 + [2] * 25)), None),
    ("a batch repeated 5 s ago", probed("uniform", batches(1.0, [0] * 25 + [1] * 5)),
     "repeated_batches"),
    ("a repeat 25 s ago and none since: resolved",
     probed("uniform", batches(1.0, [0] * 5 + [1] * 25)), None),
]


def evicting(spi: float, share: float, *, max_size: int = 1000, seconds: int = 90,
             rate: int = 100, sampler: str = "uniform", remover: str = "fifo",
             full: bool = True, pause_every: int = 0) -> tuple[TargetView, float]:
    """A full table (`full`) taking `rate` inserts a second for `seconds`, sampled `spi` per
    insert, a `share` of its inserts never sampled; with `pause_every`, no sample in one
    poll of every `pause_every`."""
    times = [1000.0 + i for i in range(seconds + 1)]
    samples, n = [], 0
    for i in range(len(times)):
        n += 0 if pause_every and i % pause_every == 0 else spi * rate * (
            pause_every / (pause_every - 1) if pause_every else 1)
        samples.append(int(n))
    tables = tuple(dataclasses.replace(s, remover=KeyDistributionOptions(remover))
                   for s in table_history(
                       times, [50_000 + rate * i for i in range(len(times))], samples,
                       size=max_size if full else max_size - 1, max_size=max_size,
                       sampler=sampler,
                       unique=[20_000 + int((1 - share) * rate * i) for i in range(len(times))]))
    return TargetView(TARGET, polls(times), {"replay": tables}, {}, {}), times[-1]


WASTE_CASES = [
    ("0.4 samples per insert, 67% never sampled: the ratio",
     evicting(0.4, 0.67), "wasted_experience"),
    ("2 per insert, 14% never sampled", evicting(2.0, 0.14), None),
    ("1 per insert, 75% never sampled: bursts", evicting(1.0, 0.75), "wasted_experience"),
    ("the same on a prioritized table", evicting(1.0, 0.75, sampler="prioritized"),
     "wasted_experience"),
    ("a table that is not full evicts nothing", evicting(0.4, 0.67, full=False), None),
    ("full for 30 s: under spi_window_s", evicting(0.4, 0.67, seconds=30), None),
    ("evicting by a heap (lowest priority first), on purpose", evicting(
        0.4, 0.67, remover="heap"), None),
    ("fewer than two turnovers", evicting(0.4, 0.67, max_size=5000), None),
    ("nothing sampled at all (a learner not started, a table only written to)",
     evicting(0.0, 1.0), None),
]


def refusing(calls: list[int], errors: list[int], rejected: int = 8) -> tuple[TargetView, float]:
    """A prioritized table's learner whose cumulative update `calls` and refused calls
    (`errors`) are read once a second."""
    n = len(calls)
    probe = tuple(dataclasses.replace(
        probe_snapshot(1000.0 + i, 10 + i, table="replay"),
        priority_updates=(PriorityUpdates("replay", calls[i], 8 * calls[i], 0.1 * calls[i],
                                          errors[i], rejected if errors[i] else 0, 0,
                                          "Priority must not be NaN." if errors[i] else None),))
        for i in range(n))
    return probed("prioritized", probe)


REJECT_CASES = [
    ("updates accepted", refusing(list(range(20)), [0] * 20), None),
    ("every call of the last 10 s refused: critical",
     refusing(list(range(20)), [0] * 8 + list(range(12))), "priority_updates_rejected"),
    ("one refused among accepted ones: a warning", refusing(list(range(20)), [0] * 15 + [1] * 5),
     "priority_updates_rejected"),
    ("a refusal 15 s ago, none since: resolved", refusing(list(range(20)), [0] * 4 + [1] * 16),
     None),
]
HEALTH_CASES = PRIORITY_CASES + BATCH_CASES + WASTE_CASES + REJECT_CASES


def test_refused_priority_updates_page_only_when_every_one_is_refused() -> None:
    severities = []
    for what, (v, now), kind in REJECT_CASES:
        found = [f for f in diagnose(v, DEFAULT, now).findings
                 if f.kind == "priority_updates_rejected"]
        assert [f.kind for f in found] == ([kind] if kind else []), what
        severities += [f.severity for f in found]
    assert severities == [Severity.CRITICAL, Severity.WARNING]
    v, now = REJECT_CASES[1][1]
    [f] = [f for f in diagnose(v, DEFAULT, now).findings if f.kind == "priority_updates_rejected"]
    assert (f.evidence["calls_in_window"], f.evidence["refused_in_window"]) == (10, 10)
    assert f.evidence["last_error"] == "Priority must not be NaN." and "NaN" in f.fix
    assert f.since == 1010.0  # the first poll of the window that saw a new refusal


def test_each_waste_case_shows_its_kind() -> None:
    for what, (v, now), kind in WASTE_CASES:
        found = [f.kind for f in diagnose(v, DEFAULT, now).findings
                 if f.kind == "wasted_experience"]
        assert found == ([kind] if kind else []), what


def wasted(v: TargetView, now: float) -> Any:
    f = rules_health.is_wasted_experience(v, DEFAULT, now)
    assert f is not None and f.severity is Severity.WARNING and f.table == "replay"
    return f


def test_too_few_samples_per_insert_print_the_ratio_and_not_a_larger_table() -> None:
    f = wasted(*evicting(0.4, 0.67))
    assert f.evidence["fix_samples_per_insert"] == 1.0 and f.evidence["fix_max_size"] is None
    assert f.evidence["burst"] is None
    assert f.evidence["uniform_share_at_this_ratio"] == pytest.approx(math.exp(-0.4), abs=1e-3)
    assert "samples_per_insert=1" in f.fix and "larger max_size changes nothing" in f.fix


def test_bursts_longer_than_the_table_print_the_max_size_that_holds_one() -> None:
    f = wasted(*evicting(1.0, 0.75))
    # 75% at 1 per insert on a table of 1000: a burst of 4000 (1 - (1 - e^-4) / 4)
    assert f.evidence["burst"] == pytest.approx(4000, rel=0.02)
    assert f.evidence["fix_max_size"] == 4800 and f.evidence["fix_samples_per_insert"] is None
    assert "max_size to 4,800" in f.fix and "prioritized" not in f.summary


def test_a_prioritized_table_names_both_causes_until_its_batches_settle_it() -> None:
    v, now = evicting(1.0, 0.75, sampler="prioritized")
    f = wasted(v, now)
    assert "either bursts" in f.summary and "batch_stats=True" in f.summary
    assert f.fix.startswith("If bursts:") and "If the priorities" in f.fix
    # A learner whose batches draw from 95% of the table: its priorities do not explain it.
    stats = BatchStats(10, 2560, 0, 0, 0, 950.0, 1000, 1.1, 1.0, 3)
    probe = (dataclasses.replace(probe_snapshot(now, 10, table="replay"), batch_stats=stats),)
    settled = wasted(dataclasses.replace(v, probes={probe[0].probe: probe}), now)
    assert "either" not in settled.summary and settled.evidence[
        "effective_sample_size_share"] == 0.95


def test_a_loop_whose_probe_counts_its_inserts_between_next_calls_gives_the_burst() -> None:
    # A synchronous loop that collects 5000 steps per train step (its wrapped writer's
    # inserts between next() calls): the burst is measured, not read from the share.
    v, now = evicting(1.0, 0.75)
    strides = NextStrides(inserts_at_first=0, inserts_at_last=50_000, count=10, least=5000,
                          most=5000)
    probe = (dataclasses.replace(probe_snapshot(now, 10, table="replay"),
                                 next_strides=strides),)
    f = wasted(dataclasses.replace(v, probes={probe[0].probe: probe}), now)
    assert f.evidence["burst"] == 5000 and f.evidence["fix_max_size"] == 6000
    assert f.evidence["burst_from"] == "the loop's inserts between next() calls"
    # The same strides where the share is e^-s: the dataset sampled through them, no burst.
    v, now = evicting(0.4, 0.67)
    f = wasted(dataclasses.replace(v, probes={probe[0].probe: probe}), now)
    assert f.evidence["burst"] is None and f.evidence["fix_max_size"] is None


def test_a_pause_the_polls_see_is_a_burst_of_its_own() -> None:
    # No sample in one poll of every ten, 1000 items a second into a table of 1000: the
    # polls see 1000-item pauses (2000 with the interval after), more than the share alone
    # explains.
    v, now = evicting(1.0, 0.55, rate=1000, pause_every=10, seconds=120)
    f = wasted(v, now)
    assert f.evidence["burst"] == 2000 and f.evidence["fix_max_size"] == 2400
    assert f.evidence["burst_from"] == "a pause in sampling the polls saw"
    assert "a learner that does not pause while the actors insert" in f.fix


def test_the_waste_arithmetic() -> None:
    assert ws.uniform_share(1.0, 100) == pytest.approx(math.exp(-1))
    assert ws.uniform_share(1.0, 100, 400) == pytest.approx(1 - 0.25 * (1 - math.exp(-4)))
    assert ws.uniform_share(0.0, 100) == 1.0
    for spi, size, burst in ((1.0, 100, 400), (0.5, 200, 800), (2.0, 250, 1000)):
        share = ws.uniform_share(spi, size, burst)
        assert ws.burst_for(share, spi, size) == pytest.approx(burst, rel=1e-6)
    assert ws.burst_for(math.exp(-1) - 0.01, 1.0, 100) is None  # e^-s explains it
    assert (ws.round_up(4000 * 1.2), ws.round_up(473.4), ws.round_up(0.0)) == (4800, 480, 0)


def test_each_batch_case_shows_its_kind() -> None:
    for what, (v, now), kind in BATCH_CASES:
        found = [f.kind for f in diagnose(v, DEFAULT, now).findings
                 if f.kind in ("priority_collapse", "repeated_batches")]
        assert found == ([kind] if kind else []), what
