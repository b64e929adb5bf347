"""The sidecar's HTTP reader of a probe: `GET /probe` (and, on demand, `/stacks`).

Not to be confused with replaywatch/probe/, the probes themselves, which run in
the trainer or an actor and serve these documents; this module reads them from
outside. One `--probe URL` may be either: the document's `role` ("trainer" or
"actor"; absent in probes older than the actor probe, which were all trainers)
says which snapshot it becomes.
"""

from __future__ import annotations

import functools
import http.client
import json
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

from replaywatch.errors import SourceError, SourceProtocolError, SourceTimeout, SourceUnreachable
from replaywatch.model import (
    GATES,
    LAYOUTS,
    NO_ANSWER,
    WRITER_CALLS,
    ActorSnapshot,
    BatchStats,
    MemorySnapshot,
    NextStrides,
    PipelineShape,
    PollOutcome,
    PriorityUpdates,
    ProbeSnapshot,
    Section,
    SectionStat,
    SourceKind,
    WriterCallStats,
)
from replaywatch.sources import PolledSource

_MAX_BODY = 4 * 1024 * 1024  # a /stacks document of a 500-thread trainer fits
_MAX_TEXT = 200  # user-given strings (names, waiting_on, errors) kept per snapshot
ROLES = ("trainer", "actor", "replay")


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
            table=_opt_text(doc, "table"),
            os_threads=_opt_int(doc, "os_threads"),
            wrapped=_opt_text(doc, "wrapped"),
            max_in_flight=_opt_int(doc, "max_in_flight"),
            iterators_per_worker=_opt_int(doc, "iterators_per_worker"),
            item_bytes=_opt_int(doc, "item_bytes"),
            layout=_layout(doc),
            writers_wrapped=int(doc.get("writers_wrapped", 0)),
            items_inserted=int(doc.get("items_inserted", 0)),
            inserts_on_next_thread=_opt_bool(doc, "inserts_on_next_thread"),
            gate=_choice(doc, "gate", GATES),
            inserts_per_step=_opt_float(doc, "inserts_per_step"),
            first_step_at=_opt_int(doc, "first_step_at"),
            batch_after_interleave=bool(doc.get("batch_after_interleave", False)),
            cycle_length=_opt_int(doc, "cycle_length"),
            workers_per_iterator=_opt_int(doc, "workers_per_iterator"),
            next_strides=_strides(doc),
            **_pipeline(doc),
            **_sections(doc),
            priority_updates=_priorities(doc),
            batch_stats=_batch_stats(doc),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise SourceProtocolError(f"{probe}: not a replaywatch probe document ({e!r})") from e


def _batch_stats(doc: dict[str, Any]) -> BatchStats | None:
    """What the learner's batches' SampleInfo says (the probe's `batch_stats`)."""
    b = doc.get("batch_stats")
    if b is None or not b.get("batches"):
        return None
    return BatchStats(int(b["batches"]), int(b["keys"]), int(b["keys_repeated_in_batch"]),
                      int(b["batches_repeated"]), int(b["infinite_priorities"]),
                      _opt_float(b, "effective_sample_size"), _opt_int(b, "table_size"),
                      _opt_float(b, "max_importance_weight"), _opt_float(b, "times_sampled_mean"),
                      _opt_int(b, "times_sampled_max"))


def _priorities(doc: dict[str, Any]) -> tuple[PriorityUpdates, ...]:
    """The learner's priority updates, by table (`wrap_client`'s `mutate_priorities`)."""
    by_table = doc.get("priority_updates") or {}
    if not isinstance(by_table, dict):
        raise ValueError("priority_updates is not an object")
    return tuple(PriorityUpdates(
        str(t)[:_MAX_TEXT], int(u["calls"]), int(u["keys"]), float(u["seconds_total"]),
        int(u.get("errors", 0)), int(u.get("rejected_keys", 0)), int(u.get("infinite_keys", 0)),
        None if u.get("last_error") is None else str(u["last_error"])[:_MAX_TEXT])
        for t, u in sorted(by_table.items())[:_MAX_SECTIONS])


def _choice(doc: dict[str, Any], key: str, allowed: tuple[str, ...]) -> str | None:
    value = doc.get(key)
    if value is not None and value not in allowed:
        raise ValueError(f"{key} {str(value)[:50]!r} is not one of {', '.join(allowed)}")
    return value


