"""The probe protocol: what a probe serves and the sidecar reads, declared once for both ends.

Standard library only: the probes import it inside the user's processes, the sidecar's
sources and model import it on the other end, so a key or a word of the protocol is
written in one place. Python 3.10 too: the Launchpad tier runs the probes there, and 3.10
has no `enum.StrEnum`, so the words are `str` enums that write themselves as `StrEnum`'s do.

A `GET /probe` document is one JSON object. Every role's carries `Doc`'s keys; a trainer's
adds `Trainer`'s and the declared pipeline (`Shape`'s keys at its top level, as
`TrainerProbe(...)` was given them), an actor's `Actor`'s, a replay probe's `Replay`'s.
The nested objects have their own: `Shape` (`pipeline_shape`, what the tf.data graph read),
`Pipeline` (`pipeline`), `Strides` (`next_strides`), `Priorities` (each table of
`priority_updates`), `Batches` (`batch_stats`), `SectionKeys` (`section` and each of
`sections`), `CallKeys` (each call of `calls`), `ErrorKeys` (`last_error`), and a replay's
`TableKeys` (each of `declared_tables`), `CheckpointerKeys`, `CheckpointKeys` (each of
`checkpoints`), `RestoreKeys` (`restore`). An RLlib probe's document adds `Rllib`'s: its
`row` (`ResultKeys`, as result.json writes a row), `buffer` (`BufferKeys`) and
`learner_queue` (`QueueKeys`). A key is never
renamed: old probes and bundles keep the names they were written with.
"""

from __future__ import annotations

import enum


class _Word(str, enum.Enum):  # noqa: UP042 (3.10 has no StrEnum)
    """A protocol word: equal to its string, and written as it (`str()`, f-strings, JSON)."""

    def __str__(self) -> str:
        return str.__str__(self)

    def __format__(self, spec: str) -> str:
        return str.__format__(self, spec)


class Layout(_Word):
    """Who inserts and who waits (replaywatch.diagnosis.budget explains each)."""

    SYNC = "sync"  # one loop inserts and trains, insert blocking disabled (Acme's LocalLayout)
    SYNC_RATIO = "sync-ratio"  # one loop, a finite max_diff that can hold its own insert
    ASYNC = "async"  # free-running actors, the learner apart
    ASYNC_LAG = "async-lag"  # actors held by a policy-lag bound (a finite max_diff)


class Gate(_Word):
    """When a synchronous loop calls next()."""

    CAN_SAMPLE = "can_sample"  # only while can_sample(batch) or ready() (Acme's LocalLayout)
    SCHEDULE = "schedule"  # a step every K inserts (TF-Agents' collect/train, Acme's older Agent)


class Role(_Word):
    """Which probe served a document; a document without `role` is an old trainer probe's."""

    TRAINER = "trainer"
    ACTOR = "actor"
    REPLAY = "replay"
    RLLIB = "rllib"  # an RLlib algorithm's driver (RLlibProbe): read by --ray-results URL


# The writer calls an ActorProbe times: a fixed set, so they may be metric label values.
WRITER_CALLS = ("append", "create_item", "flush", "end_episode", "close")


class Doc:
    """Keys of every role's document."""

    ROLE = "role"
    PID = "pid"
    NAME = "name"
    TABLE = "table"
    STARTED_AT = "started_at"
    NOW = "now"  # the probe's wall clock when it answered
    THREAD_COUNT = "thread_count"  # Python's threads
    OS_THREADS = "os_threads"  # /proc/self/task; null off Linux
    SECTION = "section"  # trainer and actor: the section the loop is inside now
    SECTIONS = "sections"  # ... and each one's past, by name


