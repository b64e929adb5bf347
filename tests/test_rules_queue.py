"""Queue tables (`reverb.Table.queue`): drained, and the stalls as a queue shows them. One
table row per case, each with why, as in tests/test_rules_stalls.py; then the engine's view.

Times are 1 s polls from t=1000; the stall window is 10 s. A queue of 100 items has the Queue
limiter: spi 1, min_size 1, min_diff 0, max_diff 100.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from replaywatch.diagnosis import rules_queue, rules_stalls
from replaywatch.diagnosis.engine import diagnose
from replaywatch.model import Finding, Severity, TableSnapshot
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

QUEUE = dict(spi=1.0, min_diff=0.0, max_diff=100.0, min_size=1, max_size=100)
MOVING = [10 * i for i in range(20)]


def queue(inserts: Any, samples: Any, size: Any, **kw: Any) -> tuple[TableSnapshot, ...]:
    return table_history(T20, inserts, samples, size=size, **QUEUE, **kw)


Rule = Callable[..., "Finding | None"]
QUEUE_CASES: list[tuple[str, Rule, Callable[[], Any], str | None]] = [
    # 10 items/s in and out, the queue empty at every poll: the learner waits for the actors.
    ("drained_when_the_queue_is_empty_while_items_move", rules_queue.is_drained,
     lambda: case(queue(MOVING, MOVING, 0, waiting_for_inserts_ms=waiting(600.0))),
     "drained"),
    # Empty at 6 of the 11 polls in the window: still a learner that keeps up.
    ("drained_when_empty_at_most_polls", rules_queue.is_drained,
     lambda: case(queue(MOVING, MOVING, [3, 0] * 10)), "drained"),
    # Full (100 items) while both sides move: the actors wait for the learner, the other way.
    ("no_drained_when_the_queue_is_full", rules_queue.is_drained,
     lambda: case(queue([100 + 10 * i for i in range(20)], MOVING, 100)), None),
    # Empty and nothing inserted for the window: that is sample_blocked, not a fast learner.
    ("no_drained_when_the_actors_stopped", rules_queue.is_drained,
     lambda: case(queue(100, 100, 0, waiting_for_inserts_ms=waiting())), None),
    # The same numbers on a replay table (spi 1, min_diff -100): not a queue.
    ("no_drained_on_a_replay_table", rules_queue.is_drained,
     lambda: case(table_history(T20, MOVING, MOVING, size=0)), None),
    # A queue whose actors stopped with the learner waiting: sample_blocked, as any table.
    ("sample_blocked_on_an_empty_queue_whose_actors_stopped", rules_stalls.is_sample_blocked,
     lambda: case(queue(100, 100, 0, waiting_for_inserts_ms=waiting())), "sample_blocked"),
]


@pytest.mark.parametrize("name,rule,scenario,expected", QUEUE_CASES,
                         ids=[c[0] for c in QUEUE_CASES])
def test_queue_rule(name: str, rule: Rule, scenario: Callable[[], Any],
                    expected: str | None) -> None:
    finding = rule(scenario(), DEFAULT)
    assert (finding.kind if finding else None) == expected
    assert_as_declared(finding, rule)


def test_drained_says_how_much_faster_the_learner_is() -> None:
    # 10 items/s, and the learner's requests waited 600 ms of every second: busy 40% of the
    # time for 10 items/s, it could take about 25/s.
    finding = rules_queue.is_drained(
        case(queue(MOVING, MOVING, 0, waiting_for_inserts_ms=waiting(600.0))), DEFAULT)
    assert finding is not None and finding.severity is Severity.INFO
    ev = finding.evidence
    assert (ev["empty_polls"], ev["polls"]) == (11, 11)
    assert ev["insert_rate_per_s"] == ev["sample_rate_per_s"] == 10.0
    assert ev["learner_waiting_share"] == pytest.approx(0.6)
    assert ev["learner_could_take_per_s"] == pytest.approx(25.0)
    assert "about 25 items/s against the 10/s inserted" in finding.summary


def test_a_drained_queue_is_not_warmup_in_the_engine() -> None:
    view = target_view([queue(MOVING, MOVING, 0)])
    assert [f.kind for f in diagnose(view, DEFAULT, 1019.0).findings] == ["drained"]


def test_sample_blocked_on_a_queue_counts_the_items_in_the_learners_client() -> None:
    # The learner (batch 16) got 5 batches = 80 items of the 100 drawn: 20 sit in its client.
    probe = probe_history(T20, 5, blocked_for=[0.0] * 5 + [float(i) for i in range(1, 16)],
                          batch_size=16, prefetch=0, started_at=990.0)
    finding = rules_stalls.is_sample_blocked(
        case(queue(100, 100, 0, waiting_for_inserts_ms=waiting()), probe), DEFAULT)
    assert finding is not None
    assert finding.evidence["queue"] is True
    assert finding.evidence["items_in_learner_client"] == 20.0
    alone = rules_stalls.is_sample_blocked(
        case(queue(100, 100, 0, waiting_for_inserts_ms=waiting())), DEFAULT)
    assert alone is not None and alone.evidence["items_in_learner_client"] is None
