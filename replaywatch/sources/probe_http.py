"""The sidecar's HTTP reader of a probe: `GET /probe` (and, on demand, `/stacks`).

Not to be confused with replaywatch/probe/, the probes themselves, which run in
the trainer or an actor and serve these documents; this module reads them from
outside. One `--probe URL` may be either: the document's `role` ("trainer" or
"actor"; absent in probes older than the actor probe, which were all trainers)
says which snapshot it becomes.
"""

from __future__ import annotations

import dataclasses
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
from typing import Any, TypeVar

from replaywatch.errors import SourceError, SourceProtocolError, SourceTimeout, SourceUnreachable
from replaywatch.model import (
    NO_ANSWER,
    WRITER_CALLS,
    ActorSnapshot,
    BatchStats,
    CheckpointCall,
    DeclaredTable,
    Gate,
    Layout,
    MemorySnapshot,
    NextStrides,
    PipelineShape,
    PollOutcome,
    PriorityUpdates,
    ProbeSnapshot,
    ReplayCode,
    Restore,
    Section,
    SectionStat,
    SourceKind,
    WriterCallStats,
)
from replaywatch.probe.protocol import (
    Actor,
    Batches,
    CallKeys,
    CheckpointerKeys,
    CheckpointKeys,
    Doc,
    ErrorKeys,
    Pipeline,
    Priorities,
    Replay,
    RestoreKeys,
    Role,
    SectionKeys,
    Shape,
    Strides,
    TableKeys,
    Trainer,
)
from replaywatch.sources import PolledSource