class Shape:
    """A tf.data pipeline's shape, the budget model's inputs: the keys of `pipeline_shape`
    (read from the graph) and, at a trainer document's top level, of what it declares."""

    BATCH_SIZE = "batch_size"
    NUM_PARALLEL_CALLS = "num_parallel_calls"
    NUM_PARALLEL_CALLS_AUTOTUNE = "num_parallel_calls_autotune"  # read only
    MAX_IN_FLIGHT = "max_in_flight"  # max_in_flight_samples_per_worker
    WORKERS_PER_ITERATOR = "workers_per_iterator"
    ITERATORS_PER_WORKER = "iterators_per_worker"
    BATCH_AFTER_INTERLEAVE = "batch_after_interleave"  # one batch after the interleave
    CYCLE_LENGTH = "cycle_length"
    ITEM_BYTES = "item_bytes"
    PREFETCH_SIZE = "prefetch_size"
    TABLE = "table"


class Trainer:
    """Keys a trainer's document adds (TrainerProbe.snapshot says what each means)."""

    LAYOUT = "layout"  # declared: a Layout
    GATE = "gate"  # declared: a Gate
    INSERTS_PER_STEP = "inserts_per_step"  # declared schedule
    FIRST_STEP_AT = "first_step_at"  # declared schedule
    BATCHES_RETRIEVED = "batches_retrieved"
    BLOCKED_IN_NEXT = "blocked_in_next"
    BLOCKED_SINCE = "blocked_since"
    BLOCKED_FOR_S = "blocked_for_s"
    BLOCKED_SECONDS_TOTAL = "blocked_seconds_total"
    LAST_BATCH_AT = "last_batch_at"
    LEARNER_STEPS = "learner_steps"
    LAST_STEP_AT = "last_step_at"
    READY = "ready"
    WRAPPED = "wrapped"
    WRITERS_WRAPPED = "writers_wrapped"
    ITEMS_INSERTED = "items_inserted"
    INSERTS_ON_NEXT_THREAD = "inserts_on_next_thread"
    PIPELINE = "pipeline"  # the graph as read: Pipeline's keys and the graph's description
    PIPELINE_SHAPE = "pipeline_shape"  # Shape's keys, read from the graph
    NEXT_STRIDES = "next_strides"
    BATCH_STATS = "batch_stats"
    PRIORITY_UPDATES = "priority_updates"  # by table


class Pipeline:
    """Keys of `pipeline` the sidecar reads: whether the graph was read, and if not why."""

    READ = "read"
    REASON = "reason"


class Strides:
    """Keys of `next_strides`, in the order the probe keeps them."""

    INSERTS_AT_FIRST = "inserts_at_first"
    INSERTS_AT_LAST = "inserts_at_last"
    COUNT = "count"
    LEAST = "least"
    MOST = "most"
    ORDER = (INSERTS_AT_FIRST, INSERTS_AT_LAST, COUNT, LEAST, MOST)


class Priorities:
    """Keys of each table's `priority_updates`, in the order the probe keeps them."""

    CALLS = "calls"
    KEYS = "keys"
    SECONDS_TOTAL = "seconds_total"
    ERRORS = "errors"
    REJECTED_KEYS = "rejected_keys"  # NaN or negative: Reverb refuses them
    INFINITE_KEYS = "infinite_keys"  # +inf: accepted, and takes over sampling
    LAST_ERROR = "last_error"
    ORDER = (CALLS, KEYS, SECONDS_TOTAL, ERRORS, REJECTED_KEYS, INFINITE_KEYS, LAST_ERROR)


class Batches:
    """Keys of `batch_stats` (replaywatch/probe/batch_stats.py)."""

    BATCHES = "batches"
    BATCHES_READ = "batches_read"
    KEYS = "keys"
    KEYS_REPEATED_IN_BATCH = "keys_repeated_in_batch"
    BATCHES_REPEATED = "batches_repeated"
    INFINITE_PRIORITIES = "infinite_priorities"
    DROPPED = "dropped"
    EFFECTIVE_SAMPLE_SIZE = "effective_sample_size"
    TABLE_SIZE = "table_size"
    MAX_IMPORTANCE_WEIGHT = "max_importance_weight"
    TIMES_SAMPLED_MEAN = "times_sampled_mean"
    TIMES_SAMPLED_MAX = "times_sampled_max"
    CPU_SECONDS = "cpu_seconds"  # the reading thread's own CPU time


