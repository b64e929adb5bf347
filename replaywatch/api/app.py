"""The app factory: wires routers, error rendering, auth and security headers."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from prometheus_client.registry import CollectorRegistry
from starlette.datastructures import Headers, MutableHeaders
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from replaywatch.api import (
    routes_bundles,
    routes_findings,
    routes_health,
    routes_ray,
    routes_tables,
)
from replaywatch.api.cache import RenderCache
from replaywatch.api.deps import ApiError, IncidentReader
from replaywatch.api.schemas import ErrorOut
from replaywatch.bearer import CHALLENGE, SECURITY_HEADERS, token_ok
from replaywatch.config import ServeConfig
from replaywatch.history import History
from replaywatch.state import StateStore

MAX_REQUEST_BYTES = 64 * 1024  # every endpoint is a GET; nothing needs a body



# Every route may answer these, always as {"error": "..."}; declared so that
# clients generated from the OpenAPI schema expect them.
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorOut, "description": "Bad parameter"},
    401: {"model": ErrorOut, "description": "Missing or wrong bearer token"},
    404: {"model": ErrorOut, "description": "Unknown target, table, incident or path"},
    413: {"model": ErrorOut, "description": "Request body too large"},
}


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def _validation_message(exc: RequestValidationError) -> str:
    first = exc.errors()[0] if exc.errors() else {}
    where = ".".join(str(p) for p in first.get("loc", ()) if p not in ("query", "path"))
    return f"invalid {where or 'request'}: {first.get('msg', 'bad value')}"


def _needs_token(path: str, serve: ServeConfig) -> bool:
    # The page's HTML and assets hold no job data, and a browser cannot send a
    # header when it first opens a page: the page then calls /api/* with it.
    if path == "/" or path.startswith("/static/"):
        return False
    if path == "/metrics":
        return serve.protect_metrics
    if path in ("/healthz", "/readyz"):
        return serve.protect_healthz
    return True


def create_app(
    store: StateStore,
    registry: CollectorRegistry,
    history: History,
    incidents: IncidentReader | None = None,
    history_s: float = 900.0,
    serve: ServeConfig = ServeConfig(),
    extra_routers: tuple[Any, ...] = (),
    bundles: Any = None,
    cache: RenderCache | None = None,
) -> FastAPI:
    """Builds the API over the poller's published state; does no I/O itself."""
    app = FastAPI(title="replaywatch", version="0.1.0", docs_url="/docs", redoc_url=None,
                  responses=ERROR_RESPONSES)
    app.state.store = store
    app.state.registry = registry
    app.state.history = history
    app.state.incidents = incidents
    app.state.history_s = history_s
    # Given, when the poller warms it before each publish (watch.py).
    app.state.cache = cache if cache is not None else RenderCache()
    app.state.bundles = bundles  # a BundleMaker, or None: no bundles served
    # Plain ASGI, not @app.middleware("http"): Starlette runs that kind through a
    # task group and memory streams, eight more event-loop turns a request, and
    # each turn may wait for the GIL while the poller computes (strace of one
    # /metrics scrape: 14 epoll_wait calls before, 6 after).
    app.add_middleware(Guard, serve=serve)

    @app.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError) -> JSONResponse:
        return _error(exc.status, exc.message)

    @app.exception_handler(RequestValidationError)
    async def bad_request(_: Request, exc: RequestValidationError) -> JSONResponse:
        return _error(400, _validation_message(exc))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 404:
            return _error(404, f"no such endpoint {request.url.path[:200]!r}")
        response = _error(exc.status_code, str(exc.detail))
        for name, value in (exc.headers or {}).items():  # e.g. Allow on a 405
            response.headers[name] = value
        return response

    @app.exception_handler(Exception)
    async def unexpected(_: Request, exc: Exception) -> JSONResponse:
        # Never a traceback to the client; the log keeps it.
        logging.getLogger("replaywatch.api").exception("unhandled error")
        return _error(500, f"internal error: {type(exc).__name__}")

    app.include_router(routes_health.router)
    app.include_router(routes_tables.router)
    app.include_router(routes_ray.router)
    app.include_router(routes_findings.router)
    app.include_router(routes_bundles.router)
    for router in extra_routers:
        app.include_router(router)
    return app


class Guard:
    """Body-size limit, bearer token and security headers around every HTTP request."""

    def __init__(self, app: ASGIApp, serve: ServeConfig):
        self._app = app
        self._serve = serve
        self._expected = serve.token.encode() if serve.token else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        length = headers.get("content-length")
        if length and (not length.isdigit() or int(length) > MAX_REQUEST_BYTES):
            refusal: Response | None = _error(413, f"request body over {MAX_REQUEST_BYTES} bytes")
        elif self._expected is not None and _needs_token(scope["path"], self._serve) and not (
            token_ok(headers.get("authorization", ""), self._expected)
        ):
            refusal = _error(401, "missing or wrong bearer token")
            refusal.headers["WWW-Authenticate"] = CHALLENGE
        else:
            refusal = None

        async def send_secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                out = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    if name not in out:
                        out.append(name, value)
            await send(message)

        if refusal is not None:
            await refusal(scope, receive, send_secured)
        else:
            await self._app(scope, receive, send_secured)
