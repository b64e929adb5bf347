"""An RLlib job's progress as its snapshots show it: which parts of each poll were read, each
progress series (the processes' counters summed by what they count, the result rows'
arrival), when it last moved, and the window it is judged by.

A series moves when any of its processes' counters rose between two polls that read it; a
process that first appears moved too, where its series can be told live (joined to a live
worker, or nothing was filtered out of either poll: a dead worker's series reappearing
when the join turns incomplete is no progress). A counter that went back (a restarted
worker) is no move, and series of dead workers, exported with their last value, never move.
So dead series, other jobs' series and restarts cannot fake a stall, and a poll that could
not read a part is no point of that part's series: the gap spans it.

The window is rhythm.py's: `max(stall_window_s, window_factor x the longest normal gap)`
between the polls that saw the series move (pinned: `stall_window_s`), and for a counter
never below `window_factor` of Ray's metrics report interval, since a counter is seen to
move at most that often (measured: every other 5 s poll). A call's window (a running
EnvRunner or Learner task) is the longer of the one its role's earlier calls set (how long
each was seen running before it ended) and its counter's before the call began.

Pure: time comes from the snapshots and `now`.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from collections.abc import Callable, Iterable, Sequence

from replaywatch.diagnosis import rhythm
from replaywatch.diagnosis.rhythm import Basis, Window
from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.ray_model import ActorRole, RaySnapshot, RayTask, RllibCounters

# Ray reports each process' metrics every 10 s (`metrics_report_interval_ms`): polled every
# 5 s, the counters of real jobs changed on every other poll.
REPORT_S = 10.0


class Part(enum.StrEnum):
    """A part of a poll, as `RaySnapshot.errors` names it (each line starts with it)."""

    STATE = "state API"  # actors and running tasks
    METRICS = "metrics"
    RESULTS = "results"


# Lines that say a part was read all the same: series kept but not joined, a line of
# result.json skipped, a job whose workers export nothing yet.
_READ_ANYWAY = ("RLlib series kept unjoined", "lines not a JSON object, skipped",
                "no ray_rllib_* series")


def known(s: RaySnapshot, part: Part) -> bool:
    """Whether this poll read `part`; a part it could not read is unknown, never empty."""
    return not s.errors or _read(s.errors, part)


@functools.lru_cache(maxsize=256)
def _read(errors: tuple[str, ...], part: Part) -> bool:
    # Asked for every series of every poll each cycle; a job's errors repeat poll to poll.
    return not any(e.startswith(f"{part}: ") and not any(m in e for m in _READ_ANYWAY)
                   for e in errors)


def actors_known(s: RaySnapshot) -> bool:
    """The actors were read (a failed tasks call leaves them known)."""
    return not any(e.startswith(f"{Part.STATE}: ") and "/api/v0/tasks" not in e
                   and not e.startswith(f"{Part.STATE}: tasks:") for e in s.errors)


# One poll's readings of a series: (process, value, may count when it first appears).
Reading = list[tuple[tuple[str, ...], float, bool]]
Reader = Callable[[RaySnapshot], Reading | None]


def counter_reader(field: str, role: ActorRole | None = None,
                   worker_id: str | None = None) -> Reader:
    """Each process' `field` (an RllibCounters field), of one role or one worker."""
    def read(s: RaySnapshot) -> Reading | None:
        if not known(s, Part.METRICS):
            return None
        trusted = s.series_dropped == 0
        return [((c.worker_id, c.rllib), v, c.joined or trusted) for c in s.counters
                if _picked(c, role, worker_id) and (v := getattr(c, field)) is not None]
    return read


def worker_readers(history: Sequence[RaySnapshot], field: str, role: ActorRole
                   ) -> dict[str, Reader]:
    """`counter_reader(field, role, w)` for every worker w, read in one pass (a job of
    many EnvRunners would read each poll's counters once per runner)."""
    by_poll: dict[int, dict[str, Reading]] = {}
    for s in history:
        if not known(s, Part.METRICS):
            continue
        trusted, mine = s.series_dropped == 0, by_poll.setdefault(id(s), {})
        for c in s.counters:
            if c.role is role and (v := getattr(c, field)) is not None:
                mine.setdefault(c.worker_id, []).append(
                    ((c.worker_id, c.rllib), v, c.joined or trusted))

    def reader(w: str) -> Reader:
        return lambda s: None if id(s) not in by_poll else by_poll[id(s)].get(w, [])
    return {w: reader(w) for w in {w for d in by_poll.values() for w in d}}


def _picked(c: RllibCounters, role: ActorRole | None, worker_id: str | None) -> bool:
    return (role is None or c.role is role) and (worker_id is None or c.worker_id == worker_id)


def rows_reader(s: RaySnapshot) -> Reading | None:
    """The result rows' arrival: the newest row's iteration (else its time)."""
    if not known(s, Part.RESULTS):
        return None
    if not s.results:
        return []
    row = s.results[-1]
    value = row.iteration if row.iteration is not None else row.timestamp
    return [] if value is None else [(("rows",), float(value), True)]


