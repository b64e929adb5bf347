"""Bundles and reports: the evidence of one cycle as a file, and its Markdown summary.

    GET /api/v1/bundle?target=T              the last cycle of T (the only target if one)
    GET /api/v1/incidents/{id}/bundle        the bundle written when the incident opened
    GET /api/v1/incidents/{id}/report        its Markdown report (linked from the page)

A bundle is built on the request's thread from the last cycle's inputs, which the findings
keeper replaces whole each cycle and never changes in place.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import Response

from replaywatch import bundle as bd
from replaywatch import report
from replaywatch.api.deps import ApiError, IncidentsDep
from replaywatch.bundle_store import BundleMaker

router = APIRouter(prefix="/api/v1")

_BUNDLE: dict[int | str, dict[str, Any]] = {200: {
    "content": {"application/json": {"schema": {"type": "object"}}},
    "description": "A bundle (format replaywatch-bundle)"}}
_REPORT: dict[int | str, dict[str, Any]] = {200: {
    "content": {"text/markdown": {"schema": {"type": "string"}}},
    "description": "The bundle's report, Markdown"}}


def _maker(request: Request) -> BundleMaker:
    maker: BundleMaker | None = getattr(request.app.state, "bundles", None)
    if maker is None:
        raise ApiError(404, "this sidecar makes no bundles")
    return maker


def _attachment(doc: dict[str, Any], name: str) -> Response:
    try:
        text = bd.fit(doc)  # within the bundle's 5 MB, saying what it dropped
    except ValueError as e:
        raise ApiError(413, f"no bundle within {bd.MAX_BYTES} bytes: {e}") from None
    return Response(text, media_type="application/json",
                    headers={"Content-Disposition": f'attachment; filename="{name}"'})


@router.get("/bundle", response_class=Response, responses=_BUNDLE)
def bundle_now(request: Request,
               target: Annotated[str | None, Query(max_length=300)] = None) -> Response:
    """The last cycle of one target as a bundle, with its open critical's transitions."""
    try:
        doc = _maker(request).now(target)
    except LookupError as e:
        raise ApiError(404, str(e)) from None
    return _attachment(doc, "replaywatch.bundle.json")


def _incident_bundle(request: Request, incidents: Any, incident_id: int) -> dict[str, Any]:
    row = incidents.get(incident_id) if incidents is not None else None
    try:
        return _maker(request).for_incident(incident_id, row)
    except LookupError as e:
        raise ApiError(404, str(e)) from None


@router.get("/incidents/{incident_id}/bundle", response_class=Response, responses=_BUNDLE)
def incident_bundle(request: Request, incidents: IncidentsDep,
                    incident_id: Annotated[int, Path(ge=1, le=2**62)]) -> Response:
    doc = _incident_bundle(request, incidents, incident_id)
    return _attachment(doc, f"incident-{incident_id}.bundle.json")


@router.get("/incidents/{incident_id}/report", response_class=Response, responses=_REPORT)
def incident_report(request: Request, incidents: IncidentsDep,
                    incident_id: Annotated[int, Path(ge=1, le=2**62)]) -> Response:
    doc = _incident_bundle(request, incidents, incident_id)
    try:
        text = report.render(bd.parse(json.dumps(doc), f"incident {incident_id}"))
    except bd.BundleError as e:
        raise ApiError(404, str(e)) from None
    return Response(text, media_type="text/markdown; charset=utf-8")
