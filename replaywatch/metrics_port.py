"""/metrics from a process of its own: `replaywatch watch --metrics-listen HOST:PORT`.

With a fleet to watch (bench/fleet.py: 32 servers and 512 probes), the sidecar's poll threads
and its diagnosis hold the interpreter lock for most of each cycle, and a scrape on the API's
event loop waits for it at each of its syscalls: /metrics p99 stayed at 60 to 90 ms with the
body already rendered, gzipped or not, and fewer poll threads traded it for late cycles. A
process has its own lock. So the poller renders as before, each render is handed to a child
over a pipe, and the child answers scrapes with the newest one on a socket of its own.

The parent's side is `MetricsPort`: it binds nothing itself (it is handed the socket, so a
port in use is the caller's one-line error) and never blocks the poller (`offer` only swaps
the newest body; a writer thread feeds the pipe). The child is `main()`, run as
`python -m replaywatch.metrics_port --fd N`: its stdin carries one JSON line (the token, whether
/metrics needs it, the connection bound) and then frames, an 8-byte big-endian length and a
body. The end of its stdin means the sidecar is gone, however it died: the child exits.
"""

from __future__ import annotations

import argparse
import json
import logging
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from typing import IO, Any

from prometheus_client import CONTENT_TYPE_LATEST

from replaywatch.bearer import CHALLENGE, SECURITY_HEADERS, token_ok
from replaywatch.config import ServeConfig

log = logging.getLogger("replaywatch.metrics_port")

HEADER = struct.Struct(">Q")
MAX_BODY = 1 << 30  # a frame longer than this is a broken pipe's garbage, not a render
RESPAWN_AFTER_S = 5.0
PATH = "/metrics"

Answer = tuple[int, bytes, list[tuple[str, str]]]


class MetricsPort:
    """The parent's side: starts the child on `sock`, hands it each render, restarts it if it
    dies (at most once every `respawn_after_s`), stops it on `close`."""

    def __init__(self, sock: socket.socket, serve: ServeConfig,
                 respawn_after_s: float = RESPAWN_AFTER_S, python: str = sys.executable):
        self._sock = sock
        self._hello = json.dumps({"token": serve.token, "protect": serve.protect_metrics,
                                  "max_in_flight": serve.max_in_flight}).encode() + b"\n"
        self._respawn_after_s = respawn_after_s
        self._python = python
        self._cond = threading.Condition()
        self._latest: bytes | None = None
        self._closed = False
        self._proc: subprocess.Popen[bytes] | None = None
        self._thread = threading.Thread(target=self._feed, name="replaywatch-metrics-port",
                                        daemon=True)
        self.spawns = 0

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._sock.getsockname()[:2]
        return host, port

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self) -> None:
        self._spawn()
        self._thread.start()

    def offer(self, body: bytes) -> None:
        """The newest render; an older one not yet handed over is dropped."""
        with self._cond:
            self._latest = body
            self._cond.notify()

    def close(self, timeout_s: float = 5.0) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        proc = self._proc
        if proc is not None:
            if proc.stdin is not None:
                try:
                    proc.stdin.close()  # the child's EOF: it finishes the scrapes it has, exits
                except OSError:
                    pass
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._thread.ident is not None:  # closed before it started: a start-up error
            self._thread.join(timeout_s)
        self._sock.close()

    def _spawn(self) -> None:
        fd = self._sock.fileno()
        # A session of its own: a Ctrl-C at the terminal stops the sidecar, which then closes
        # the pipe; the child is never left serving a parent that is shutting down.
        self._proc = subprocess.Popen(
            [self._python, "-m", "replaywatch.metrics_port", "--fd", str(fd)],
            stdin=subprocess.PIPE, pass_fds=(fd,), start_new_session=True)
        self.spawns += 1
        assert self._proc.stdin is not None
        self._proc.stdin.write(self._hello)
        self._proc.stdin.flush()

    def _feed(self) -> None:
        sent: bytes | None = None
        while True:
            with self._cond:
                while not self._closed and (self._latest is None or self._latest is sent):
                    self._cond.wait()
                if self._closed:
                    return
                body = self._latest
            assert body is not None and self._proc is not None and self._proc.stdin is not None
            try:
                self._proc.stdin.write(HEADER.pack(len(body)))
                self._proc.stdin.write(body)
                self._proc.stdin.flush()
                sent = body
            except (BrokenPipeError, ValueError, OSError):
                if not self._restart():
                    return
                sent = None

    def _restart(self) -> bool:
        """After the child died: waits, then starts another on the same socket. False once
        closed."""
        assert self._proc is not None
        code = self._proc.poll()
        log.warning("the /metrics process exited (%s); starting another in %.0f s",
                    "still running" if code is None else f"code {code}", self._respawn_after_s)
        with self._cond:
            if self._cond.wait_for(lambda: self._closed, self._respawn_after_s):
                return False
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()
        self._spawn()
        return True


