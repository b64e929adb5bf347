"""The edge that reads a Ray cluster's RLlib job from outside it: no code in the job.

One poll reads, each with its own timeout and each failure one line of `RaySnapshot.errors`:

    actors     GET {dashboard}/api/v0/actors?limit=10000&detail=1          (the token)
    tasks      GET {dashboard}/api/v0/tasks?detail=1&... state=RUNNING     (the token)
    workers    GET {dashboard}/api/v0/workers?... is_alive=true            (the token), only
               while a live actor's WorkerId is unknown
    metrics    <temp dir>/prom_metrics_service_discovery.json, then GET /metrics of each
               target (no token); only the `ray_rllib_*` and `ray_actors` families kept
    results    a result.json (or the newest under a directory), tailed line by line; with
               several jobs on the cluster, the newest of the job's own (its first row's
               pid the job's driver's or an actor's, from GET {dashboard}/api/jobs/)

The state API wants `Authorization: Bearer <token>` since Ray enables token authentication
by default; the metrics endpoints want none. The job is the one named, or else the newest job
with a live RLlib actor; Ray lists the dead actors of earlier jobs, and keeps exporting the
series of dead workers with their last value, so both are filtered: actors by `job_id`,
series by `WorkerId` (a metrics page carries no job), joined to live workers through the
tasks API's `worker_id` (a running task's, matched to its actor by actor id or pid), else the
workers API's (matched by node and pid), each remembered, and the driver's id (the job id,
then `ff`s). A running call alone misses actors whose calls are short (a DQN EnvRunner's
`sample`): on a cluster running several jobs their series were counted as every job's. While
any live actor's WorkerId is still unknown no series is dropped, and that is said. The parsers
are pure and take the documents as read: `parse_actors`, `parse_tasks`, `parse_workers`,
`parse_metrics` (the result rows' own, `parse_result_row`, is in sources/ray_results.py).
"""

from __future__ import annotations

import collections
import dataclasses
import http.client
import json
import math
import os
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from replaywatch.errors import SourceError, SourceProtocolError, SourceTimeout, SourceUnreachable
from replaywatch.model import NO_ANSWER, PollOutcome, SourceKind
from replaywatch.ray_model import (
    ActorRole,
    RayActor,
    RayActorCount,
    RaySnapshot,
    RayTask,
    ResultRow,
    RllibCounters,
    driver_worker_id,
    role_of_class,
)
from replaywatch.sources import PolledSource
from replaywatch.sources.ray_results import JobOwner, ResultProbe, ResultTail
from replaywatch.sources.ray_shared import ClusterReads

URL_SCHEMES = ("http://", "https://")
SD_FILE = "prom_metrics_service_discovery.json"
DEFAULT_TEMP_DIR = "/tmp/ray"
ACTORS = "/api/v0/actors?limit=10000&detail=1"
_EQ = "&filter_predicates=%3D"
RUNNING_TASKS = f"/api/v0/tasks?detail=1&limit=10000&filter_keys=state{_EQ}&filter_values=RUNNING"
NODES = "/api/v0/nodes?limit=1000"
LIVE_WORKERS = f"/api/v0/workers?limit=10000&filter_keys=is_alive{_EQ}&filter_values=true"
# Every job, driver and submission alike, with its driver's pid and its start (Ray's job API,
# which the state API's jobs list mirrors): which result.json is whose, on a shared cluster.
JOBS = "/api/jobs/"
# The dashboard's py-spy of a worker, on the worker's node (Ray's reporter agent): text
TRACEBACK = "/worker/traceback"
TRACEBACK_TIMEOUT_S = 15.0  # py-spy attaches, walks every thread, and Ray relays it
_MAX_TRACEBACK = 2 * 1024 * 1024
_MAX_STATE = 32 * 1024 * 1024  # 10,000 actors in detail
_MAX_METRICS = 64 * 1024 * 1024  # the node's page grows with every job the cluster ran
_TEXT = 300

