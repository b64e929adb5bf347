"""The composition root: a WatchConfig becomes a running sidecar, and back to nothing.

    config -> sources (+ targets file) -> history -> findings keeper (+ incident log)
           -> poller -> state store

`build_sidecar` is the one place these parts meet; `replaywatch check` and
`replaywatch watch` both start from it. The HTTP edge (app, registry, server)
is added on top of a Sidecar by replaywatch/watch.py, so that `check` never
imports the web stack.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import platform
import threading
import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any

from replaywatch.bundle_store import BundleMaker, BundleStore, default_directory
from replaywatch.config import RayTarget, WatchConfig, default_db_path
from replaywatch.errors import ConfigError
from replaywatch.findings import FindingsKeeper
from replaywatch.fleet import JOB_LABEL
from replaywatch.history import COARSE_EVERY_S, History
from replaywatch.incidents import IncidentLog
from replaywatch.kubernetes_sd import KubePods
from replaywatch.poller import Poller, SourceBinding, targets_of
from replaywatch.shards import Sharding
from replaywatch.sources import ray_jobs
from replaywatch.sources.memory import MemoryWatch, is_local, port_of
from replaywatch.sources.probe_http import HttpProbeSource
from replaywatch.sources.ray_cluster import RayClusterSource, RaySource
from replaywatch.sources.ray_jobs import RayJobs
from replaywatch.sources.ray_shared import ClusterReads
from replaywatch.sources.reverb import ReverbSource
from replaywatch.stack_taker import StackTaker, py_spy_dump
from replaywatch.state import Published, StateStore
from replaywatch.targets_file import ParsedTargets, TargetsFile

log = logging.getLogger("replaywatch")

Reload = Callable[[], list[SourceBinding] | None]


def make_bindings(config: WatchConfig) -> list[SourceBinding]:
    """The sources named on the command line."""
    timeout = config.poll.effective_timeout_s
    pids = dict(config.reverb_pids)
    bindings = [SourceBinding(ReverbSource(t, timeout, memory=memory_watch(t, pids.get(t))), t)
                for t in config.targets]
    for probe in config.probes:
        assert probe.target is not None  # resolved by WatchConfig
        bindings.append(SourceBinding(HttpProbeSource(probe.url, timeout, target=probe.target),
                                      probe.target))
    for ray in config.ray:
        if not ray.every_job:  # every job's: found by discovery (with_ray_jobs)
            bindings.append(SourceBinding(ray_source(ray, timeout), ray.name))
    return bindings


def ray_source(ray: RayTarget, timeout: float, job_id: str | None = None,
               shared: ClusterReads | None = None) -> RaySource:
    """One RLlib job's cluster (`job_id`: a discovered job's). Each read of a poll (the
    state API's two calls, each metrics endpoint) has its own deadline within the poll's; a
    poll still running at the next cycle is skipped and counted late, never stacked. The
    jobs of one cluster share the reads that are the same for each (`shared`)."""
    each = max(0.5, timeout / 2)
    # A discovered job's rows are its own of the directory every job's are under.
    cluster = RayClusterSource(ray.name, token=ray.token, temp_dir=ray.temp_dir,
                               job_id=job_id or ray.job_id, results=ray.results,
                               timeout_s=each, scrape_timeout_s=each, shared=shared,
                               results_by_job=ray.every_job)
    return RaySource(cluster, ray.job_name(job_id) if job_id else ray.name, timeout)


def with_ray_jobs(plan: TargetsPlan, config: WatchConfig) -> TargetsPlan:
    """The plan with every RLlib job of each `--ray-job all` cluster, each a target of its
    own (sources/ray_jobs.py): found at the first cycle and every 10 s after, a job leaving
    the watch a TTL after its RLlib actors died. The targets file's reloads go on beside."""
    rays = [r for r in config.ray if r.every_job]
    if not rays:
        return plan
    timeout = config.poll.effective_timeout_s
    # A cycle's polls of one cluster's jobs start together: what each reads alike (actors,
    # workers, every node's metrics page) is read by the first and handed to the others.
    shared = {r.name: ClusterReads(fresh_s=config.poll.interval_s / 2) for r in rays}
    finders = [(r, RayJobs(ray_source(r, timeout, shared=shared[r.name]).cluster.read_actors,
                           every_s=ray_jobs.DISCOVER_EVERY_S, ttl_s=r.job_ttl_s))
               for r in rays]
    base = list(plan.bindings)
    found: dict[str, list[SourceBinding]] = {r.name: [] for r in rays}

    def reload() -> list[SourceBinding] | None:
        nonlocal base
        changed = False
        if plan.reload is not None and (fresh := plan.reload()) is not None:
            base, changed = list(fresh), True
        for ray, finder in finders:
            jobs = finder.jobs(time.time())
            if jobs is not None:
                found[ray.name] = [SourceBinding(s, s.name) for s in (
                    ray_source(ray, timeout, job, shared[ray.name]) for job in jobs)]
                changed = True
        return base + [b for bs in found.values() for b in bs] if changed else None

    def errors() -> tuple[str, ...]:
        said = tuple(e for _, f in finders if (e := f.last_error))
        return (*plan.errors(), *said)

    return TargetsPlan(base, reload, errors, plan.closers)


def with_kubernetes(plan: TargetsPlan, config: WatchConfig) -> TargetsPlan:
    """The plan with the replay servers and probes of the pods `--kubernetes` selects
    (kubernetes_sd.py): listed at start (an API that refuses is a ConfigError, exit 2), then
    followed by the API's watch; a pod's targets are added or leave at the next cycle. The
    targets file's and the Ray jobs' reloads go on beside."""
    if config.kubernetes is None:
        return plan
    timeout = config.poll.effective_timeout_s
    pods = KubePods(config.kubernetes, timeout_s=max(5.0, timeout))
    pods.start()
    first = pods.targets()
    assert first is not None  # the first call always answers
    for error in first.errors:
        log.warning("%s", error)
    base = list(plan.bindings)

    def apart(parsed: ParsedTargets) -> list[SourceBinding]:
        # A server also named by a flag or the targets file is polled once, as named there.
        named = {b.source.name for b in base}
        return [b for b in bindings_from_file(parsed, timeout) if b.source.name not in named]

    found = apart(first)

    def reload() -> list[SourceBinding] | None:
        nonlocal base, found
        changed = False
        if plan.reload is not None and (fresh := plan.reload()) is not None:
            base, changed = list(fresh), True
        discovered = pods.targets()
        if discovered is not None:
            for error in discovered.errors:
                log.warning("%s", error)
            found, changed = apart(discovered), True
        return base + found if changed else None

    def errors() -> tuple[str, ...]:
        return (*plan.errors(), *pods.errors())

    return TargetsPlan(base + found, reload, errors, (*plan.closers, pods.stop))


def memory_watch(target: str, pid: int | None) -> MemoryWatch | None:
    """The server's process where this host can read it: named, or a local target's."""
    if pid is None and not is_local(target):
        return None
    return MemoryWatch(target, port_of(target), pid)


def bindings_from_file(parsed: ParsedTargets, timeout: float) -> list[SourceBinding]:
    out = []
    for entry in parsed.entries:
        out.append(SourceBinding(ReverbSource(entry.address, timeout,
                                              memory=memory_watch(entry.address, None)),
                                 entry.address, entry.labels))
        for url in entry.probe_urls:  # trainer, actor and replay probes alike
            out.append(SourceBinding(HttpProbeSource(url, timeout, target=entry.address),
                                     entry.address, entry.labels))
    return out


@dataclasses.dataclass(frozen=True)
class TargetsPlan:
    """The initial bindings, how to reload them, and the targets file's current errors."""

    bindings: list[SourceBinding]
    reload: Reload | None = None
    errors: Callable[[], tuple[str, ...]] = tuple
    closers: tuple[Callable[[], None], ...] = ()  # discovery threads stopped with the sidecar


def plan_targets(config: WatchConfig, static: list[SourceBinding]) -> TargetsPlan:
    """Adds --targets-file's entries to the static bindings.

    At start an unreadable or shapeless file is a ConfigError (exit 2); bad
    entries are reported and skipped. Later, a broken edit keeps what runs.
    """
    if not config.targets_file:
        return TargetsPlan(static)
    timeout = config.poll.effective_timeout_s
    tf = TargetsFile(config.targets_file, reserved=frozenset(config.targets))
    parsed = tf.read_if_changed()
    if parsed is None:
        raise ConfigError(tf.last_error or f"targets file {config.targets_file}: unreadable")
    for error in parsed.errors:
        log.warning("%s", error)
    if not static and not parsed.entries:
        raise ConfigError(f"targets file {config.targets_file} has no valid target")

    def reload() -> list[SourceBinding] | None:
        fresh = tf.read_if_changed()
        if fresh is None:
            if tf.last_error:
                log.warning("%s; keeping the current targets", tf.last_error)
            return None
        for error in fresh.errors:
            log.warning("%s", error)
        return static + bindings_from_file(fresh, timeout)

    def errors() -> tuple[str, ...]:
        return (tf.last_error,) if tf.last_error else ()

    return TargetsPlan(static + bindings_from_file(parsed, timeout), reload, errors)


def sharded(plan: TargetsPlan, sharding: Sharding) -> TargetsPlan:
    """The plan with only the targets this shard owns (a job's servers together), and their
    probes (a probe's target is its server), at start and at each reload."""
    def keep(bindings: list[SourceBinding]) -> list[SourceBinding]:
        # A job's servers are hashed by their job, so that one sidecar judges them together
        targets = {b.target: dict(b.labels).get(JOB_LABEL) or b.target for b in bindings}
        owned = sharding.keep(targets)
        return [b for b in bindings if b.target in owned]

    reload = plan.reload

    def reloaded() -> list[SourceBinding] | None:
        fresh = reload() if reload is not None else None
        return None if fresh is None else keep(fresh)

    return TargetsPlan(keep(plan.bindings), reloaded if reload is not None else None,
                       plan.errors, plan.closers)


def open_incident_log(path: str) -> IncidentLog:
    """The incident log at `path` (":memory:" for none on disk); its directory is made here."""
    if path != ":memory:":
        try:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        except OSError as e:  # the log reports it in /readyz; watching goes on
            log.error("cannot create the incident log's directory: %s", e)
    return IncidentLog(path)


@dataclasses.dataclass(frozen=True)
class Sidecar:
    """Every part of one sidecar; `close()` (or leaving a `with`) stops and closes them."""

    config: WatchConfig
    history: History
    store: StateStore
    incidents: IncidentLog
    keeper: FindingsKeeper
    poller: Poller
    bundles: BundleMaker
    _stop: threading.Event = dataclasses.field(default_factory=threading.Event)
    _threads: list[threading.Thread] = dataclasses.field(default_factory=list)
    _closers: list[Callable[[], None]] = dataclasses.field(default_factory=list)

    def start(self) -> None:
        """Polls on a background thread until `close()`."""
        thread = threading.Thread(target=self.poller.run, args=(self._stop,),
                                  name="replaywatch-poller", daemon=True)
        self._threads.append(thread)
        thread.start()

    def close(self) -> None:
        """Stops polling, then closes the sources and the incident log; safe to repeat."""
        self._stop.set()
        poll = self.config.poll
        for thread in self._threads:
            thread.join(timeout=poll.interval_s + poll.effective_timeout_s + 2)
        self._threads.clear()
        for stop in self._closers:
            stop()
        self.poller.close()
        self.incidents.close()

    def __enter__(self) -> Sidecar:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def build_sidecar(config: WatchConfig, incidents_path: str | None = None,
                  before_publish: Callable[[Published], None] = lambda _: None,
                  after_publish: Callable[[Published], None] = lambda _: None) -> Sidecar:
    """Builds (and starts nothing of) the sidecar for `config`.

    `incidents_path` overrides the config's log (":memory:" for a one-shot look);
    `before_publish`/`after_publish`: the poller's hooks around each picture's swap.
    """
    th = config.thresholds
    # Buckets of 10 s, or finer where a drop is judged over less than 100 s (a test's
    # seconds-long thresholds): a span needs several buckets to be judged.
    coarse_every_s = min(COARSE_EVERY_S, th.throughput_drop_for_s / 10)
    history = History(max_age_s=config.poll.history_s, max_points=config.poll.max_points,
                      coarse_every_s=coarse_every_s,
                      coarse_age_s=th.throughput_lookback_s + coarse_every_s)
    store = StateStore()
    plan = with_kubernetes(with_ray_jobs(plan_targets(config, make_bindings(config)), config),
                           config)
    sharding = Sharding(config.shard) if config.shard is not None else None
    if sharding is not None:
        plan = sharded(plan, sharding)
    incidents = open_incident_log(incidents_path or config.db_path or default_db_path())
    poller: Poller | None = None

    def current_targets() -> dict[str, list[str]]:
        # Asked at each cycle, so a reloaded targets file is diagnosed from its
        # next cycle on.
        assert poller is not None
        return targets_of(poller.bindings)

    db = incidents_path or config.db_path or default_db_path()
    store_dir = config.bundle_dir or default_directory(db)
    bundles = BundleStore(store_dir, bundle_config(config), incidents, keep=config.bundle_keep)

    def ray_stacks(target: str, workers: Sequence[tuple[int, str | None]]
                   ) -> dict[str, Any] | None:
        assert poller is not None
        for b in poller.bindings:
            if isinstance(b.source, RaySource) and b.target == target:
                cluster = b.source.cluster
                return local_fallback(cluster.target, cluster.tracebacks(workers))
        return None

    keeper = FindingsKeeper(current_targets, config.thresholds, config.poll.interval_s,
                            incidents, stacks=StackTaker(config.trainer_pid, ray=ray_stacks),
                            layout=config.layout, bundles=bundles)
    poller = Poller(plan.bindings, history, store, keeper, interval_s=config.poll.interval_s,
                    timeout_s=config.poll.effective_timeout_s, reload=plan.reload,
                    config_errors=plan.errors, before_publish=before_publish,
                    after_publish=after_publish,
                    shard=(lambda: sharding.counts) if sharding is not None else None)
    maker = BundleMaker(bundles, keeper.last_cycle, lambda: list(current_targets()))
    return Sidecar(config=config, history=history, store=store, incidents=incidents,
                   keeper=keeper, poller=poller, bundles=maker, _closers=list(plan.closers))


def local_fallback(dashboard: str, taken: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The dashboard's py-spy refused (Ray 2.60 serves it only with
    RAY_DASHBOARD_ENABLE_PROFILING=1 on the head) or failed: on a cluster on this host, the
    same pid is dumped with this host's py-spy; the dashboard's answer is kept beside it."""
    host = dashboard.split("://", 1)[-1].rstrip("/")
    if not is_local(host):
        return dict(taken)
    out: dict[str, Any] = {}
    for where, doc in taken.items():
        pid = doc.get("pid")
        if "error" in doc and isinstance(pid, int) and os.path.isdir(f"/proc/{pid}"):
            out[where] = {**py_spy_dump(pid), "pid": pid, "dashboard_error": doc["error"]}
        else:
            out[where] = doc
    return out


def bundle_config(config: WatchConfig) -> dict[str, Any]:
    """The settings a bundle records beside the thresholds."""
    return {"interval_s": config.poll.interval_s, "timeout_s": config.poll.effective_timeout_s,
            "history_s": config.poll.history_s, "layout": config.layout,
            "trainer_pid": config.trainer_pid, "targets": list(config.targets),
            "targets_file": config.targets_file,
            "probes": [{"url": p.url, "target": p.target} for p in config.probes],
            "ray": [{"dashboard": r.name, "job_id": r.job_id, "results": r.results}
                    for r in config.ray],
            "python": platform.python_version()}
