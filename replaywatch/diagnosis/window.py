"""History windows: the view the rules judge, progress over a window, and rates.

Reverb's counters are cumulative and restart from zero when the server
restarts, so every increase and rate here treats a decrease as a reset (as
Prometheus's `rate()` does): the increase across a reset is the new value
itself, never a negative number. Time always comes from the snapshots, never
from a clock.

A stall is judged by progress, never by waiting time: a healthy synchronous
loop keeps Reverb's table worker `waiting_for_inserts` ~98% of the time and
parks the cursor at `min_diff` between inserts. So "stalled" means a counter
has not moved across the whole window, proven by snapshots at both ends:

    idle_for(points, inserts_of, samples_of) >= stall_window_s
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

from replaywatch.diagnosis import memory as mem
from replaywatch.diagnosis.baseline import Baseline
from replaywatch.diagnosis.rhythm import Rhythm
from replaywatch.model import (
    ActorSnapshot,
    MemorySnapshot,
    ProbeSnapshot,
    ReplayCode,
    TableSnapshot,
)

T = TypeVar("T", TableSnapshot, ProbeSnapshot)


# -- what the rules see: one target's polls and snapshots ---------------------------------------

@dataclasses.dataclass(frozen=True, slots=True)
class PollRecord:
    """The bare fact of one poll: when, whether it worked, and why not."""

    at: float
    ok: bool
    duration_s: float
    error: str | None = None


@dataclasses.dataclass(frozen=True)
class PeerTable:
    """A table of the same name on another server of the same job (its experience sharded
    over several servers that do not know each other), as that server's view held it: the
    newest snapshot, and its counters since its last reset over the view's reach."""

    target: str
    latest: TableSnapshot
    points: tuple[tuple[float, float, float], ...]  # (observed_at, inserts, samples)

    @property
    def name(self) -> str:
        return self.latest.name


@dataclasses.dataclass(frozen=True)
class PeerMemory:
    """Another server of the same job whose memory limit is this server's too (the same
    host's memory, or the same cgroup's: the limit's scope): its newest reading and the
    tables it still fills, what it will add to the limit's count."""

    target: str
    reading: MemorySnapshot
    filling: tuple[mem.FillingTable, ...]


@dataclasses.dataclass(frozen=True)
class TargetView:
    """An immutable slice of one Reverb target's history for the diagnosis."""

    target: str
    polls: tuple[PollRecord, ...]
    tables: dict[str, tuple[TableSnapshot, ...]]
    probes: dict[str, tuple[ProbeSnapshot, ...]]  # trainer probes (and ones never read yet)
    probe_polls: dict[str, tuple[PollRecord, ...]]  # every probe's polls, both roles
    actors: dict[str, tuple[ActorSnapshot, ...]] = dataclasses.field(default_factory=dict)
    # One snapshot per ~10 s over the throughput baselines' look-back (History's coarse copy).
    coarse_tables: dict[str, tuple[TableSnapshot, ...]] = dataclasses.field(
        default_factory=dict)
    coarse_actors: dict[str, tuple[ActorSnapshot, ...]] = dataclasses.field(
        default_factory=dict)
    # By table, then series: the baselines of throughput drops already open (the findings
    # keeper's memory), which they go on being judged against until the rate recovers.
    held_baselines: dict[str, dict[str, Baseline]] = dataclasses.field(default_factory=dict)
    # By series ("samples NAME", "inserts NAME", "probe URL", "actor URL"): the job's rhythm
    # as learned so far (the keeper's memory, diagnosis/rhythm.py), which sets the windows.
    rhythms: dict[str, Rhythm] = dataclasses.field(default_factory=dict)
    # The Reverb server's process memory and its limit, where its host could be read.
    memory: tuple[MemorySnapshot, ...] = ()
    # Its job (the `job` label of a targets file or discovery) when it shards over several
    # servers: the other servers' tables of the same names (diagnosis/peers.py).
    job: str | None = None
    peers: tuple[PeerTable, ...] = ()
    memory_peers: tuple[PeerMemory, ...] = ()  # peers under this server's memory limit

    def fill(self, name: str) -> tuple[TableSnapshot, ...]:
        """A table's snapshots over its fill: the coarse copy (one per 10 s, over the
        throughput look-back) since its last reset, then the newest one, which the coarse
        copy lags by up to 10 s."""
        points = since_last_reset(self.coarse_tables.get(name) or self.tables[name])
        if points and points[-1] is not self.tables[name][-1]:
            points = (*points, self.tables[name][-1])
        return tuple(points)

    def fill_polls(self, name: str) -> tuple[TableSnapshot, ...]:
        """A table's snapshots since its last reset, every poll's where the fine history
        has them (`reach`): an item's bytes and the fill rate are read from the fill's first
        seconds, which the coarse copy's one per 10 s would leave one reading of."""
        return since_last_reset(reach(self, name))

    @functools.cached_property
    def table_memories(self) -> dict[str, mem.TableMemory]:
        """Each table's cost to its process (memory.table_memory over its fill), worked out
        once per view: the published figures, memory_exhaustion and wasted_experience all
        read it. Not a field: a bundle carries the view, and this follows from it."""
        out = {}
        for name in sorted(self.tables):
            if (tm := mem.table_memory(self.fill_polls(name), self.memory)) is not None:
                out[name] = tm
        return out

    @functools.cached_property
    def own_filling(self) -> tuple[mem.FillingTable, ...]:
        """The tables still filling, each item's bytes read from the process's own memory
        (memory.own_filling): what the server adds to a limit it shares with its peers."""
        return mem.own_filling({n: self.fill_polls(n) for n in self.tables}, self.memory)

    def replay_code(self, now: float, max_age_s: float
                    ) -> tuple[MemorySnapshot, ReplayCode] | None:
        """The replay probe's newest reading of what its code did with the server
        (ReplayProbe.server), if it answered within `max_age_s`."""
        for m in reversed(self.memory):
            if m.code is not None:
                return (m, m.code) if now - m.observed_at <= max_age_s else None
        return None

    def table_named(self, table: str | None) -> str | None:
        """The table a probe names, or, when it names none, the target's only table."""
        if table is None and len(self.tables) == 1:
            return next(iter(self.tables))
        return table