_MAX_BODY = 4 * 1024 * 1024  # a /stacks document of a 500-thread trainer fits
_MAX_TEXT = 200  # user-given strings (names, waiting_on, errors) kept per snapshot
ROLES = tuple(Role)
W = TypeVar("W", Layout, Gate)


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
        ready = doc.get(Trainer.READY)
        pipeline_read, pipeline_reason, read = _pipeline(doc)
        section, sections = _sections(doc)
        return ProbeSnapshot(
            probe=probe,
            observed_at=observed_at,
            pid=int(doc[Doc.PID]),
            name=str(doc.get(Doc.NAME, "")),
            batches_retrieved=int(doc[Trainer.BATCHES_RETRIEVED]),
            blocked_in_next=bool(doc[Trainer.BLOCKED_IN_NEXT]),
            blocked_since=_opt_float(doc, Trainer.BLOCKED_SINCE),
            blocked_for_s=float(doc.get(Trainer.BLOCKED_FOR_S, 0.0)),
            blocked_seconds_total=float(doc.get(Trainer.BLOCKED_SECONDS_TOTAL, 0.0)),
            last_batch_at=_opt_float(doc, Trainer.LAST_BATCH_AT),
            ready=None if ready is None else bool(ready),
            learner_steps=int(doc.get(Trainer.LEARNER_STEPS, 0)),
            last_step_at=_opt_float(doc, Trainer.LAST_STEP_AT),
            thread_count=int(doc.get(Doc.THREAD_COUNT, 0)),
            started_at=float(doc.get(Doc.STARTED_AT, 0.0)),
            table=_opt_text(doc, Doc.TABLE),
            os_threads=_opt_int(doc, Doc.OS_THREADS),
            wrapped=_opt_text(doc, Trainer.WRAPPED),
            declared=_shape(doc),
            layout=_word(doc, Trainer.LAYOUT, Layout),
            writers_wrapped=int(doc.get(Trainer.WRITERS_WRAPPED, 0)),
            items_inserted=int(doc.get(Trainer.ITEMS_INSERTED, 0)),
            inserts_on_next_thread=_opt_bool(doc, Trainer.INSERTS_ON_NEXT_THREAD),
            gate=_word(doc, Trainer.GATE, Gate),
            inserts_per_step=_opt_float(doc, Trainer.INSERTS_PER_STEP),
            first_step_at=_opt_int(doc, Trainer.FIRST_STEP_AT),
            next_strides=_strides(doc),
            pipeline_read=pipeline_read,
            pipeline_reason=pipeline_reason,
            read=read,
            section=section,
            sections=sections,
            priority_updates=_priorities(doc),
            batch_stats=_batch_stats(doc),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise SourceProtocolError(f"{probe}: not a replaywatch probe document ({e!r})") from e


def _shape(doc: dict[str, Any]) -> PipelineShape:
    """A pipeline's shape under Shape's keys: what a trainer declares, at its document's top
    level, or what its probe read from the graph (`pipeline_shape`)."""
    after = doc.get(Shape.BATCH_AFTER_INTERLEAVE)
    return PipelineShape(
        batch_size=_opt_int(doc, Shape.BATCH_SIZE),
        num_parallel_calls=_opt_int(doc, Shape.NUM_PARALLEL_CALLS),
        num_parallel_calls_autotune=bool(doc.get(Shape.NUM_PARALLEL_CALLS_AUTOTUNE)),
        max_in_flight=_opt_int(doc, Shape.MAX_IN_FLIGHT),
        workers_per_iterator=_opt_int(doc, Shape.WORKERS_PER_ITERATOR),
        iterators_per_worker=_opt_int(doc, Shape.ITERATORS_PER_WORKER),
        batch_after_interleave=None if after is None else bool(after),
        cycle_length=_opt_int(doc, Shape.CYCLE_LENGTH),
        item_bytes=_opt_int(doc, Shape.ITEM_BYTES),
        prefetch_size=_opt_int(doc, Shape.PREFETCH_SIZE),
        table=_opt_text(doc, Shape.TABLE))


def _batch_stats(doc: dict[str, Any]) -> BatchStats | None:
    """What the learner's batches' SampleInfo says (the probe's `batch_stats`)."""
    b = doc.get(Trainer.BATCH_STATS)
    if b is None or not b.get(Batches.BATCHES):
        return None
    return BatchStats(int(b[Batches.BATCHES]), int(b[Batches.KEYS]),
                      int(b[Batches.KEYS_REPEATED_IN_BATCH]), int(b[Batches.BATCHES_REPEATED]),
                      int(b[Batches.INFINITE_PRIORITIES]),
                      _opt_float(b, Batches.EFFECTIVE_SAMPLE_SIZE),
                      _opt_int(b, Batches.TABLE_SIZE), _opt_float(b, Batches.MAX_IMPORTANCE_WEIGHT),
                      _opt_float(b, Batches.TIMES_SAMPLED_MEAN),
                      _opt_int(b, Batches.TIMES_SAMPLED_MAX))


def _priorities(doc: dict[str, Any]) -> tuple[PriorityUpdates, ...]:
    """The learner's priority updates, by table (`wrap_client`'s `mutate_priorities`)."""
    by_table = doc.get(Trainer.PRIORITY_UPDATES) or {}
    if not isinstance(by_table, dict):
        raise ValueError("priority_updates is not an object")
    return tuple(PriorityUpdates(
        str(t)[:_MAX_TEXT], int(u[Priorities.CALLS]), int(u[Priorities.KEYS]),
        float(u[Priorities.SECONDS_TOTAL]), int(u.get(Priorities.ERRORS, 0)),
        int(u.get(Priorities.REJECTED_KEYS, 0)), int(u.get(Priorities.INFINITE_KEYS, 0)),
        _opt_text(u, Priorities.LAST_ERROR))
        for t, u in sorted(by_table.items())[:_MAX_SECTIONS])


def _word(doc: dict[str, Any], key: str, word: type[W]) -> W | None:
    """A layout or a gate, checked: it picks the budget model's arithmetic."""
    value = doc.get(key)
    if value is None:
        return None
    if value not in tuple(word):
        raise ValueError(f"{key} {str(value)[:50]!r} is not one of {', '.join(word)}")
    return word(value)


def _pipeline(doc: dict[str, Any]) -> tuple[bool | None, str | None, PipelineShape | None]:
    """The pipeline as the probe read it: read or not (None: not yet), why not, and the
    shape read from the graph."""
    raw, shape = doc.get(Trainer.PIPELINE), doc.get(Trainer.PIPELINE_SHAPE)
    if not isinstance(raw, dict):
        return None, None, None
    read = None
    if isinstance(shape, dict):
        # The graph always says its workers and iterators: one each where Reverb's is auto.
        said = _shape(shape)
        read = dataclasses.replace(
            said, num_parallel_calls=int(shape[Shape.NUM_PARALLEL_CALLS]),
            workers_per_iterator=said.workers_per_iterator or 1,
            iterators_per_worker=said.iterators_per_worker or 1,
            batch_after_interleave=bool(said.batch_after_interleave))
    return bool(raw.get(Pipeline.READ)), _opt_text(raw, Pipeline.REASON), read


_MAX_SECTIONS = 32  # a probe's named sections kept: names are the code's, a few by nature


def _sections(doc: dict[str, Any]) -> tuple[Section | None, tuple[SectionStat, ...]]:
    """The section the loop is inside now and each one's past (`probe.section(name)`)."""
    now, past = doc.get(Doc.SECTION), doc.get(Doc.SECTIONS) or {}
    if not isinstance(past, dict):
        raise ValueError("sections is not an object")
    section = None
    if isinstance(now, dict):
        timeout = _opt_float(now, SectionKeys.TIMEOUT_S)
        section = Section(str(now[SectionKeys.NAME])[:_MAX_TEXT], float(now[SectionKeys.FOR_S]),
                          timeout)
    stats = tuple(SectionStat(str(name)[:_MAX_TEXT], int(v[SectionKeys.COUNT]),
                              float(v[SectionKeys.LONGEST_S]), float(v[SectionKeys.LAST_S]))
                  for name, v in sorted(past.items())[:_MAX_SECTIONS])
    return section, stats


def _strides(doc: dict[str, Any]) -> NextStrides | None:
    s = doc.get(Trainer.NEXT_STRIDES)
    if s is None:
        return None
    return NextStrides(*(int(s[key]) for key in Strides.ORDER))


def _opt_bool(doc: dict[str, Any], key: str) -> bool | None:
    value = doc.get(key)
    return None if value is None else bool(value)


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
    calls = doc.get(Actor.CALLS) or {}
    if not isinstance(calls, dict):
        raise TypeError("calls must be an object")
    return tuple(
        WriterCallStats(call=c, count=int(s[CallKeys.COUNT]),
                        errors=int(s.get(CallKeys.ERRORS, 0)),
                        seconds_total=float(s.get(CallKeys.SECONDS_TOTAL, 0.0)),
                        last_at=_opt_float(s, CallKeys.LAST_AT))
        for c in WRITER_CALLS if isinstance(s := calls.get(c), dict)
    )


def _last_error(doc: dict[str, Any]) -> tuple[str | None, float | None]:
    error = doc.get(Actor.LAST_ERROR)
    if not isinstance(error, dict):
        return None, None
    text = (f"{error.get(ErrorKeys.CALL)}: {error.get(ErrorKeys.TYPE)}: "
            f"{error.get(ErrorKeys.MESSAGE, '')}")
    return " ".join(text.split())[:_MAX_TEXT], _opt_float(error, ErrorKeys.AT)


def actor_from_probe(doc: dict[str, Any], probe: str, observed_at: float) -> ActorSnapshot:
    """Turns an actor probe's `/probe` document into a snapshot; raises on a wrong shape."""
    try:
        waiting_on = _opt_text(doc, Actor.WAITING_ON)
        if waiting_on is None and doc.get(Actor.WAITING):
            waiting_on = "?"  # waiting, on something unnamed: still waiting
        error, error_at = _last_error(doc)
        section, sections = _sections(doc)
        return ActorSnapshot(
            probe=probe,
            observed_at=observed_at,
            pid=int(doc[Doc.PID]),
            name=str(doc.get(Doc.NAME, ""))[:_MAX_TEXT],
            table=_opt_text(doc, Doc.TABLE),
            started_at=float(doc.get(Doc.STARTED_AT, 0.0)),
            steps_total=int(doc[Actor.STEPS_TOTAL]),
            last_step_at=_opt_float(doc, Actor.LAST_STEP_AT),
            seconds_since_last_step=_opt_float(doc, Actor.SECONDS_SINCE_LAST_STEP),
            in_call=_call(doc, Actor.IN_CALL),
            in_call_since=_opt_float(doc, Actor.IN_CALL_SINCE),
            blocked_for_s=float(doc.get(Actor.BLOCKED_FOR_S, 0.0)),
            items_created_total=int(doc[Actor.ITEMS_CREATED_TOTAL]),
            appends_total=int(doc.get(Actor.APPENDS_TOTAL, 0)),
            pending_items=int(doc.get(Actor.PENDING_ITEMS, 0)),
            waiting_on=waiting_on,
            waiting_since=_opt_float(doc, Actor.WAITING_SINCE),
            waiting_for_s=float(doc.get(Actor.WAITING_FOR_S, 0.0)),
            waits_total=int(doc.get(Actor.WAITS_TOTAL, 0)),
            waiting_seconds_total=float(doc.get(Actor.WAITING_SECONDS_TOTAL, 0.0)),
            thread_count=int(doc.get(Doc.THREAD_COUNT, 0)),
            os_threads=_opt_int(doc, Doc.OS_THREADS),
            writers_wrapped=int(doc.get(Actor.WRITERS_WRAPPED, 0)),
            calls=_calls(doc),
            last_error=error,
            last_error_at=error_at,
            max_policy_lag=_opt_int(doc, Actor.MAX_POLICY_LAG),
            max_items_ahead=_opt_int(doc, Actor.MAX_ITEMS_AHEAD),
            episode_appends=_opt_int(doc, Actor.EPISODE_APPENDS),
            keep_alive_refs=_opt_int(doc, Actor.KEEP_ALIVE_REFS),
            section=section,
            sections=sections,
        )
    except (KeyError, TypeError, ValueError) as e:
        raise SourceProtocolError(
            f"{probe}: not a replaywatch actor probe document ({e!r})"[:300]) from e


def memory_from_probe(doc: dict[str, Any], probe: str, target: str, observed_at: float
                      ) -> MemorySnapshot:
    """A replay probe's `/probe` document as its target's memory reading; raises on a wrong
    shape."""
    try:
        rss = _opt_int(doc, Replay.RSS_BYTES)
        return MemorySnapshot(
            target=target, observed_at=observed_at,
            pid=int(doc[Doc.PID]) if rss is not None else None, rss_bytes=rss,
            limit_bytes=int(doc[Replay.LIMIT_BYTES]),
            limit_from=str(doc.get(Replay.LIMIT_FROM, "host"))[:_MAX_TEXT],
            cgroup_usage_bytes=_opt_int(doc, Replay.CGROUP_USAGE_BYTES),
            oom_kills=_opt_int(doc, Replay.OOM_KILLS),
            found_by=f"replay probe {probe}"[:_MAX_TEXT],
            cgroup_anon_bytes=_opt_int(doc, Replay.CGROUP_ANON_BYTES),
            code=replay_code(doc),
            limit_scope=(str(scope)[:_MAX_TEXT] if isinstance(scope := doc.get(
                Replay.LIMIT_SCOPE), str) else None))
    except (KeyError, TypeError, ValueError) as e:
        raise SourceProtocolError(
            f"{probe}: not a replaywatch replay probe document ({e!r})"[:300]) from e


_CALLS_KEPT = 64  # a replay's checkpoint calls kept per snapshot


def replay_code(doc: dict[str, Any]) -> ReplayCode | None:
    """What a replay probe handed its server says of it (None: not handed one)."""
    tables, ckpt = doc.get(Replay.DECLARED_TABLES), doc.get(Replay.CHECKPOINTER)
    if tables is None and ckpt is None:
        return None
    ckpt = ckpt or {}
    restore = doc.get(Replay.RESTORE)
    return ReplayCode(
        probe_now=float(doc[Doc.NOW]),
        tables=tuple(_declared_table(t) for t in tables or ()),
        checkpointer_path=(str(ckpt[CheckpointerKeys.PATH])[:_MAX_TEXT]
                           if ckpt.get(CheckpointerKeys.PATH) is not None else None),
        temporary=bool(ckpt.get(CheckpointerKeys.TEMPORARY, False)),
        every_s=_opt_float(ckpt, CheckpointerKeys.EVERY_S),
        incomplete=tuple(str(n)[:_MAX_TEXT]
                         for n in (ckpt.get(CheckpointerKeys.INCOMPLETE) or ())[:_CALLS_KEPT]),
        checkpoints=tuple(_checkpoint_call(c)
                          for c in (doc.get(Replay.CHECKPOINTS) or ())[-_CALLS_KEPT:]),
        restore=None if restore is None else Restore(
            started_at=float(restore[RestoreKeys.STARTED_AT]),
            ended_at=_opt_float(restore, RestoreKeys.ENDED_AT),
            path=_opt_text(restore, RestoreKeys.PATH),
            bytes=int(restore.get(RestoreKeys.BYTES) or 0),
            read_bytes=_opt_int(restore, RestoreKeys.READ_BYTES)))


def _declared_table(t: dict[str, Any]) -> DeclaredTable:
    return DeclaredTable(
        name=str(t[TableKeys.NAME])[:_MAX_TEXT], max_size=int(t[TableKeys.MAX_SIZE]),
        max_times_sampled=int(t[TableKeys.MAX_TIMES_SAMPLED]),
        sampler=str(t[TableKeys.SAMPLER])[:_MAX_TEXT],
        remover=str(t[TableKeys.REMOVER])[:_MAX_TEXT],
        samples_per_insert=float(t[TableKeys.SAMPLES_PER_INSERT]),
        min_size_to_sample=int(t[TableKeys.MIN_SIZE_TO_SAMPLE]),
        min_diff=float(t[TableKeys.MIN_DIFF]), max_diff=float(t[TableKeys.MAX_DIFF]),
        priority_exponent=_opt_float(t, TableKeys.PRIORITY_EXPONENT))


def _checkpoint_call(c: dict[str, Any]) -> CheckpointCall:
    return CheckpointCall(
        started_at=float(c[CheckpointKeys.STARTED_AT]),
        ended_at=_opt_float(c, CheckpointKeys.ENDED_AT),
        path=_opt_text(c, CheckpointKeys.PATH), bytes=_opt_int(c, CheckpointKeys.BYTES),
        error=_opt_text(c, CheckpointKeys.ERROR))


def role_of(doc: dict[str, Any], probe: str) -> Role:
    """The document's role; a document without one is an old trainer probe's."""
    role = doc.get(Doc.ROLE, Role.TRAINER)
    if role not in ROLES:
        raise SourceProtocolError(
            f"{probe}: unknown probe role {str(role)[:50]!r} (known: actor, replay, trainer)")
    return Role(role)


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
            role = role_of(doc, self.name)
            if role == Role.REPLAY:
                memory = memory_from_probe(doc, self.name, self._target, started_at)
                return PollOutcome(self.name, self.kind, started_at, self._perf() - t0,
                                   memory=memory)
            if role == Role.ACTOR:
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
