"""Domain data of a Ray/RLlib job as read from outside it: its actors, its running calls, the
RLlib counters its processes export, and the rows its training loop writes.

Frozen dataclasses from the stdlib only, like replaywatch/model.py's. Field names follow what
Ray 2.60 says (its state API's `ActorState` and `TaskState`, the `ray_rllib_*` metric names,
the keys of `algo.train()`'s result). A value the job did not say is None, never 0: RLlib
exports a metric only once its code path has run (the circular buffer's drop counter appears
with the first drop), and a hung learner's result row holds NaN where its means would be.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any


class ActorRole(enum.StrEnum):
    """What an actor does for the algorithm, told by its class name."""

    ENV_RUNNER = "env_runner"
    LEARNER = "learner"
    AGGREGATOR = "aggregator"
    OTHER = "other"


ENV_RUNNER_CLASSES = frozenset({"SingleAgentEnvRunner", "MultiAgentEnvRunner"})
# A Learner actor is Ray Train's backend-executor wrapper,
# `create_executable_class.<locals>._WrappedExecutable`: the word Learner is not in its name.
LEARNER_MARKS = ("_WrappedExecutable", "Learner")
AGGREGATOR_CLASS = "AggregatorActor"


_WORKER_ID_HEX = 56  # a WorkerID is 28 bytes; a driver's is its job id, then 0xff


def driver_worker_id(job_id: str) -> str:
    """The driver's WorkerId, the label of its series: the job id padded with `f`."""
    return job_id + "f" * (_WORKER_ID_HEX - len(job_id))


def role_of_class(class_name: str) -> ActorRole:
    """The role of an actor (or of the `rllib` tag of a metric, which names the same class)."""
    short = class_name.rsplit(".", 1)[-1]
    if short in ENV_RUNNER_CLASSES:
        return ActorRole.ENV_RUNNER
    if short == AGGREGATOR_CLASS:
        return ActorRole.AGGREGATOR
    if any(mark in class_name for mark in LEARNER_MARKS):
        return ActorRole.LEARNER
    return ActorRole.OTHER


@dataclasses.dataclass(frozen=True, slots=True)
class RayActor:
    """One actor as the state API lists it (`/api/v0/actors?detail=1`)."""

    actor_id: str
    class_name: str
    role: ActorRole
    state: str  # DEPENDENCIES_UNREADY, PENDING_CREATION, ALIVE, RESTARTING, DEAD
    num_restarts: int  # the API sends a string
    death_cause: str | None  # one line: the reason and Ray's message; None while alive
    pid: int | None  # 0 or None before the actor's process exists
    node_id: str | None
    job_id: str
    name: str = ""  # a named actor's name; RLlib names none
    worker_id: str | None = None  # its process' WorkerId, where a task of it showed it

    @property
    def alive(self) -> bool:
        return self.state == "ALIVE"


@dataclasses.dataclass(frozen=True, slots=True)
class RayTask:
    """One running actor task (`/api/v0/tasks`, state RUNNING): a call in progress, aged.

    A healthy EnvRunner's `apply` runs a second or two; a hung env's or learner's runs on,
    and its age is the one outside sign of a hung call (with the learner in the driver
    there is no task at all: the wait is the driver's own)."""

    name: str  # `SingleAgentEnvRunner.apply`, `_WrappedExecutable.apply`
    role: ActorRole  # of the class before the method name
    worker_pid: int | None
    worker_id: str | None  # the WorkerId label of the same process' metrics
    job_id: str
    running_for_s: float | None  # the observation time less start_time_ms; None unsaid
    actor_id: str | None = None
    task_id: str = ""
    attempt: int = 0  # attempt_number: an actor's creation task counts its restarts


