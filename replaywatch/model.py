"""Domain data: what a Reverb table, a trainer probe and an actor probe look like at one instant.

Everything here is a frozen dataclass built from the stdlib only, so the pure
diagnosis core, the API edge and the tests share one vocabulary. Field names
follow Reverb's `TableInfo` proto (reverb/cc/schema.proto) and the probe's
JSON document (its keys in replaywatch/probe/protocol.py), but for a trainer's
pipeline: what it declares and what its probe read from the graph are one
`PipelineShape` each, and `ProbeSnapshot.pipeline` chooses between them.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

from replaywatch.probe.protocol import WRITER_CALLS as WRITER_CALLS  # the actor's, for labels
from replaywatch.probe.protocol import Gate, Layout
from replaywatch.ray_model import RaySnapshot

# Reverb writes `max_diff = sys.float_info.max` when inserts must never block
# (Acme's synchronous `_disable_insert_blocking` rewrite, `MinSize` limiter).
FLOAT_MAX = 1.7976931348623157e308


class SourceKind(enum.StrEnum):
    """What a source reads: a Reverb server (ServerInfo), a probe's HTTP documents, or a Ray
    cluster's RLlib job from outside (state API, metrics, result rows)."""

    REVERB = "reverb"
    PROBE = "probe"
    RAY = "ray"


# How a poll error says the server accepted the call but did not answer in time (a timeout,
# not a refused connection): its table lock held, by a checkpoint or a hung server.
NO_ANSWER = "did not answer within"

@dataclasses.dataclass(frozen=True, slots=True)
class KeyDistributionOptions:
    """A sampler or remover: one of fifo, uniform, prioritized, heap, lifo."""

    kind: str
    priority_exponent: float | None = None  # only for `prioritized`
    min_heap: bool | None = None  # only for `heap`
    is_deterministic: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class RateLimiterInfo:
    """The rate limiter's configuration and its completed call counts.

    The cursor is `inserts * samples_per_insert - samples`; a sample may proceed
    while `cursor - n >= min_diff` (once `min_size_to_sample` items are in the
    table) and an insert while `cursor + n * samples_per_insert <= max_diff`.
    """

    samples_per_insert: float
    min_diff: float
    max_diff: float
    min_size_to_sample: int
    inserts: int  # insert_stats.completed
    samples: int  # sample_stats.completed


@dataclasses.dataclass(frozen=True, slots=True)
class TableWorkerTime:
    """Cumulative milliseconds the table worker spent in each state."""

    running_ms: int = 0
    sampling_ms: int = 0
    inserting_ms: int = 0
    sleeping_ms: int = 0
    waiting_for_sampling_ms: int = 0
    waiting_for_inserts_ms: int = 0

    STATES = (
        "running",
        "sampling",
        "inserting",
        "sleeping",
        "waiting_for_sampling",
        "waiting_for_inserts",
    )

    def ms(self, state: str) -> int:
        return int(getattr(self, f"{state}_ms"))

    @property
    def total_ms(self) -> int:
        """Every state's time: the worker's uptime. Summed field by field, not through
        `ms`, since the window runs it for every point of every table on every cycle."""
        return (self.running_ms + self.sampling_ms + self.inserting_ms + self.sleeping_ms
                + self.waiting_for_sampling_ms + self.waiting_for_inserts_ms)


@dataclasses.dataclass(frozen=True, slots=True)
class TableSnapshot:
    """One table's `TableInfo` as seen by one poll at `observed_at` (epoch s)."""

    target: str
    name: str
    observed_at: float
    max_size: int
    current_size: int
    max_times_sampled: int
    num_episodes: int
    num_deleted_episodes: int
    num_unique_samples: int
    sampler: KeyDistributionOptions
    remover: KeyDistributionOptions
    rate_limiter: RateLimiterInfo
    worker_time: TableWorkerTime
    has_signature: bool = False
    # One item's bytes by the signature (uncompressed); None without a signature or with a
    # dimension of unknown size. It bounds how many items one sample response carries.
    item_bytes: int | None = None