def _pipeline(doc: dict[str, Any]) -> dict[str, Any]:
    """The pipeline as the probe read it: read or not (and why), and the model's inputs."""
    raw, shape = doc.get("pipeline"), doc.get("pipeline_shape")
    if not isinstance(raw, dict):
        return {}
    fields: dict[str, Any] = {"pipeline_read": bool(raw.get("read")),
                              "pipeline_reason": _opt_text(raw, "reason")}
    if isinstance(shape, dict):
        fields["pipeline"] = PipelineShape(
            batch_size=_opt_int(shape, "batch_size"),
            num_parallel_calls=int(shape["num_parallel_calls"]),
            num_parallel_calls_autotune=bool(shape.get("num_parallel_calls_autotune")),
            max_in_flight=_opt_int(shape, "max_in_flight"),
            workers_per_iterator=int(shape.get("workers_per_iterator") or 1),
            iterators_per_worker=int(shape.get("iterators_per_worker") or 1),
            batch_after_interleave=bool(shape.get("batch_after_interleave")),
            cycle_length=_opt_int(shape, "cycle_length"),
            item_bytes=_opt_int(shape, "item_bytes"),
            prefetch_size=_opt_int(shape, "prefetch_size"),
            table=_opt_text(shape, "table"))
    return fields


_MAX_SECTIONS = 32  # a probe's named sections kept: names are the code's, a few by nature


def _sections(doc: dict[str, Any]) -> dict[str, Any]:
    """The section the loop is inside now and each one's past (`probe.section(name)`)."""
    now, past = doc.get("section"), doc.get("sections") or {}
    if not isinstance(past, dict):
        raise ValueError("sections is not an object")
    section = None
    if isinstance(now, dict):
        timeout = _opt_float(now, "timeout_s")
        section = Section(str(now["name"])[:_MAX_TEXT], float(now["for_s"]), timeout)
    stats = tuple(SectionStat(str(name)[:_MAX_TEXT], int(v["count"]), float(v["longest_s"]),
                              float(v["last_s"]))
                  for name, v in sorted(past.items())[:_MAX_SECTIONS])
    return {"section": section, "sections": stats}


def _strides(doc: dict[str, Any]) -> NextStrides | None:
    s = doc.get("next_strides")
    if s is None:
        return None
    return NextStrides(int(s["inserts_at_first"]), int(s["inserts_at_last"]), int(s["count"]),
                       int(s["least"]), int(s["most"]))


def _opt_bool(doc: dict[str, Any], key: str) -> bool | None:
    value = doc.get(key)
    return None if value is None else bool(value)


def _layout(doc: dict[str, Any]) -> str | None:
    """A declared layout, checked: it picks the budget model's arithmetic."""
    value = doc.get("layout")
    if value is not None and value not in LAYOUTS:
        raise ValueError(f"layout {str(value)[:50]!r} is not one of {LAYOUTS}")
    return value


def _opt_text(doc: dict[str, Any], key: str) -> str | None:
    value = doc.get(key)
    return None if value is None else str(value)[:_MAX_TEXT]


def _call(doc: dict[str, Any], key: str) -> str | None:
    """A writer call name, checked: it becomes a metric label value."""
    value = doc.get(key)
    if value is not None and value not in WRITER_CALLS:
        raise ValueError(f"{key} {str(value)[:50]!r} is not a writer call {WRITER_CALLS}")
    return value


def _calls(doc: dict[str, Any]) -> tuple[WriterCallStats, ...]:
    calls = doc.get("calls") or {}
    if not isinstance(calls, dict):
        raise TypeError("calls must be an object")
    return tuple(
        WriterCallStats(call=c, count=int(s["count"]), errors=int(s.get("errors", 0)),
                        seconds_total=float(s.get("seconds_total", 0.0)),
                        last_at=_opt_float(s, "last_at"))
        for c in WRITER_CALLS if isinstance(s := calls.get(c), dict)
    )


def _last_error(doc: dict[str, Any]) -> tuple[str | None, float | None]:
    error = doc.get("last_error")
    if not isinstance(error, dict):
        return None, None
    text = f"{error.get('call')}: {error.get('type')}: {error.get('message', '')}"
    return " ".join(text.split())[:_MAX_TEXT], _opt_float(error, "at")