# Sample name -> RllibCounters field. A histogram is read by its _count: calls completed.
FIELD_OF = {
    "ray_rllib_env_runner_num_env_steps_sampled_counter_total": "env_steps_sampled",
    "ray_rllib_env_runner_num_try_env_step_counter_total": "env_step_calls",
    "ray_rllib_learner_all_modules_num_env_steps_trained_counter_total": "env_steps_trained",
    "ray_rllib_learner_all_modules_num_module_steps_trained_counter_total":
        "module_steps_trained",
    "ray_rllib_algorithm_step_time_count": "iterations",
    "ray_rllib_algorithm_training_step_time_count": "training_steps",
    "ray_rllib_learner_group_update_time_count": "learner_group_updates",
    "ray_rllib_learner_update_inner_update_time_count": "learner_updates",
    "ray_rllib_learner_impala_learner_thread_step_update_time_count": "learner_thread_steps",
    "ray_rllib_utils_circular_buffer_put_time_count": "circular_buffer_puts",
    "ray_rllib_utils_circular_buffer_get_time_count": "circular_buffer_gets",
    "ray_rllib_utils_circular_buffer_put_ts_dropped_counter_total": "circular_buffer_dropped",
    "ray_rllib_algorithms_impala_training_step_env_steps_dropped_counter_total":
        "env_steps_dropped",
    "ray_rllib_algorithms_impala_training_step_input_batches_counter_total": "input_batches",
    "ray_rllib_algorithms_impala_training_step_zero_input_batches_counter_total":
        "zero_input_batches",
    "ray_rllib_utils_aggregator_actor_get_batch_output_batches_counter_total":
        "aggregator_output_batches",
}
# Both count iterations; `step` is Algorithm.step, `run_one_training_iteration` inside it.
ITERATIONS_TOO = "ray_rllib_algorithm_run_one_training_iteration_time_count"
# What each emitting class exports once it has run; any other tag is the algorithm's own.
EXPECTED = {
    ActorRole.ENV_RUNNER: ("env_steps_sampled",),
    "_WrappedExecutable": ("env_steps_trained",),
    "LearnerGroup": ("learner_group_updates",),
    "IMPALA/LearnerThread": ("learner_thread_steps",),
    "CircularBuffer": ("circular_buffer_puts", "circular_buffer_dropped"),
    ActorRole.AGGREGATOR: ("aggregator_output_batches",),
}
ALGORITHM_EXPECTS = ("iterations", "training_steps")
RLLIB_PREFIX = "ray_rllib_"
ACTORS_FAMILY = "ray_actors"


def _one_line(text: Any) -> str:
    return " ".join(str(text).split())[:_TEXT]


def _opt_int(value: Any) -> int | None:
    return None if value in (None, "") else int(value)


def state_rows(doc: Any) -> tuple[list[dict[str, Any]], tuple[str, ...]]:
    """The rows of a state API answer, and what it warned of (a partial or truncated list)."""
    if not isinstance(doc, dict) or not doc.get("result"):
        msg = doc.get("msg") if isinstance(doc, dict) else None
        raise SourceProtocolError(f"not a state API answer: {_one_line(msg or doc)[:120]}")
    data = doc.get("data")
    data = data.get("result") if isinstance(data, dict) else None
    rows = data.get("result") if isinstance(data, dict) else None
    if not isinstance(data, dict) or not isinstance(rows, list):
        raise SourceProtocolError("state API answer without a list of rows")
    warnings = [_one_line(w) for w in (data.get("partial_failure_warning"),
                                       *(data.get("warnings") or ())) if w]
    total, kept = data.get("total"), data.get("num_after_truncation")
    if isinstance(total, int) and isinstance(kept, int) and kept < total:
        warnings.append(f"truncated to {kept} of {total} rows")
    return [r for r in rows if isinstance(r, dict)], tuple(warnings)


def head_node(doc: Any) -> str | None:
    """The head node's id from a state API nodes answer (None: none marked head)."""
    rows, _ = state_rows(doc)
    return next((str(r["node_id"]) for r in rows
                 if r.get("is_head_node") and r.get("node_id")), None)


def _death_cause(cause: Any) -> str | None:
    """One line from `death_cause`: the reason and Ray's message, whichever context it is
    (actor_died_error_context, creation_task_failure_context, ...)."""
    if not isinstance(cause, dict) or not cause:
        return None
    key, context = next(iter(cause.items()))
    if not isinstance(context, dict):
        return _one_line(f"{key}: {context}")
    said = [context.get("reason"), context.get("error_message")
            or context.get("formatted_exception_string")]
    return _one_line(": ".join(str(s) for s in said if s) or key)