@dataclasses.dataclass(frozen=True)
class DeclaredLayout:
    """The job's layout as the sidecar is told it (`--layout`, `--gate`, ...), kept as one
    string spec where settings and bundles keep it: "sync gate=schedule inserts_per_step=4"."""

    kind: Layout | None = None
    gate: Gate | None = None  # a synchronous loop's
    inserts_per_step: float | None = None
    first_step_at: int | None = None

    @classmethod
    def parse(cls, spec: str | None) -> DeclaredLayout | None:
        """The spec's fields; ValueError names a bad one."""
        if not spec:
            return None
        words = spec.split()
        kind = words.pop(0) if words and "=" not in words[0] else None
        if kind is not None and kind not in tuple(Layout):
            raise ValueError(f"layout {kind!r} must be one of {', '.join(Layout)}")
        found: dict[str, str] = {}
        settings = [f.name for f in dataclasses.fields(cls)][1:]  # gate, inserts_per_step, ...
        for word in words:
            key, _, value = word.partition("=")
            if key not in settings or not value:
                raise ValueError(f"{word!r} is not gate=, inserts_per_step= or first_step_at=")
            found[key] = value
        gate = found.get("gate")
        if gate is not None and gate not in tuple(Gate):
            raise ValueError(f"gate {gate!r} must be one of {', '.join(Gate)}")
        k = float(found["inserts_per_step"]) if "inserts_per_step" in found else None
        m = int(found["first_step_at"]) if "first_step_at" in found else None
        if (k is not None and not k > 0) or (m is not None and m < 0):
            raise ValueError("inserts_per_step must be > 0 and first_step_at >= 0")
        if (k is not None or m is not None) and gate != Gate.SCHEDULE:
            raise ValueError("inserts_per_step and first_step_at go with gate=schedule")
        return cls(None if kind is None else Layout(kind), None if gate is None else Gate(gate),
                   k, m)

    def spec(self) -> str:
        words: list[str] = [str(self.kind)] if self.kind else []
        words += [f"gate={self.gate}"] if self.gate else []
        words += [f"inserts_per_step={self.inserts_per_step:g}"] if self.inserts_per_step else []
        words += ([f"first_step_at={self.first_step_at}"] if self.first_step_at is not None
                  else [])
        return " ".join(words)


@dataclasses.dataclass(frozen=True, slots=True)
class PipelineShape:
    """A learner's tf.data pipeline, the budget model's inputs: as the trainer declares it
    (`TrainerProbe(batch_size=...)`), as its probe read it from the graph, or the two chosen
    into one (`ProbeSnapshot.pipeline`). None: not said."""

    batch_size: int | None = None
    num_parallel_calls: int | None = None
    num_parallel_calls_autotune: bool = False  # AUTOTUNE: judged as one thread, the most stranded
    max_in_flight: int | None = None  # max_in_flight_samples_per_worker
    workers_per_iterator: int | None = None
    iterators_per_worker: int | None = None
    batch_after_interleave: bool | None = None  # one batch after the interleave (TF-Agents)
    cycle_length: int | None = None  # Reverb datasets interleaved
    item_bytes: int | None = None
    prefetch_size: int | None = None
    table: str | None = None

    def over(self, under: PipelineShape) -> PipelineShape:
        """This shape, with `under`'s values where this one says nothing."""
        return PipelineShape(*(mine if mine is not None else theirs for mine, theirs in zip(
            (getattr(self, f) for f in _SHAPE_FIELDS),
            (getattr(under, f) for f in _SHAPE_FIELDS), strict=True)))


_SHAPE_FIELDS = tuple(f.name for f in dataclasses.fields(PipelineShape))


@dataclasses.dataclass(frozen=True, slots=True)
class NextStrides:
    """A synchronous loop's items inserted (its wrapped writer's) around its next() calls."""

    inserts_at_first: int  # when it first entered next()
    inserts_at_last: int  # when it last entered next()
    count: int  # strides seen: next() calls after the first
    least: int  # the fewest items inserted between two next() calls
    most: int  # the most


@dataclasses.dataclass(frozen=True, slots=True)
class Section:
    """A named part of a loop the code marks (`with probe.section("evaluate"):`), in which
    it makes no progress on purpose: the one it is inside now."""

    name: str
    for_s: float  # how long it has been inside, by the process's own clock
    timeout_s: float | None  # the code's own bound, if it gave one


@dataclasses.dataclass(frozen=True, slots=True)
class SectionStat:
    """A section's past: how often it ended and how long it lasted (the learned length)."""

    name: str
    count: int  # times it ended
    longest_s: float
    last_s: float


