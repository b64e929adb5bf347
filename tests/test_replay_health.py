"""Replay health, judged from the learner's probe and ServerInfo: priorities_ignored,
priority_collapse and repeated_batches cases. Real Reverb and a real learner:
tests/test_priorities.py."""

from __future__ import annotations

import dataclasses

from replaywatch.diagnosis import rules_health
from replaywatch.diagnosis.case import TableCase
from replaywatch.diagnosis.engine import diagnose
from replaywatch.diagnosis.window import TargetView
from replaywatch.model import BatchStats, KeyDistributionOptions, PriorityUpdates, Severity
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
HEALTH_CASES = PRIORITY_CASES + BATCH_CASES


def test_each_batch_case_shows_its_kind() -> None:
    for what, (v, now), kind in BATCH_CASES:
        found = [f.kind for f in diagnose(v, DEFAULT, now).findings
                 if f.kind in ("priority_collapse", "repeated_batches")]
        assert found == ([kind] if kind else []), what
