"""What a table rule judges: one table's history since its last reset, and the probes on it.

Also the facts several rules share, in Reverb's words: whether the table worker waited in a
state during the stall window, and the limiter numbers every table finding shows.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from replaywatch.diagnosis import window as win
from replaywatch.diagnosis.actors import Actor
from replaywatch.diagnosis.kinds import Kind
from replaywatch.diagnosis.ratelimiter import cursor
from replaywatch.diagnosis.rhythm import Window
from replaywatch.diagnosis.stacks import StackVerdict
from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.diagnosis.window import PeerTable
from replaywatch.model import Finding, ProbeSnapshot, TableSnapshot

Probe = tuple[ProbeSnapshot, ...]


@dataclasses.dataclass(frozen=True)
class TableCase:
    """One table's snapshots since its last counter reset, and the probes reading it."""

    target: str
    history: tuple[TableSnapshot, ...]  # non-empty, time-ordered
    probes: tuple[Probe, ...]  # each since its trainer's last restart
    now: float
    actors: tuple[Actor, ...] = ()  # actor probes writing to it (none: no actor information)
    stacks: StackVerdict | None = None  # two py-spy dumps of the loop, when the keeper took them
    declared_layout: str | None = None  # the sidecar's --layout setting (layout.resolve)
    # When the server last came back: a restart in the table's history, or its first answer
    # after an outage; None if neither is in the view.
    came_back_at: float | None = None
    came_back_how: str | None = None
    # The stall window its rules judge by, learned from the job's rhythm (stall_window.py).
    window: Window | None = None
    # When its counters last moved, as its rhythms saw it: a rest longer than the view holds
    # (a learner living on a deep pipeline's fill) is still proven.
    rested_since: float | None = None
    # Its job's other servers' tables of this name, when the job shards (diagnosis/peers.py).
    job: str | None = None
    peers: tuple[PeerTable, ...] = ()

    @property
    def latest(self) -> TableSnapshot:
        return self.history[-1]

    @property
    def name(self) -> str:
        return self.latest.name

    def resting_s(self) -> float:
        """Seconds neither its inserts nor its samples moved, up to the newest snapshot."""
        idle = win.idle_for(self.history, win.inserts_of, win.samples_of)
        if self.rested_since is None:
            return idle
        return max(idle, self.latest.observed_at - self.rested_since)

    def finding(self, kind: Kind, summary: str, evidence: dict[str, Any], fix: str,
                since: float) -> Finding:
        return kind.finding(self.target, self.name, summary, evidence, fix, since=since,
                            last_seen=self.now)


def worker_waited(case: TableCase, state: str, th: Thresholds) -> bool:
    """The table worker spent time in `state` (e.g. `waiting_for_inserts`) in the window."""
    points = win.window(case.history, case.latest.observed_at - th.stall_window_s)
    return win.increase(points, lambda s: s.worker_time.ms(state)) > 0


def limiter_evidence(t: TableSnapshot) -> dict[str, Any]:
    """The rate limiter's numbers, shown with every table finding."""
    rl = t.rate_limiter
    return {"cursor": cursor(t), "min_diff": rl.min_diff, "max_diff": rl.max_diff,
            "samples_per_insert": rl.samples_per_insert, "current_size": t.current_size,
            "min_size_to_sample": rl.min_size_to_sample}
