"""The actor side of one table, read from actor probes: who is dead, who waits on the learner.

From Reverb and the learner alone, dead actors and live actors that wait for the learner (a
policy-lag bound, a parameter hand-off) look the same: inserts stop either way. An actor
probe tells them apart. Each actor is put in one state, judged over the stall window:

    down            its probe does not answer (more than `down_polls` failures, or nothing
                    fresher than the stall window): a dead actor, as far as we can know
    waiting         inside `probe.waiting(on)` for most of the window: it waits on the
                    learner (parameters, a policy-lag bound), outside Reverb
    in_writer_call  inside a writer call (create_item, flush, end_episode, append) for the
                    whole window: stuck in Reverb's client, or throttled at max_diff
    silent          alive, but no step, no item and no wait for the window: stuck elsewhere
    stepping        alive and making progress

Pure: the time is an argument, every number comes from the snapshots.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.diagnosis.window import PollRecord, failed_polls_at_end
from replaywatch.model import ActorSnapshot

DOWN, WAITING, IN_WRITER_CALL, SILENT, STEPPING = (
    "down", "waiting", "in_writer_call", "silent", "stepping")

# "Most of the window": an actor that waits in a loop of short waits (wait, check the
# learner's step, wait again) spends a little of it outside `waiting()`.
WAITING_SHARE = 0.5


@dataclasses.dataclass(frozen=True)
class Actor:
    """One actor probe on a table: its snapshots since its last restart, and its polls."""

    url: str
    history: tuple[ActorSnapshot, ...]  # may be empty: answered once, nothing in the window
    polls: tuple[PollRecord, ...]

    @property
    def name(self) -> str:
        return self.history[-1].name if self.history else self.url


def state(actor: Actor, th: Thresholds, now: float) -> str:
    """The actor's state over the stall window ending `now` (see the module docstring)."""
    if (not actor.history or failed_polls_at_end(actor.polls) > th.down_polls
            or now - actor.history[-1].observed_at > th.stall_window_s):
        return DOWN
    a = actor.history[-1]
    if a.waiting_on is not None and waited_in_window(actor, th) >= WAITING_SHARE * (
            th.stall_window_s):
        return WAITING
    if a.in_call is not None and a.blocked_for_s >= th.stall_window_s:
        return IN_WRITER_CALL
    return SILENT if idle_for(actor) >= th.stall_window_s else STEPPING


def waited_in_window(actor: Actor, th: Thresholds) -> float:
    """Seconds spent inside `waiting()` over the stall window (the wait in progress counts)."""
    a = actor.history[-1]
    start = a.observed_at - th.stall_window_s
    first = next((s for s in reversed(actor.history) if s.observed_at <= start),
                 actor.history[0])
    return max(a.waiting_for_s, a.waiting_seconds_total - first.waiting_seconds_total)


def idle_for(actor: Actor) -> float:
    """Seconds the actor took no step and created no item (by the snapshots, and by its own
    clock for steps)."""
    h = actor.history
    a = h[-1]
    onset = h[0].observed_at
    for s in reversed(h):
        if s.steps_total != a.steps_total or s.items_created_total != a.items_created_total:
            break
        onset = s.observed_at
    seen = a.observed_at - onset
    if a.seconds_since_last_step is None:
        return seen
    return min(seen, a.seconds_since_last_step) if a.steps_total else seen


def states(actors: Iterable[Actor], th: Thresholds, now: float) -> dict[str, str]:
    """Each actor's state by a readable key: its name, or its URL when names repeat."""
    actors = list(actors)
    names = [a.name for a in actors]
    return {(a.name if names.count(a.name) == 1 else a.url): state(a, th, now) for a in actors}


def all_waiting(actors: Iterable[Actor], th: Thresholds, now: float) -> bool:
    """Every actor on the table is alive and waits on the learner (and there is one)."""
    found = states(actors, th, now)
    return bool(found) and all(s == WAITING for s in found.values())


def known_to_wait(actors: Iterable[Actor]) -> bool:
    """Some actor has waited on the learner (`probe.waiting(...)`) since it started."""
    return any(s.waits_total > 0 or s.waiting_on is not None
               for a in actors for s in a.history[-1:])


def evidence(actors: Iterable[Actor], th: Thresholds, now: float) -> dict[str, Any]:
    """What the actor probes say, for a finding's evidence."""
    actors = list(actors)
    found = states(actors, th, now)
    waiting_on = sorted({a.history[-1].waiting_on for a in actors
                         if a.history and a.history[-1].waiting_on is not None})
    return {"actors": found, "actors_waiting_on": waiting_on or None,
            "pending_items": sum(a.history[-1].pending_items for a in actors if a.history)}
