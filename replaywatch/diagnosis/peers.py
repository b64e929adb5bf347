"""A job that shards its experience over several Reverb servers, as each shard sees the others.

Users shard past one server's memory or throughput by running N servers that do not know
each other (Reverb's README): actors write to one or all of them, the learner reads each
through a dataset of its own, interleaved or zipped. Judged alone, each server misreads what
the others cause: a server the learner never reads looks like a learner that stopped
consuming; a learner that reads its shards in turn and waits on one starved shard stops
sampling all the others, which then look like a dead learner too. So each server's view
carries its peers' tables of the same name (the servers of its `job` label), and the shard
rules (rules_shards.py) judge it against them. Shards on one host, or in one cgroup, also
share one memory limit: each view carries those peers' memory and what their filling tables
will add (`memory_peers`), and memory_exhaustion judges them together (rules_memory.py).

    views = with_peers(views, jobs)       # the keeper, each cycle: pure
    samples_in(peer, start)               # what a peer drew since `start`
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from replaywatch.diagnosis import window as win
from replaywatch.diagnosis.window import PeerMemory, PeerTable, TargetView
from replaywatch.model import MemorySnapshot


def peer_table(target: str, snapshots: tuple) -> PeerTable | None:
    """One table of a peer, since its last reset; None without a snapshot."""
    history = win.since_last_reset(snapshots)
    if not history:
        return None
    return PeerTable(target, history[-1], tuple(
        (s.observed_at, win.inserts_of(s), win.samples_of(s)) for s in history))


def with_peers(views: Mapping[str, TargetView], jobs: Mapping[str, str]
               ) -> dict[str, TargetView]:
    """Every view, those of a job with two servers or more given their job and the others'
    tables of the same names. A target without a job label is a job of its own: no peers."""
    members: dict[str, list[str]] = {}
    for target, view in views.items():
        if (job := jobs.get(target)) and view.tables:
            members.setdefault(job, []).append(target)
    out = dict(views)
    for job, targets in members.items():
        if len(targets) < 2:
            continue
        # Each server's tables once, handed to each of its N-1 peers
        read = {t: {name: p for name, snaps in views[t].tables.items()
                    if (p := peer_table(t, snaps)) is not None} for t in targets}
        scopes = {t: m.limit_scope for t in targets
                  if (m := _newest_memory(views[t])) is not None and m.limit_scope}
        for target in targets:
            view = views[target]
            peers = tuple(read[other][name] for other in sorted(targets) if other != target
                          for name in sorted(view.tables) if name in read[other])
            shared = tuple(
                PeerMemory(other, m, views[other].own_filling) for other in sorted(targets)
                if other != target and target in scopes and scopes.get(other) == scopes[target]
                and (m := _newest_memory(views[other])) is not None)
            out[target] = dataclasses.replace(view, job=job, peers=peers, memory_peers=shared)
    return out


def _newest_memory(view: TargetView) -> MemorySnapshot | None:
    return view.memory[-1] if view.memory else None


def _increase(points: tuple[tuple[float, float, float], ...], start: float, i: int) -> float:
    # From the first point at or after `start`: a peer polled in the same cycle as the moment
    # `start` marks is read a few milliseconds apart from it, and what it drew before that
    # cycle is not "since".
    return win.counter_increase([(p[0], p[i]) for p in points if p[0] >= start])


def samples_in(peer: PeerTable, start: float) -> float:
    """Samples the peer's table completed since `start`."""
    return _increase(peer.points, start, 2)


def inserts_in(peer: PeerTable, start: float) -> float:
    """Inserts the peer's table completed since `start`."""
    return _increase(peer.points, start, 1)


def last_moved(peer: PeerTable, i: int) -> float | None:
    """When the peer's inserts (i=1) or samples (i=2) were last seen to move."""
    for a, b in zip(reversed(peer.points[:-1]), reversed(peer.points[1:]), strict=False):
        if b[i] != a[i]:
            return b[0]
    return None


def covers(peer: PeerTable, start: float) -> bool:
    """The peer was polled before `start`: its increase since then is proven."""
    return bool(peer.points) and peer.points[0][0] <= start


def cycle_start(history: tuple, since: float) -> float:
    """The middle of the poll interval that ends at `since` (a poll of the table's own
    history): the peers' polls of the cycle that saw `since` are read from here."""
    before = [s.observed_at for s in history if s.observed_at < since]
    return (before[-1] + since) / 2 if before else since
