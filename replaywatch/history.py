"""The bounded history of every source: the poller writes, API threads read."""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from replaywatch.diagnosis.window import PollRecord, TargetView, last_reset_index
from replaywatch.model import (
    ActorSnapshot,
    MemorySnapshot,
    PollOutcome,
    ProbeSnapshot,
    SourceKind,
    TableSnapshot,
)
from replaywatch.ray_model import RaySnapshot

_SWEEP_EVERY = 1000  # records between sweeps for sources that went quiet
COARSE_EVERY_S = 10.0  # the throughput baselines' bucket


def _poll_at(r: Any) -> float:
    return float(r.at)


def _observed_at(s: Any) -> float:
    return float(s.observed_at)


def _append(points: collections.deque, item: Any, oldest: float,
            stamp: Callable[[Any], float]) -> None:
    points.append(item)
    while points and stamp(points[0]) < oldest:
        points.popleft()


T = TypeVar("T")


def _tail(points: Sequence[T], start: float,
          at: Callable[[T], float] = _observed_at) -> tuple[T, ...]:
    """The points at or after `start` (by `at`: a snapshot's observed_at by default), walked
    from the newest back. A view's window is a minute or two of a history kept for fifteen;
    read from the oldest, the views of a fleet (32 servers, 512 probes) scanned the whole
    history every cycle, and the cycle grew with it."""
    kept = []
    for point in reversed(points):
        if at(point) < start:
            break
        kept.append(point)
    kept.reverse()
    return tuple(kept)


def _since(points: Sequence[TableSnapshot], start: float) -> tuple[TableSnapshot, ...]:
    """A table's snapshots since `start`, led by the old server's last one where a new server
    answered after it: a restore longer than the view (a 100 GiB load takes minutes) would
    otherwise leave no trace of the old server, and the restart could not be named."""
    kept = _tail(points, start)
    older = len(points) - len(kept)
    if kept and older and last_reset_index((points[older - 1], kept[0])) == 1:
        return (points[older - 1], *kept)
    return tuple(kept)


