"""Response models: the API's public shape, built from the domain dataclasses."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from pydantic import BaseModel

from replaywatch.diagnosis.ratelimiter import TableDerived
from replaywatch.model import ActorSnapshot, Finding, ProbeSnapshot, TableSnapshot
from replaywatch.state import SourceStatus


class ErrorOut(BaseModel):
    error: str


class TargetOut(BaseModel):
    name: str
    kind: str
    target: str
    up: bool
    last_poll_at: float | None
    last_ok_at: float | None
    last_error: str | None
    last_duration_s: float | None
    consecutive_failures: int
    polls_total: int
    failures_total: int
    late_polls_total: int
    labels: dict[str, str] = {}

    @classmethod
    def of(cls, s: SourceStatus) -> TargetOut:
        doc = dataclasses.asdict(s)
        doc["labels"] = dict(s.labels)
        return cls(**doc)


class TargetsOut(BaseModel):
    targets: list[TargetOut]
    probes: list[TargetOut]
    config_errors: list[str] = []


class KeyDistributionOut(BaseModel):
    kind: str
    priority_exponent: float | None
    min_heap: bool | None
    is_deterministic: bool


class RateLimiterOut(BaseModel):
    samples_per_insert: float
    min_diff: float
    max_diff: float
    min_size_to_sample: int
    inserts: int
    samples: int


class WorkerTimeOut(BaseModel):
    running_ms: int
    sampling_ms: int
    inserting_ms: int
    sleeping_ms: int
    waiting_for_sampling_ms: int
    waiting_for_inserts_ms: int


class DerivedOut(BaseModel):
    cursor: float
    sample_headroom: float
    insert_headroom: float
    can_sample: bool
    can_insert: bool
    insert_blocking_disabled: bool
    warming_up: bool
    insert_rate: float | None
    sample_rate: float | None
    observed_samples_per_insert: float | None
    waiting_for_inserts_ms_per_s: float | None
    waiting_for_sampling_ms_per_s: float | None
    window_s: float


class TableOut(BaseModel):
    target: str
    name: str
    observed_at: float
    max_size: int
    current_size: int
    max_times_sampled: int
    num_episodes: int
    num_deleted_episodes: int
    num_unique_samples: int
    sampler: KeyDistributionOut
    remover: KeyDistributionOut
    rate_limiter: RateLimiterOut
    worker_time: WorkerTimeOut
    has_signature: bool
    derived: DerivedOut | None = None

    @classmethod
    def of(cls, snap: TableSnapshot, derived: TableDerived | None = None) -> TableOut:
        doc: dict[str, Any] = dataclasses.asdict(snap)
        if derived is not None:
            doc["derived"] = dataclasses.asdict(derived)
        return cls(**doc)


class TablesOut(BaseModel):
    tables: list[TableOut]


class HistoryOut(BaseModel):
    target: str
    table: str
    seconds: float
    points: list[TableOut]


class ProbeOut(BaseModel):
    """A probe of either role. `snapshot` is its latest document as the sidecar read it
    (replaywatch.model's ProbeSnapshot for a trainer, ActorSnapshot for an actor), kept
    while it is down; `role` is "unknown" until it first answered."""

    probe: str
    target: str
    up: bool
    last_error: str | None
    snapshot: dict[str, Any] | None
    role: str = "unknown"
    steps_per_s: float | None = None  # an actor's steps over the rate window

    @classmethod
    def of(cls, status: SourceStatus, snap: ProbeSnapshot | ActorSnapshot | None,
           steps_per_s: float | None = None) -> ProbeOut:
        role = "unknown" if snap is None else \
            "actor" if isinstance(snap, ActorSnapshot) else "trainer"
        return cls(
            probe=status.name,
            target=status.target,
            up=status.up,
            last_error=status.last_error,
            snapshot=dataclasses.asdict(snap) if snap is not None else None,
            role=role,
            steps_per_s=steps_per_s,
        )


class ProbesOut(BaseModel):
    probes: list[ProbeOut]


class FindingOut(BaseModel):
    id: str
    kind: str
    severity: str
    target: str
    table: str
    summary: str
    evidence: dict[str, Any]
    fix: str
    since: float
    last_seen: float
    resolved_at: float | None
    incident_id: int | None = None

    @classmethod
    def of(cls, f: Finding, incident_id: int | None = None) -> FindingOut:
        return cls(**f.to_document(), incident_id=incident_id)


class FindingsOut(BaseModel):
    findings: list[FindingOut]
    insufficient_data: list[str]


class IncidentOut(BaseModel):
    """One incident as the incident log keeps it (replaywatch/incidents.py)."""

    id: int
    finding_id: str
    kind: str
    severity: str
    target: str
    table: str
    summary: str
    evidence: dict[str, Any]
    fix: str | None
    since: float
    last_seen: float
    resolved_at: float | None
    has_stacks: bool
    state: Literal["open", "resolved"]


class IncidentsOut(BaseModel):
    incidents: list[IncidentOut]
    log: Literal["disabled"] | None = None  # set when the sidecar runs without a log


class EventOut(BaseModel):
    id: int
    transition: Literal["opened", "updated", "resolved"]
    at: float
    finding: dict[str, Any]
    context: dict[str, Any]


class IncidentDetailOut(IncidentOut):
    stacks: dict[str, Any] | None
    events: list[EventOut]
