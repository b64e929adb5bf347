"""A scrape serves the body rendered once per cycle, from the event loop, rendering nothing.

Why it matters: at 50 targets x 5 tables the poller holds the GIL for most of a
cycle; every thread hop or render inside a scrape waits for it (bench/scale.py).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Iterator

from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import CollectorRegistry
from starlette.middleware.base import BaseHTTPMiddleware

from replaywatch.api import create_app, routes_health
from replaywatch.api.routes_health import METRICS_CACHE_KEY
from replaywatch.history import History
from replaywatch.state import EMPTY, StateStore


class CountingCollector:
    """Counts how often a scrape made the registry render."""

    def __init__(self) -> None:
        self.collects = 0

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        self.collects += 1
        gauge = GaugeMetricFamily("replaywatch_renders", "Renders so far.")
        gauge.add_metric([], float(self.collects))
        yield gauge


def _app(cycle: int = 3) -> tuple[TestClient, StateStore, CountingCollector]:
    store = StateStore()
    store.publish(dataclasses.replace(EMPTY, cycle=cycle))
    collector = CountingCollector()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)  # type: ignore[arg-type]
    return TestClient(create_app(store, registry, History())), store, collector


def test_a_scrape_of_a_warmed_cycle_renders_nothing() -> None:
    client, _, collector = _app(cycle=3)
    client.app.state.cache.get(  # type: ignore[attr-defined]
        METRICS_CACHE_KEY, 3, lambda: b"# warmed by the poller\n")
    for _ in range(3):
        response = client.get("/metrics")
        assert (response.status_code, response.text) == (200, "# warmed by the poller\n")
    assert collector.collects == 0


def test_a_cold_cycle_renders_once_and_a_new_cycle_renders_again() -> None:
    client, store, collector = _app(cycle=3)
    assert "replaywatch_renders 1.0" in client.get("/metrics").text
    assert "replaywatch_renders 1.0" in client.get("/metrics").text
    store.publish(dataclasses.replace(store.current(), cycle=4))
    assert "replaywatch_renders 2.0" in client.get("/metrics").text
    assert collector.collects == 2


def test_the_metrics_route_stays_on_the_event_loop() -> None:
    route = next(r for r in routes_health.router.routes
                 if isinstance(r, APIRoute) and r.path == "/metrics")
    # A sync endpoint or a sync dependency would be run on the thread pool.
    assert inspect.iscoroutinefunction(route.endpoint)
    assert route.dependant.dependencies == []


def test_no_middleware_adds_event_loop_turns() -> None:
    # Starlette's BaseHTTPMiddleware (@app.middleware("http")) hands each request
    # through a task group and memory streams: eight more loop turns a scrape, each
    # one a wait for the GIL while the poller computes (bench/scale.py's tail).
    client, _, _ = _app()
    kinds = [m.cls for m in client.app.user_middleware]  # type: ignore[attr-defined]
    assert kinds and BaseHTTPMiddleware not in kinds
