"""What the poller publishes: one immutable result per cycle, swapped atomically.

The poller is the only writer. The API and the metrics collector take the
current reference and read it without locks held, so a slow HTTP client never
delays a poll and a poll never leaves a reader with a half-updated picture.
"""

from __future__ import annotations

import dataclasses
import threading

from replaywatch.diagnosis.figures import TableFigures
from replaywatch.model import (
    ActorSnapshot,
    Finding,
    MemorySnapshot,
    ProbeSnapshot,
    SourceKind,
    TableSnapshot,
)
from replaywatch.ray_model import RaySnapshot
from replaywatch.shards import ShardCounts


@dataclasses.dataclass(frozen=True)
class SourceStatus:
    """A target's or probe's health as of its latest poll."""

    name: str
    kind: SourceKind
    target: str  # the Reverb target (a probe's owner; itself for a target)
    up: bool
    last_poll_at: float | None
    last_ok_at: float | None
    last_error: str | None
    last_duration_s: float | None
    consecutive_failures: int
    polls_total: int
    failures_total: int
    late_polls_total: int
    labels: tuple[tuple[str, str], ...] = ()


@dataclasses.dataclass(frozen=True)
class Published:
    """The sidecar's whole picture after one poll cycle."""

    at: float
    cycle: int
    sources: dict[str, SourceStatus]
    tables: dict[tuple[str, str], TableSnapshot]
    probes: dict[str, ProbeSnapshot]  # trainer probes' latest documents, by URL
    findings: tuple[Finding, ...] = ()
    insufficient: tuple[str, ...] = ()
    incident_ids: dict[str, int] = dataclasses.field(default_factory=dict)
    cycle_duration_s: float = 0.0
    incident_log_error: str | None = None
    config_errors: tuple[str, ...] = ()
    incident_log_dropped: int = 0  # transitions the incident log lost to a full queue
    late_cycles: int = 0  # poll cycles that overran the interval
    shard: ShardCounts | None = None  # --shard: this sidecar's part of the list
    bundles_written: int = 0  # incident bundles written since the sidecar started
    bundle_failures: int = 0  # bundles that could not be written
    # "target: rule: error" for each rule that raised in this cycle: its finding is missing
    rule_errors: tuple[str, ...] = ()
    # actor probes' latest documents, by URL (trainer probes' are in `probes`)
    actors: dict[str, ActorSnapshot] = dataclasses.field(default_factory=dict)
    # each Reverb target's process memory and its limit, where its host could be read
    memory: dict[str, MemorySnapshot] = dataclasses.field(default_factory=dict)
    # (target, table) -> everything worked out about the table (diagnosis/figures.py)
    figures: dict[tuple[str, str], TableFigures] = dataclasses.field(default_factory=dict)
    # each Ray target's newest snapshot of its RLlib job
    ray: dict[str, RaySnapshot] = dataclasses.field(default_factory=dict)


EMPTY = Published(at=0.0, cycle=0, sources={}, tables={}, probes={})


class StateStore:
    """Holds the latest `Published`; `publish` is one assignment under a lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._current = EMPTY

    def publish(self, published: Published) -> None:
        with self._lock:
            self._current = published

    def current(self) -> Published:
        with self._lock:
            return self._current