@dataclasses.dataclass(frozen=True)
class Progress:
    """One series over the history: its total, when it moved, and its window."""

    what: str
    value: float  # the newest total over its processes
    since: float  # when its current rest began, as far as the history shows
    moved_at: float | None  # the newest poll that saw it move (None: none in the history)
    first_moved_at: float | None
    gained: float  # how much it rose over the history (first sight not counted)
    current: bool  # the newest poll read it
    learned: bool  # its window comes from gaps it was seen to move by
    window: Window
    points: tuple[tuple[float, float], ...]  # (observed_at, running total of its rises)

    def rested_s(self, now: float) -> float:
        return now - self.since

    def stalled(self, now: float) -> bool:
        """At rest past its window, read by the newest poll."""
        return self.current and now - self.since > self.window.seconds

    def moving(self, now: float) -> bool:
        """Seen moving within its window."""
        return self.moved_at is not None and now - self.moved_at <= self.window.seconds

    def evidence(self, now: float) -> dict[str, object]:
        return {"value": self.value, "last_moved_at": self.moved_at,
                "resting_since": self.since, "rested_s": round(now - self.since, 1),
                "window_s": round(self.window.seconds, 1),
                "window_basis": str(self.window.basis), "window_why": self.window.why}


def progress(history: Sequence[RaySnapshot], read: Reader, what: str, th: Thresholds,
             floor_s: float = 0.0, until: float | None = None) -> Progress | None:
    """The series `read` gives over `history`; None where no poll read a value of it. The
    window is learned from the polls up to `until` (default: all)."""
    points: list[tuple[float, float]] = []
    moves: list[float] = []
    # Each process' last value read, kept across a poll that missed its series: one that
    # comes back has moved by its rise since, not by its whole value.
    last: dict[tuple[str, ...], float] = {}
    total, gained, first_read, last_read = 0.0, 0.0, None, None
    current, seen_before = False, False
    for s in history:
        reading = read(s)
        current = reading is not None
        if reading is None:
            continue
        now_vals = {key: v for key, v, _ in reading}
        if seen_before:
            step = sum(max(0.0, v - last[k]) for k, v in now_vals.items() if k in last)
            step += sum(v for k, v, trusted in reading if k not in last and trusted and v > 0)
            if step > 0:
                gained += step
                moves.append(s.observed_at)
        seen_before = True
        last.update(now_vals)
        if now_vals:
            total = sum(now_vals.values())
            first_read = s.observed_at if first_read is None else first_read
            last_read = s.observed_at
        points.append((s.observed_at, gained))
    if first_read is None or last_read is None:
        return None
    cut = [p for p in points if until is None or p[0] <= until]
    # Only the polls that saw it move make gaps: the ones between are left out of learn()
    # (which copies its record at every point), the first kept for first sight.
    r = rhythm.learn(None, [p for i, p in enumerate(cut) if i == 0 or p[1] != cut[i - 1][1]])
    learned = r is not None and rhythm.longest_normal(r.gaps) is not None
    window = floored(rhythm.series_window(r, th, what), floor_s)
    return Progress(what, total, moves[-1] if moves else first_read,
                    moves[-1] if moves else None, moves[0] if moves else None, gained,
                    current, learned, window, tuple(points))


def floored(w: Window, floor_s: float) -> Window:
    """`w`, never below `floor_s` (a counter's: Ray reports it every REPORT_S)."""
    if w.seconds >= floor_s:
        return w
    return Window(floor_s, w.basis, f"{w.why}; at least {floor_s:g} s: Ray reports a "
                  f"counter every {REPORT_S:g} s", w.normal_s)


def counter_floor(th: Thresholds) -> float:
    return th.window_factor * REPORT_S


# -- calls -----------------------------------------------------------------------------------

def _call_id(t: RayTask) -> tuple[object, ...]:
    return (t.task_id,) if t.task_id else (t.name, t.worker_pid, t.attempt)


def call_durations(history: Sequence[RaySnapshot], role: ActorRole) -> list[float]:
    """How long each call of `role` was seen running before it ended (at least that long)."""
    out: list[float] = []
    read = [s for s in history if known(s, Part.STATE)]
    for prev, cur in zip(read, read[1:]):
        ages = {_call_id(t): t.running_for_s for t in cur.tasks}
        for t in prev.tasks:
            if t.role is not role or t.running_for_s is None:
                continue
            after = ages.get(_call_id(t), None)
            if _call_id(t) not in ages or (after is not None and after < t.running_for_s):
                out.append(t.running_for_s)
    return out


def call_window(history: Sequence[RaySnapshot], role: ActorRole, th: Thresholds,
                counter: Progress | None, what: str) -> Window:
    """The window a running call of `role` is judged by: the longer of its role's earlier
    calls' (pinned: stall_window_s) and its counter's before the call began (`counter`,
    learned up to then)."""
    durations = call_durations(history, role)
    normal = rhythm.longest_normal(durations)
    if not th.learned_windows:
        own = rhythm.fixed(th, f"pinned: stall_window_s {th.stall_window_s:g} s")
    elif normal is None or th.window_factor * normal <= th.stall_window_s:
        seen = "none seen to end" if normal is None else f"longest {normal:.1f} s"
        own = rhythm.fixed(th, f"stall_window_s {th.stall_window_s:g} s ({what} calls: {seen})")
    else:
        own = Window(th.window_factor * normal, Basis.LEARNED,
                     f"learned: {len(durations)} {what} calls seen to end, longest normal "
                     f"{normal:.1f} s; window {th.window_factor * normal:.0f} s")
    if counter is None or counter.window.seconds <= own.seconds:
        return own
    return Window(counter.window.seconds, counter.window.basis,
                  f"{counter.what} before the call began: {counter.window.why}")


def tasks_of(s: RaySnapshot, roles: Iterable[ActorRole]) -> list[RayTask]:
    wanted = set(roles)
    return [t for t in s.tasks if t.role in wanted and t.running_for_s is not None]
