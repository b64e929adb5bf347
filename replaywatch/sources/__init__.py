"""Sources: the edge where replaywatch reads a Reverb server or a trainer probe.

A source has a name and `poll()`; it never raises for a failed read, it returns
the failure as a `PollOutcome` with `error` set. The poller's loop is:

    for source in sources:
        outcome = source.poll()
        history.record(outcome)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from replaywatch.model import PollOutcome, SourceKind


class Source(Protocol):
    name: str
    kind: SourceKind

    def poll(self) -> PollOutcome: ...

    def close(self) -> None: ...


class PolledSource:
    """What every source keeps: its name, the per-poll timeout, and two clocks (the wall
    clock for `observed_at`, a monotonic one for durations) that tests may hand fakes."""

    def __init__(self, name: str, timeout_s: float, clock: Callable[[], float] = time.time,
                 perf: Callable[[], float] = time.perf_counter):
        self.name = name
        self._timeout_s = timeout_s
        self._clock = clock
        self._perf = perf
