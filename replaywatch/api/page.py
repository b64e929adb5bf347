"""The status page: one HTML document and its assets, all served by the sidecar.

It must work where the job runs, often without internet access, and under the
CSP that app.py sends (`script-src 'self'; style-src 'self'`): no CDN, no inline
script or style. The page draws everything from the JSON API in the browser
(static/status.js), so this router only hands out fixed files: names outside
the allow-list are 404, which also rules out path traversal.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

from fastapi import APIRouter
from fastapi.responses import Response

from replaywatch.api.deps import ApiError

router = APIRouter(include_in_schema=False)

INDEX = "index.html"
# name -> content type; nothing else under static/ is ever served.
ASSETS = {
    "status.js": "text/javascript; charset=utf-8",
    "status.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}


@lru_cache(maxsize=len(ASSETS) + 1)
def _read(name: str) -> bytes:
    return (resources.files("replaywatch.api") / "static" / name).read_bytes()


@router.get("/")
def index() -> Response:
    return Response(_read(INDEX), media_type="text/html; charset=utf-8")


@router.get("/static/{name}")
def static(name: str) -> Response:
    media_type = ASSETS.get(name)
    if media_type is None:
        raise ApiError(404, f"no such file {name[:100]!r}")
    return Response(_read(name), media_type=media_type)