def parse_actors(doc: Any, now: float) -> tuple[RayActor, ...]:
    """`/api/v0/actors?detail=1` as actors; `now` is unused (an actor carries no age) but
    kept so every state parser reads the same. Raises SourceProtocolError on a wrong shape."""
    rows, _ = state_rows(doc)
    try:
        return tuple(RayActor(
            actor_id=str(r["actor_id"]), class_name=str(r["class_name"]),
            role=role_of_class(str(r["class_name"])), state=str(r["state"]),
            num_restarts=int(r.get("num_restarts") or 0),
            death_cause=_death_cause(r.get("death_cause")),
            pid=_opt_int(r.get("pid")) or None, node_id=r.get("node_id") or None,
            job_id=str(r["job_id"]), name=str(r.get("name") or "")[:_TEXT])
            for r in rows)
    except (KeyError, TypeError, ValueError) as e:
        raise SourceProtocolError(f"not an actor row ({e!r})"[:_TEXT]) from None


def parse_tasks(doc: Any, now: float) -> tuple[RayTask, ...]:
    """`/api/v0/tasks?detail=1` as tasks, each aged from its `start_time_ms` to `now`."""
    rows, _ = state_rows(doc)
    try:
        return tuple(_task(r, now) for r in rows)
    except (KeyError, TypeError, ValueError) as e:
        raise SourceProtocolError(f"not a task row ({e!r})"[:_TEXT]) from None


def _task(r: dict[str, Any], now: float) -> RayTask:
    name = str(r["name"])
    started = r.get("start_time_ms")
    return RayTask(
        name=name[:_TEXT], role=role_of_class(name.rpartition(".")[0] or name),
        worker_pid=_opt_int(r.get("worker_pid")), worker_id=r.get("worker_id") or None,
        job_id=str(r["job_id"]),
        running_for_s=None if not started else max(0.0, now - int(started) / 1000.0),
        actor_id=r.get("actor_id") or None, task_id=str(r.get("task_id") or ""),
        attempt=int(r.get("attempt_number") or 0))


def parse_workers(doc: Any) -> dict[tuple[str | None, int], str]:
    """`/api/v0/workers` as each live worker's WorkerId by (node id, pid), the key an actor
    row carries. Raises SourceProtocolError on a wrong shape."""
    rows, _ = state_rows(doc)
    try:
        return {(r.get("node_id") or None, int(r["pid"])): str(r["worker_id"])
                for r in rows if r.get("is_alive", True) and r.get("pid")}
    except (KeyError, TypeError, ValueError) as e:
        raise SourceProtocolError(f"not a worker row ({e!r})"[:_TEXT]) from None


@dataclasses.dataclass(frozen=True, slots=True)
class JobDriver:
    """A job's driver as Ray's job API lists it: its pid and when the job started."""

    pid: int | None
    started_at: float | None  # seconds since the epoch


def parse_job_drivers(doc: Any) -> dict[str, JobDriver]:
    """`/api/jobs/` as each job's driver by job id (a submission whose driver has not started
    has no job id yet, and is left out). Raises SourceProtocolError on a wrong shape."""
    if not isinstance(doc, list):
        raise SourceProtocolError("the jobs list is not a JSON list")
    drivers: dict[str, JobDriver] = {}
    for row in doc:
        if not isinstance(row, dict):
            raise SourceProtocolError("a job is not a JSON object")
        job_id = row.get("job_id")
        if not isinstance(job_id, str) or not job_id:
            continue
        info = row.get("driver_info")
        pid = info.get("pid") if isinstance(info, dict) else None
        started = row.get("start_time")
        drivers[job_id] = JobDriver(
            pid=int(pid) if isinstance(pid, (str, int)) and str(pid).isdigit() else None,
            started_at=started / 1000.0 if isinstance(started, (int, float))
            and not isinstance(started, bool) and started > 0 else None)
    return drivers


@dataclasses.dataclass(frozen=True, slots=True)
class MetricsPage:
    """What one or more `/metrics` pages say of RLlib: its series per process and tag (none
    joined yet), the `ray_actors` counts, and the Ray version the labels name."""

    counters: tuple[RllibCounters, ...] = ()
    actor_counts: tuple[RayActorCount, ...] = ()
    ray_version: str | None = None