def failed_polls_at_end(polls: Sequence[PollRecord]) -> int:
    """How many polls in a row, ending with the newest, failed."""
    run = 0
    for record in reversed(polls):
        if record.ok:
            break
        run += 1
    return run


def answered_again_at(polls: Sequence[PollRecord], down_polls: int) -> float | None:
    """The first answer after the newest run of more than `down_polls` failed polls (an
    outage target_down named), if the server has answered since."""
    answer, run = None, 0
    for record in reversed(polls):
        if record.ok:
            if run > down_polls and answer is not None:
                return answer.at
            answer, run = record, 0
        elif answer is not None:
            run += 1
    return answer.at if answer is not None and run > down_polls else None


def restarted_at(snapshots: Sequence[TableSnapshot]) -> float | None:
    """The first poll of the newest server behind a table's history, if it changed."""
    i = last_reset_index(snapshots)
    return snapshots[i].observed_at if i > 0 else None


# -- counters and rates: reset-aware, time from the snapshots ------------------------------------

def counter_increase(points: Sequence[tuple[float, float]]) -> float:
    """Sum of increases of a cumulative counter; a drop counts as a reset."""
    total = 0.0
    for (_, prev), (_, cur) in zip(points, points[1:]):
        total += cur - prev if cur >= prev else cur
    return total


def rate(points: Sequence[tuple[float, float]]) -> float | None:
    """Per-second increase over the points' time span; None below two points."""
    if len(points) < 2:
        return None
    span = points[-1][0] - points[0][0]
    if span <= 0:
        return None
    return counter_increase(points) / span


def series(
    snapshots: Iterable[TableSnapshot], value: Callable[[TableSnapshot], float]
) -> list[tuple[float, float]]:
    return [(s.observed_at, float(value(s))) for s in snapshots]


def inserts_of(s: TableSnapshot) -> float:
    return s.rate_limiter.inserts


def samples_of(s: TableSnapshot) -> float:
    return s.rate_limiter.samples


def insert_rate(snapshots: Sequence[TableSnapshot]) -> float | None:
    """Items inserted per second over the given snapshots."""
    return rate(series(snapshots, inserts_of))


def sample_rate(snapshots: Sequence[TableSnapshot]) -> float | None:
    """Items sampled per second over the given snapshots."""
    return rate(series(snapshots, samples_of))


def observed_samples_per_insert(snapshots: Sequence[TableSnapshot]) -> float | None:
    """Samples drawn per item inserted over the window; None without inserts."""
    if len(snapshots) < 2:
        return None
    inserted = counter_increase(series(snapshots, inserts_of))
    if inserted <= 0:
        return None
    return counter_increase(series(snapshots, samples_of)) / inserted


def waiting_growth(snapshots: Sequence[TableSnapshot], state: str) -> float | None:
    """Milliseconds per second the table worker spent in `state` (e.g.
    `waiting_for_inserts`) over the window. Healthy runs wait too, so this
    says which side waits, never whether the job is stalled."""
    return rate(series(snapshots, lambda s: s.worker_time.ms(state)))


def worker_ms(s: TableSnapshot) -> int:
    """The table worker's time in all its states: the server's uptime in ms (Reverb's worker
    accounts for every moment), so a drop means a new server even if counters did not drop
    (a checkpoint restore)."""
    return s.worker_time.total_ms


def last_reset_index(snapshots: Sequence[TableSnapshot]) -> int:
    """Index of the first snapshot after the newest counter reset or new server (0 if none)."""
    if len(snapshots) < 2:
        return 0
    if not isinstance(snapshots, tuple):
        return _last_reset_index(snapshots)
    # A cycle asks this of the same history a dozen times (each rule, each figure): a tuple
    # is immutable, and the one kept here cannot be freed, so its id names it while kept.
    kept = _RESETS.get(id(snapshots))
    if kept is not None and kept[0] is snapshots:
        return kept[1]
    found = _last_reset_index(snapshots)
    if len(_RESETS) >= _RESETS_KEPT:
        del _RESETS[next(iter(_RESETS))]  # the oldest: histories of earlier cycles
    _RESETS[id(snapshots)] = (snapshots, found)
    return found


