"""GET /api/v1/ray: each RLlib job's cluster as last read (the page's "RLlib jobs")."""

from __future__ import annotations

from fastapi import APIRouter

from replaywatch.api.deps import PublishedDep
from replaywatch.api.schemas import RayJobOut, RayJobsOut

router = APIRouter(prefix="/api/v1")


@router.get("/ray", response_model=RayJobsOut)
def ray_jobs(state: PublishedDep) -> RayJobsOut:
    """One document per Ray target: `RaySnapshot.document()`, what `check --json` prints."""
    return RayJobsOut(jobs=[RayJobOut(**state.ray[t].document()) for t in sorted(state.ray)])