class SectionKeys:
    """Keys of `section` (the one inside now) and of each section's past in `sections`."""

    NAME = "name"
    FOR_S = "for_s"
    TIMEOUT_S = "timeout_s"
    COUNT = "count"
    LONGEST_S = "longest_s"
    LAST_S = "last_s"


class Actor:
    """Keys an actor's document adds (ActorProbe.snapshot says what each means)."""

    STEPS_TOTAL = "steps_total"
    LAST_STEP_AT = "last_step_at"
    SECONDS_SINCE_LAST_STEP = "seconds_since_last_step"
    IN_CALL = "in_call"
    IN_CALL_SINCE = "in_call_since"
    BLOCKED_FOR_S = "blocked_for_s"
    ITEMS_CREATED_TOTAL = "items_created_total"
    APPENDS_TOTAL = "appends_total"
    PENDING_ITEMS = "pending_items"
    EPISODE_APPENDS = "episode_appends"
    KEEP_ALIVE_REFS = "keep_alive_refs"
    CALLS = "calls"  # by writer call: CallKeys
    LAST_ERROR = "last_error"  # ErrorKeys
    WAITING = "waiting"
    WAITING_ON = "waiting_on"
    WAITING_SINCE = "waiting_since"
    WAITING_FOR_S = "waiting_for_s"
    WAITS_TOTAL = "waits_total"
    WAITING_SECONDS_TOTAL = "waiting_seconds_total"
    WRITERS_WRAPPED = "writers_wrapped"
    MAX_POLICY_LAG = "max_policy_lag"
    MAX_ITEMS_AHEAD = "max_items_ahead"


class CallKeys:
    """Keys of each writer call's totals in an actor's `calls`."""

    COUNT = "count"
    ERRORS = "errors"
    SECONDS_TOTAL = "seconds_total"
    LAST_AT = "last_at"


class ErrorKeys:
    """Keys of an actor's `last_error`."""

    CALL = "call"
    TYPE = "type"
    MESSAGE = "message"
    AT = "at"


class Replay:
    """Keys a replay probe's document adds, bytes throughout (ReplayProbe.snapshot)."""

    RSS_BYTES = "rss_bytes"
    LIMIT_BYTES = "limit_bytes"
    LIMIT_FROM = "limit_from"  # "cgroup v1", "cgroup v2" or "host"
    CGROUP_USAGE_BYTES = "cgroup_usage_bytes"
    CGROUP_ANON_BYTES = "cgroup_anon_bytes"
    OOM_KILLS = "oom_kills"
    LIMIT_SCOPE = "limit_scope"  # what the limit covers: the same for processes sharing it
    # What its code declared and did with its server (ReplayProbe.server): null when the
    # probe was not handed the server.
    DECLARED_TABLES = "declared_tables"  # each: TableKeys, the tables as the code wrote them
    CHECKPOINTER = "checkpointer"  # CheckpointerKeys
    CHECKPOINTS = "checkpoints"  # the newest checkpoint calls, oldest first: CheckpointKeys
    RESTORE = "restore"  # RestoreKeys: the checkpoint the server loaded at its start


class TableKeys:
    """Keys of each table the replay's code declared (its `reverb.Table` as written)."""

    NAME = "name"
    MAX_SIZE = "max_size"
    MAX_TIMES_SAMPLED = "max_times_sampled"
    SAMPLER = "sampler"  # fifo, lifo, uniform, prioritized, heap
    PRIORITY_EXPONENT = "priority_exponent"  # a prioritized sampler's
    REMOVER = "remover"
    SAMPLES_PER_INSERT = "samples_per_insert"
    MIN_SIZE_TO_SAMPLE = "min_size_to_sample"
    MIN_DIFF = "min_diff"
    MAX_DIFF = "max_diff"