class History:
    """Bounded, time-ordered history of every source, written by the poller.

    One writer (the poller thread) and many readers (API threads): every method
    takes the lock briefly and readers get copies, never the live deques.
    """

    def __init__(self, max_age_s: float = 900.0, max_points: int = 900,
                 coarse_every_s: float = COARSE_EVERY_S, coarse_age_s: float = 0.0):
        if max_age_s <= 0 or max_points < 2:
            raise ValueError(
                f"history max_age_s ({max_age_s}) must be > 0 and max_points ({max_points}) >= 2"
            )
        if coarse_every_s <= 0 or coarse_age_s < 0:
            raise ValueError(f"coarse_every_s ({coarse_every_s}) must be > 0 and coarse_age_s "
                             f"({coarse_age_s}) >= 0")
        self._max_age_s = max_age_s
        self._max_points = max_points
        # A coarse copy, one snapshot per `coarse_every_s`, kept for `coarse_age_s`: the
        # throughput baselines look back half an hour, which the full history (every poll,
        # for the stall rules) would hold at 1,800 snapshots a table.
        self._coarse_every_s = coarse_every_s
        self._coarse_age_s = coarse_age_s
        self._coarse_tables: dict[tuple[str, str], collections.deque[TableSnapshot]] = {}
        self._coarse_actors: dict[str, collections.deque[ActorSnapshot]] = {}
        self._lock = threading.Lock()
        self._polls: dict[str, collections.deque[PollRecord]] = {}
        self._tables: dict[tuple[str, str], collections.deque[TableSnapshot]] = {}
        self._probes: dict[str, collections.deque[ProbeSnapshot]] = {}
        self._actors: dict[str, collections.deque[ActorSnapshot]] = {}
        self._memory: dict[str, collections.deque[MemorySnapshot]] = {}
        self._ray: dict[str, collections.deque[RaySnapshot]] = {}  # by Ray target
        # Targets whose replay probe serves their memory: the probe's URL and its newest
        # reading's time. Read from inside the process, it is kept over what the sidecar reads
        # of a local one while it answers; once it stops (a server the kernel killed takes its
        # probe with it) the local reading, the one that sees the cgroup's OOM count, is kept.
        self._memory_probed: dict[str, tuple[str, float]] = {}
        self._memory_local_at: dict[str, float] = {}
        self._records = 0

    def _deque(self, store: dict[Any, Any], key: Any) -> collections.deque[Any]:
        if key not in store:
            store[key] = collections.deque(maxlen=self._max_points)
        return store[key]

    def record(self, outcome: PollOutcome) -> None:
        """Adds one poll's outcome and forgets what is older than the window."""
        oldest = outcome.started_at - self._max_age_s
        record = PollRecord(outcome.started_at, outcome.ok, outcome.duration_s, outcome.error)
        with self._lock:
            _append(self._deque(self._polls, outcome.source), record, oldest, _poll_at)
            if outcome.memory is not None and self._keeps_memory(outcome):
                _append(self._deque(self._memory, outcome.memory.target), outcome.memory,
                        oldest, _observed_at)
            for table in outcome.tables:
                points = self._deque(self._tables, (table.target, table.name))
                _append(points, table, oldest, _observed_at)
                self._coarse(self._coarse_tables, (table.target, table.name), table,
                             outcome.started_at)
            # A probe URL has one role at a time: a process replaced by one of
            # the other role (a port reused) starts that URL's history afresh.
            if outcome.probe is not None:
                self._actors.pop(outcome.source, None)
                points = self._deque(self._probes, outcome.source)
                _append(points, outcome.probe, oldest, _observed_at)
            if outcome.ray is not None:
                _append(self._deque(self._ray, outcome.source), outcome.ray, oldest,
                        _observed_at)
            if outcome.actor is not None:
                self._probes.pop(outcome.source, None)
                points = self._deque(self._actors, outcome.source)
                _append(points, outcome.actor, oldest, _observed_at)
                self._coarse(self._coarse_actors, outcome.source, outcome.actor,
                             outcome.started_at)
            self._records += 1
            if self._records % _SWEEP_EVERY == 0:
                self._sweep(oldest)

    def _keeps_memory(self, outcome: PollOutcome) -> bool:
        """A replay probe's reading always; a local one unless the probe answered lately (within
        three of the local readings' own gaps)."""
        m = outcome.memory
        assert m is not None
        if outcome.kind == SourceKind.PROBE:
            self._memory_probed[m.target] = (outcome.source, m.observed_at)
            return True
        gap = m.observed_at - self._memory_local_at.get(m.target, m.observed_at)
        self._memory_local_at[m.target] = m.observed_at
        probed = self._memory_probed.get(m.target)
        return probed is None or m.observed_at - probed[1] > 3 * max(gap, 1.0)

    def _coarse(self, store: dict[Any, collections.deque], key: Any, item: Any,
                now: float) -> None:
        """Keeps `item` in the coarse copy when `coarse_every_s` passed since the last kept."""
        if self._coarse_age_s <= 0:
            return
        points = store.setdefault(key, collections.deque())
        if not points or item.observed_at - points[-1].observed_at >= self._coarse_every_s:
            _append(points, item, now - self._coarse_age_s, _observed_at)

    def _sweep(self, oldest: float) -> None:
        """Drops sources and tables that stopped reporting (removed, renamed)."""
        stores: list[dict[Any, Any]] = [self._polls, self._tables, self._probes, self._actors,
                                        self._memory, self._ray]
        coarse_oldest = oldest + self._max_age_s - self._coarse_age_s
        for store, cut in [*((st, oldest) for st in stores),
                           (self._coarse_tables, coarse_oldest),
                           (self._coarse_actors, coarse_oldest)]:
            for key in list(store):
                points = store[key]
                stamp = _poll_at if store is self._polls else _observed_at
                while points and stamp(points[0]) < cut:
                    points.popleft()
                if not points:
                    del store[key]

    def table(self, target: str, name: str, start: float = float("-inf")) -> list[TableSnapshot]:
        with self._lock:
            return list(_tail(self._tables.get((target, name), ()), start))

    def table_keys(self) -> list[tuple[str, str]]:
        with self._lock:
            return sorted(self._tables)

    def latest_tables(self) -> dict[tuple[str, str], TableSnapshot]:
        """Each table's newest snapshot, by (target, table), in key order."""
        with self._lock:
            return {key: self._tables[key][-1] for key in sorted(self._tables)
                    if self._tables[key]}

    def rate_windows(self, target: str, start: float) -> dict[str, tuple[TableSnapshot, ...]]:
        """Each of the target's tables since `start`, or its newest snapshot however old:
        what its limiter's figures are derived over (diagnosis/figures.py)."""
        with self._lock:
            return {name: _tail(points, start) or (points[-1],)
                    for (tgt, name), points in self._tables.items() if tgt == target and points}

    def probe(self, source: str, start: float = float("-inf")) -> list[ProbeSnapshot]:
        with self._lock:
            return list(_tail(self._probes.get(source, ()), start))

    def latest_probes(self, sources: Sequence[str]) -> dict[str, ProbeSnapshot]:
        """Each trainer probe's newest snapshot (kept while the probe is down)."""
        with self._lock:
            return {s: self._probes[s][-1] for s in sources if self._probes.get(s)}

    def actor(self, source: str, start: float = float("-inf")) -> list[ActorSnapshot]:
        with self._lock:
            return list(_tail(self._actors.get(source, ()), start))

    def ray(self, target: str, start: float = float("-inf")) -> tuple[RaySnapshot, ...]:
        """A Ray target's snapshots since `start`, oldest first."""
        with self._lock:
            return _tail(self._ray.get(target, ()), start)

    def latest_ray(self) -> dict[str, RaySnapshot]:
        """Each Ray target's newest snapshot."""
        with self._lock:
            return {t: points[-1] for t, points in self._ray.items() if points}

    def latest_memory(self) -> dict[str, MemorySnapshot]:
        """Each Reverb target's newest memory reading, where its process could be read."""
        with self._lock:
            return {t: points[-1] for t, points in self._memory.items() if points}

    def latest_actors(self, sources: Sequence[str]) -> dict[str, ActorSnapshot]:
        """Each actor probe's newest snapshot (kept while the probe is down, like probes')."""
        with self._lock:
            return {s: self._actors[s][-1] for s in sources if self._actors.get(s)}

    def view(self, target: str, probes: Sequence[str], start: float,
             coarse_start: float | None = None) -> TargetView:
        """An immutable slice since `start` for one target and its probes; with
        `coarse_start`, the coarse copy since then too."""
        with self._lock:
            replay_probes = {url for url, _ in self._memory_probed.values()}
            coarse = coarse_start is not None
            cstart = coarse_start if coarse_start is not None else 0.0
            tables = {name: _since(points, start)
                      for (tgt, name), points in self._tables.items() if tgt == target}
            return TargetView(
                target=target,
                polls=_tail(self._polls.get(target, ()), start, _poll_at),
                tables={k: v for k, v in tables.items() if v},
                # A URL is an actor's once an actor document was read from it;
                # until then (never answered) it counts as a trainer probe, as before.
                probes={
                    p: _tail(self._probes.get(p, ()), start)
                    for p in probes if p not in self._actors and p not in replay_probes
                },
                actors={p: _tail(self._actors[p], start) for p in probes if p in self._actors},
                probe_polls={p: _tail(self._polls.get(p, ()), start, _poll_at) for p in probes},
                # Over the long look-back where asked: an item's bytes are measured over the
                # table's fill, which takes longer than a stall window.
                memory=_tail(self._memory.get(target, ()), cstart if coarse else start),
                coarse_tables={
                    name: _tail(points, cstart)
                    for (tgt, name), points in self._coarse_tables.items()
                    if coarse and tgt == target
                },
                coarse_actors={
                    p: _tail(self._coarse_actors[p], cstart)
                    for p in probes if coarse and p in self._coarse_actors
                    and p in self._actors
                },
            )
