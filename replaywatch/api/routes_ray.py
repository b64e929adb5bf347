"""GET /api/v1/ray: each RLlib job's cluster as last read (the page's "RLlib jobs"); GET
/api/v1/fleet: every job watched, its health at a glance, the worst first (the page's
"Jobs")."""

from __future__ import annotations

from fastapi import APIRouter

from replaywatch.api.deps import PublishedDep
from replaywatch.api.schemas import FleetJobOut, FleetOut, RayJobOut, RayJobsOut
from replaywatch.fleet import fleet

router = APIRouter(prefix="/api/v1")


@router.get("/ray", response_model=RayJobsOut)
def ray_jobs(state: PublishedDep) -> RayJobsOut:
    """One document per Ray target: `RaySnapshot.document()`, what `check --json` prints."""
    return RayJobsOut(jobs=[RayJobOut(**state.ray[t].document()) for t in sorted(state.ray)])


@router.get("/fleet", response_model=FleetOut)
def fleet_jobs(state: PublishedDep) -> FleetOut:
    """Every job the sidecar watches (replaywatch/fleet.py), the worst first."""
    return FleetOut(jobs=[FleetJobOut(**j.document()) for j in fleet(state)])