_RESETS: dict[int, tuple[tuple[TableSnapshot, ...], int]] = {}
_RESETS_KEPT = 1024  # a few cycles of every table's fine and coarse histories


def _last_reset_index(snapshots: Sequence[TableSnapshot]) -> int:
    # Walks back from the newest point: the first reset found is the newest, and each
    # point's uptime is summed once (this runs for every table on every cycle).
    cur, cur_ms = snapshots[-1].rate_limiter, worker_ms(snapshots[-1])
    for i in range(len(snapshots) - 1, 0, -1):
        prev, prev_ms = snapshots[i - 1].rate_limiter, worker_ms(snapshots[i - 1])
        if cur.inserts < prev.inserts or cur.samples < prev.samples or cur_ms < prev_ms:
            return i
        cur, cur_ms = prev, prev_ms
    return 0

# -- progress: when a counter last moved, and what the window covers ---------------------------

def since_last_reset(snapshots: Sequence[TableSnapshot]) -> tuple[TableSnapshot, ...]:
    """The snapshots after the newest counter reset (a Reverb restart zeroes them)."""
    return tuple(snapshots[last_reset_index(snapshots):])


def reach(view: TargetView, name: str) -> tuple[TableSnapshot, ...]:
    """A table's snapshots as far back as the view holds them: the coarse copy (one per
    ~10 s) before the fine history begins, then every poll of the fine history."""
    fine = view.tables.get(name, ())
    start = fine[0].observed_at if fine else float("inf")
    return (*(s for s in view.coarse_tables.get(name, ()) if s.observed_at < start), *fine)


def since_last_restart(snapshots: Sequence[ProbeSnapshot]) -> tuple[ProbeSnapshot, ...]:
    """The probe's snapshots since the trainer last (re)started: new pid, or counters dropped."""
    start = 0
    for i in range(1, len(snapshots)):
        a, b = snapshots[i - 1], snapshots[i]
        if (
            b.pid != a.pid
            or b.started_at != a.started_at
            or b.batches_retrieved < a.batches_retrieved
            or b.learner_steps < a.learner_steps
        ):
            start = i
    return tuple(snapshots[start:])


def actor_since_last_restart(snapshots: Sequence[ActorSnapshot]) -> tuple[ActorSnapshot, ...]:
    """An actor probe's snapshots since the actor last (re)started: new pid, or counters dropped.

    The actor probe derives `started_at` from its monotonic clock on every read, so it
    jitters by microseconds: only a move of more than a second is a new start.
    """
    start = 0
    for i in range(1, len(snapshots)):
        a, b = snapshots[i - 1], snapshots[i]
        if (
            b.pid != a.pid
            or abs(b.started_at - a.started_at) > 1.0
            or b.steps_total < a.steps_total
            or b.items_created_total < a.items_created_total
        ):
            start = i
    return tuple(snapshots[start:])


def idle_since(points: Sequence[T], *values: Callable[[T], float]) -> float:
    """When the newest value of every counter was first seen: the onset of "no progress".

    Progress happened somewhere between the previous poll and this one; the
    first poll that saw the final value is the latest time we can prove it.
    """
    onset = points[0].observed_at
    for value in values:
        final = value(points[-1])
        first_seen = points[-1].observed_at
        for p in reversed(points):
            if value(p) != final:
                break
            first_seen = p.observed_at
        onset = max(onset, first_seen)
    return onset


def idle_for(points: Sequence[T], *values: Callable[[T], float]) -> float:
    """Seconds, between the onset and the newest snapshot, that no counter moved."""
    return points[-1].observed_at - idle_since(points, *values)


def window(points: Sequence[T], start: float) -> tuple[T, ...]:
    """The snapshots from the last one at or before `start` to the newest.

    Starting one point early lets a counter's increase be measured over the
    whole window rather than from its first poll inside it.
    """
    first = 0
    for i, p in enumerate(points):
        if p.observed_at <= start:
            first = i
    return tuple(points[first:])


def covers(points: Sequence[T], start: float) -> bool:
    """Whether the history reaches back to `start`, so a window claim is proven."""
    return bool(points) and points[0].observed_at <= start


def increase(points: Sequence[T], value: Callable[[T], float]) -> float:
    """Reset-aware increase of a cumulative counter over the points."""
    return counter_increase([(p.observed_at, float(value(p))) for p in points])


def span(points: Sequence[T]) -> float:
    """Seconds between the first and the newest snapshot."""
    return points[-1].observed_at - points[0].observed_at if points else 0.0


def progressing_s(points: Sequence[T], value: Callable[[T], float]) -> float:
    """Seconds of the poll intervals in which `value` grew: how long it was seen moving.

    A prefetch filling once before a learner's first step moves for a poll or two; a
    learner that trains moves every poll.
    """
    return sum(b.observed_at - a.observed_at for a, b in zip(points, points[1:])
               if value(b) > value(a))
