"""Frozen, validated configuration for the TD3 agent and its replay.

Three groups, each checked at construction so a bad value fails at start with
the value in the message, never minutes later inside a jitted function:

- `TD3Config`: the algorithm and its networks.
- `ReplayConfig`: the Reverb table, its rate limiter and the sampling dataset.
- `RunConfig`: the run loop (mode, budget, evaluation, addresses, stall injection).

Flags are read in one place only (`agents.run`).
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Literal

Mode = Literal["sync", "distributed"]


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


@dataclasses.dataclass(frozen=True)
class StepDelay:
    """What each environment step costs on top of the simulator's own: `base_s`, growing
    linearly to `base_s * factor` over `ramp_s` from `after_s` after the environment is made.

    A stand-in for a costly simulator and for one that slows down (the throughput a job
    loses without anything blocking: reverb#99, Mava#366), to test that replaywatch names it.
    """

    base_s: float = 0.0
    factor: float = 1.0
    after_s: float = 0.0
    ramp_s: float = 0.0
    # `FACTORx@SECONDS`: not the delay but the whole actor loop FACTOR times slower (each
    # step starts FACTOR times its mean interval of the minute before SECONDS after the last):
    # a rate that falls by FACTOR whatever else the loop costs and however busy the machine.
    paced: bool = False

    def __post_init__(self) -> None:
        if self.base_s < 0 or self.factor <= 0 or self.after_s < 0 or self.ramp_s < 0:
            raise ValueError(f"step delay ({self}) needs base_s, after_s, ramp_s >= 0 and "
                             "factor > 0")
        if self.factor != 1.0 and self.base_s == 0 and not self.paced:
            raise ValueError("a slow-down multiplies --env-step-delay-s, which is 0")

    @classmethod
    def parse(cls, base_s: float, slow_down: str | None) -> StepDelay:
        """`FACTOR@SECONDS[:RAMP]`: e.g. `10@240:90`, a delay ten times longer from 240 s,
        over 90 s; `FACTORx@SECONDS`: e.g. `2x@240`, the actor loop's rate halved from 240 s."""
        if not slow_down:
            return cls(base_s)
        try:
            factor, _, rest = slow_down.partition("@")
            after, _, ramp = rest.partition(":")
            paced = factor.endswith("x")
            if paced and ramp:
                raise ValueError("a paced slow-down has no ramp")
            return cls(base_s, float(factor.removesuffix("x")), float(after), float(ramp or 0),
                       paced)
        except ValueError as error:
            raise ValueError(f"slow-down {slow_down!r}: FACTOR@SECONDS[:RAMP] ({error})") from None

    def at(self, elapsed_s: float) -> float:
        if self.factor == 1.0 or elapsed_s <= self.after_s or self.paced:
            return self.base_s
        done = 1.0 if self.ramp_s == 0 else min(1.0, (elapsed_s - self.after_s) / self.ramp_s)
        return self.base_s * (1.0 + (self.factor - 1.0) * done)


@dataclasses.dataclass(frozen=True)
class TD3Config:
    """TD3 (Fujimoto et al. 2018) with n-step returns; DrQ-v2 style when `pixels`."""

    discount: float = 0.99
    n_step: int = 3
    learning_rate: float = 3e-4
    tau: float = 0.005  # polyak rate: target <- (1 - tau) * target + tau * online
    policy_delay: int = 2  # actor and targets move once per `policy_delay` critic steps
    target_noise: float = 0.2  # target-policy smoothing, in action units ([-1, 1])
    noise_clip: float = 0.5
    exploration_sigma: float = 0.1
    hidden_sizes: tuple[int, ...] = (256, 256)
    pixels: bool = False
    image_size: int = 64
    frame_stack: int = 3
    crop_padding: int = 4  # DrQ-v2's random shift: pad, then crop back to image_size
    encoder_channels: int = 32
    embedding_size: int = 50

    def __post_init__(self) -> None:
        _require(0.0 < self.discount <= 1.0, f"discount ({self.discount}) must be in (0, 1]")
        _require(self.n_step >= 1, f"n_step ({self.n_step}) must be >= 1")
        _require(self.learning_rate > 0, f"learning_rate ({self.learning_rate}) must be > 0")
        _require(0.0 < self.tau <= 1.0, f"tau ({self.tau}) must be in (0, 1]")
        _require(self.policy_delay >= 1, f"policy_delay ({self.policy_delay}) must be >= 1")
        for name in ("target_noise", "noise_clip", "exploration_sigma"):
            value = getattr(self, name)
            _require(value >= 0, f"{name} ({value}) must be >= 0")
        _require(
            len(self.hidden_sizes) > 0 and all(h > 0 for h in self.hidden_sizes),
            f"hidden_sizes ({self.hidden_sizes}) must be non-empty and positive",
        )
        _require(self.image_size >= 16, f"image_size ({self.image_size}) must be >= 16")
        _require(self.frame_stack >= 1, f"frame_stack ({self.frame_stack}) must be >= 1")
        _require(self.crop_padding >= 0, f"crop_padding ({self.crop_padding}) must be >= 0")


SAMPLERS = ("uniform", "prioritized")


@dataclasses.dataclass(frozen=True)
class ReplayConfig:
    """The table and the dataset that reads it, shaped like Acme's.

    The rate limiter is `SampleToInsertRatio` with
    `error_buffer = min_replay_size * samples_per_insert * tolerance`, so Reverb
    keeps `error = inserts * samples_per_insert - samples` within
    `min_replay_size * samples_per_insert +/- error_buffer`.
    """

    table: str = "priority_table"
    batch_size: int = 256
    samples_per_insert: float = 128.0  # batch 256: one learner step per 2 env steps
    tolerance: float = 0.1
    min_replay_size: int = 1000
    max_replay_size: int = 1_000_000
    # Acme's make_reverb_dataset defaults to 12; each worker batches on its own,
    # which is what starves the learner in the seed incident. 1 is the safe default.
    num_parallel_calls: int = 1
    prefetch_size: int = 4
    max_in_flight_items: int = 5  # the adder's unconfirmed inserts before flush() blocks
    # `reverb.Table.queue(table, max_replay_size)`: every item sampled once, in order (an
    # on-policy layout; the Queue limiter replaces SampleToInsertRatio). Distributed only.
    queue: bool = False
    # `prioritized`: a Prioritized(priority_exponent) sampler; the learner sends each batch's
    # |TD error| back as its items' priorities (prioritized replay, as Acme's D4PG/R2D2 do).
    sampler: str = "uniform"
    priority_exponent: float = 0.6

    def __post_init__(self) -> None:
        _require(bool(self.table), "table must be a non-empty name")
        _require(self.sampler in SAMPLERS,
                 f"sampler ({self.sampler!r}) must be one of {', '.join(SAMPLERS)}")
        _require(self.priority_exponent >= 0,
                 f"priority_exponent ({self.priority_exponent}) must be >= 0")
        _require(self.batch_size >= 1, f"batch_size ({self.batch_size}) must be >= 1")
        _require(
            self.samples_per_insert > 0,
            f"samples_per_insert ({self.samples_per_insert}) must be > 0",
        )
        _require(self.tolerance > 0, f"tolerance ({self.tolerance}) must be > 0")
        _require(
            self.min_replay_size >= 1, f"min_replay_size ({self.min_replay_size}) must be >= 1"
        )
        _require(
            self.max_replay_size >= self.min_replay_size,
            f"max_replay_size ({self.max_replay_size}) must be >= min_replay_size "
            f"({self.min_replay_size})",
        )
        _require(
            self.num_parallel_calls >= 1,
            f"num_parallel_calls ({self.num_parallel_calls}) must be >= 1",
        )
        _require(self.prefetch_size >= 0, f"prefetch_size ({self.prefetch_size}) must be >= 0")
        _require(
            self.max_in_flight_items >= 1,
            f"max_in_flight_items ({self.max_in_flight_items}) must be >= 1",
        )
        # Reverb rejects a window narrower than 2 * max(1, samples_per_insert);
        # say so here, with the numbers, instead of deep inside reverb.Table.
        _require(
            self.error_buffer >= max(1.0, self.samples_per_insert),
            f"tolerance ({self.tolerance}) gives error_buffer {self.error_buffer:g} "
            f"= min_replay_size * samples_per_insert * tolerance, which must be >= "
            f"max(1, samples_per_insert) ({max(1.0, self.samples_per_insert):g})",
        )

    @property
    def error_buffer(self) -> float:
        return self.min_replay_size * self.samples_per_insert * self.tolerance

    @property
    def max_in_flight_samples_per_worker(self) -> int:
        return 2 * self.batch_size


class StallKind(enum.Enum):
    ACTOR_EXIT = "actor-exit"  # one actor process exits (distributed)
    ACTORS_EXIT = "actors-exit"  # every actor process exits (distributed)
    LEARNER_HANG = "learner-hang"  # the learner stops consuming, as a hung pmap would


@dataclasses.dataclass(frozen=True)
class StallInjection:
    """A fault to inject `after_s` seconds into training, for testing the diagnosis."""

    kind: StallKind
    after_s: float

    def __post_init__(self) -> None:
        _require(self.after_s >= 0, f"stall time ({self.after_s}) must be >= 0")

    @classmethod
    def parse(cls, text: str) -> StallInjection:
        """`actor-exit@30`, `actors-exit@30` or `learner-hang@30` (seconds)."""
        kind, sep, seconds = text.partition("@")
        kinds = ", ".join(k.value for k in StallKind)
        _require(bool(sep), f"stall ({text!r}) must be KIND@SECONDS with KIND one of {kinds}")
        try:
            stall_kind = StallKind(kind)
        except ValueError:
            raise ValueError(f"stall kind ({kind!r}) must be one of {kinds}") from None
        try:
            after_s = float(seconds)
        except ValueError:
            raise ValueError(f"stall time ({seconds!r}) must be a number of seconds") from None
        return cls(stall_kind, after_s)


@dataclasses.dataclass(frozen=True)
class RunConfig:
    mode: Mode = "sync"
    steps: int = 30_000  # environment steps, summed over actors
    num_actors: int = 4  # distributed only
    seed: int = 0
    eval_every: int = 2_000  # environment steps between evaluations; 0 turns them off
    eval_episodes: int = 10
    log_every_s: float = 5.0
    reverb_port: int = 0  # 0: any free port
    probe_listen: str = "127.0.0.1:0"
    # A ReplayProbe in the process that runs the Reverb server (its memory and its limit, read
    # from inside: where the sidecar cannot read that process's cgroup); None: none.
    replay_probe_listen: str | None = None
    actor_update_period: int = 200  # distributed actors fetch parameters every N env steps
    replace_dead_actors_after_s: float = 10.0  # < 0: never replace a dead actor
    ray_address: str | None = None  # None: a local Ray started by ray.init()
    stall: StallInjection | None = None
    # The seed's debugging loop: read `table.info` and print the limiter's numbers
    # before every learner step (sync only). For measuring what that costs.
    seed_debug_loop: bool = False
    # An ActorProbe per actor (distributed) or on the loop (sync), on probe_listen's host.
    actor_probes: bool = True
    # Distributed: after this many environment steps without seeing the learner step, an
    # actor waits for it (a policy-lag bound, a parameter hand-off); 0: actors never wait.
    max_policy_lag: int = 0
    # Sleep this long inside the learner's first update, after its first batch: a stand-in
    # for a long first jit compile (acme#212), to test start-up awareness. 0: none.
    first_step_delay_s: float = 0.0
    # Every learner update sleeps this long after its batch: a learner whose step is slow
    # (a big network on a small host), to test the learned stall windows. 0: none.
    learner_step_delay_s: float = 0.0
    # What each environment step costs on top of Pendulum's own, and how it grows
    # (environments.StepDelay; --env-step-delay-s, --slow-down FACTOR[x]@SECONDS[:RAMP]).
    env_step_delay: StepDelay = StepDelay()
    # Checkpoint the Reverb server (`client.checkpoint()`) every this many seconds; 0: never.
    checkpoint_every_s: float = 0.0
    # Distributed: Ray custom resources that place each role on the nodes offering them.
    replay_resource: str | None = None
    learner_resource: str | None = None
    actor_resource: str | None = None

    def __post_init__(self) -> None:
        _require(
            self.mode in ("sync", "distributed"), f"mode ({self.mode!r}) must be sync|distributed"
        )
        _require(self.steps >= 1, f"steps ({self.steps}) must be >= 1")
        _require(self.num_actors >= 1, f"num_actors ({self.num_actors}) must be >= 1")
        _require(self.eval_every >= 0, f"eval_every ({self.eval_every}) must be >= 0")
        _require(self.eval_episodes >= 1, f"eval_episodes ({self.eval_episodes}) must be >= 1")
        _require(self.log_every_s > 0, f"log_every_s ({self.log_every_s}) must be > 0")
        _require(
            0 <= self.reverb_port <= 65535, f"reverb_port ({self.reverb_port}) must be in 0..65535"
        )
        _require(
            self.actor_update_period >= 1,
            f"actor_update_period ({self.actor_update_period}) must be >= 1",
        )
        _require(self.checkpoint_every_s >= 0,
                 f"checkpoint_every_s ({self.checkpoint_every_s}) must be >= 0 (0: never)")
        _require(self.learner_step_delay_s >= 0,
                 f"learner_step_delay_s ({self.learner_step_delay_s}) must be >= 0 (0: none)")
        _require(self.first_step_delay_s >= 0,
                 f"first_step_delay_s ({self.first_step_delay_s}) must be >= 0 (0: none)")
        _require(self.max_policy_lag >= 0,
                 f"max_policy_lag ({self.max_policy_lag}) must be >= 0 (0: actors never wait)")
        _require(
            self.max_policy_lag == 0 or self.mode == "distributed",
            f"max_policy_lag ({self.max_policy_lag}) needs --mode distributed: in sync mode "
            "the learner steps on the actor's own thread",
        )
        for role in ("replay", "learner", "actor"):
            resource = getattr(self, f"{role}_resource")
            if resource is not None:
                _require(self.mode == "distributed",
                         f"{role}_resource ({resource!r}) needs --mode distributed")
                _require(bool(resource.strip()),
                         f"{role}_resource ({resource!r}) must be a Ray resource name")
        if self.stall is not None and self.mode == "sync":
            _require(
                self.stall.kind is StallKind.LEARNER_HANG,
                f"stall ({self.stall.kind.value}) needs --mode distributed: in sync mode the "
                "actor is the learner's own thread",
            )