@dataclasses.dataclass(frozen=True, slots=True)
class BatchStats:
    """What the learner's batches' SampleInfo says, read by its trainer probe (cumulative
    counts, and the effective sample size over its recent batches)."""

    batches: int
    keys: int
    keys_repeated_in_batch: int
    batches_repeated: int  # batches exactly equal to one of the recent ones
    infinite_priorities: int
    effective_sample_size: float | None  # 1 / mean(probability): items the sampler draws from
    table_size: int | None
    max_importance_weight: float | None  # 1 / (table_size x the smallest probability)
    times_sampled_mean: float | None
    times_sampled_max: int | None


@dataclasses.dataclass(frozen=True, slots=True)
class PriorityUpdates:
    """A learner's `mutate_priorities` calls to one table, counted by its trainer probe."""

    table: str
    calls: int
    keys: int
    seconds_total: float
    errors: int  # calls that raised
    rejected_keys: int  # NaN or negative: Reverb refuses them, skipping the rest of the call
    infinite_keys: int  # +inf: accepted, and takes over sampling
    last_error: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class ProbeSnapshot:
    """A trainer's `GET /probe` document at `observed_at` (sidecar's clock)."""

    probe: str  # the URL it was read from
    observed_at: float
    pid: int
    name: str
    batches_retrieved: int
    blocked_in_next: bool
    blocked_since: float | None
    blocked_for_s: float  # as measured by the trainer's own clock
    blocked_seconds_total: float
    last_batch_at: float | None
    ready: bool | None
    learner_steps: int
    last_step_at: float | None
    thread_count: int
    started_at: float
    table: str | None = None
    os_threads: int | None = None  # every OS thread (tf.data, gRPC); null off Linux
    wrapped: str | None = None  # what the probe wraps: "iterator", "learner.step", or null
    # The dataset's shape and items as the trainer declares them, and as its probe read them
    # from the tf.data graph: `pipeline` chooses between the two, and every reader reads it.
    declared: PipelineShape = PipelineShape()
    read: PipelineShape | None = None  # None until read, or where the graph was not read
    layout: Layout | None = None  # declared
    writers_wrapped: int = 0  # the loop's own writers: the trainer inserts
    items_inserted: int = 0  # through the loop's own wrapped writer
    inserts_on_next_thread: bool | None = None  # the inserting thread is the one in next()
    gate: Gate | None = None  # declared
    inserts_per_step: float | None = None  # declared schedule: inserts between steps
    first_step_at: int | None = None  # declared schedule: items at the first step
    next_strides: NextStrides | None = None  # the loop's inserts between next() calls
    # The tf.data graph: None until the probe read it; else read or not and why not.
    pipeline_read: bool | None = None
    pipeline_reason: str | None = None
    section: Section | None = None  # the section the loop is inside now
    sections: tuple[SectionStat, ...] = ()  # each section that ended, by name
    priority_updates: tuple[PriorityUpdates, ...] = ()  # by table, through wrap_client
    batch_stats: BatchStats | None = None  # the batches' SampleInfo, where read

    @property
    def pipeline(self) -> PipelineShape:
        """The pipeline the diagnosis judges: what the probe read from the graph wins (a
        wrong declaration is a wrong verdict), and the declared values fill what the read
        left unknown (a batch the graph does not show, the items' size)."""
        return self.declared if self.read is None else self.read.over(self.declared)

    def priorities_to(self, table: str) -> PriorityUpdates | None:
        return next((u for u in self.priority_updates if u.table == table), None)


@dataclasses.dataclass(frozen=True, slots=True)
class WriterCallStats:
    """One writer call's totals in an actor: calls returned or raised, time inside."""

    call: str  # one of WRITER_CALLS
    count: int
    errors: int
    seconds_total: float  # includes the call in progress
    last_at: float | None


@dataclasses.dataclass(frozen=True, slots=True)
class ActorSnapshot:
    """An actor's `GET /probe` document (role "actor") at `observed_at` (sidecar's clock).

    Durations (`blocked_for_s`, `waiting_for_s`, `seconds_since_last_step`) are
    measured by the actor's own monotonic clock, so clock skew does not distort them.
    """

    probe: str  # the URL it was read from
    observed_at: float
    pid: int
    name: str
    table: str | None
    started_at: float
    steps_total: int
    last_step_at: float | None
    seconds_since_last_step: float | None  # None before the first step()
    in_call: str | None  # the writer call the actor is inside now (WRITER_CALLS)
    in_call_since: float | None
    blocked_for_s: float  # how long it has been inside `in_call`; 0 outside
    items_created_total: int
    appends_total: int
    pending_items: int  # an upper bound: created but not yet proven written
    waiting_on: str | None  # `probe.waiting(on)`: e.g. "learner"; None when not waiting
    waiting_since: float | None
    waiting_for_s: float
    waits_total: int
    waiting_seconds_total: float
    thread_count: int
    os_threads: int | None = None
    writers_wrapped: int = 0
    calls: tuple[WriterCallStats, ...] = ()
    last_error: str | None = None  # "call: Type: message" of the last failed writer call
    last_error_at: float | None = None
    max_policy_lag: int | None = None  # steps it takes without a learner step, then waits
    max_items_ahead: int | None = None  # items it may insert ahead of what was consumed
    section: Section | None = None
    sections: tuple[SectionStat, ...] = ()
    episode_appends: int | None = None  # append calls since the last end_episode
    keep_alive_refs: int | None = None  # the writers' largest num_keep_alive_refs, where seen

    @property
    def waiting(self) -> bool:
        return self.waiting_on is not None


