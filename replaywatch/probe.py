"""TrainerProbe: what only the trainer process knows, served over loopback HTTP.

Reverb can tell how many samples left the table, but not whether the learner
got them: the seed incident (12 tf.data workers each batching on their own)
shows a table that "can sample" while `next()` blocks forever. The probe wraps
the learner's iterator and counts batches and the time spent blocked in
`next()`, then serves those numbers from a daemon thread, so it keeps
answering while the trainer's own thread is stuck.

    from replaywatch.probe import TrainerProbe
    probe = TrainerProbe(batch_size=256, num_parallel_calls=12, name="learner")
    iterator = probe.wrap(iterator)
    port = probe.start()        # GET /probe, GET /stacks on 127.0.0.1:port
    ...
    probe.step()                # optional learner-step heartbeat

Standard library only: it must be importable next to any trainer without
pulling TensorFlow, JAX or a web framework. Read-only: no endpoint changes the
trainer.
"""

from __future__ import annotations

import http.server
import json
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

_MAX_FRAMES = 64


def _parse_listen(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"listen ({listen!r}) must be HOST:PORT, e.g. 127.0.0.1:0")
    return host.strip("[]") or "127.0.0.1", int(port)


class _ProbedIterator:
    """Passes items through and tells the probe when `next()` starts and ends."""

    def __init__(self, inner: Any, probe: TrainerProbe):
        self._inner = inner
        self._probe = probe

    def __iter__(self) -> _ProbedIterator:
        return self

    def __next__(self) -> Any:
        # Inlined rather than calling probe methods: this runs once per batch on
        # the learner's thread, and each Python call costs ~0.3 us here.
        probe = self._probe
        since = probe._blocked_since = probe._clock()
        try:
            item = next(self._inner)
        except BaseException:
            probe._leave_next(got_batch=False)
            raise
        now = probe._clock()
        probe._blocked_since = None
        batches, total, _ = probe._batch_state
        probe._batch_state = (batches + 1, total + (now - since), now)
        return item

    def ready(self) -> bool:
        """Acme's prefetching iterators answer whether `next()` would not block."""
        return bool(self._inner.ready())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class TrainerProbe:
    """Counts the learner's batches and blocked time; serves them as JSON."""

    def __init__(
        self,
        batch_size: int | None = None,
        num_parallel_calls: int | None = None,
        listen: str = "127.0.0.1:0",
        name: str = "learner",
        prefetch_size: int | None = None,
        table: str | None = None,
        clock: Callable[[], float] = time.time,
    ):
        for label, value in (
            ("batch_size", batch_size),
            ("num_parallel_calls", num_parallel_calls),
            ("prefetch_size", prefetch_size),
        ):
            if value is not None and (not isinstance(value, int) or value < 0):
                raise ValueError(f"{label} ({value!r}) must be a non-negative int")
        self._address = _parse_listen(listen)
        self._clock = clock
        self._static = {
            "pid": os.getpid(),
            "name": name,
            "batch_size": batch_size,
            "num_parallel_calls": num_parallel_calls,
            "prefetch_size": prefetch_size,
            "table": table,
        }
        self._started_at = clock()
        self._blocked_since: float | None = None
        # (batches retrieved, seconds blocked in next() so far, last batch at)
        self._batch_state: tuple[int, float, float | None] = (0, 0.0, None)
        # (learner steps, last step at)
        self._steps_state: tuple[int, float | None] = (0, None)
        self._iterator: _ProbedIterator | None = None
        self._server: http.server.ThreadingHTTPServer | None = None

    # -- the trainer's side -------------------------------------------------
    def wrap(self, iterator: Iterator[Any]) -> Iterator[Any]:
        """Returns an iterator that yields the same items and is counted."""
        self._iterator = _ProbedIterator(iterator, self)
        return self._iterator

    def step(self) -> None:
        """Heartbeat for one learner step (call after each update)."""
        self._steps_state = (self._steps_state[0] + 1, self._clock())

    # The hot path takes no lock: only the trainer's thread writes these fields,
    # and each write is one attribute assignment (atomic under the GIL), so the
    # HTTP thread always reads a consistent tuple. A lock here measured ~0.8 us
    # per acquire on our CI machine, a fifth of the whole per-next() cost.
    def _leave_next(self, got_batch: bool) -> None:
        now = self._clock()
        since, self._blocked_since = self._blocked_since, None
        batches, total, last = self._batch_state
        total += 0.0 if since is None else now - since
        self._batch_state = (batches + 1, total, now) if got_batch else (batches, total, last)

    # -- what it serves -----------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """The `GET /probe` document."""
        now = self._clock()
        blocked_since = self._blocked_since
        batches, total, last_batch_at = self._batch_state
        steps, last_step_at = self._steps_state
        blocked_for = 0.0 if blocked_since is None else max(0.0, now - blocked_since)
        doc = dict(self._static)
        doc.update(
            batches_retrieved=batches,
            blocked_in_next=blocked_since is not None,
            blocked_since=blocked_since,
            blocked_for_s=blocked_for,
            blocked_seconds_total=total + blocked_for,
            last_batch_at=last_batch_at,
            learner_steps=steps,
            last_step_at=last_step_at,
        )
        doc.update(
            ready=self._ready(),
            thread_count=threading.active_count(),
            started_at=self._started_at,
            now=now,
        )
        return doc

    def _ready(self) -> bool | None:
        inner = self._iterator._inner if self._iterator is not None else None
        if inner is None or not callable(getattr(inner, "ready", None)):
            return None
        try:
            return bool(inner.ready())
        except Exception:  # a probe must never break on the trainer's iterator
            return None

    def stacks(self) -> dict[str, Any]:
        """Every thread's Python stack, innermost frame last (`GET /stacks`)."""
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
        return {"pid": os.getpid(), "name": self._static["name"], "taken_at": self._clock(),
                "threads": threads}

    # -- serving ------------------------------------------------------------
    def start(self) -> int:
        """Starts serving on a daemon thread; returns the bound port."""
        if self._server is not None:
            return self._server.server_address[1]
        server = http.server.ThreadingHTTPServer(self._address, _make_handler(self))
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


def _make_handler(probe: TrainerProbe) -> type[http.server.BaseHTTPRequestHandler]:
    routes: dict[str, Callable[[], dict[str, Any]]] = {
        "/probe": probe.snapshot,
        "/stacks": probe.stacks,
    }

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
