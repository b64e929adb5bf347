"""Faults injected on purpose, so the diagnosis can be tested against real symptoms."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from agents.config import StallInjection, StallKind

Emit = Callable[[dict[str, Any]], None]


class StallTimer:
    """Answers "is it time?" for one injected stall, against a start time and a clock."""

    def __init__(
        self,
        stall: StallInjection | None,
        started_at: float,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._stall = stall
        self._started_at = started_at
        self._clock = clock

    def due(self, kind: StallKind) -> bool:
        return (
            self._stall is not None
            and self._stall.kind is kind
            and self._clock() - self._started_at >= self._stall.after_s
        )

    def maybe_hang_learner(self, emit: Emit) -> None:
        """If a learner hang is due, block this thread forever, as a hung pmap would.

        The process stays alive and the probe keeps answering: learner steps
        stop while `blocked_in_next` stays false, which is what tells a hung
        learner from a starved iterator.
        """
        if self.due(StallKind.LEARNER_HANG):
            emit({"event": "stall_injected", "kind": StallKind.LEARNER_HANG.value})
            threading.Event().wait()

    def maybe_exit_actor(self, emit: Emit, kinds: tuple[StallKind, ...]) -> None:
        """If an actor exit of one of `kinds` is due, end this process at once."""
        if any(self.due(kind) for kind in kinds):
            emit({"event": "stall_injected", "kind": self._stall.kind.value, "pid": os.getpid()})
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(17)  # no cleanup: an actor killed by the OOM killer gets none either