@dataclasses.dataclass(frozen=True)
class DeclaredTable:
    """A table as the replay's code wrote it (its `reverb.Table`): what a restore replaces."""

    name: str
    max_size: int
    max_times_sampled: int
    sampler: str  # fifo, lifo, uniform, prioritized, heap
    remover: str
    samples_per_insert: float
    min_size_to_sample: int
    min_diff: float
    max_diff: float
    priority_exponent: float | None = None


@dataclasses.dataclass(frozen=True)
class CheckpointCall:
    """One `client.checkpoint()` as the replay probe saw it, on the probe's clock."""

    started_at: float
    ended_at: float | None  # None while it writes
    path: str | None  # the checkpoint written
    bytes: int | None
    error: str | None = None  # why it failed


@dataclasses.dataclass(frozen=True)
class Restore:
    """The checkpoint `reverb.Server` loaded at its start (or loads: `ended_at` None)."""

    started_at: float
    ended_at: float | None
    path: str | None  # None: nothing to load, it started empty
    bytes: int  # that checkpoint's size
    read_bytes: int | None  # what the process has read since the load began


@dataclasses.dataclass(frozen=True)
class ReplayCode:
    """What the replay process's code declared and did with its server (its ReplayProbe,
    handed the server): the tables as written, the checkpointer, checkpoint calls, restore.
    Times are the probe's clock; `probe_now` is that clock at the reading."""

    probe_now: float
    tables: tuple[DeclaredTable, ...] = ()
    checkpointer_path: str | None = None
    temporary: bool = False  # Reverb's default: a fresh temporary directory per start
    every_s: float | None = None  # the interval the code said it checkpoints at
    incomplete: tuple[str, ...] = ()  # checkpoints an earlier process never finished
    checkpoints: tuple[CheckpointCall, ...] = ()
    restore: Restore | None = None

    def on_sidecar_clock(self, t: float, observed_at: float) -> float:
        """A probe time `t` on the sidecar's clock (the reading's own offset)."""
        return t + (observed_at - self.probe_now)


@dataclasses.dataclass(frozen=True, slots=True)
class MemorySnapshot:
    """The replay process's memory and its limit at `observed_at` (sidecar's clock), read on
    its host: /proc for the process, its cgroup (v1 or v2) for the limit, else the host's."""

    target: str
    observed_at: float
    pid: int | None  # None: the process is gone (its cgroup is still read)
    rss_bytes: int | None  # resident memory (None: gone)
    limit_bytes: int  # what it may use before the kernel kills it
    limit_from: str  # "cgroup v1", "cgroup v2" or "host"
    cgroup_usage_bytes: int | None = None  # the cgroup's own count (page cache included)
    oom_kills: int | None = None  # the cgroup's OOM kills so far (None: not readable)
    found_by: str = ""  # "listening on port 8000", "--reverb-pid"
    # What counts against a cgroup's limit: its anonymous memory (page cache is reclaimed
    # before the OOM killer acts, and shared library pages are charged to whoever loaded
    # them first). None: the process's resident memory counts (a host limit).
    cgroup_anon_bytes: int | None = None
    # What the replay's code declared and did (its ReplayProbe, handed the server)
    code: ReplayCode | None = None
    # What the limit covers (process_memory.scope_of): equal for processes that share it,
    # the job's shards on one host or in one cgroup. None: not read.
    limit_scope: str | None = None

    @property
    def counted_bytes(self) -> int | None:
        """The memory judged against the limit."""
        return self.cgroup_anon_bytes if self.cgroup_anon_bytes is not None else self.rss_bytes


