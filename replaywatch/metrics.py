"""Prometheus metrics, built fresh at scrape time from the published state.

Declared families (`Family`) with rows computed from the latest `Published`,
not long-lived metric objects: every render reads one picture, so a table that
disappears stops being reported and a target that is down still answers with
`replaywatch_target_up 0`. Names follow
Prometheus conventions: `replaywatch_` prefix, base units (`_seconds`), `_total`
for counters, and only the bounded labels `target`, `table`, `probe`, `source`, `state`,
`kind`, `severity`, `role` (trainer, actor, replay, unknown; an RLlib actor's env_runner,
learner, aggregator, other), and `call` (the fixed set of writer calls); an RLlib job is a
`table` (`job:<id>`, metrics_ray.py). What an actor waits on is the user's free text: it goes to the
API, never into a label.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from operator import itemgetter
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import CollectorRegistry

from replaywatch.diagnosis.figures import TableFigures
from replaywatch.diagnosis.ratelimiter import TableDerived
from replaywatch.metric_families import Family, Group, Row, counter, gauge
from replaywatch.metrics_probes import actor_rows, owners, replay_health_rows, role_of, trainer_rows
from replaywatch.metrics_ray import ray_rows
from replaywatch.model import SourceKind, TableSnapshot, TableWorkerTime
from replaywatch.state import Published

TABLE = ("target", "table")
SOURCE = ("target", "source")

UP = gauge("target_up", "1 if the last poll of the target succeeded: a Reverb server's "
           "ServerInfo, or a Ray cluster's RLlib job (anything of it could be read).",
           ("target",))
PROBE_UP = gauge("probe_up", "1 if the last poll of the probe (trainer, actor or replay) "
                 "succeeded; role unknown until it first answered.", ("target", "probe", "role"))
DURATION = gauge("poll_duration_seconds", "Duration of the source's last poll.", SOURCE)
LAST = gauge("last_poll_timestamp_seconds", "When the source was last polled.", SOURCE)
POLLS = counter("polls", "Polls of the source.", SOURCE)
FAILURES = counter("poll_failures", "Failed polls of the source.", SOURCE)
LATE = counter("late_polls", "Polls skipped because the previous one still ran.", SOURCE)

# Every table has a sample in each of these: each family with what reads its value from the
# table's snapshot and its derived numbers.
TableValue = Callable[[TableSnapshot, TableDerived], float]
TABLE_GAUGES: tuple[tuple[Family, TableValue], ...] = (
    (gauge("table_size_items", "Items in the table (current_size).", TABLE),
     lambda s, d: s.current_size),
    (gauge("table_max_size_items", "The table's max_size.", TABLE), lambda s, d: s.max_size),
    (gauge("table_episodes", "Episodes referenced by items.", TABLE),
     lambda s, d: s.num_episodes),
    (gauge("table_samples_per_insert", "Configured samples_per_insert.", TABLE),
     lambda s, d: s.rate_limiter.samples_per_insert),
    (gauge("table_rate_limiter_min_diff", "Rate limiter min_diff.", TABLE),
     lambda s, d: s.rate_limiter.min_diff),
    (gauge("table_rate_limiter_max_diff",
           "Rate limiter max_diff (float max: insert blocking disabled).", TABLE),
     lambda s, d: s.rate_limiter.max_diff),
    (gauge("table_min_size_to_sample", "Rate limiter min_size_to_sample.", TABLE),
     lambda s, d: s.rate_limiter.min_size_to_sample),
    (gauge("table_rate_limiter_cursor", "inserts * samples_per_insert - samples.", TABLE),
     lambda s, d: d.cursor),
    (gauge("table_sample_headroom", "cursor - min_diff: samples the limiter still allows.",
           TABLE), lambda s, d: d.sample_headroom),
    (gauge("table_insert_headroom", "max_diff - cursor, in sample units.", TABLE),
     lambda s, d: d.insert_headroom),
    (gauge("table_can_sample", "1 if one item could be sampled now.", TABLE),
     lambda s, d: d.can_sample),
    (gauge("table_can_insert", "1 if one item could be inserted now.", TABLE),
     lambda s, d: d.can_insert),
    (gauge("table_insert_blocking_disabled", "1 if max_diff is float max (synchronous layout).",
           TABLE), lambda s, d: d.insert_blocking_disabled),
)
RATE_BASELINE = gauge(
    "table_rate_baseline_per_second",
    "throughput_drop's baseline: the median 10 s rate of the series (inserts, samples) over "
    "the look-back, before the span it judges; absent until established.",
    (*TABLE, "series"))
RATE_BAND_LOW = gauge(
    "table_rate_band_low_per_second",
    "The baseline band's low edge (at most half the baseline): below it for "
    "throughput_drop_for_s is a throughput_drop.", (*TABLE, "series"))
OBSERVED_SPI = gauge("table_observed_samples_per_insert",
                     "Samples per insert observed over the rate window.", TABLE)
TABLE_COUNTERS: tuple[tuple[Family, TableValue], ...] = (
    (counter("table_inserts", "Completed inserts (insert_stats).", TABLE),
     lambda s, d: s.rate_limiter.inserts),
    (counter("table_samples", "Completed samples (sample_stats).", TABLE),
     lambda s, d: s.rate_limiter.samples),
    (counter("table_deleted_episodes", "num_deleted_episodes.", TABLE),
     lambda s, d: s.num_deleted_episodes),
    (counter("table_unique_samples", "num_unique_samples.", TABLE),
     lambda s, d: s.num_unique_samples),
)
WORKER = counter("table_worker_seconds", "Table worker time by state (table_worker_time).",
                 (*TABLE, "state"))

MEMORY = gauge("replay_memory_bytes", "The Reverb server's memory that counts against its "
               "limit (its cgroup's anonymous memory, else its resident memory), where its "
               "host can be read.", ("target",))
MEMORY_RSS = gauge("replay_resident_bytes", "The Reverb server process's resident memory.",
                   ("target",))
MEMORY_LIMIT = gauge("replay_memory_limit_bytes", "The Reverb server's memory limit (its "
                     "cgroup's, else the host's).", ("target",))
OOM_KILLS = counter("replay_oom_kills", "OOM kills in the Reverb server's memory cgroup.",
                    ("target",))
ITEM_BYTES = gauge("replay_item_bytes", "What an item of the table costs the server's memory: "
                   "measured from the memory's growth against current_size while the table "
                   "fills (measured=\"true\"), else the signature's uncompressed size, an "
                   "upper bound (measured=\"false\").", (*TABLE, "measured"))
CONSUMED_SPI = gauge("table_consumed_samples_per_insert", "Samples the learner took (the "
                     "trainer probe's batches x batch size) per insert over the drift window: "
                     "the ratio it trains at, where the server's counts the prefetch too.", TABLE)
UNCONSUMED = gauge("table_unconsumed_samples", "Samples drawn from the table that the learner "
                   "has not taken yet (in the pipeline's buffers and partial batches).", TABLE)
PROJECTED = gauge("replay_memory_projected_bytes", "The server's memory with the table at "
                  "max_size: its memory now plus an item's bytes for each item still to come.",
                  TABLE)

# Families drawn from a table's figures alone (diagnosis/figures.py), after the other table
# families: each with what reads its rows from the record (the labels after target and
# table, and the value). A new figure's families go here.
FigureRows = Callable[[TableFigures], Iterable[tuple[tuple[str, ...], float]]]
TABLE_FIGURE_FAMILIES: list[tuple[Family, FigureRows]] = [
    (RATE_BASELINE, lambda f: [((s,), b.median) for s, b in sorted(f.baselines.items())]),
    (RATE_BAND_LOW, lambda f: [((s,), b.low) for s, b in sorted(f.baselines.items())]),
]

FINDING = ("kind", "severity", "target", "table")
ACTIVE = gauge("finding_active", "1 for each active finding.", FINDING)
SINCE = gauge("finding_since_timestamp_seconds", "Onset of each active finding.", FINDING)

# From the cycle's polls' start to its picture's publication: its diagnosis runs beside the
# next cycle's polls, so this may pass the interval where no cycle is late (late_poll_cycles).
CYCLE = gauge("poll_cycle_duration_seconds",
              "Seconds from the last published cycle's polls' start to its publication.")
LOG_OK = gauge("incident_log_healthy", "1 while the incident log accepts writes.")
DROPPED = counter("incident_log_dropped",
                  "Transitions the incident log lost because its write queue was full.")
BUNDLES = counter("bundles_written", "Incident bundles written to the bundle directory.")
BUNDLE_FAILURES = counter("bundle_failures",
                          "Bundles not written (a full disk, an unwritable directory); the log "
                          "says why.")
RULE_ERRORS = gauge("rule_errors",
                    "Rules that raised in the last poll cycle: their findings are missing "
                    "(the others still judge); /api/v1/findings and the log say which.")
LATE_CYCLES = counter("late_poll_cycles",
                      "Poll cycles that overran the interval (the next one started late).")
SHARD_INDEX = gauge("shard_index", "This sidecar's shard I of --shard I/N (absent without it).")
SHARD_COUNT = gauge("shard_count", "N of --shard I/N: the shards the targets are split over.")
TARGETS = gauge("targets",
                "Targets of the list (flags and targets file) this shard polls (state=owned) "
                "and leaves to the other shards (state=others); with --shard only. Summed "
                "over the shards, owned equals the list only when every shard runs.",
                ("state",))


def families(state: Published) -> Group:
    """Every family with its samples, in exposition order: the one source both renderers read."""
    owner = owners(state)
    yield from _source_rows(state)
    yield from _table_rows(state)
    yield from _memory_rows(state)
    yield from trainer_rows(state, owner)
    yield from replay_health_rows(state, owner)
    yield from actor_rows(state, owner)
    yield from ray_rows(state)
    active: list[Row] = []
    since: list[Row] = []
    for f in state.findings:
        labels = (f.kind, f.severity.label, f.target, f.table)
        active.append((labels, 1.0))
        since.append((labels, f.since))
    yield ACTIVE, active
    yield SINCE, since
    yield CYCLE, [((), state.cycle_duration_s)]
    yield LOG_OK, [((), 0.0 if state.incident_log_error else 1.0)]
    yield DROPPED, [((), state.incident_log_dropped)]
    yield BUNDLES, [((), state.bundles_written)]
    yield BUNDLE_FAILURES, [((), state.bundle_failures)]
    yield RULE_ERRORS, [((), float(len(state.rule_errors)))]
    yield LATE_CYCLES, [((), state.late_cycles)]
    if state.shard is not None:
        yield SHARD_INDEX, [((), float(state.shard.shard.index))]
        yield SHARD_COUNT, [((), float(state.shard.shard.count))]
        yield TARGETS, [(("owned",), float(state.shard.owned)),
                        (("others",), float(state.shard.others))]


def _memory_rows(state: Published) -> Group:
    memory = sorted(state.memory.items())
    yield MEMORY, [((t,), float(m.counted_bytes)) for t, m in memory
                   if m.counted_bytes is not None and m.pid is not None]
    yield MEMORY_RSS, [((t,), float(m.rss_bytes)) for t, m in memory if m.rss_bytes is not None]
    yield MEMORY_LIMIT, [((t,), float(m.limit_bytes)) for t, m in memory]
    yield OOM_KILLS, [((t,), float(m.oom_kills)) for t, m in memory if m.oom_kills is not None]
    tables = [(key, f.memory) for key, f in sorted(state.figures.items()) if f.memory]
    yield ITEM_BYTES, [((t, n, "true" if tm.measured else "false"), tm.bytes_per_item)
                       for (t, n), tm in tables]
    yield PROJECTED, [((t, n), tm.projected_bytes) for (t, n), tm in tables
                      if tm.projected_bytes is not None]


def _source_rows(state: Published) -> Group:
    rows: list[list[Row]] = [[] for _ in range(7)]
    up, probe_up, duration, last, polls, failures, late = rows
    for status in state.sources.values():
        if status.kind in (SourceKind.REVERB, SourceKind.RAY):
            up.append(((status.name,), 1.0 if status.up else 0.0))
        else:
            probe_up.append(((status.target, status.name, role_of(state, status.name)),
                             1.0 if status.up else 0.0))
        labels = (status.target, status.name)
        if status.last_duration_s is not None:
            duration.append((labels, status.last_duration_s))
        if status.last_poll_at is not None:
            last.append((labels, status.last_poll_at))
        polls.append((labels, status.polls_total))
        failures.append((labels, status.failures_total))
        late.append((labels, status.late_polls_total))
    yield from zip((UP, PROBE_UP, DURATION, LAST, POLLS, FAILURES, LATE), rows)


def _table_rows(state: Published) -> Group:
    # A table has its limiter's figures once a diagnosis saw it (a table of a target no
    # longer watched, kept in the history a while, has none).
    tables = [(key, snap, f.derived) for key, snap in state.tables.items()
              if (f := state.figures.get(key)) is not None and f.derived is not None]
    for family, value in TABLE_GAUGES:
        yield family, [(key, value(snap, d)) for key, snap, d in tables]
    yield OBSERVED_SPI, [(key, d.observed_samples_per_insert) for key, _, d in tables
                         if d.observed_samples_per_insert is not None]
    consumed = [(key, f.consumption) for key, f in sorted(state.figures.items())
                if f.consumption is not None]
    yield CONSUMED_SPI, [(key, c.consumed_per_insert) for key, c in consumed
                         if c.consumed_per_insert is not None]
    yield UNCONSUMED, [(key, c.unconsumed_samples) for key, c in consumed
                       if c.unconsumed_samples is not None]
    for family, value in TABLE_COUNTERS:
        yield family, [(key, value(snap, d)) for key, snap, d in tables]
    worker: list[Row] = [((*key, st), snap.worker_time.ms(st) / 1000.0)
                         for key, snap in state.tables.items() for st in TableWorkerTime.STATES]
    yield WORKER, worker
    for family, rows in TABLE_FIGURE_FAMILIES:
        yield family, [((*key, *labels), value) for key, f in state.figures.items()
                       for labels, value in rows(f)]


class ReplaywatchCollector:
    """prometheus_client's view of `families`; registered, never global.

    The reference the text renderer is tested against, and what tests read
    single values back from (`get_sample_value`).
    """

    def __init__(self, current: Callable[[], Published]):
        self._current = current

    def describe(self) -> list[Metric]:
        return []  # families vary with the watched tables; skip the dry run

    def collect(self) -> Iterator[Metric]:
        for family, rows in families(self._current()):
            cls = CounterMetricFamily if family.type == "counter" else GaugeMetricFamily
            metric = cls(family.name, family.doc, labels=list(family.labels))
            for values, value in rows:
                metric.add_metric(list(values), value)
            yield metric


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


def render_published(state: Published) -> bytes:
    """The text exposition (format 0.0.4) of `families(state)`, written straight from the rows.

    Byte-equal to `generate_latest(make_registry(...))` (tests hold it to that)
    at a fraction of the CPU: no Sample namedtuple and labels dict per sample,
    no label-name validation. This runs on the poller's thread once per cycle
    holding the GIL, and a scrape landing meanwhile waits for it.
    Each label string is built once per render and shared by every family with
    the same label names: a table's `{target=..,table=..}` serves 18 families.
    """
    out: list[str] = []
    escaped = _Memo(_escape)  # targets, tables and URLs recur in thousands of samples
    numbers = _Numbers()
    by_names: dict[tuple[str, ...], _Memo] = {}
    for family, rows in families(state):
        name = family.name + "_total" if family.type == "counter" else family.name
        doc = family.doc.replace("\\", "\\\\").replace("\n", "\\n")
        out.append(f"# HELP {name} {doc}\n# TYPE {name} {family.type}\n")
        labels = by_names.get(family.labels)
        if labels is None:
            writer = _label_writer(family.labels, escaped, by_names)
            labels = by_names[family.labels] = _Memo(writer)
        # A zero is spelled by Python like Go, sign included; it skips the memo, where
        # 0.0 and -0.0 would share one entry (equal, one hash).
        out += [f"{name}{labels[values]} {numbers[value] if value else str(float(value))}\n"
                for values, value in rows]
    return "".join(out).encode("utf-8")


class _Memo(dict):  # type: ignore[type-arg]
    """A dict that computes a missing key once; a hit costs one C-level lookup, no call."""

    def __init__(self, compute: Callable[[Any], str]):
        super().__init__()
        self._compute = compute

    def __missing__(self, key: Any) -> str:
        value = self[key] = self._compute(key)
        return value


class _Numbers(dict):  # type: ignore[type-arg]
    """Go float spelling of nonzero values, memoised: most are 1 or small counts."""

    def __missing__(self, value: float) -> str:
        text = self[value] = _go_float(float(value))
        return text


def _label_writer(names: tuple[str, ...], escaped: _Memo,
                  by_names: dict[tuple[str, ...], _Memo]) -> Callable[[tuple[str, ...]], str]:
    """`{a="..",b=".."}` for label values in `names`' order; the exposition sorts by name."""
    if not names:
        return lambda values: ""
    order = sorted(range(len(names)), key=names.__getitem__)
    if len(names) > 1 and order[0] == len(names) - 1 and names[:-1] in by_names:
        # One more label that sorts first (worker `state`, actor `call`): prepend it to the
        # string the families without it already built, 1500 times per 50x5 render.
        base, head = by_names[names[:-1]], "{" + names[-1] + '="'
        return lambda values: f'{head}{escaped[values[-1]]}",{base[values[:-1]][1:]}'
    template = "{" + ",".join(f'{names[i]}="%s"' for i in order) + "}"
    if len(names) == 1:
        return lambda values: template % escaped[values[0]]
    # itemgetter and map keep the per-miss work in C.
    sort = itemgetter(*order)
    return lambda values: template % tuple(map(escaped.__getitem__, sort(values)))


def render(registry: CollectorRegistry) -> bytes:
    """The text exposition of a registry: straight from the picture for one `make_registry` built.

    Any other registry (tests register their own collectors) is walked through
    its family objects, equal byte for byte to `generate_latest` for gauge and
    counter families without timestamps.
    """
    if isinstance(registry, _PictureRegistry):
        return render_published(registry.current())
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


class _PictureRegistry(CollectorRegistry):
    """A registry that remembers where its picture comes from, so `render` can skip it."""

    def __init__(self, current: Callable[[], Published]):
        super().__init__(auto_describe=False)
        self.current = current


def make_registry(current: Callable[[], Published]) -> CollectorRegistry:
    """A fresh registry holding only replaywatch's collector (no process globals)."""
    registry = _PictureRegistry(current)
    registry.register(ReplaywatchCollector(current))  # type: ignore[arg-type]
    return registry
