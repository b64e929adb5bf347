"""The HTTP side shared by both probes: GET /probe, GET /stacks, on a daemon thread.

A probe serves from its own daemon thread so it keeps answering while the
process's main loop is stuck in `next()` or in a writer call: that moment is
exactly when the sidecar needs it.
"""

from __future__ import annotations

import http.server
import json
import os
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Any

_MAX_FRAMES = 64
Document = Callable[[], dict[str, Any]]


def parse_listen(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"listen ({listen!r}) must be HOST:PORT, e.g. 127.0.0.1:0")
    return host.strip("[]") or "127.0.0.1", int(port)


def thread_counts() -> dict[str, int | None]:
    """Python's threads and the operating system's.

    Most of a training process's threads are not Python's: tf.data, Reverb's
    samplers and gRPC start their own (the seed's ">500 threads" were OS
    threads while Python saw 8). Linux lists every thread in /proc/self/task;
    elsewhere the OS count is null rather than a guess.
    """
    try:
        os_threads: int | None = len(os.listdir("/proc/self/task"))
    except OSError:
        os_threads = None
    return {"thread_count": threading.active_count(), "os_threads": os_threads}


def thread_stacks(name: str, taken_at: float) -> dict[str, Any]:
    """Every Python thread's stack, innermost frame last (the `GET /stacks` document)."""
    names = {t.ident: t for t in threading.enumerate()}
    threads = []
    for ident, frame in sys._current_frames().items():
        thread = names.get(ident)
        frames = traceback.extract_stack(frame)[-_MAX_FRAMES:]
        threads.append(
            {
                "ident": ident,
                "name": thread.name if thread else f"thread-{ident}",
                "daemon": bool(thread.daemon) if thread else None,
                "frames": [
                    {"file": f.filename, "line": f.lineno, "function": f.name, "code": f.line}
                    for f in frames
                ],
            }
        )
    return {"pid": os.getpid(), "name": name, "taken_at": taken_at, "threads": threads}


class ProbeServer:
    """Serves a probe's two documents on loopback (by default); read-only."""

    def __init__(self, listen: str, probe: Document, stacks: Document):
        self._address = parse_listen(listen)  # bad input fails at construction
        self._routes = {"/probe": probe, "/stacks": stacks}
        self._server: http.server.ThreadingHTTPServer | None = None

    def start(self) -> int:
        """Starts serving on a daemon thread (idempotent); returns the bound port."""
        if self._server is not None:
            return self._server.server_address[1]
        server = http.server.ThreadingHTTPServer(self._address, _make_handler(self._routes))
        server.daemon_threads = True
        thread = threading.Thread(
            target=server.serve_forever, name="replaywatch-probe", daemon=True
        )
        thread.start()
        self._server = server
        return server.server_address[1]

    @property
    def url(self) -> str | None:
        if self._server is None:
            return None
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def _make_handler(routes: dict[str, Document]) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        server_version = "replaywatch-probe"
        timeout = 5  # a stuck client must not hold a handler thread forever

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            route = routes.get(self.path.split("?", 1)[0])
            if route is None:
                self._send(404, {"error": f"unknown path {self.path[:100]!r}; try /probe"})
            else:
                self._send(200, route())

        def _read_only(self) -> None:
            self._send(405, {"error": "the probe is read-only; use GET"})

        do_POST = do_PUT = do_DELETE = do_PATCH = _read_only  # noqa: N815

        def _send(self, status: int, doc: dict[str, Any]) -> None:
            body = json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # the trainer's stderr is not ours to fill

    return Handler


class Served:
    """The serving half both probes share: `start()`, `url`, `stop()` and `GET /stacks`.

    A probe class sets `_http` (its ProbeServer), `_static["name"]` and `_clock`.
    """

    _http: ProbeServer
    _static: dict[str, Any]
    _clock: Callable[[], float]

    def stacks(self) -> dict[str, Any]:
        """Every thread's Python stack, innermost frame last (`GET /stacks`)."""
        return thread_stacks(str(self._static["name"]), self._clock())

    def start(self) -> int:
        """Starts serving on a daemon thread; returns the bound port."""
        return self._http.start()

    @property
    def url(self) -> str | None:
        return self._http.url

    def stop(self) -> None:
        self._http.stop()