def actor_from_probe(doc: dict[str, Any], probe: str, observed_at: float) -> ActorSnapshot:
    """Turns an actor probe's `/probe` document into a snapshot; raises on a wrong shape."""
    try:
        waiting_on = _opt_text(doc, "waiting_on")
        if waiting_on is None and doc.get("waiting"):
            waiting_on = "?"  # waiting, on something unnamed: still waiting
        error, error_at = _last_error(doc)
        return ActorSnapshot(
            probe=probe,
            observed_at=observed_at,
            pid=int(doc["pid"]),
            name=str(doc.get("name", ""))[:_MAX_TEXT],
            table=_opt_text(doc, "table"),
            started_at=float(doc.get("started_at", 0.0)),
            steps_total=int(doc["steps_total"]),
            last_step_at=_opt_float(doc, "last_step_at"),
            seconds_since_last_step=_opt_float(doc, "seconds_since_last_step"),
            in_call=_call(doc, "in_call"),
            in_call_since=_opt_float(doc, "in_call_since"),
            blocked_for_s=float(doc.get("blocked_for_s", 0.0)),
            items_created_total=int(doc["items_created_total"]),
            appends_total=int(doc.get("appends_total", 0)),
            pending_items=int(doc.get("pending_items", 0)),
            waiting_on=waiting_on,
            waiting_since=_opt_float(doc, "waiting_since"),
            waiting_for_s=float(doc.get("waiting_for_s", 0.0)),
            waits_total=int(doc.get("waits_total", 0)),
            waiting_seconds_total=float(doc.get("waiting_seconds_total", 0.0)),
            thread_count=int(doc.get("thread_count", 0)),
            os_threads=_opt_int(doc, "os_threads"),
            writers_wrapped=int(doc.get("writers_wrapped", 0)),
            calls=_calls(doc),
            last_error=error,
            last_error_at=error_at,
            max_policy_lag=_opt_int(doc, "max_policy_lag"),
            max_items_ahead=_opt_int(doc, "max_items_ahead"),
            episode_appends=_opt_int(doc, "episode_appends"),
            keep_alive_refs=_opt_int(doc, "keep_alive_refs"),
            **_sections(doc),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise SourceProtocolError(
            f"{probe}: not a replaywatch actor probe document ({e!r})"[:300]) from e


def memory_from_probe(doc: dict[str, Any], probe: str, target: str, observed_at: float
                      ) -> MemorySnapshot:
    """A replay probe's `/probe` document as its target's memory reading; raises on a wrong
    shape."""
    try:
        rss = _opt_int(doc, "rss_bytes")
        return MemorySnapshot(
            target=target, observed_at=observed_at,
            pid=int(doc["pid"]) if rss is not None else None, rss_bytes=rss,
            limit_bytes=int(doc["limit_bytes"]),
            limit_from=str(doc.get("limit_from", "host"))[:_MAX_TEXT],
            cgroup_usage_bytes=_opt_int(doc, "cgroup_usage_bytes"),
            oom_kills=_opt_int(doc, "oom_kills"), found_by=f"replay probe {probe}"[:_MAX_TEXT],
            cgroup_anon_bytes=_opt_int(doc, "cgroup_anon_bytes"))
    except (KeyError, TypeError, ValueError) as e:
        raise SourceProtocolError(
            f"{probe}: not a replaywatch replay probe document ({e!r})"[:300]) from e


def role_of(doc: dict[str, Any], probe: str) -> str:
    """"trainer" or "actor"; a document without a role is an old trainer probe's."""
    role = doc.get("role", "trainer")
    if role not in ROLES:
        raise SourceProtocolError(
            f"{probe}: unknown probe role {str(role)[:50]!r} (known: actor, replay, trainer)")
    return str(role)


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
        raise SourceTimeout(f"{url}: {NO_ANSWER} {timeout_s:g}s") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        if isinstance(reason, (socket.timeout, TimeoutError)):
            raise SourceTimeout(f"{url}: {NO_ANSWER} {timeout_s:g}s") from None
        raise SourceUnreachable(f"{url}: unreachable ({reason})") from None
    return _json_object(url, body)


def _json_object(url: str, body: bytes) -> dict[str, Any]:
    if len(body) > _MAX_BODY:
        raise SourceProtocolError(f"{url}: answer larger than {_MAX_BODY} bytes")
    try:
        doc = json.loads(body)
    except ValueError:
        raise SourceProtocolError(f"{url}: answer is not JSON") from None
    if not isinstance(doc, dict):
        raise SourceProtocolError(f"{url}: answer is not a JSON object")
    return doc


class _KeptAlive:
    """One HTTP/1.1 connection to a probe, reused from poll to poll.

    A new connection per poll cost the probed trainer a TCP accept and a thread
    start each time, most of its CPU per request (bench/induced_cost.py). The
    probe closes a connection idle for 5 s, so a reused one may be gone: GET is
    idempotent, and such a request is retried once on a fresh connection.
    """

    def __init__(self, base: str, timeout_s: float):
        self._base, self._timeout_s = base, timeout_s
        parts = urllib.parse.urlsplit(base)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{base}: not an http(s) URL")
        self._make = functools.partial(
            http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection,
            parts.hostname, parts.port, timeout=timeout_s)
        self._prefix = parts.path.rstrip("/")
        self._conn: http.client.HTTPConnection | None = None

    def get_json(self, path: str) -> dict[str, Any]:
        """`get_json` of prefix+path over this connection, with the same SourceErrors."""
        url = f"{self._base}{path}"
        try:
            status, body = self._get_retrying(path)
        except http.client.HTTPException as e:
            raise SourceProtocolError(f"{url}: {type(e).__name__}: {e}") from None
        except TimeoutError:
            raise SourceTimeout(f"{url}: {NO_ANSWER} {self._timeout_s:g}s") from None
        except OSError as e:
            raise SourceUnreachable(f"{url}: unreachable ({e})") from None
        if status != 200:
            raise SourceProtocolError(f"{url}: HTTP {status}")
        return _json_object(url, body)

    def _get_retrying(self, path: str) -> tuple[int, bytes]:
        reused = self._conn is not None
        try:
            return self._get(path)
        except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
            self.close()
            if not reused:
                raise
        except BaseException:
            self.close()  # a half-read answer must not be read as the next one
            raise
        try:
            return self._get(path)
        except BaseException:
            self.close()
            raise

    def _get(self, path: str) -> tuple[int, bytes]:
        if self._conn is None:
            self._conn = self._make()
        self._conn.request("GET", self._prefix + path, headers={"Accept": "application/json"})
        response = self._conn.getresponse()
        body = response.read(_MAX_BODY + 1)
        if response.will_close or len(body) > _MAX_BODY or not response.isclosed():
            self.close()
        return response.status, body

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class HttpProbeSource(PolledSource):
    """Polls one probe over HTTP: a TrainerProbe, an ActorProbe or a ReplayProbe, told apart
    by `role`."""

    kind = SourceKind.PROBE

    def __init__(
        self,
        url: str,
        timeout_s: float,
        clock: Callable[[], float] = time.time,
        perf: Callable[[], float] = time.perf_counter,
        target: str = "",
    ):
        super().__init__(url.rstrip("/"), timeout_s, clock, perf)
        self._target = target  # the Reverb target a replay probe's memory belongs to
        self._conn: _KeptAlive | None = None
        # The poller polls a source from one thread at a time; the lock keeps any
        # other caller off the shared connection (it gets a connection of its own).
        self._lock = threading.Lock()

    def _get_probe(self) -> dict[str, Any]:
        if not self._lock.acquire(blocking=False):
            return get_json(f"{self.name}/probe", self._timeout_s)
        try:
            if self._conn is None:
                try:
                    self._conn = _KeptAlive(self.name, self._timeout_s)
                except ValueError:  # not http(s): urllib's one-shot request says why
                    return get_json(f"{self.name}/probe", self._timeout_s)
            return self._conn.get_json("/probe")
        finally:
            self._lock.release()

    def poll(self) -> PollOutcome:
        started_at, t0 = self._clock(), self._perf()
        try:
            doc = self._get_probe()
            if role_of(doc, self.name) == "replay":
                memory = memory_from_probe(doc, self.name, self._target, started_at)
                return PollOutcome(self.name, self.kind, started_at, self._perf() - t0,
                                   memory=memory)
            if role_of(doc, self.name) == "actor":
                actor = actor_from_probe(doc, self.name, started_at)
                return PollOutcome(self.name, self.kind, started_at, self._perf() - t0,
                                   actor=actor)
            snap = snapshot_from_probe(doc, self.name, started_at)
        except SourceError as e:
            return PollOutcome(self.name, self.kind, started_at, self._perf() - t0, error=str(e))
        return PollOutcome(self.name, self.kind, started_at, self._perf() - t0, probe=snap)

    def close(self) -> None:
        # No lock: closing must not wait out a poll in flight (which then fails, as it should).
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
