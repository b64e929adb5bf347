"""Findings (what is wrong now) and incidents (every finding ever opened)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query

from replaywatch.api.deps import ApiError, IncidentsDep, PublishedDep
from replaywatch.api.schemas import (
    FindingOut,
    FindingsOut,
    IncidentDetailOut,
    IncidentOut,
    IncidentsOut,
)
from replaywatch.diagnosis.kinds import worst_first

router = APIRouter(prefix="/api/v1")

SeverityParam = Literal["info", "warning", "critical"]


@router.get("/findings", response_model=FindingsOut)
def findings(
    state: PublishedDep,
    incidents: IncidentsDep,
    scope: Annotated[Literal["active", "all"], Query(alias="state")] = "active",
    target: Annotated[str | None, Query(max_length=300)] = None,
    kind: Annotated[str | None, Query(max_length=64)] = None,
    severity: SeverityParam | None = None,
) -> FindingsOut:
    """Active findings, worst first; `state=all` adds resolved ones from the log."""
    out = [
        FindingOut.of(f, state.incident_ids.get(f.finding_id))
        for f in worst_first(state.findings)
        if _matches(f.target, f.kind, f.severity.label, target, kind, severity)
    ]
    if scope == "all" and incidents is not None:
        active = {f.id for f in out}
        for row in incidents.list("resolved", target=target, kind=kind, severity=severity,
                                  limit=500):
            finding = _finding_from_incident(row)
            if finding.id not in active or finding.resolved_at is not None:
                out.append(finding)
    return FindingsOut(findings=out, insufficient_data=list(state.insufficient),
                       rule_errors=list(state.rule_errors))


def _matches(t: str, k: str, s: str, target: str | None, kind: str | None,
             severity: str | None) -> bool:
    return (target is None or t == target) and (kind is None or k == kind) and (
        severity is None or s == severity
    )


def _finding_from_incident(row: dict[str, Any]) -> FindingOut:
    return FindingOut(
        id=row["finding_id"],
        kind=row["kind"],
        severity=row["severity"],
        target=row["target"],
        table=row["table"],
        summary=row["summary"],
        evidence=row.get("evidence") or {},
        fix=row.get("fix") or "",
        since=row["since"],
        last_seen=row["last_seen"],
        resolved_at=row.get("resolved_at"),
        incident_id=row["id"],
    )


@router.get("/incidents", response_model=IncidentsOut)
def incidents_list(
    incidents: IncidentsDep,
    scope: Annotated[Literal["open", "resolved", "all"], Query(alias="state")] = "all",
    target: Annotated[str | None, Query(max_length=300)] = None,
    kind: Annotated[str | None, Query(max_length=64)] = None,
    severity: SeverityParam | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> IncidentsOut:
    if incidents is None:
        return IncidentsOut(incidents=[], log="disabled")
    rows = incidents.list(scope, target=target, kind=kind, severity=severity, limit=limit)
    return IncidentsOut(incidents=[IncidentOut(**r) for r in rows])


@router.get("/incidents/{incident_id}", response_model=IncidentDetailOut)
def incident_detail(
    incidents: IncidentsDep,
    incident_id: Annotated[int, Path(ge=1, le=2**62)],
) -> IncidentDetailOut:
    row = incidents.get(incident_id) if incidents is not None else None
    if row is None:
        raise ApiError(404, f"unknown incident {incident_id}")
    return IncidentDetailOut(**row)


__all__ = ["router"]