def _kept(line: str) -> bool:
    if line.startswith("#"):
        words = line.split(None, 3)
        line = words[2] if len(words) > 2 and words[1] in ("TYPE", "HELP") else ""
    name = line.split("{", 1)[0].split(" ", 1)[0]
    return (name.startswith(RLLIB_PREFIX) and not name.endswith("_bucket")) or (
        name == ACTORS_FAMILY)


def kept_text(text: str) -> str:
    """The lines of the families kept, histogram buckets left out: the node's page is
    megabytes of other families and of dead workers' buckets, not worth parsing."""
    return "\n".join(line for line in text.splitlines() if _kept(line)) + "\n"


def parse_metrics(text: str) -> MetricsPage:
    """A Prometheus text page as RLlib series per (WorkerId, rllib) and `ray_actors`."""
    series: dict[tuple[str, str], dict[str, float]] = collections.defaultdict(dict)
    counts, version = [], None
    try:
        families = list(text_string_to_metric_families(kept_text(text)))
    except ValueError as e:
        raise SourceProtocolError(f"not a Prometheus text page ({e})"[:_TEXT]) from None
    for family in families:
        for s in family.samples:
            if math.isnan(s.value):
                continue
            version = version or s.labels.get("Version")
            if s.name == ACTORS_FAMILY:
                counts.append(RayActorCount(
                    s.labels.get("JobId", ""), s.labels.get("Name", ""),
                    s.labels.get("State", ""), s.value, s.labels.get("Source", "")))
            elif "WorkerId" in s.labels and not s.name.endswith("_created"):
                series[s.labels["WorkerId"], s.labels.get("rllib", "")][s.name] = s.value
    return MetricsPage(tuple(_counters(w, tag, v) for (w, tag), v in sorted(series.items())),
                       tuple(counts), version)


def _counters(worker_id: str, tag: str, values: dict[str, float]) -> RllibCounters:
    fields = {f: values[n] for n, f in FIELD_OF.items() if n in values}
    if "iterations" not in fields and ITERATIONS_TOO in values:
        fields["iterations"] = values[ITERATIONS_TOO]
    role = role_of_class(tag)
    expected = EXPECTED.get(tag) or EXPECTED.get(role) or (
        ALGORITHM_EXPECTS if role == ActorRole.OTHER else ())
    return RllibCounters(worker_id=worker_id, rllib=tag, role=role, joined=False,
                         missing=tuple(f for f in expected if f not in fields),
                         samples=tuple(sorted(values.items())), **fields)


def find_token(flag: str | None, environ: Mapping[str, str], home: Path) -> tuple[str | None, str]:
    """The cluster's token, and where it came from, in Ray's order: the flag, then
    RAY_AUTH_TOKEN, the file at RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token."""
    if flag and flag.strip():
        return flag.strip(), "the flag"
    if environ.get("RAY_AUTH_TOKEN", "").strip():
        return environ["RAY_AUTH_TOKEN"].strip(), "RAY_AUTH_TOKEN"
    paths = [Path(p) for p in (environ.get("RAY_AUTH_TOKEN_PATH"),) if p]
    paths.append(home / ".ray" / "auth_token")
    for path in paths:
        try:
            token = path.read_text().strip()
        except OSError:
            continue
        if token:
            return token, str(path)
    return None, "no token in the flag, RAY_AUTH_TOKEN, " + " or ".join(map(str, paths))


def job_number(job_id: str) -> int:
    """A job id is a little-endian counter in hex: `03000000` is the cluster's third job."""
    try:
        return int.from_bytes(bytes.fromhex(job_id), "little")
    except ValueError:
        return -1


def newest_rllib_job(actors: Iterable[RayActor]) -> str | None:
    """The newest job with an RLlib actor (EnvRunner, Learner, aggregator) not dead."""
    live = {a.job_id for a in actors if a.role != ActorRole.OTHER and a.state != "DEAD"}
    return max(live, key=job_number, default=None)


