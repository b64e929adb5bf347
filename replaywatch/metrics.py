"""Prometheus metrics, built fresh at scrape time from the published state.

A collector, not long-lived metric objects: every scrape renders the latest
`Published` picture, so a table that disappears stops being reported and a
target that is down still answers with `replaywatch_target_up 0`. Names follow
Prometheus conventions: `replaywatch_` prefix, base units (`_seconds`), `_total`
for counters, and only the bounded labels `target`, `table`, `probe`, `source`, `state`,
`kind`, `severity`, `role` (trainer, actor, unknown) and `call` (the fixed set of
writer calls). What an actor waits on is the user's free text: it goes to the
API, never into a label.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import CollectorRegistry

from replaywatch.metrics_actors import actor_families, role_of
from replaywatch.model import TableWorkerTime
from replaywatch.state import Published

TABLE_LABELS = ["target", "table"]
PROBE_LABELS = ["target", "probe"]
FINDING_LABELS = ["kind", "severity", "target", "table"]


def _gauge(name: str, doc: str, labels: list[str], unit: str = "") -> GaugeMetricFamily:
    return GaugeMetricFamily(f"replaywatch_{name}", doc, labels=labels, unit=unit)


def _counter(name: str, doc: str, labels: list[str]) -> CounterMetricFamily:
    return CounterMetricFamily(f"replaywatch_{name}", doc, labels=labels)


class ReplaywatchCollector:
    """Renders one `Published` into metric families; registered, never global."""

    def __init__(self, current: Callable[[], Published]):
        self._current = current

    def describe(self) -> list[Metric]:
        return []  # families vary with the watched tables; skip the dry run

    def collect(self) -> Iterator[Metric]:
        state = self._current()
        yield from self._sources(state)
        yield from self._tables(state)
        yield from self._probes(state)
        yield from actor_families(state)
        yield from self._findings(state)
        cycle = _gauge("poll_cycle_duration_seconds", "Duration of the last poll cycle.", [])
        cycle.add_metric([], state.cycle_duration_s)
        yield cycle
        log_ok = _gauge("incident_log_healthy", "1 while the incident log accepts writes.", [])
        log_ok.add_metric([], 0.0 if state.incident_log_error else 1.0)
        yield log_ok
        dropped = _counter("incident_log_dropped",
                           "Transitions the incident log lost because its write queue was full.",
                           [])
        dropped.add_metric([], state.incident_log_dropped)
        yield dropped
        late = _counter("late_poll_cycles",
                        "Poll cycles that overran the interval (the next one started late).", [])
        late.add_metric([], state.late_cycles)
        yield late

    def _sources(self, state: Published) -> Iterator[Metric]:
        up = _gauge("target_up", "1 if the last ServerInfo poll of the target succeeded.",
                    ["target"])
        probe_up = _gauge("probe_up", "1 if the last poll of the probe (trainer or actor) "
                          "succeeded; role unknown until it first answered.",
                          PROBE_LABELS + ["role"])
        duration = _gauge("poll_duration_seconds", "Duration of the source's last poll.",
                          ["target", "source"])
        last = _gauge("last_poll_timestamp_seconds", "When the source was last polled.",
                      ["target", "source"])
        polls = _counter("polls", "Polls of the source.", ["target", "source"])
        failures = _counter("poll_failures", "Failed polls of the source.", ["target", "source"])
        late = _counter("late_polls", "Polls skipped because the previous one still ran.",
                        ["target", "source"])
        for status in state.sources.values():
            if status.kind == "reverb":
                up.add_metric([status.name], 1.0 if status.up else 0.0)
            else:
                probe_up.add_metric([status.target, status.name, role_of(state, status.name)],
                                    1.0 if status.up else 0.0)
            labels = [status.target, status.name]
            if status.last_duration_s is not None:
                duration.add_metric(labels, status.last_duration_s)
            if status.last_poll_at is not None:
                last.add_metric(labels, status.last_poll_at)
            polls.add_metric(labels, status.polls_total)
            failures.add_metric(labels, status.failures_total)
            late.add_metric(labels, status.late_polls_total)
        yield from (up, probe_up, duration, last, polls, failures, late)

    def _tables(self, state: Published) -> Iterator[Metric]:
        g = {
            "size": _gauge("table_size_items", "Items in the table (current_size).", TABLE_LABELS),
            "max_size": _gauge("table_max_size_items", "The table's max_size.", TABLE_LABELS),
            "episodes": _gauge("table_episodes", "Episodes referenced by items.", TABLE_LABELS),
            "spi": _gauge("table_samples_per_insert", "Configured samples_per_insert.",
                          TABLE_LABELS),
            "min_diff": _gauge("table_rate_limiter_min_diff", "Rate limiter min_diff.",
                               TABLE_LABELS),
            "max_diff": _gauge("table_rate_limiter_max_diff",
                               "Rate limiter max_diff (float max: insert blocking disabled).",
                               TABLE_LABELS),
            "min_size": _gauge("table_min_size_to_sample", "Rate limiter min_size_to_sample.",
                               TABLE_LABELS),
            "cursor": _gauge("table_rate_limiter_cursor",
                             "inserts * samples_per_insert - samples.", TABLE_LABELS),
            "sample_headroom": _gauge("table_sample_headroom",
                                      "cursor - min_diff: samples the limiter still allows.",
                                      TABLE_LABELS),
            "insert_headroom": _gauge("table_insert_headroom",
                                      "max_diff - cursor, in sample units.", TABLE_LABELS),
            "can_sample": _gauge("table_can_sample", "1 if one item could be sampled now.",
                                 TABLE_LABELS),
            "can_insert": _gauge("table_can_insert", "1 if one item could be inserted now.",
                                 TABLE_LABELS),
            "sync": _gauge("table_insert_blocking_disabled",
                           "1 if max_diff is float max (synchronous layout).", TABLE_LABELS),
            "observed_spi": _gauge("table_observed_samples_per_insert",
                                   "Samples per insert observed over the rate window.",
                                   TABLE_LABELS),
        }
        c = {
            "inserts": _counter("table_inserts", "Completed inserts (insert_stats).",
                                TABLE_LABELS),
            "samples": _counter("table_samples", "Completed samples (sample_stats).",
                                TABLE_LABELS),
            "deleted": _counter("table_deleted_episodes", "num_deleted_episodes.", TABLE_LABELS),
            "unique": _counter("table_unique_samples", "num_unique_samples.", TABLE_LABELS),
        }
        worker = CounterMetricFamily("replaywatch_table_worker_seconds",
                                     "Table worker time by state (table_worker_time).",
                                     labels=TABLE_LABELS + ["state"])
        for key, snap in state.tables.items():
            labels = list(key)
            d = state.derived[key]
            rl = snap.rate_limiter
            for name, value in (
                ("size", snap.current_size), ("max_size", snap.max_size),
                ("episodes", snap.num_episodes), ("spi", rl.samples_per_insert),
                ("min_diff", rl.min_diff), ("max_diff", rl.max_diff),
                ("min_size", rl.min_size_to_sample), ("cursor", d.cursor),
                ("sample_headroom", d.sample_headroom), ("insert_headroom", d.insert_headroom),
                ("can_sample", d.can_sample), ("can_insert", d.can_insert),
                ("sync", d.insert_blocking_disabled),
            ):
                g[name].add_metric(labels, float(value))
            if d.observed_samples_per_insert is not None:
                g["observed_spi"].add_metric(labels, d.observed_samples_per_insert)
            c["inserts"].add_metric(labels, rl.inserts)
            c["samples"].add_metric(labels, rl.samples)
            c["deleted"].add_metric(labels, snap.num_deleted_episodes)
            c["unique"].add_metric(labels, snap.num_unique_samples)
            for st in TableWorkerTime.STATES:
                worker.add_metric(labels + [st], snap.worker_time.ms(st) / 1000.0)
        yield from g.values()
        yield from c.values()
        yield worker

    def _probes(self, state: Published) -> Iterator[Metric]:
        batches = _counter("probe_batches", "Batches the learner took from its iterator.",
                           PROBE_LABELS)
        steps = _counter("probe_learner_steps", "Learner steps reported by the probe.",
                         PROBE_LABELS)
        blocked_total = _counter("probe_next_blocked_seconds",
                                 "Time the learner spent blocked in next().", PROBE_LABELS)
        blocked = _gauge("probe_blocked_in_next", "1 while the learner is blocked in next().",
                         PROBE_LABELS)
        blocked_for = _gauge("probe_blocked_duration_seconds",
                             "How long the current next() has been blocked.", PROBE_LABELS)
        ready = _gauge("probe_iterator_ready", "1 if the iterator reports ready().",
                       PROBE_LABELS)
        threads = _gauge("probe_threads", "Threads in the trainer process.", PROBE_LABELS)
        batch = _gauge("probe_batch_size", "The learner's batch size.", PROBE_LABELS)
        workers = _gauge("probe_num_parallel_calls", "Parallel sampling workers.", PROBE_LABELS)
        owner = {s.name: s.target for s in state.sources.values()}
        for url, p in state.probes.items():
            labels = [owner.get(url, ""), url]
            batches.add_metric(labels, p.batches_retrieved)
            steps.add_metric(labels, p.learner_steps)
            blocked_total.add_metric(labels, p.blocked_seconds_total)
            blocked.add_metric(labels, 1.0 if p.blocked_in_next else 0.0)
            blocked_for.add_metric(labels, p.blocked_for_s)
            if p.ready is not None:
                ready.add_metric(labels, 1.0 if p.ready else 0.0)
            threads.add_metric(labels, p.thread_count)
            if p.batch_size is not None:
                batch.add_metric(labels, p.batch_size)
            if p.num_parallel_calls is not None:
                workers.add_metric(labels, p.num_parallel_calls)
        yield from (batches, steps, blocked_total, blocked, blocked_for, ready, threads, batch,
                    workers)

    def _findings(self, state: Published) -> Iterator[Metric]:
        active = _gauge("finding_active", "1 for each active finding.", FINDING_LABELS)
        since = _gauge("finding_since_timestamp_seconds", "Onset of each active finding.",
                       FINDING_LABELS)
        for f in state.findings:
            labels = [f.kind, f.severity.label, f.target, f.table]
            active.add_metric(labels, 1.0)
            since.add_metric(labels, f.since)
        yield active
        yield since


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _go_float(value: float) -> str:
    """Prometheus' float spelling (client_python's floatToGoString), fast path first."""
    if value != value:
        return "NaN"
    if value in (math.inf, -math.inf):
        return "+Inf" if value > 0 else "-Inf"
    text = repr(value)
    dot = text.find(".")
    if value > 0 and dot > 6:  # Go switches to exponents sooner than Python
        mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1:]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return text


def render(registry: CollectorRegistry) -> bytes:
    """The text exposition (format 0.0.4) of our gauge and counter families.

    Equal, byte for byte, to prometheus_client's `generate_latest` for the
    families this module builds (a test holds it to that), at a fifth of the
    cost: `generate_latest` re-validates every label name of every sample,
    which for 50 targets x 5 tables took 77 ms per scrape on our CI machine.
    Our label names are constants, so only the values need escaping, and a
    table's label string is built once per scrape and reused by every family.
    """
    out: list[str] = []
    labels_cache: dict[tuple[tuple[str, str], ...], str] = {}
    for family in registry.collect():
        name = family.name + "_total" if family.type == "counter" else family.name
        doc = family.documentation.replace("\\", "\\\\").replace("\n", "\\n")
        out.append(f"# HELP {name} {doc}\n# TYPE {name} {family.type}\n")
        for sample in family.samples:
            # A family's label dicts share one key order, so the unsorted items are a
            # good cache key; sorting is paid once per distinct label set.
            key = tuple(sample.labels.items())
            labels = labels_cache.get(key)
            if labels is None:
                inner = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(key))
                labels = labels_cache[key] = "{" + inner + "}" if inner else ""
            out.append(f"{sample.name}{labels} {_go_float(float(sample.value))}\n")
    return "".join(out).encode("utf-8")


def make_registry(current: Callable[[], Published]) -> CollectorRegistry:
    """A fresh registry holding only replaywatch's collector (no process globals)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ReplaywatchCollector(current))  # type: ignore[arg-type]
    return registry
