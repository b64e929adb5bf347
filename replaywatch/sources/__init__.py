"""Sources: the edge where replaywatch reads a Reverb server or a trainer probe.

A source has a name and `poll()`; it never raises for a failed read, it returns
the failure as a `PollOutcome` with `error` set. The poller's loop is:

    for source in sources:
        outcome = source.poll()
        history.record(outcome)
"""

from __future__ import annotations

from typing import Protocol

from replaywatch.model import PollOutcome, SourceKind


class Source(Protocol):
    name: str
    kind: SourceKind

    def poll(self) -> PollOutcome: ...

    def close(self) -> None: ...