def join_counters(counters: Iterable[RllibCounters], live: set[str], complete: bool
                  ) -> tuple[tuple[RllibCounters, ...], int]:
    """Series of live workers marked joined; the others dropped where the live set is
    `complete` (every live actor's WorkerId known), else kept unjoined. Returns the kept
    series and how many were dropped."""
    kept, dropped = [], 0
    for c in counters:
        if c.worker_id in live:
            kept.append(dataclasses.replace(c, joined=True))
        elif complete:
            dropped += 1
        else:
            kept.append(c)
    return tuple(kept), dropped


class _Refused(SourceUnreachable):
    """Nothing listens there: for a metrics target, normal (Ray lists one that never does)."""


def http_get(url: str, timeout_s: float, limit: int,
             headers: Mapping[str, str] | None = None) -> bytes:
    """GET with a deadline; every failure a SourceError, an HTTP error with its first words."""
    request = urllib.request.Request(url, headers=dict(headers or {}))
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            body = response.read(limit + 1)
    except urllib.error.HTTPError as e:
        said = _one_line(e.read(200).decode("utf-8", "replace"))[:120]
        raise SourceProtocolError(f"HTTP {e.code} {said}".strip()) from None
    except (ValueError, http.client.HTTPException) as e:
        raise SourceProtocolError(f"{type(e).__name__}: {e}"[:_TEXT]) from None
    except TimeoutError:
        raise SourceTimeout(f"{NO_ANSWER} {timeout_s:g}s") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        if isinstance(reason, (socket.timeout, TimeoutError)):
            raise SourceTimeout(f"{NO_ANSWER} {timeout_s:g}s") from None
        if isinstance(reason, ConnectionRefusedError):
            raise _Refused("unreachable (connection refused)") from None
        raise SourceUnreachable(f"unreachable ({reason})"[:_TEXT]) from None
    if len(body) > limit:
        raise SourceProtocolError(f"answer larger than {limit} bytes")
    return body


