"""The replay ratio an RLlib DQN-family job trains at, from its configuration alone.

RLlib's new API stack alternates two steps in `training_step` (dqn.py,
`_training_step_new_api_stack`): `store` rounds of sampling (each EnvRunner steps
`rollout_fragment_length` x `num_envs_per_env_runner` times, then the episodes are added to
the replay buffer) and `train` rounds of one `train_batch_size` batch drawn from the buffer
and learned on. The two weights come from `calculate_rr_weights`:

    natural = train_batch_size / (fragment x envs_per_runner x max(num_env_runners + 1, 1))
    w = training_intensity / natural
    (store, train) = (round(1 / w), 1) if w < 1 else (1, round(w))

`natural` counts one EnvRunner more than sample where remote ones exist (the local one,
which then does not sample), and the weights are rounded to whole rounds, so the ratio the
job trains at is

    trained / sampled = train x train_batch_size / (store x fragment x envs x max(runners, 1))

which is not `training_intensity` in general: 1 EnvRunner, batch 32, fragment 1 and
`training_intensity` 4 train at 8. Without `training_intensity` both weights are 1 and the
job trains at its natural ratio, sampling counted as it really is. The fragment length
"auto" is `n_step` for DQN (DQNConfig.get_rollout_fragment_length); for the upper bound of
a ranged n_step, `n_step[1]`.

Warm-up: learning starts once `num_env_steps_sampled_lifetime` reaches
`num_steps_sampled_before_learning_starts`, a count of steps sampled, not stored: a warm-up
above the buffer's capacity still ends, its first batches drawn from the last `capacity`
steps only.

bench/RESULTS.md ("RLlib replay ratio") holds the real runs this is checked against.
"""

from __future__ import annotations

import dataclasses
import enum
import math


class RatioVerdict(enum.StrEnum):
    """Whether the job trains at the replay ratio it asks for."""

    AS_ASKED = "as_asked"  # within the tolerance of training_intensity (or none asked)
    OFF = "off"  # RLlib's rounding and its count of samplers give another ratio


@dataclasses.dataclass(frozen=True)
class RllibReplay:
    """The settings of an RLlib DQN-family algorithm the ratio and the warm-up follow."""

    train_batch_size: int
    num_env_runners: int = 0
    num_envs_per_env_runner: int = 1
    rollout_fragment_length: int | None = None  # None: "auto", n_step for DQN
    n_step: int = 1
    training_intensity: float | None = None
    capacity: int | None = None  # the replay buffer's, in env steps
    learning_starts: int | None = None  # num_steps_sampled_before_learning_starts

    def __post_init__(self) -> None:
        for name in ("train_batch_size", "num_envs_per_env_runner", "n_step"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.num_env_runners < 0:
            raise ValueError("num_env_runners must be 0 or more")
        if self.rollout_fragment_length is not None and self.rollout_fragment_length < 1:
            raise ValueError("rollout_fragment_length must be at least 1 (or auto)")
        if self.training_intensity is not None and not self.training_intensity > 0:
            raise ValueError("training_intensity must be above 0")

    @property
    def fragment(self) -> int:
        return self.rollout_fragment_length or self.n_step

    @property
    def sampled_per_round(self) -> int:
        """Env steps one store round adds: the remote EnvRunners', or the local one's."""
        return self.fragment * self.num_envs_per_env_runner * max(self.num_env_runners, 1)

    @property
    def natural(self) -> float:
        """RLlib's natural ratio, as `calculate_rr_weights` counts it (one sampler more)."""
        return self.train_batch_size / (self.fragment * self.num_envs_per_env_runner
                                        * max(self.num_env_runners + 1, 1))


@dataclasses.dataclass(frozen=True)
class Ratio:
    """The weights RLlib will use and the ratio they train at."""

    store_rounds: int
    train_rounds: int
    trained_per_sampled: float
    asked: float | None  # training_intensity
    verdict: RatioVerdict

    @property
    def off_by(self) -> float | None:
        """trained_per_sampled / asked; None where nothing was asked."""
        return None if self.asked is None else self.trained_per_sampled / self.asked


# RLlib's weights are whole rounds: a ratio within a tenth of the asked one is as asked.
TOLERANCE = 0.1


def weights(r: RllibReplay) -> tuple[int, int]:
    """(store, train) rounds per training_step, as `calculate_rr_weights` rounds them
    (numpy's round: half to even)."""
    if not r.training_intensity:
        return 1, 1
    w = r.training_intensity / r.natural
    return (max(round(1 / w), 1), 1) if w < 1 else (1, max(round(w), 1))


def ratio(r: RllibReplay) -> Ratio:
    store, train = weights(r)
    trained = train * r.train_batch_size / (store * r.sampled_per_round)
    asked = r.training_intensity
    ok = asked is None or abs(trained / asked - 1) <= TOLERANCE
    return Ratio(store, train, trained, asked, RatioVerdict.AS_ASKED if ok else
                 RatioVerdict.OFF)


def intensity_for(r: RllibReplay, wanted: float) -> float | None:
    """A training_intensity that makes the job train at `wanted`, where whole rounds can:
    the one whose weights give the ratio nearest `wanted`, None if none is within the
    tolerance."""
    per_round = r.train_batch_size / r.sampled_per_round
    best: tuple[float, float] | None = None
    for store, train in _rounds(wanted / per_round):
        got = train * per_round / store
        if abs(got / wanted - 1) > TOLERANCE:
            continue
        # The middle of the weights' rounding interval, so RLlib picks exactly these.
        w = train if store == 1 else 1 / store
        intensity = w * r.natural
        if best is None or abs(got - wanted) < abs(best[1] - wanted):
            best = (intensity, got)
    return None if best is None else best[0]


def _rounds(w: float) -> list[tuple[int, int]]:
    if w >= 1:
        return [(1, n) for n in {max(1, math.floor(w)), max(1, math.ceil(w))}]
    return [(n, 1) for n in {max(1, math.floor(1 / w)), max(1, math.ceil(1 / w))}]


def warm_up_beyond_capacity(r: RllibReplay) -> bool:
    """Learning starts after more steps than the buffer holds: it still starts (the count
    is of steps sampled), on a buffer that kept only the last `capacity` of them."""
    return (r.capacity is not None and r.learning_starts is not None
            and r.learning_starts > r.capacity)
