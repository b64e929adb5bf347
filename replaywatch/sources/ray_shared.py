"""What every job of one Ray cluster reads alike, read once a cycle (`--ray-job all`).

Each job on a cluster is a target of its own, polled on its own thread, and three of its
reads are the same for every job: the state API's actors list, its live workers, and each
node's metrics page (a node's page holds every job's series, so with N jobs it grows N-fold
and N job sources parsed it N times a cycle). `ClusterReads` hands a read younger than
`fresh_s` (half the poll interval) to the job sources after the first, and makes one that
asks while the read is in flight wait for it: its answer, or its error, since a dashboard
that does not answer one job's poll does not answer the others' either.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from replaywatch.errors import SourceError

T = TypeVar("T")


class ClusterReads:
    """Reads shared by a cluster's job sources, by key, each for `fresh_s` from its start."""

    def __init__(self, fresh_s: float, clock: Callable[[], float] = time.monotonic):
        self._fresh_s = fresh_s
        self._clock = clock
        self._lock = threading.Lock()
        self._in_flight: dict[str, threading.Lock] = {}
        self._done: dict[str, tuple[float, Any, SourceError | None]] = {}
        self.reads = 0  # reads made, not handed on: what sharing saves is counted against it
        self.handed = 0

    def read(self, key: str, fetch: Callable[[], T]) -> T:
        """`fetch()`'s answer, read now or handed from a read started less than `fresh_s`
        ago; its SourceError is raised to every job that asks within that time."""
        with self._lock:
            lock = self._in_flight.setdefault(key, threading.Lock())
        with lock:
            hit = self._done.get(key)
            if hit is not None and self._clock() - hit[0] < self._fresh_s:
                self.handed += 1
                if hit[2] is not None:
                    raise copy.copy(hit[2])  # each raise its own: a traceback is per thread
                value: T = hit[1]
                return value
            began = self._clock()
            self.reads += 1
            try:
                value = fetch()
            except SourceError as e:
                self._done[key] = (began, None, e)
                raise
            self._done[key] = (began, value, None)
            return value
