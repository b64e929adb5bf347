"""The window's reset finder against its definition, on random histories.

`last_reset_index` runs for every table on every cycle, so it walks back from the newest
point; this checks it against the plain forward reading of the definition.
"""

from __future__ import annotations

import random

from replaywatch.diagnosis.window import last_reset_index, worker_ms
from tests.builders import table_history


def forward(snapshots: tuple) -> int:
    start = 0
    for i in range(1, len(snapshots)):
        prev, cur = snapshots[i - 1], snapshots[i]
        if (cur.rate_limiter.inserts < prev.rate_limiter.inserts
                or cur.rate_limiter.samples < prev.rate_limiter.samples
                or worker_ms(cur) < worker_ms(prev)):
            start = i
    return start


def test_the_newest_reset_is_found_as_the_definition_reads() -> None:
    rng = random.Random(7)
    found = set()
    for _ in range(300):
        n = rng.randint(0, 40)

        def walk(drop: float, n: int = n) -> list[int]:
            values, v = [], rng.randint(0, 50)
            for _ in range(n):
                v = rng.randint(0, 5) if rng.random() < drop else v + rng.randint(0, 9)
                values.append(v)
            return values

        hist = table_history(list(range(n)), walk(0.05), walk(0.05),
                             waiting_for_inserts_ms=walk(0.05))
        assert last_reset_index(hist) == forward(hist)
        found.add(forward(hist) > 0)
    assert found == {True, False}  # both kinds of history were drawn


def test_a_restore_that_keeps_counters_is_found_by_the_worker_uptime() -> None:
    hist = table_history([0, 1, 2, 3], [10, 20, 30, 40], [5, 10, 15, 20],
                         waiting_for_inserts_ms=[1000, 2000, 50, 1050])
    assert last_reset_index(hist) == 2
    assert last_reset_index(hist[:1]) == 0 and last_reset_index(()) == 0


def test_answered_again_is_the_first_answer_after_a_long_enough_outage() -> None:
    from replaywatch.diagnosis.window import PollRecord, answered_again_at

    def polls(oks: str) -> tuple[PollRecord, ...]:
        return tuple(PollRecord(float(i), c == "o", 0.001, None if c == "o" else "x")
                     for i, c in enumerate(oks))

    assert answered_again_at(polls("ooxxxoo"), 2) == 5.0  # three failures, back at t=5
    assert answered_again_at(polls("ooxxoo"), 2) is None  # two are not target_down
    assert answered_again_at(polls("oxxxooxoo"), 2) == 4.0  # a later single failure: no
    assert answered_again_at(polls("ooxxx"), 2) is None  # still down
    assert answered_again_at(polls("xxxoo"), 2) == 3.0  # the view began mid-outage
    assert answered_again_at(polls("oooo"), 2) is None
