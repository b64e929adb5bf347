"""Dependencies as `Annotated` aliases, so tests can override any of them."""

from __future__ import annotations

from typing import Annotated, Any, Protocol

from fastapi import Depends, Request

from replaywatch.api.cache import RenderCache
from replaywatch.history import History
from replaywatch.state import Published, StateStore


class IncidentReader(Protocol):
    last_error: str | None

    def list(
        self,
        state: str = "open",
        target: str | None = None,
        kind: str | None = None,
        severity: str | None = None,
        limit: int = 100,
    ) -> list[dict[str, Any]]: ...

    def get(self, incident_id: int) -> dict[str, Any] | None: ...


class ApiError(Exception):
    """Raised by routes; rendered as `{"error": message}` with `status`."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def get_published(request: Request) -> Published:
    store: StateStore = request.app.state.store
    return store.current()


def get_history(request: Request) -> History:
    return request.app.state.history


def get_incidents(request: Request) -> IncidentReader | None:
    return request.app.state.incidents


def get_cache(request: Request) -> RenderCache:
    return request.app.state.cache


PublishedDep = Annotated[Published, Depends(get_published)]
HistoryDep = Annotated[History, Depends(get_history)]
IncidentsDep = Annotated["IncidentReader | None", Depends(get_incidents)]
CacheDep = Annotated[RenderCache, Depends(get_cache)]