class RayClusterSource:
    """One Ray cluster's RLlib job, read from outside: `poll(now)` returns a `RaySnapshot`
    and never raises; what could not be read is a line of its `errors`.

    `dashboard` is the dashboard's address (`http://127.0.0.1:8265`); `token` the cluster's
    (else found as Ray finds it, at the first poll); `temp_dir` Ray's temp dir, where the
    head writes the metrics' service-discovery file; `job_id` the job to watch (else the
    newest with a live RLlib actor); `results` a result.json or a directory holding one;
    `results_by_job`: the directory holds several jobs' (`--ray-job all`), and this job's are
    the ones whose first row's pid is its driver's or one of its actors'.
    """

    def __init__(self, dashboard: str, *, token: str | None = None,
                 temp_dir: str | Path = DEFAULT_TEMP_DIR, job_id: str | None = None,
                 results: str | Path | None = None, timeout_s: float = 2.0,
                 scrape_timeout_s: float = 2.0, environ: Mapping[str, str] | None = None,
                 home: Path | None = None, shared: ClusterReads | None = None,
                 results_by_job: bool = False):
        base = dashboard if "://" in dashboard else f"http://{dashboard}"
        self.target = base.rstrip("/")
        self.name = f"ray {self.target}"
        self._flag_token = token
        self._token: str | None = None
        self._token_from = ""
        self._sd_file = Path(temp_dir) / SD_FILE
        self._job = job_id
        self._pinned = job_id is not None
        # A URL is an RLlib probe in the driver (replaywatch.probe.rllib); a path, result.json.
        self._tail: ResultTail | ResultProbe | None = (
            None if results is None
            else ResultProbe(str(results), timeout_s) if str(results).startswith(URL_SCHEMES)
            else ResultTail(Path(results)))
        self._timeout_s, self._scrape_timeout_s = timeout_s, scrape_timeout_s
        self._environ = os.environ if environ is None else environ
        self._home = home
        self._worker_of: dict[str, tuple[int, str]] = {}  # actor -> (restarts, WorkerId)
        # The reads every job of the cluster makes alike, made once a cycle for all of them
        # (ray_shared.py); None: this source reads them itself.
        self._shared = shared
        self._by_job = results_by_job and isinstance(self._tail, ResultTail)
        self._driver: JobDriver | None = None  # this job's, once Ray's job API lists it

    def close(self) -> None:
        """Nothing held between polls: every read opens and closes its own connection."""

    def poll(self, now: float) -> RaySnapshot:
        errors: list[str] = []
        actors = self._actors(now, errors)
        job = self._choose(actors, errors)
        mine = tuple(a for a in actors or () if a.job_id == job)
        tasks = self._tasks(RUNNING_TASKS, job, now, errors) if job and actors is not None else ()
        mine = self._with_workers(mine, tasks, job, now, errors)
        counters, counts, version, targets, refused, dropped = self._metrics(
            job if actors is not None else None, mine, tasks, errors)
        rows: tuple[ResultRow, ...] = ()
        file = None
        live = None
        if isinstance(self._tail, ResultTail) and self._by_job:
            owner = self._owner(job, mine, errors)
            if owner is not None:
                rows, file, said = self._tail.read(owner)
                errors += said
        elif self._tail is not None:
            rows, file, said = self._tail.read()
            errors += said
            live = self._tail.live if isinstance(self._tail, ResultProbe) else None
        return RaySnapshot(
            target=self.target, observed_at=now, job_id=job,
            driver_pid=rows[-1].pid if rows else None, actors=mine, tasks=tasks,
            counters=counters, actor_counts=counts, results=rows, result_file=file, live=live,
            ray_version=version, metrics_targets=targets, metrics_targets_refused=refused,
            series_dropped=dropped, errors=tuple(errors))

    def _owner(self, job: str | None, actors: tuple[RayActor, ...],
               errors: list[str]) -> JobOwner | None:
        """Whose result.json this job's is: its driver's pid and start (Ray's job API, read
        until it lists the job) and its actors' pids; None (said) while none is known."""
        if job is None:
            return None
        if self._driver is None or self._driver.pid is None:
            try:
                self._driver = parse_job_drivers(self._cluster_state(JOBS)).get(job)
            except SourceError as e:
                errors.append(f"results: {self.target}{JOBS}: {e}: which result.json is job "
                              f"{job}'s is not known")
        pids = {a.pid for a in actors if a.pid is not None}
        if self._driver is not None and self._driver.pid is not None:
            pids.add(self._driver.pid)
        if not pids:
            errors.append(f"results: job {job} has no driver or actor pid listed yet")
            return None
        since = self._driver.started_at if self._driver and self._driver.started_at else 0.0
        return JobOwner(job, frozenset(pids), since)

    def _state(self, path: str) -> Any:
        """A state API document, with the token; SourceError names what went wrong."""
        headers = {"Accept": "application/json", **self._auth()}
        try:
            return json.loads(http_get(self.target + path, self._timeout_s, _MAX_STATE, headers))
        except SourceProtocolError as e:
            if str(e).startswith(("HTTP 401", "HTTP 403")):
                hint = (f"token from {self._token_from}" if self._token
                        else self._token_from)
                self._token = None  # read again next poll: the file may be written by then
                raise SourceProtocolError(f"{e} ({hint})") from None
            raise
        except ValueError:
            raise SourceProtocolError("answer is not JSON") from None

    def tracebacks(self, workers: Sequence[tuple[int, str | None]]
                   ) -> dict[str, dict[str, Any]]:
        """Each worker's stacks by the dashboard's py-spy (`/worker/traceback`), keyed
        `ray:PID`: `{"text": ...}`, or `{"error": ...}` saying why not. A worker of no known
        node (the driver, which is no actor) is read on the head node, where `ray.init` runs
        a driver unless it joined from elsewhere. Called off the poller's thread."""
        head, no_head = None, "no node known for it"
        if any(node is None for _, node in workers):
            try:
                head = head_node(self._state(NODES))
            except SourceError as e:
                no_head = f"no node known for it ({self.target}{NODES}: {e})"
        taken: dict[str, dict[str, Any]] = {}
        for pid, node in workers:
            on = node or head
            if on is None:
                taken[f"ray:{pid}"] = {"error": no_head, "pid": pid}
                continue
            query = urllib.parse.urlencode({"pid": pid, "node_id": on})
            try:
                taken[f"ray:{pid}"] = {"text": self._get_text(f"{TRACEBACK}?{query}"),
                                       "pid": pid, "node_id": on}
            except SourceError as e:
                taken[f"ray:{pid}"] = {"error": f"{self.target}{TRACEBACK}: {e}", "pid": pid,
                                       "node_id": on}
        return taken

    def _get_text(self, path: str) -> str:
        return http_get(self.target + path, TRACEBACK_TIMEOUT_S, _MAX_TRACEBACK,
                        self._auth()).decode("utf-8", "replace")

    def _auth(self) -> dict[str, str]:
        """The token's header (found as Ray finds it, at the first call); none without one."""
        if self._token is None:
            home = self._home if self._home is not None else Path.home()
            self._token, self._token_from = find_token(self._flag_token, self._environ, home)
        return {"Authorization": f"Bearer {self._token}"} if self._token else {}

    def _cluster_state(self, path: str) -> Any:
        """A state API document every job reads alike: shared where the source is."""
        if self._shared is None:
            return self._state(path)
        return self._shared.read(path, lambda: self._state(path))

    def read_actors(self, now: float) -> tuple[RayActor, ...]:
        """Every actor the state API lists, of every job (discovery's read); raises
        SourceError."""
        return parse_actors(self._cluster_state(ACTORS), now)

    def _actors(self, now: float, errors: list[str]) -> tuple[RayActor, ...] | None:
        try:
            doc = self._cluster_state(ACTORS)
            errors += [f"state API: actors: {w}" for w in state_rows(doc)[1]]
            return parse_actors(doc, now)
        except SourceError as e:
            errors.append(f"state API: {self.target}/api/v0/actors: {e}")
            return None

    def _choose(self, actors: tuple[RayActor, ...] | None, errors: list[str]) -> str | None:
        """The job named, or the newest with a live RLlib actor; a job whose actors all died
        stays watched until a newer one starts, so its end is seen rather than lost."""
        if self._pinned or actors is None:
            return self._job
        newest = newest_rllib_job(actors)
        if newest is not None and job_number(newest) >= job_number(self._job or ""):
            self._job = newest
        if self._job is None:
            errors.append("state API: no job with a live RLlib actor (name one to watch it)")
        return self._job

    def _tasks(self, path: str, job: str, now: float, errors: list[str]) -> tuple[RayTask, ...]:
        try:
            doc = self._state(f"{path}&filter_keys=job_id{_EQ}&filter_values={job}")
            errors += [f"state API: tasks: {w}" for w in state_rows(doc)[1]]
            return tuple(t for t in parse_tasks(doc, now) if t.job_id == job)
        except SourceError as e:
            errors.append(f"state API: {self.target}/api/v0/tasks: {e}")
            return ()

    def _with_workers(self, actors: tuple[RayActor, ...], running: tuple[RayTask, ...],
                      job: str | None, now: float, errors: list[str]) -> tuple[RayActor, ...]:
        """The job's actors with their WorkerIds: from a running task of theirs, else from the
        workers API, asked only while a live actor's (or restart's) id is unknown."""
        self._worker_of = {a.actor_id: w for a in actors
                           if (w := self._worker_of.get(a.actor_id)) is not None}
        # Creation tasks list the actor's worker_pid but no worker_id (Ray 2.60, recorded):
        # the id comes from a running task, matched by actor or by pid, or from the live
        # workers by node and pid, and is kept for as long as the actor has not restarted.
        for t in running:
            for actor in actors:
                if t.worker_id and (t.actor_id == actor.actor_id or (
                        actor.pid is not None and t.worker_pid == actor.pid)):
                    self._worker_of[actor.actor_id] = (actor.num_restarts, t.worker_id)
        unknown = [a for a in actors if a.alive and a.pid is not None
                   and self._worker_of.get(a.actor_id, (-1, ""))[0] != a.num_restarts]
        if unknown:
            try:
                doc = self._cluster_state(LIVE_WORKERS)
                errors += [f"state API: workers: {w}" for w in state_rows(doc)[1]]
                by_pid = parse_workers(doc)
            except SourceError as e:
                errors.append(f"state API: {self.target}/api/v0/workers: {e}")
                by_pid = {}
            for a in unknown:
                if (w_id := by_pid.get((a.node_id, a.pid or 0))) is not None:
                    self._worker_of[a.actor_id] = (a.num_restarts, w_id)
        return tuple(dataclasses.replace(a, worker_id=w[1]) if (
            w := self._worker_of.get(a.actor_id)) and w[0] == a.num_restarts else a
            for a in actors)

    def _metrics(self, job: str | None, actors: tuple[RayActor, ...],
                 tasks: tuple[RayTask, ...], errors: list[str]
                 ) -> tuple[tuple[RllibCounters, ...], tuple[RayActorCount, ...], str | None,
                            int, int, int]:
        """The pages' series, joined to the job's live workers; `job` is None where the
        actors could not be read, and then no series is dropped: none can be told dead."""
        targets, refused, pages = self._scrape(errors)
        page = MetricsPage(tuple(c for p in pages for c in p.counters),
                           tuple(c for p in pages for c in p.actor_counts),
                           next((p.ray_version for p in pages if p.ray_version), None))
        live_actors = [a for a in actors if a.alive]
        live = {a.worker_id for a in live_actors if a.worker_id}
        live |= {t.worker_id for t in tasks if t.worker_id}
        if job:
            live.add(driver_worker_id(job))
        named = sum(1 for a in live_actors if a.worker_id)
        complete = job is not None and named == len(live_actors)
        counters, dropped = join_counters(page.counters, live, complete)
        unjoined = sum(1 for c in counters if not c.joined)
        if unjoined:
            why = (f"the state API named the WorkerId of {named} of {len(live_actors)} live "
                   f"actors of job {job}" if job else "no job's live workers to join them to")
            errors.append(f"metrics: {unjoined} RLlib series kept unjoined: {why}")
        elif pages and job and not counters:
            errors.append(f"metrics: no ray_rllib_* series of job {job}'s workers")
        counts = tuple(c for c in page.actor_counts if job is None or c.job_id == job)
        return counters, counts, page.ray_version, targets, refused, dropped

    def _scrape(self, errors: list[str]) -> tuple[int, int, list[MetricsPage]]:
        """Each target of the service-discovery file, read afresh each poll (the head
        rewrites it as nodes come and go): how many, how many refused, their pages; read once
        a cycle for every job where the source is shared."""
        targets, refused, pages, said = (
            self._scrape_pages() if self._shared is None
            else self._shared.read("metrics", self._scrape_pages))
        errors += said
        return targets, refused, list(pages)

    def _scrape_pages(self) -> tuple[int, int, tuple[MetricsPage, ...], tuple[str, ...]]:
        errors: list[str] = []
        try:
            groups = json.loads(self._sd_file.read_text())
            targets = [str(t) for g in groups for t in g["targets"]]
        except FileNotFoundError:
            errors.append(f"metrics: no service-discovery file at {self._sd_file}")
            return 0, 0, (), tuple(errors)
        except (OSError, ValueError, TypeError, KeyError) as e:
            errors.append(f"metrics: {self._sd_file} is not Prometheus file_sd JSON "
                          f"({type(e).__name__})")
            return 0, 0, (), tuple(errors)
        refused, pages = 0, []
        for target in targets:
            try:
                body = http_get(f"http://{target}/metrics", self._scrape_timeout_s, _MAX_METRICS)
                pages.append(parse_metrics(body.decode("utf-8", "replace")))
            except _Refused:
                refused += 1
            except SourceError as e:
                errors.append(f"metrics: {target}/metrics: {e}")
        if targets and refused == len(targets):
            errors.append(f"metrics: every target of {self._sd_file} refused ({refused})")
        return len(targets), refused, tuple(pages), tuple(errors)


class RaySource(PolledSource):
    """A Ray cluster as one of the poller's sources: each poll's `RaySnapshot` in a
    `PollOutcome` of kind RAY. The poll is down (`error`) only when nothing of the job could
    be read; a part that failed while others answered is a line of the snapshot's `errors`,
    which the rules read as that part unknown this poll."""

    kind = SourceKind.RAY

    def __init__(self, cluster: RayClusterSource, name: str, timeout_s: float,
                 clock: Callable[[], float] = time.time,
                 perf: Callable[[], float] = time.perf_counter):
        super().__init__(name, timeout_s, clock, perf)
        self.cluster = cluster

    def poll(self) -> PollOutcome:
        started, t0 = self._clock(), self._perf()
        snap = self.cluster.poll(started)
        read_nothing = snap.job_id is None and snap.errors and not snap.counters
        error = "; ".join(snap.errors[:2]) if read_nothing else None
        return PollOutcome(self.name, SourceKind.RAY, started, self._perf() - t0, error=error,
                           ray=snap)

    def close(self) -> None:
        self.cluster.close()