class CheckpointerKeys:
    """Keys of a replay's `checkpointer`."""

    PATH = "path"  # its root directory
    TEMPORARY = "temporary"  # a fresh temporary directory per process start (Reverb's default)
    EVERY_S = "every_s"  # the interval the code checkpoints at (null: not said)
    INCOMPLETE = "incomplete"  # checkpoint directories under path without their DONE file


class CheckpointKeys:
    """Keys of each checkpoint call in a replay's `checkpoints`."""

    STARTED_AT = "started_at"
    ENDED_AT = "ended_at"  # null while it runs
    PATH = "path"  # the checkpoint written (null until it ends, or if it failed)
    BYTES = "bytes"  # its files' size
    ERROR = "error"  # why it failed ("Type: message"), null if it did not


class RestoreKeys:
    """Keys of a replay's `restore`."""

    STARTED_AT = "started_at"
    ENDED_AT = "ended_at"  # null while the server loads
    PATH = "path"  # the checkpoint it loads (null: none there, it starts empty)
    BYTES = "bytes"  # that checkpoint's files' size
    READ_BYTES = "read_bytes"  # what the process has read since the load began (/proc io)


class Rllib:
    """Keys an RLlib probe's document adds (RLlibProbe.snapshot)."""

    ALGORITHM = "algorithm"  # the Algorithm's class name: DQN, APPO, ...
    ROW = "row"  # the newest `algo.train()` result, ResultKeys' subset of it; null before one
    BUFFER = "buffer"  # BufferKeys, read when asked; null: no replay buffer in the driver
    LEARNER_QUEUE = "learner_queue"  # QueueKeys; null: no learner thread in the driver
    # The driver's memory, where its replay buffer lives, and its limit, as Replay's are read.
    RSS_BYTES = "rss_bytes"
    LIMIT_BYTES = "limit_bytes"
    LIMIT_FROM = "limit_from"  # "cgroup v1", "cgroup v2" or "host"
    CGROUP_USAGE_BYTES = "cgroup_usage_bytes"
    CGROUP_ANON_BYTES = "cgroup_anon_bytes"  # what the OOM killer weighs: no page cache
    OOM_KILLS = "oom_kills"


class ResultKeys:
    """The keys of a result row that replaywatch reads, as RLlib 2.60 names them: nested
    dicts in result.json, "/"-joined here (the probe's `row` is flat)."""

    ITERATION = "training_iteration"
    TIMESTAMP = "timestamp"
    TIME_THIS_ITER_S = "time_this_iter_s"
    TIME_TOTAL_S = "time_total_s"
    PID = "pid"
    CONFIG = "config"
    REPLAY_ENV_STEPS_ADDED = "replay_buffer/num_env_steps_added"
    REPLAY_ENV_STEPS_ADDED_LIFETIME = "replay_buffer/num_env_steps_added_lifetime"
    REPLAY_ENV_STEPS_SAMPLED = "replay_buffer/num_env_steps_sampled"
    REPLAY_ENV_STEPS_SAMPLED_LIFETIME = "replay_buffer/num_env_steps_sampled_lifetime"
    REPLAY_ENV_STEPS_EVICTED = "replay_buffer/num_env_steps_evicted"
    REPLAY_ENV_STEPS_EVICTED_LIFETIME = "replay_buffer/num_env_steps_evicted_lifetime"
    REPLAY_ENV_STEPS_STORED = "replay_buffer/num_env_steps_stored"
    REPLAY_EPISODES_STORED = "replay_buffer/num_episodes_stored"
    REPLAY_EPISODES_ADDED = "replay_buffer/num_episodes_added"
    REPLAY_EPISODES_EVICTED = "replay_buffer/num_episodes_evicted"
    REPLAY_ENV_STEP_UTILIZATION = "replay_buffer/env_step_utilization"
    REPLAY_NUM_RESAMPLES = "replay_buffer/num_resamples"
    ENV_STEPS_SAMPLED = "env_runners/num_env_steps_sampled"
    ENV_STEPS_SAMPLED_LIFETIME = "env_runners/num_env_steps_sampled_lifetime"
    ENV_STEPS_TRAINED = "learners/__all_modules__/num_env_steps_trained"
    ENV_STEPS_TRAINED_LIFETIME = "learners/__all_modules__/num_env_steps_trained_lifetime"
    LEARNER_GROUP_TS_DROPPED_LIFETIME = "learner_group/learner_group_ts_dropped_lifetime"
    LEARNER_THREAD_IN_QUEUE_WAIT_TIMER = (
        "learners/__all_modules__/learner_thread_in_queue_wait_timer")
    LEARNER_THREAD_OUT_QUEUE_SIZE = "learners/__all_modules__/learner_thread_out_queue_size"
    AGGREGATOR_ENV_STEPS_DROPPED_LIFETIME = "aggregator_actors/num_env_steps_dropped_lifetime"
    NUM_HEALTHY_WORKERS = "fault_tolerance/num_healthy_workers"
    NUM_REMOTE_WORKER_RESTARTS = "fault_tolerance/num_remote_worker_restarts"


