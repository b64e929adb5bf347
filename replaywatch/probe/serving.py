"""The HTTP side shared by both probes: GET /probe, GET /stacks, on a daemon thread.

A probe serves from its own daemon thread so it keeps answering while the
process's main loop is stuck in `next()` or in a writer call: that moment is
exactly when the sidecar needs it.
"""

from __future__ import annotations

import email.utils
import http.server
import json
import os
import socket
import socketserver
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Any

from replaywatch.probe.protocol import Doc

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
    return {Doc.THREAD_COUNT: threading.active_count(), Doc.OS_THREADS: os_threads}


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
        self._connections = _Connections()

    def start(self) -> int:
        """Starts serving on a daemon thread (idempotent); returns the bound port."""
        if self._server is not None:
            return self._server.server_address[1]
        self._connections = _Connections()
        server = http.server.ThreadingHTTPServer(
            self._address, _make_handler(self._routes, self._connections))
        server.daemon_threads = True
        thread = threading.Thread(
            target=server.serve_forever, name="replaywatch-probe", daemon=True
        )
        thread.start()
        self._server = server
        return server.server_address[1]

    def fileno(self) -> int | None:
        """The listening socket's descriptor (None: not serving), for a child that answers
        while this process cannot (restore_watch.py)."""
        return None if self._server is None else self._server.socket.fileno()

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
            self._connections.close_all()  # a kept-alive client must not keep a stopped probe
            self._server = None


# Each GET /probe used to cost the trainer's process ~0.35 ms of CPU (0.75-1.2 ms on a loaded
# machine): a new TCP connection and a new thread per request, then BaseHTTPRequestHandler's
# header parsing through email.parser, for a 500-byte answer. Keep-alive alone does not fix
# it: http.server writes the headers and the body separately, and on a kept-alive
# connection the second write waits out the client's delayed ACK (Nagle), 40 ms a request.
# This handler reads only the request line and the two headers that matter, answers in one
# write, and keeps HTTP/1.1 connections open, so a sidecar reuses one socket and one thread:
# 0.15-0.2 ms a request on the same loaded machine (bench/induced_cost.py).
_MAX_LINE = 8192  # request line or header line; a probe's paths are short
_MAX_HEADERS = 100  # http.server's own limit
_READ_ONLY = (b"POST", b"PUT", b"DELETE", b"PATCH")
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            414: "URI Too Long", 431: "Request Header Fields Too Large",
            501: "Not Implemented"}


class _Connections:
    """The open connections of one server, so that `stop()` can end kept-alive ones."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._closed = False

    def add(self, sock: socket.socket) -> None:
        with self._lock:
            self._open.add(sock)
            closed = self._closed
        if closed:  # accepted just as the server stopped
            _shut(sock)

    def discard(self, sock: socket.socket) -> None:
        with self._lock:
            self._open.discard(sock)

    def close_all(self) -> None:
        with self._lock:
            self._closed = True
            socks, self._open = self._open, set()
        for sock in socks:
            _shut(sock)  # its handler's read returns at once and the thread ends


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already closed by the client


def _make_handler(routes: dict[str, Document], connections: _Connections
                  ) -> type[socketserver.StreamRequestHandler]:
    class Handler(socketserver.StreamRequestHandler):
        # A stuck or idle client must not hold a handler thread forever: an idle
        # kept-alive connection is closed after this too (the sidecar then reconnects).
        timeout = 5

        def setup(self) -> None:
            super().setup()
            connections.add(self.connection)

        def finish(self) -> None:
            connections.discard(self.connection)
            super().finish()

        def handle(self) -> None:
            try:
                while self._one_request():
                    pass
            except (OSError, ValueError):  # timeouts, resets, a closed socket
                pass

        def _one_request(self) -> bool:
            """Reads and answers one request; False when the connection should close."""
            line = self.rfile.readline(_MAX_LINE + 1)
            if not line:
                return False
            if len(line) > _MAX_LINE:
                return self._send(414, {"error": "request line too long"}, close=True)
            parts = line.split()
            if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
                return self._send(400, {"error": "not an HTTP/1.x request line"}, close=True)
            method, target, version = parts
            keep_alive, has_body = self._read_headers(version == b"HTTP/1.1")
            if keep_alive is None:
                return self._send(431, {"error": "too many or too long headers"}, close=True)
            # A request body is never read: the connection closes after answering it.
            close = not keep_alive or has_body
            if method == b"GET":
                path = target.decode("latin-1")
                route = routes.get(path.split("?", 1)[0])
                if route is None:
                    doc = {"error": f"unknown path {path[:100]!r}; try /probe"}
                    return self._send(404, doc, close)
                return self._send(200, route(), close)
            if method in _READ_ONLY:
                return self._send(405, {"error": "the probe is read-only; use GET"}, close)
            return self._send(501, {"error": "unsupported method; use GET"}, close)

        def _read_headers(self, keep_alive: bool) -> tuple[bool | None, bool]:
            """(keep the connection open, the request has a body); None past the limits."""
            has_body = False
            for _ in range(_MAX_HEADERS + 1):
                line = self.rfile.readline(_MAX_LINE + 1)
                if line in (b"\r\n", b"\n", b""):
                    return keep_alive, has_body
                if len(line) > _MAX_LINE:
                    break
                name, _, value = line.partition(b":")
                name = name.strip().lower()
                if name == b"connection":
                    token = value.strip().lower()
                    keep_alive = token == b"keep-alive" or (keep_alive and token != b"close")
                elif name in (b"content-length", b"transfer-encoding"):
                    has_body = value.strip() not in (b"0", b"")
            return None, has_body

        def _send(self, status: int, doc: dict[str, Any], close: bool) -> bool:
            body = json.dumps(doc).encode()
            head = (
                f"HTTP/1.1 {status} {_REASONS[status]}\r\n"
                "Server: replaywatch-probe\r\n"
                f"Date: {email.utils.formatdate(usegmt=True)}\r\n"
                "Content-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n"
                "Cache-Control: no-store\r\n"
                f"{'Connection: close' if close else 'Connection: keep-alive'}\r\n\r\n"
            )
            self.wfile.write(head.encode("latin-1") + body)  # one write, one segment
            return not close

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

