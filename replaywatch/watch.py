"""`replaywatch watch`: a Sidecar (replaywatch.wiring) plus its HTTP edge.

The app reads only the state store, history and incident log; the poller
thread renders /metrics into the app's cache before each publish.
"""

from __future__ import annotations

import logging
import signal
import socket
import sys
import time
from collections.abc import Callable

import uvicorn
from fastapi import FastAPI

from replaywatch.api import create_app, page
from replaywatch.api.cache import RenderCache
from replaywatch.api.routes_health import METRICS_CACHE_KEY
from replaywatch.config import WatchConfig, is_loopback
from replaywatch.errors import ConfigError
from replaywatch.gc_pacing import GcPacing
from replaywatch.metrics import make_registry, render_published
from replaywatch.metrics_port import MetricsPort
from replaywatch.state import Published
from replaywatch.wiring import Sidecar, build_sidecar

log = logging.getLogger("replaywatch")
SWITCH_INTERVAL_S = 0.001  # the GIL's; Python's default is 0.005


def build_app(sidecar: Sidecar, cache: RenderCache) -> FastAPI:
    """The API, page and /metrics over the sidecar's state, its renders in `cache`."""
    config = sidecar.config
    return create_app(sidecar.store, make_registry(sidecar.store.current), sidecar.history,
                      sidecar.incidents, history_s=config.poll.history_s, serve=config.serve,
                      extra_routers=(page.router,), bundles=sidecar.bundles, cache=cache)


def warming(cache: RenderCache, port: MetricsPort | None = None
            ) -> Callable[[Published], None]:
    """Renders /metrics on the poller's thread before each publish, so a scrape is a cache
    hit and never renders (50 targets x 5 tables: ~9 ms of CPU, bench/render_cost.py); the
    same body goes to the /metrics port's process, if there is one."""
    def warm(state: Published) -> None:
        body = cache.get(METRICS_CACHE_KEY, state.cycle, lambda: render_published(state))
        if port is not None:
            port.offer(body)
    return warm


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.listen(512)
    sock.set_inheritable(True)
    return sock


def run_watch(config: WatchConfig, log_level: str = "info") -> int:
    if not is_loopback(config.serve.listen_host) and not config.serve.token:
        log.warning("listening on %s without a token: anyone who can reach it can read the "
                    "job's state; set REPLAYWATCH_TOKEN or --token-file",
                    config.serve.listen_host)
    # A scrape's thread waits for the GIL at each syscall while the poller
    # computes; Python makes it wait up to the switch interval (5 ms) each time,
    # which put /metrics p99 at 85 ms at 50 targets x 5 tables. 1 ms costs the
    # poller a few more thread switches a cycle.
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    pacing, cache = GcPacing(), RenderCache()
    listen = config.serve.metrics_listen
    metrics_port = MetricsPort(_bind(*listen), config.serve) if listen else None
    try:
        _serve(config, log_level, pacing, cache, metrics_port)
    finally:
        if metrics_port is not None:
            metrics_port.close()
    return 0


def _serve(config: WatchConfig, log_level: str, pacing: GcPacing, cache: RenderCache,
           metrics_port: MetricsPort | None) -> None:
    with build_sidecar(config, before_publish=warming(cache, metrics_port),
                       after_publish=lambda _: pacing.after_cycle(time.monotonic())
                       ) as sidecar:
        sock = _bind(config.serve.listen_host, config.serve.listen_port)
        app = build_app(sidecar, cache)
        pacing.start(time.monotonic())
        if metrics_port is not None:
            metrics_port.start()
        sidecar.start()
        also = f"; /metrics also at {_url(*metrics_port.address)}metrics" if metrics_port else ""
        print(f"replaywatch: watching {', '.join(config.targets)}; serving "
              f"{_url(*sock.getsockname()[:2])}{also}", file=sys.stderr, flush=True)
        server = uvicorn.Server(uvicorn.Config(app, log_level=log_level, access_log=False,
                                               timeout_graceful_shutdown=2,
                                               limit_concurrency=config.serve.max_in_flight))
        # uvicorn shuts down gracefully on SIGTERM, then re-raises it to the handler
        # that was installed before it; ours turns it into a normal exit so that the
        # sidecar (poller, sources, incident log) is closed by the `with`.
        signal.signal(signal.SIGTERM, _exit_on_signal)
        server.run(sockets=[sock])


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


def _exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(0)
