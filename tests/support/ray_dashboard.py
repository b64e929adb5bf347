"""A Ray cluster's dashboard and a node's metrics endpoint served over real local HTTP from
the documents recorded off real Ray 2.60 jobs (tests/fixtures/ray/; how they were recorded:
tests/test_ray_source.py's docstring). The state API wants the token as Ray's does."""

from __future__ import annotations

import http.server
import json
import socket
import threading
from pathlib import Path
from typing import Any

from replaywatch.sources.ray_cluster import SD_FILE

FIXTURES = Path(__file__).parent.parent / "fixtures" / "ray"
TOKEN = "a-cluster-token"


class Dashboard(http.server.BaseHTTPRequestHandler):
    """Ray's dashboard and a node's metrics endpoint, answering with recorded documents; the
    state API wants the token as Ray's does (its recorded 401 and 403 bodies)."""

    token: str = TOKEN
    metrics: bytes = b""
    delay_s: float = 0.0
    seen: list[tuple[str, str | None]]
    actors: list[bytes] | None = None  # [document] in place of the recorded actors list
    jobs: list[bytes] | None = None  # [document] in place of the recorded jobs list

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.seen.append((self.path, self.headers.get("Authorization")))
        if self.delay_s:
            threading.Event().wait(self.delay_s)
        if self.path == "/metrics":
            return self._answer(200, self.metrics, "text/plain; version=0.0.4")
        said = self.headers.get("Authorization")
        if said != f"Bearer {self.token}":
            status, body = (FIXTURES / ("unauthorized.txt" if said is None else
                                        "forbidden.txt")).read_text().split("\n", 1)
            return self._answer(int(status), body.encode(), "text/plain")
        if self.path.startswith("/api/v0/actors?"):
            if self.actors is not None:  # a cluster whose jobs changed since the recording
                return self._answer(200, self.actors[0], "application/json")
            name = "actors.json"
        elif "ACTOR_CREATION_TASK" in self.path:
            name = "creation_tasks.json"
        elif "filter_values=RUNNING" in self.path:
            name = "tasks.json"
        elif self.path.startswith("/api/v0/workers?"):
            name = "workers.json"  # recorded beside actors_with_learner.json, not actors.json
        elif self.path == "/api/jobs/":
            if self.jobs is not None:
                return self._answer(200, self.jobs[0], "application/json")
            name = "jobs.json"
        else:
            return self._answer(404, b"not found", "text/plain")
        self._answer(200, (FIXTURES / name).read_bytes(), "application/json")

    def _answer(self, status: int, body: bytes, kind: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.write(body)
        except BrokenPipeError:
            pass  # the slow target's reader gave up, as it should

    def log_message(self, *args: Any) -> None:
        pass


class Cluster:
    """One served dashboard (its metrics endpoint on the same server), a refused port, and a
    temp dir whose service-discovery file lists both, as Ray's head lists a dead target."""

    def __init__(self, temp_dir: Path, metrics: str, delay_s: float = 0.0):
        self.seen: list[tuple[str, str | None]] = []
        self.actors: list[bytes] = []
        handler = type("H", (Dashboard,), {"metrics": (FIXTURES / metrics).read_bytes(),
                                            "seen": self.seen, "delay_s": delay_s})
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        self.dashboard = f"http://{self.address}"
        with socket.socket() as s:  # a port nothing listens on
            s.bind(("127.0.0.1", 0))
            self.refused = f"127.0.0.1:{s.getsockname()[1]}"
        self.temp_dir = temp_dir
        (temp_dir / SD_FILE).write_text(json.dumps(
            [{"labels": {"job": "ray"}, "targets": [self.address, self.refused]}]))

    def serve_actors(self, doc: dict[str, Any]) -> None:
        """The state API lists these actors from now on (the recorded ones edited)."""
        self.actors[:] = [json.dumps(doc).encode()]
        self.server.RequestHandlerClass.actors = self.actors  # type: ignore[attr-defined]

    def serve_jobs(self, doc: list[dict[str, Any]]) -> None:
        """Ray's job API lists these jobs from now on (the recorded ones edited)."""
        self.server.RequestHandlerClass.jobs = [  # type: ignore[attr-defined]
            json.dumps(doc).encode()]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
