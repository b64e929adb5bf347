"""agents/seed_hang.py: reading the warm-up race's outcome from the probe, and the retries.

Scripted probe documents stand in for agents (the helper only sees our own interface:
start, read the probe, stop); the real agent runs in test_alerting_e2e.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from agents.seed_hang import STRANDED_AFTER_S, until_stranded, warmup_outcome

WAITING = {"blocked_in_next": False, "blocked_for_s": 0.0, "batches_retrieved": 0}
BLOCKING = {"blocked_in_next": True, "blocked_for_s": 1.0, "batches_retrieved": 0}
STRANDED = {"blocked_in_next": True, "blocked_for_s": STRANDED_AFTER_S, "batches_retrieved": 0}
FED = {"blocked_in_next": False, "blocked_for_s": 0.0, "batches_retrieved": 3}


@pytest.mark.parametrize(("probe", "outcome"), [
    (WAITING, None), (BLOCKING, None), (STRANDED, "stranded"), (FED, "passed"),
    # Blocked now but batches came before: the race went the healthy way at warm-up.
    ({**STRANDED, "batches_retrieved": 1}, "passed"),
])  # fmt: skip
def test_warmup_outcome(probe: dict[str, Any], outcome: str | None) -> None:
    assert warmup_outcome(probe) == outcome


class Script:
    """Each start plays one list of probe documents, the last one repeating."""

    def __init__(self, *runs: list[dict[str, Any]]):
        self.runs = runs
        self.started: list[int] = []
        self.stopped: list[int] = []
        self.now = 0.0
        self.reads = {i: 0 for i in range(len(runs))}

    def start(self, attempt: int) -> int:
        self.started.append(attempt)
        return len(self.started) - 1

    def read(self, handle: int) -> dict[str, Any]:
        run = self.runs[handle]
        doc = run[min(self.reads[handle], len(run) - 1)]
        self.reads[handle] += 1
        return doc

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def call(self, **kw: Any) -> tuple[int, int]:
        return until_stranded(self.start, self.read, self.stopped.append,
                              clock=lambda: self.now, sleep=self.sleep, **kw)


def test_a_stranded_first_start_is_kept_and_not_stopped() -> None:
    script = Script([WAITING, BLOCKING, STRANDED])
    assert script.call() == (0, 1)
    assert script.started == [1] and script.stopped == []


def test_fed_starts_are_stopped_and_started_again() -> None:
    script = Script([WAITING, FED], [FED], [BLOCKING, STRANDED])
    assert script.call() == (2, 3)
    assert script.started == [1, 2, 3] and script.stopped == [0, 1]


def test_every_start_fed_is_an_error_naming_the_outcomes() -> None:
    script = Script([FED], [FED])
    with pytest.raises(RuntimeError, match=r"all 2 starts: \['passed', 'passed'\]"):
        script.call(attempts=2)
    assert script.stopped == [0, 1]


def test_a_start_that_decides_nothing_times_out_and_is_stopped() -> None:
    script = Script([WAITING])
    with pytest.raises(TimeoutError, match="attempt 1"):
        script.call(timeout_s=5.0)
    assert script.stopped == [0]
