"""Sections: the parts of a loop where it makes no progress on purpose.

    with probe.section("evaluate"):             # an evaluation inside the learner loop
        run_eval_episodes()
    with probe.section("checkpoint", timeout_s=600):
        checkpointer.save()

Inside a section the sidecar's stall rules wait for the section's own `timeout_s`, or, once
it has ended before, for its learned length (its longest, with slack), and say so
(`in_section`); past that the usual stall is named. Each section's past (how often it
ended, its longest and last length) is kept here, in the process, so a restarted sidecar
has it at once. Durations are the process's monotonic clock: a step of the wall clock
never makes a section look long.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from replaywatch.probe.protocol import Doc, SectionKeys

MAX_NAMES = 32  # sections are the code's own few names; more are refused, not grown
MAX_NAME = 64


class Sections:
    """The section a loop is inside now (innermost, when nested) and each one's past."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._lock = threading.Lock()
        self._open: list[tuple[str, float, float | None]] = []  # name, entered, timeout_s
        self._past: dict[str, tuple[int, float, float]] = {}  # name -> count, longest, last

    @contextlib.contextmanager
    def section(self, name: str, timeout_s: float | None = None) -> Iterator[None]:
        """Marks the block as the section `name`; `timeout_s`: the longest it may take."""
        if not isinstance(name, str) or not name or len(name) > MAX_NAME:
            raise ValueError(f"section name must be 1 to {MAX_NAME} characters, got {name!r}")
        if timeout_s is not None and not timeout_s > 0:
            raise ValueError(f"section timeout_s ({timeout_s!r}) must be > 0")
        with self._lock:
            if name not in self._past and len(self._past) >= MAX_NAMES:
                raise ValueError(f"more than {MAX_NAMES} section names: name sections by "
                                 "what they do (evaluate, checkpoint), not by step")
            entry = (name, self._clock(), None if timeout_s is None else float(timeout_s))
            self._open.append(entry)
        try:
            yield
        finally:
            took = self._clock() - entry[1]
            with self._lock:
                self._open.remove(entry)
                count, longest, _ = self._past.get(name, (0, 0.0, 0.0))
                self._past[name] = (count + 1, max(longest, took), took)

    def doc(self) -> dict[str, Any]:
        """`section` (the one inside now, or null) and `sections` (each one's past)."""
        now = self._clock()
        with self._lock:
            current = self._open[-1] if self._open else None
            past = dict(self._past)
        return {
            Doc.SECTION: None if current is None else {
                SectionKeys.NAME: current[0], SectionKeys.FOR_S: max(0.0, now - current[1]),
                SectionKeys.TIMEOUT_S: current[2]},
            Doc.SECTIONS: {name: {SectionKeys.COUNT: c, SectionKeys.LONGEST_S: longest,
                                  SectionKeys.LAST_S: last}
                           for name, (c, longest, last) in sorted(past.items())},
        }
