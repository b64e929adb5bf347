"""The sidecar's HTTP reader of a probe: `GET /probe` (and, on demand, `/stacks`).

Not to be confused with replaywatch/probe.py, the probe itself, which runs in
the trainer and serves these documents; this module reads them from outside.
"""

from __future__ import annotations

import http.client
import json
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from replaywatch.errors import SourceError, SourceProtocolError, SourceTimeout, SourceUnreachable
from replaywatch.model import PollOutcome, ProbeSnapshot

_MAX_BODY = 4 * 1024 * 1024  # a /stacks document of a 500-thread trainer fits


def _opt_float(doc: dict[str, Any], key: str) -> float | None:
    value = doc.get(key)
    return None if value is None else float(value)


def _opt_int(doc: dict[str, Any], key: str) -> int | None:
    value = doc.get(key)
    return None if value is None else int(value)


def snapshot_from_probe(doc: dict[str, Any], probe: str, observed_at: float) -> ProbeSnapshot:
    """Turns a `/probe` document into a snapshot; raises on a wrong shape.

    Durations are taken from the trainer's own clock (`blocked_for_s`), so a
    skew between the trainer's and the sidecar's clocks does not distort them.
    """
    try:
        ready = doc.get("ready")
        return ProbeSnapshot(
            probe=probe,
            observed_at=observed_at,
            pid=int(doc["pid"]),
            name=str(doc.get("name", "")),
            batch_size=_opt_int(doc, "batch_size"),
            num_parallel_calls=_opt_int(doc, "num_parallel_calls"),
            prefetch_size=_opt_int(doc, "prefetch_size"),
            batches_retrieved=int(doc["batches_retrieved"]),
            blocked_in_next=bool(doc["blocked_in_next"]),
            blocked_since=_opt_float(doc, "blocked_since"),
            blocked_for_s=float(doc.get("blocked_for_s", 0.0)),
            blocked_seconds_total=float(doc.get("blocked_seconds_total", 0.0)),
            last_batch_at=_opt_float(doc, "last_batch_at"),
            ready=None if ready is None else bool(ready),
            learner_steps=int(doc.get("learner_steps", 0)),
            last_step_at=_opt_float(doc, "last_step_at"),
            thread_count=int(doc.get("thread_count", 0)),
            started_at=float(doc.get("started_at", 0.0)),
            table=doc.get("table"),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise SourceProtocolError(f"{probe}: not a replaywatch probe document ({e!r})") from e


def get_json(url: str, timeout_s: float) -> dict[str, Any]:
    """GET a JSON object with a deadline; every failure becomes a SourceError."""
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            body = response.read(_MAX_BODY + 1)
    except urllib.error.HTTPError as e:
        raise SourceProtocolError(f"{url}: HTTP {e.code}") from None
    except (ValueError, http.client.HTTPException) as e:  # e.g. InvalidURL, BadStatusLine
        raise SourceProtocolError(f"{url}: {type(e).__name__}: {e}") from None
    except TimeoutError:
        raise SourceTimeout(f"{url}: no answer within {timeout_s:g}s") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        if isinstance(reason, (socket.timeout, TimeoutError)):
            raise SourceTimeout(f"{url}: no answer within {timeout_s:g}s") from None
        raise SourceUnreachable(f"{url}: unreachable ({reason})") from None
    if len(body) > _MAX_BODY:
        raise SourceProtocolError(f"{url}: answer larger than {_MAX_BODY} bytes")
    try:
        doc = json.loads(body)
    except ValueError:
        raise SourceProtocolError(f"{url}: answer is not JSON") from None
    if not isinstance(doc, dict):
        raise SourceProtocolError(f"{url}: answer is not a JSON object")
    return doc


class HttpProbeSource:
    """Polls one probe (a TrainerProbe today) over HTTP."""

    kind = "probe"

    def __init__(
        self,
        url: str,
        timeout_s: float,
        clock: Callable[[], float] = time.time,
        perf: Callable[[], float] = time.perf_counter,
    ):
        self.name = url.rstrip("/")
        self._timeout_s = timeout_s
        self._clock = clock
        self._perf = perf

    def poll(self) -> PollOutcome:
        started_at, t0 = self._clock(), self._perf()
        try:
            doc = get_json(f"{self.name}/probe", self._timeout_s)
            snap = snapshot_from_probe(doc, self.name, started_at)
        except SourceError as e:
            return PollOutcome(self.name, self.kind, started_at, self._perf() - t0, error=str(e))
        return PollOutcome(self.name, self.kind, started_at, self._perf() - t0, probe=snap)

    def stacks(self) -> dict[str, Any]:
        """The trainer's thread stacks (`GET /stacks`); raises a SourceError."""
        return get_json(f"{self.name}/stacks", max(self._timeout_s, 2.0))

    def close(self) -> None:
        pass