def frames(stream: IO[bytes]) -> Iterator[bytes]:
    """The bodies on `stream` until its end; a frame cut short or too long ends it too."""
    while True:
        head = stream.read(HEADER.size)
        if len(head) < HEADER.size:
            return
        (size,) = HEADER.unpack(head)
        if size > MAX_BODY:
            log.error("a frame of %d bytes on the pipe: the stream is broken", size)
            return
        body = stream.read(size)
        if len(body) < size:
            return
        yield body


class MetricsApp:
    """The child's ASGI app: /metrics only, the newest body, the API's token and headers."""

    def __init__(self, latest: Callable[[], bytes | None], token: str | None, protect: bool):
        self._latest = latest
        self._expected = token.encode() if token and protect else None

    def answer(self, method: str, path: str, authorization: str) -> Answer:
        if path != PATH:
            return _error(404, f"no such endpoint {path[:200]!r}: this port serves {PATH} only")
        if method not in ("GET", "HEAD"):
            status, body, headers = _error(405, "method not allowed")
            return status, body, [*headers, ("Allow", "GET, HEAD")]
        if self._expected is not None and not token_ok(authorization, self._expected):
            status, body, headers = _error(401, "missing or wrong bearer token")
            return status, body, [*headers, ("WWW-Authenticate", CHALLENGE)]
        body_now = self._latest()
        if body_now is None:
            return _error(503, "no poll cycle has been rendered yet")
        return 200, body_now, [("Content-Type", CONTENT_TYPE_LATEST)]

    async def __call__(self, scope: dict[str, Any], receive: Callable[..., Any],
                       send: Callable[..., Any]) -> None:
        if scope["type"] != "http":
            return
        authorization = next((v.decode("latin-1") for k, v in scope["headers"]
                              if k == b"authorization"), "")
        status, body, headers = self.answer(scope["method"], scope["path"], authorization)
        raw = [(k.lower().encode(), v.encode()) for k, v in
               [*headers, *SECURITY_HEADERS.items(), ("Content-Length", str(len(body)))]]
        await send({"type": "http.response.start", "status": status, "headers": raw})
        await send({"type": "http.response.body",
                    "body": b"" if scope["method"] == "HEAD" else body})


def _error(status: int, message: str) -> Answer:
    return status, json.dumps({"error": message}).encode(), [("Content-Type", "application/json")]


class _Newest:
    def __init__(self) -> None:
        self.body: bytes | None = None

    def __call__(self) -> bytes | None:
        return self.body


def main(argv: list[str] | None = None) -> int:
    import uvicorn  # the child's only heavy import

    parser = argparse.ArgumentParser(prog="python -m replaywatch.metrics_port",
                                     description="serves /metrics for `replaywatch watch`")
    parser.add_argument("--fd", type=int, required=True, help="the listening socket's fd")
    args = parser.parse_args(argv)
    stdin = sys.stdin.buffer
    try:
        hello = json.loads(stdin.readline(1 << 16))
    except ValueError:
        print("replaywatch.metrics_port: no settings on stdin: it is started by "
              "`replaywatch watch --metrics-listen`", file=sys.stderr)
        return 2
    newest = _Newest()
    server = uvicorn.Server(uvicorn.Config(
        MetricsApp(newest, hello.get("token"), bool(hello.get("protect"))),
        log_level="warning", access_log=False, lifespan="off",
        limit_concurrency=int(hello.get("max_in_flight", 256)), timeout_graceful_shutdown=2))

    def read() -> None:
        try:
            for body in frames(stdin):
                newest.body = body
        finally:
            server.should_exit = True  # the sidecar is gone

    threading.Thread(target=read, name="metrics-port-pipe", daemon=True).start()
    server.run(sockets=[socket.socket(fileno=args.fd)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
