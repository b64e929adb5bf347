"""What the budget model concludes, as data: the verdict, and which case of the model decided
it with the numbers it decided on.

`budget` computes these and never writes a sentence; `budget_words` says each case in
words. A case that qualifies another (an unknown stride, thin answers, an unknown gate)
carries the case it qualifies.
"""

from __future__ import annotations

import dataclasses
import enum

from replaywatch.probe.protocol import Gate


class Verdict(enum.StrEnum):
    """Whether the learner can hang in next(), best first."""

    SAFE = "safe"
    CAN_HANG = "can_hang"
    WILL_HANG = "will_hang"

    def rank(self) -> int:
        """0 for safe, higher for worse: verdicts are compared by it."""
        return list(Verdict).index(self)

    def worse_than(self, other: Verdict) -> bool:
        return self.rank() > other.rank()


class Later(enum.Enum):
    """What a scheduled loop's later steps find, against its first."""

    MORE = enum.auto()  # its inserts release more than its steps take
    SAME = enum.auto()  # they release exactly a batch a step
    UNKNOWN = enum.auto()  # the stride is not known


@dataclasses.dataclass(frozen=True)
class ActorsFree:
    """Free-running actors: held at max_diff, they resume as soon as the learner draws."""


@dataclasses.dataclass(frozen=True)
class ItemsAhead:
    """Actors bound to `ahead` items past what the learner consumed."""

    ahead: int
    error_buffer: float
    spi: float


@dataclasses.dataclass(frozen=True)
class LagShort:
    """A policy-lag bound whose inserts release less than the batch a step takes."""

    batch: int
    lag: int
    spi: float
    released: float


@dataclasses.dataclass(frozen=True)
class Lag:
    """A policy-lag bound: the inserts after the learner's last step are what is held."""

    lag: int
    spi: float


@dataclasses.dataclass(frozen=True)
class WarmBurst:
    """A can_sample loop sent into next() by the warm-up burst."""

    error_buffer: float
    batch: int


@dataclasses.dataclass(frozen=True)
class OneInsert:
    """A can_sample loop sent into next() by one insert's release."""

    spi: float
    error_buffer: float


@dataclasses.dataclass(frozen=True)
class ReadyOnly:
    """A can_sample loop that never holds a batch's credit: it takes ready batches only."""

    error_buffer: float
    spi: float
    batch: int


@dataclasses.dataclass(frozen=True)
class FirstStepEarly:
    """A scheduled loop that first asks below min_size_to_sample."""

    first_step_at: int
    min_size: int


@dataclasses.dataclass(frozen=True)
class FirstStepBlocked:
    """A scheduled loop whose own inserts meet max_diff before its first step."""

    first_step_at: int
    max_diff: float
    blocks_at: float


@dataclasses.dataclass(frozen=True)
class Schedule:
    """A scheduled loop's first step: its stride, when it starts, and what is released."""

    stride: float
    stride_known: bool
    first_step_at: int
    released: float
    error_buffer: float
    spi: float
    past_min_size: int  # inserts after min_size before the first step


@dataclasses.dataclass(frozen=True)
class CreditFalls:
    """Each step takes more than its inserts release: the credit falls below a batch."""

    schedule: Schedule
    batch: int
    per_step: float
    steps: int  # the step that finds less than a batch; 0: the first


@dataclasses.dataclass(frozen=True)
class SurplusGrows:
    """Each step's inserts release more than it takes, until max_diff blocks the loop."""

    schedule: Schedule
    batch: int
    per_step: float
    max_diff: float
    steps: int


@dataclasses.dataclass(frozen=True)
class ScheduleHolds:
    """A schedule whose first step decides, its later ones finding as much or more."""

    schedule: Schedule
    later: Later


@dataclasses.dataclass(frozen=True)
class StrideUnknown:
    """A scheduled reading at the one stride that runs for good, the real one unknown."""

    within: Reason
    paid: float  # batch / spi: the stride the ratio pays for


@dataclasses.dataclass(frozen=True)
class ThinSizeUnknown:
    """The items' size unknown: answers may carry less than a batch once trained."""

    within: Reason
    within_verdict: Verdict  # the warm-up reading's, which smaller items get
    thin_bytes: int
    batch: int
    workers: int


@dataclasses.dataclass(frozen=True)
class ThinAnswers:
    """Answers that carry less than a batch, dealt across several read iterators."""

    within: Reason
    cap: int
    workers: int
    batch: int


@dataclasses.dataclass(frozen=True)
class GateUnknown:
    """Both gates' readings judged: the worse given, the other said beside it."""

    worse_gate: Gate
    worse: Reason
    other_gate: Gate
    other_verdict: Verdict
    other: Reason


Reason = (ActorsFree | ItemsAhead | LagShort | Lag | WarmBurst | OneInsert | ReadyOnly
          | FirstStepEarly | FirstStepBlocked | CreditFalls | SurplusGrows | ScheduleHolds
          | StrideUnknown | ThinSizeUnknown | ThinAnswers | GateUnknown)