@dataclasses.dataclass(frozen=True, slots=True)
class RllibCounters:
    """One process' RLlib series under one `rllib` tag (the emitting class), at one scrape.

    Series carry no job id, actor id or pid: only `WorkerId`, the process. Counters are the
    `_total` samples, histograms their `_count`; None where the process did not export it
    (`missing` names those its tag should have). Series of dead workers stay exported with
    their last value, so `joined` says whether this WorkerId was matched to a live worker of
    the job (a running task, a live actor's creation task, or the driver's id); False where
    the state API could not say which process it is."""

    worker_id: str
    rllib: str  # DQN, APPO, SingleAgentEnvRunner, _WrappedExecutable, LearnerGroup, ...
    role: ActorRole  # of the tag: the algorithm's own (DQN, APPO) is OTHER, and LearnerGroup,
    # the driver's handle on its learners, reads as a learner like the Learner actor's tag
    joined: bool
    env_steps_sampled: float | None = None  # ray_rllib_env_runner_num_env_steps_sampled_counter
    env_step_calls: float | None = None  # ..._env_runner_num_try_env_step_counter
    env_steps_trained: float | None = None  # ..._learner_all_modules_num_env_steps_trained_counter
    module_steps_trained: float | None = None  # ..._num_module_steps_trained_counter
    iterations: float | None = None  # ..._algorithm_step_time_count (or run_one_training_...)
    training_steps: float | None = None  # ..._algorithm_training_step_time_count
    learner_group_updates: float | None = None  # ..._learner_group_update_time_count
    learner_updates: float | None = None  # ..._learner_update_inner_update_time_count
    learner_thread_steps: float | None = None  # ..._impala_learner_thread_step_update_time_count
    circular_buffer_puts: float | None = None  # ..._utils_circular_buffer_put_time_count
    circular_buffer_gets: float | None = None  # ..._utils_circular_buffer_get_time_count
    circular_buffer_dropped: float | None = None  # ..._put_ts_dropped_counter: only once >0
    env_steps_dropped: float | None = None  # ..._impala_training_step_env_steps_dropped_counter
    input_batches: float | None = None  # ..._impala_training_step_input_batches_counter
    zero_input_batches: float | None = None  # ..._training_step_zero_input_batches_counter
    aggregator_output_batches: float | None = None  # ..._aggregator_actor_..._output_batches
    missing: tuple[str, ...] = ()  # the fields above this tag should carry and did not
    # Every kept counter, histogram _count and _sum and gauge of the series, by sample name.
    samples: tuple[tuple[str, float], ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class RayActorCount:
    """One `ray_actors` series: how many actors of a class are in a state, per job."""

    job_id: str
    class_name: str
    state: str  # ALIVE_IDLE, ALIVE_RUNNING_TASKS, ...
    count: float
    source: str = ""  # the `Source` label (executor, owner)


@dataclasses.dataclass(frozen=True, slots=True)
class ResultRow:
    """One `algo.train()` result (a line of result.json), the keys the rules read.

    Keys are RLlib's, nested in the row and written here with `/`. Some are means over the
    iteration, not points (`replay_buffer/num_env_steps_stored`, the learner thread's queue
    size and wait): a buffer's size is not in a row, only its mean. NaN (a hung learner's
    means) is read as None, like a key the row lacks. The config's values come from the
    row's `config` (Tune writes it there; the rows of a plain loop may not carry one)."""

    iteration: int | None  # training_iteration
    timestamp: float | None  # epoch s, the driver's clock
    time_this_iter_s: float | None
    time_total_s: float | None = None
    pid: int | None = None  # the driver's
    # replay_buffer/*: DQN's buffer, in the driver
    replay_env_steps_added: float | None = None
    replay_env_steps_added_lifetime: float | None = None
    replay_env_steps_sampled: float | None = None
    replay_env_steps_sampled_lifetime: float | None = None
    replay_env_steps_evicted: float | None = None
    replay_env_steps_evicted_lifetime: float | None = None
    replay_env_steps_stored: float | None = None  # mean over the iteration
    replay_episodes_stored: float | None = None  # mean
    replay_episodes_added: float | None = None
    replay_episodes_evicted: float | None = None
    replay_env_step_utilization: float | None = None
    replay_num_resamples: float | None = None
    # sampled (env_runners/) and trained (learners/__all_modules__/), per iteration and lifetime
    env_steps_sampled: float | None = None
    env_steps_sampled_lifetime: float | None = None
    env_steps_trained: float | None = None
    env_steps_trained_lifetime: float | None = None
    learner_group_ts_dropped_lifetime: float | None = None
    learner_thread_in_queue_wait_timer: float | None = None  # mean
    learner_thread_out_queue_size: float | None = None  # mean
    aggregator_env_steps_dropped_lifetime: float | None = None
    num_healthy_workers: float | None = None  # fault_tolerance/
    num_remote_worker_restarts: float | None = None
    # config/
    training_intensity: float | None = None
    train_batch_size: int | None = None
    train_batch_size_per_learner: int | None = None
    num_learners: int | None = None
    replay_capacity: int | None = None  # config/replay_buffer_config/capacity
    num_steps_sampled_before_learning_starts: int | None = None
    num_env_runners: int | None = None
    rollout_fragment_length: int | None = None  # None where "auto" (see the next field)
    rollout_fragment_length_auto: bool | None = None  # the config said "auto"
    num_envs_per_env_runner: int | None = None
    n_step: int | None = None  # DQN's "auto" fragment; None where a range (min, max)


@dataclasses.dataclass(frozen=True, slots=True)
class RllibLive:
    """What an RLlib probe in the driver (replaywatch.probe.rllib, role "rllib") read when
    polled: the replay buffer and the learner thread's queue now, in env steps. None where
    the probe said null (no buffer, no learner thread in the driver) or did not say."""

    observed_at: float  # the probe's clock
    algorithm: str | None = None
    buffer_kind: str | None = None
    capacity: int | None = None
    env_steps_stored: int | None = None
    env_steps_added: int | None = None
    env_steps_sampled: int | None = None
    episodes_stored: int | None = None
    episodes_evicted: int | None = None
    max_priority: float | None = None
    queue_depth: int | None = None
    queue_maxsize: int | None = None
    learner_thread_alive: bool | None = None
    learner_waiting: bool | None = None  # blocked on its queue's get() when polled
    learner_waited_s: float | None = None  # ... seconds so blocked, of learner_watched_s
    learner_watched_s: float | None = None
    rss_bytes: int | None = None  # the driver's resident memory, where the buffer lives
    limit_bytes: int | None = None  # what it may use: its memory cgroup's limit, else the host's
    limit_from: str | None = None  # "cgroup v1", "cgroup v2", "host"
    cgroup_usage_bytes: int | None = None  # what counts against a cgroup's limit
    cgroup_anon_bytes: int | None = None  # ... of it anonymous: what cannot be reclaimed
    oom_kills: int | None = None  # the cgroup's OOM kills so far


@dataclasses.dataclass(frozen=True, slots=True)
class RaySnapshot:
    """One poll of a Ray cluster for one RLlib job: what could be read, and what could not.

    `errors` names each part that could not be read, one line each ("state API: HTTP 401
    ..."); an empty part with no error is a part that was read and held nothing."""

    target: str  # the dashboard's address
    observed_at: float  # epoch s
    job_id: str | None  # the job watched; None: none found
    driver_pid: int | None  # from the latest result row, where there is one
    actors: tuple[RayActor, ...] = ()  # the job's, dead ones included
    tasks: tuple[RayTask, ...] = ()  # the job's running tasks
    counters: tuple[RllibCounters, ...] = ()
    actor_counts: tuple[RayActorCount, ...] = ()  # `ray_actors` of the job
    results: tuple[ResultRow, ...] = ()  # the latest rows, oldest first
    result_file: str | None = None  # the result.json read, or the RLlib probe's URL
    live: RllibLive | None = None  # the RLlib probe's reading, where --ray-results is one
    ray_version: str | None = None  # the metrics' `Version` label
    metrics_targets: int = 0  # in the service-discovery file
    metrics_targets_refused: int = 0  # nothing listened: normal for some of Ray's targets
    series_dropped: int = 0  # RLlib series of workers not live in the job (dead, other jobs)
    errors: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.errors

    def document(self) -> dict[str, Any]:
        """The snapshot as JSON-ready data for people (the API, `check --json`): each
        process' counters without their raw samples and without what it did not say, and
        the newest result row only."""
        doc = dataclasses.asdict(self)
        doc["counters"] = [{k: v for k, v in c.items() if k != "samples" and v is not None}
                           for c in doc["counters"]]
        doc["results"] = doc["results"][-1:]
        return doc