class ConfigKeys:
    """The keys of a result row's `config` that replaywatch reads (AlgorithmConfig.to_dict's
    names; the probe's `row` carries these only)."""

    TRAIN_BATCH_SIZE = "train_batch_size"
    TRAIN_BATCH_SIZE_PER_LEARNER = "train_batch_size_per_learner"
    TRAIN_BATCH_SIZE_PER_LEARNER_ATTR = "_train_batch_size_per_learner"  # to_dict's copy
    NUM_LEARNERS = "num_learners"
    REPLAY_CAPACITY = "replay_buffer_config/capacity"
    LEARNING_STARTS = "num_steps_sampled_before_learning_starts"
    NUM_ENV_RUNNERS = "num_env_runners"
    NUM_ENVS_PER_ENV_RUNNER = "num_envs_per_env_runner"
    N_STEP = "n_step"
    TRAINING_INTENSITY = "training_intensity"
    ROLLOUT_FRAGMENT_LENGTH = "rollout_fragment_length"


class BufferKeys:
    """Keys of an RLlib probe's `buffer`: the driver's replay buffer when asked, env steps."""

    KIND = "kind"  # its class: EpisodeReplayBuffer, PrioritizedEpisodeReplayBuffer, ...
    CAPACITY = "capacity"
    STORED = "env_steps_stored"
    ADDED = "env_steps_added"  # since the buffer was made
    SAMPLED = "env_steps_sampled"  # ... drawn into batches
    EPISODES_STORED = "episodes_stored"
    EPISODES_EVICTED = "episodes_evicted"
    MAX_PRIORITY = "max_priority"  # a prioritized buffer's; null otherwise


class QueueKeys:
    """Keys of an RLlib probe's `learner_queue`: the driver's learner thread (IMPALA, APPO
    with the learner in the driver) and the queue it takes its batches from."""

    DEPTH = "depth"  # batches waiting now
    MAXSIZE = "maxsize"  # learner_queue_size
    THREAD_ALIVE = "thread_alive"
    WAITING = "waiting"  # the thread is blocked on the queue's get() now
    WAITED_S = "waited_s"  # ... its time so blocked, sampled every 0.1 s since the probe began
    WATCHED_S = "watched_s"  # how long it has been sampled


# Every key class, for the test that keeps the keys out of the code that writes and reads
# them (tests/test_probe_protocol.py).
KEY_CLASSES = (Doc, Shape, Trainer, Pipeline, Strides, Priorities, Batches, SectionKeys,
               Actor, CallKeys, ErrorKeys, Replay, TableKeys, CheckpointerKeys, CheckpointKeys,
               RestoreKeys, Rllib, ResultKeys, ConfigKeys, BufferKeys, QueueKeys)


def keys() -> frozenset[str]:
    """Every key the protocol declares."""
    return frozenset(v for c in KEY_CLASSES for k, v in vars(c).items()
                     if k.isupper() and isinstance(v, str))
