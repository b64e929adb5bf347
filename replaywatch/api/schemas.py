"""Response models: the API's public shape, built from the domain dataclasses."""

from __future__ import annotations

import dataclasses
import typing
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from replaywatch.diagnosis.figures import TableFigures
from replaywatch.model import ActorSnapshot, Finding, Name, ProbeSnapshot, TableSnapshot
from replaywatch.state import SourceStatus


class ErrorOut(BaseModel):
    error: str


def mirrored(dc: type, **override: Any) -> dict[str, Any]:
    """A dataclass's fields as a model's annotations: the model serves exactly what the
    domain holds, and a field added there shows in the API without a second list."""
    hints = typing.get_type_hints(dc)
    return {f.name: override.get(f.name, hints[f.name]) for f in dataclasses.fields(dc)}


class TargetOut(BaseModel):
    """A target or probe's health (state.SourceStatus), its labels as a mapping."""

    __annotations__ = mirrored(SourceStatus, labels=dict[str, str])
    labels: dict[str, str] = {}

    @classmethod
    def of(cls, s: SourceStatus) -> TargetOut:
        doc = dataclasses.asdict(s)
        doc["labels"] = dict(s.labels)
        return cls(**doc)


class MemoryOut(BaseModel):
    """model.MemorySnapshot per target, with `counted_bytes`: what counts against the limit;
    per table, diagnosis.memory.TableMemory with its target and table."""

    memory: list[dict[str, Any]]
    tables: list[dict[str, Any]] = []


class TargetsOut(BaseModel):
    targets: list[TargetOut]
    probes: list[TargetOut]
    ray: list[TargetOut] = []  # RLlib jobs' clusters (--ray)
    config_errors: list[str] = []


def figure_fields(record: type[TableFigures]) -> dict[str, Any]:
    """The figures a table's record names for its document (`DOCUMENTED`: the limiter's
    `derived`, the learner's `consumption`...), as optional fields of their own types."""
    hints = typing.get_type_hints(record)
    return {name: Annotated[hints[name], Field(default=None)] for name in record.DOCUMENTED}


class TableOut(BaseModel):
    """One table's snapshot (model.TableSnapshot: its limiter, sampler, remover and worker
    time as Reverb reports them) and what the sidecar works out from its recent history (the
    documented fields of its diagnosis.figures.TableFigures)."""

    # A figure documented by a record wider than this one is served as it comes.
    model_config = ConfigDict(extra="allow")
    __annotations__ = {**mirrored(TableSnapshot), **figure_fields(TableFigures)}

    @classmethod
    def of(cls, snap: TableSnapshot, figures: TableFigures | None = None) -> TableOut:
        return cls(**{f.name: getattr(snap, f.name) for f in dataclasses.fields(snap)},
                   **(figures.document() if figures is not None else {}))


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
    while it is down; a trainer's carries its `pipeline` too, the shape the diagnosis judges
    (`declared` and `read` chosen into one); `role` is "unknown" until it first answered."""

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
            snapshot=None if snap is None else _document(snap),
            role=role,
            steps_per_s=steps_per_s,
        )


def _document(snap: ProbeSnapshot | ActorSnapshot) -> dict[str, Any]:
    doc = dataclasses.asdict(snap)
    if isinstance(snap, ProbeSnapshot):
        doc["pipeline"] = dataclasses.asdict(snap.pipeline)
    return doc


class ProbesOut(BaseModel):
    probes: list[ProbeOut]


class FindingOut(BaseModel):
    id: str
    kind: Name  # its string in JSON; the schema lists every kind
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
    # Rules that raised in the last cycle ("target: rule: error"): what they would have
    # found is missing from `findings`, so the list is not the whole picture.
    rule_errors: list[str] = []


class IncidentOut(BaseModel):
    """One incident as the incident log keeps it (replaywatch/incidents.py)."""

    id: int
    finding_id: str
    kind: str  # the log may hold a kind an older or newer sidecar wrote
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
    # how a closed one closed: "gone" when its target left the watch (a targets file or
    # discovery dropped it), never shown fixed; null while open
    closed_as: Literal["resolved", "gone"] | None = None


class IncidentsOut(BaseModel):
    incidents: list[IncidentOut]
    log: Literal["disabled"] | None = None  # set when the sidecar runs without a log


class EventOut(BaseModel):
    id: int
    transition: Literal["opened", "updated", "resolved", "gone"]
    at: float
    finding: dict[str, Any]
    context: dict[str, Any]


class IncidentDetailOut(IncidentOut):
    stacks: dict[str, Any] | None
    events: list[EventOut]


class RayJobOut(BaseModel):
    """One Ray target's newest read of its RLlib job (`ray_model.RaySnapshot.document()`):
    its actors, running calls aged, each process' counters (no raw samples), the newest
    result row, and one line per part that could not be read."""

    target: str
    observed_at: float
    job_id: str | None
    driver_pid: int | None
    actors: list[dict[str, Any]]
    tasks: list[dict[str, Any]]
    counters: list[dict[str, Any]]
    actor_counts: list[dict[str, Any]]
    results: list[dict[str, Any]]  # the newest row only
    result_file: str | None
    ray_version: str | None
    metrics_targets: int
    metrics_targets_refused: int
    series_dropped: int
    errors: list[str]


class RayJobsOut(BaseModel):
    jobs: list[RayJobOut]


class FleetWorstOut(BaseModel):
    kind: str
    severity: Literal["info", "warning", "critical"]
    target: str
    table: str
    summary: str
    since: float


class FleetJobOut(BaseModel):
    job: str  # its `job` label, else its one target's name
    targets: list[str]
    sources: int  # targets and probes polled for it
    down: list[str]  # those whose last poll failed
    findings: dict[str, int]  # active findings by severity
    health: Literal["critical", "warning", "info", "down", "ok"]
    worst: FleetWorstOut | None


class FleetOut(BaseModel):
    jobs: list[FleetJobOut]