@dataclasses.dataclass(frozen=True)
class PollOutcome:
    """What one poll of one source produced: data, or the error that replaced it."""

    source: str
    kind: SourceKind
    started_at: float
    duration_s: float
    tables: tuple[TableSnapshot, ...] = ()
    probe: ProbeSnapshot | None = None  # a trainer probe's document
    error: str | None = None
    actor: ActorSnapshot | None = None  # an actor probe's document
    memory: MemorySnapshot | None = None  # a Reverb target's process, where it can be read
    ray: RaySnapshot | None = None  # a Ray cluster's RLlib job, as far as it could be read

    @property
    def ok(self) -> bool:
        return self.error is None


class Severity(enum.IntEnum):
    """Ordered so that `max()` picks the worst."""

    INFO = 1
    WARNING = 2
    CRITICAL = 3

    @property
    def label(self) -> str:
        return self.name.lower()


class Name(enum.StrEnum):
    """Every kind's name, as findings, alerts, runbooks and the API spell it."""

    WORKER_STARVATION = "worker_starvation"
    LEARNER_STALLED = "learner_stalled"
    SAMPLE_BLOCKED = "sample_blocked"
    INSERT_BLOCKED = "insert_blocked"
    SHARD_NOT_SAMPLED = "shard_not_sampled"
    WAITS_ON_SHARD = "waits_on_shard"
    SHARD_CONFIG_DIFFERS = "shard_config_differs"
    WRITER_STALLED = "writer_stalled"
    BATCH_EXCEEDS_HEADROOM = "batch_exceeds_headroom"
    WARMUP_IMPOSSIBLE = "warmup_impossible"
    TARGET_DOWN = "target_down"
    PROBE_DOWN = "probe_down"
    DEADLOCK_RISK = "deadlock_risk"
    SPI_DRIFT = "spi_drift"
    STALE_DATA = "stale_data"
    TOO_MANY_THREADS = "too_many_threads"
    THROUGHPUT_DROP = "throughput_drop"
    LEARNER_STARTING = "learner_starting"
    SERVER_RESTARTED = "server_restarted"
    RECONNECTING = "reconnecting"
    CHECKPOINTING = "checkpointing"
    RESTORING = "restoring"
    CHECKPOINT_FAILED = "checkpoint_failed"
    CHECKPOINT_UNRESTORABLE = "checkpoint_unrestorable"
    RESTORE_CONFIG_OVERRIDE = "restore_config_override"
    DRAINED = "drained"
    WARMUP = "warmup"
    DECLARED_PIPELINE_DIFFERS = "declared_pipeline_differs"
    IN_SECTION = "in_section"
    PIPELINE_DRAINING = "pipeline_draining"
    MEMORY_EXHAUSTION = "memory_exhaustion"
    MEMORY_LEAK = "memory_leak"
    PRIORITIES_IGNORED = "priorities_ignored"
    REPEATED_BATCHES = "repeated_batches"
    PRIORITY_COLLAPSE = "priority_collapse"
    WASTED_EXPERIENCE = "wasted_experience"
    PRIORITY_UPDATES_REJECTED = "priority_updates_rejected"
    ENV_RUNNER_STALLED = "env_runner_stalled"
    DRIVER_STALLED = "driver_stalled"
    RLLIB_ACTOR_DOWN = "rllib_actor_down"
    ENV_STEPS_DROPPED = "env_steps_dropped"


@dataclasses.dataclass(frozen=True)
class Finding:
    """A named condition with the numbers that prove it and what to change."""

    kind: Name  # serialised as its string
    severity: Severity
    target: str
    table: str  # "" for findings about a whole target or probe
    summary: str
    evidence: dict[str, Any]
    fix: str
    since: float
    last_seen: float
    resolved_at: float | None = None

    @property
    def key(self) -> tuple[str, str, str]:
        """Identity of a finding across evaluations: same kind, same place."""
        return (self.kind, self.target, self.table)

    @property
    def finding_id(self) -> str:
        return f"{self.kind}:{self.target}:{self.table}"

    def to_document(self) -> dict[str, Any]:
        """The one JSON shape of a finding (`--json`, the API, the incident log): its fields,
        its `id`, and the severity by its lowercase name."""
        return {"id": self.finding_id, "kind": self.kind, "severity": self.severity.label,
                "target": self.target, "table": self.table, "summary": self.summary,
                "evidence": dict(self.evidence), "fix": self.fix, "since": self.since,
                "last_seen": self.last_seen, "resolved_at": self.resolved_at}
