"""The fixes the budget model proves: for each knob, the smallest change it calls `safe`.

Every search asks `budget.predict` (docs/predict.md has the arithmetic), so a fix is
safe under the same readings the verdict was: a loop whose gate is unknown gets only fixes
that hold whether it waits on can_sample or steps on a schedule. The rules ask again on
every poll while a finding stays open, so the answer is kept (the arguments are frozen).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import math
from collections.abc import Callable
from typing import Any

from replaywatch.diagnosis.budget import (
    FIRST_REQUEST,
    Dataset,
    JobLayout,
    Limiter,
    inserts_before_blocking,
    predict,
    steady_race,
)
from replaywatch.diagnosis.budget_reasons import Verdict
from replaywatch.probe.protocol import Gate
from replaywatch.probe.protocol import Layout as Kind

# Fixes are searched up to these values; past them a knob is no fix worth printing.
MAX_ERROR_BUFFER = 10**9
MAX_POLICY_LAG = 10**6


class Knob(enum.StrEnum):
    """What a fix changes, by the name the job sets it by (Reverb, tf.data, Acme)."""

    NUM_PARALLEL_CALLS = "num_parallel_calls"  # sampling workers, or interleave threads
    CYCLE_LENGTH = "cycle_length"  # Reverb datasets interleaved (TF-Agents)
    ERROR_BUFFER = "error_buffer"
    BATCH_SIZE = "batch_size"
    MAX_POLICY_LAG = "max_policy_lag"
    MAX_ITEMS_AHEAD = "max_items_ahead"
    FIRST_STEP_AT = "first_step_at"
    INSERTS_PER_STEP = "inserts_per_step"


class Change(enum.Enum):
    """Which change of its knob a fix makes; `Fix.cost` says what each costs."""

    ONE_WORKER = enum.auto()  # one sampling worker, with what it still needs beside it
    FEWER_WORKERS = enum.auto()
    MORE_THREADS = enum.auto()  # after the interleave: a thread for every sampler
    FEWER_SAMPLERS = enum.auto()
    MORE_BUFFER = enum.auto()
    SMALLER_BATCH = enum.auto()
    LONGER_LAG = enum.auto()
    MORE_AHEAD = enum.auto()
    LATER_FIRST_STEP = enum.auto()
    PAID_STRIDE = enum.auto()  # a stride nobody said, set to what the ratio pays for
    LOWER_RATIO = enum.auto()  # a scheduled loop stepping less often
    RATIO_STEPS = enum.auto()  # a scheduled loop stepping as often as its ratio pays for


@dataclasses.dataclass(frozen=True)
class Fix:
    """One change the model calls safe, with the numbers its cost is said by."""

    knob: Knob
    value: int
    was: float | int | None
    change: Change
    # A second knob that must change with this one: no single knob suffices.
    together: Fix | None = None
    tolerance: float | None = None  # error_buffer: Acme's tolerance rate, at this value
    hangs_below: tuple[int, ...] = ()  # batch_size: smaller sizes that can hang, largest first
    # A gate nobody said: the inserts between steps the fix holds at, if the loop is scheduled
    # (at least that many where insert blocking is disabled).
    stride: float | None = None
    stride_at_least: bool = False

    @property
    def cost(self) -> str:
        """What the change costs the job, in words."""
        return _cost(self)

    def document(self) -> dict[str, object]:
        doc: dict[str, object] = {"knob": self.knob.value, "value": self.value, "was": self.was,
                                  "cost": self.cost}
        if self.together is not None:
            doc["together_with"] = self.together.document()
        return doc

    def text(self) -> str:
        alone = f"{self.knob}={self.value} (now {_num(self.was)}; {self.cost})"
        return alone if self.together is None else f"{alone} together with {self.together.text()}"


# The rules ask again on every poll while a finding stays open, and a search tries up to a
# batch size of configurations; the arguments are frozen, so the answer is kept.
@functools.lru_cache(maxsize=1024)
def fixes(lim: Limiter, ds: Dataset, layout: JobLayout) -> tuple[Fix, ...]:
    """For each knob, the smallest change the model calls safe (never the current value).
    Empty when the configuration is safe already.

    One knob suffices but in two cases: error_buffer raises what is released without bound
    in the synchronous layouts, and a longer lag under a lag bound (where error_buffer never
    helps). The first is a race of thin answers, which only one worker removes, where one
    worker still has unread iterators (Acme's repeat-interleave) that warm-up can strand:
    then the pair, one worker together with the least error_buffer safe for it. The second
    is a scheduled loop whose steps take more than its inserts release and whose first step
    finds less than it can strand: no error_buffer outlasts the fall, and a schedule that
    pays for its steps still starts short, so the pair is that schedule together with the
    least error_buffer safe for it.
    """
    if predict(lim, ds, layout).verdict == Verdict.SAFE:
        return ()
    if _schedule_reading(layout) and not layout.stride_known:
        return _set_stride(lim, ds, layout)
    found = _found(lim, ds, layout)
    if (layout.synchronous and layout.gate is None and layout.kind != Kind.SYNC_RATIO
            and layout.inserts_per_step is None):
        # The scheduled reading took B / spi inserts a step, a stride nobody said: what the
        # fix rests on is said with it (with insert blocking disabled it holds at any larger
        # stride, JobLayout.for_fixes).
        return tuple(dataclasses.replace(f, stride=_paid(lim, ds, f),
                                         stride_at_least=lim.insert_blocking_disabled)
                     for f in found)
    return found


def _paid(lim: Limiter, ds: Dataset, fix: Fix) -> float:
    """The inserts a step the fixed loop's ratio pays for: B / spi, with the fix's B."""
    batch = ds.batch_size
    part: Fix | None = fix
    while part is not None:
        batch = part.value if part.knob == Knob.BATCH_SIZE else batch
        part = part.together
    return batch / lim.samples_per_insert


def _found(lim: Limiter, ds: Dataset, layout: JobLayout) -> tuple[Fix, ...]:
    if steady_race(ds, layout):
        # No error_buffer or batch size removes a race of thin answers (bench/RESULTS.md
        # has the runs); one read iterator takes every answer.
        one = _fewer_workers(lim, ds, layout)
        if one is not None:
            return (one,)
        single = dataclasses.replace(ds, workers=1)
        more = _more_buffer(lim, single, layout)
        if more is None:
            return ()
        return (Fix(Knob.NUM_PARALLEL_CALLS, 1, ds.workers, Change.ONE_WORKER, together=more),)
    found = tuple(f for f in (search(lim, ds, layout) for search in _SEARCHES)
                  if f is not None)
    pair = _paid_schedule(lim, ds, layout)
    if pair is not None and not any(f.knob == Knob.INSERTS_PER_STEP for f in found):
        found += (pair,)
    return found


def _set_stride(lim: Limiter, ds: Dataset, layout: JobLayout) -> tuple[Fix, ...]:
    """K unknown: every other knob's safety turns on it, so each fix sets it first, to what
    the ratio pays for (budget's docstring), together with what that schedule still needs."""
    paid = math.ceil(ds.batch_size / lim.samples_per_insert)
    scheduled = dataclasses.replace(layout, inserts_per_step=paid, stride_known=True)
    if _safe(lim, ds, scheduled):
        return (Fix(Knob.INSERTS_PER_STEP, paid, None, Change.PAID_STRIDE),)
    # A batch fix would move the schedule the ratio pays for: not one to pair with K.
    return tuple(Fix(Knob.INSERTS_PER_STEP, paid, None, Change.PAID_STRIDE, together=f)
                 for f in fixes(lim, ds, scheduled)
                 if f.knob not in (Knob.BATCH_SIZE, Knob.INSERTS_PER_STEP))


def _paid_schedule(lim: Limiter, ds: Dataset, layout: JobLayout) -> Fix | None:
    """The pair for a scheduled loop that runs its credit down (fixes' docstring)."""
    if not _schedule_reading(layout):
        return None
    current = layout.inserts_per_step or ds.batch_size / lim.samples_per_insert
    paid = math.ceil(ds.batch_size / lim.samples_per_insert)
    if current >= paid:
        return None
    scheduled = dataclasses.replace(layout, inserts_per_step=paid)
    more = _more_buffer(lim, ds, scheduled)
    if more is None:
        return None
    return Fix(Knob.INSERTS_PER_STEP, paid, current, Change.LOWER_RATIO, together=more)


def _safe(lim: Limiter, ds: Dataset, layout: JobLayout) -> bool:
    return predict(lim, ds, layout).verdict == Verdict.SAFE


def _fewer_workers(lim: Limiter, ds: Dataset, layout: JobLayout) -> Fix | None:
    if ds.after_interleave:
        return None  # fewer threads read fewer of the samplers: never safer
    return _largest_smaller(lim, ds, layout, "workers", Knob.NUM_PARALLEL_CALLS,
                            Change.FEWER_WORKERS)


def _largest_smaller(lim: Limiter, ds: Dataset, layout: JobLayout, field: str, knob: Knob,
                     change: Change) -> Fix | None:
    """The largest value of a dataset field below its current one that the model calls safe."""
    current = getattr(ds, field)
    for value in range(current - 1, 0, -1):
        changed: dict[str, Any] = {field: value}
        if _safe(lim, dataclasses.replace(ds, **changed), layout):
            return Fix(knob, value, current, change)
    return None


def _more_buffer(lim: Limiter, ds: Dataset, layout: JobLayout) -> Fix | None:
    e = lim.error_buffer
    value = _least(lambda v: _safe_from(lim, ds, layout, v), math.floor(e) + 1,
                   MAX_ERROR_BUFFER)
    if value is None:
        return None
    offset = lim.samples_per_insert * lim.min_size_to_sample
    return Fix(Knob.ERROR_BUFFER, value, e, Change.MORE_BUFFER,
               tolerance=value / offset if offset > 0 else None)


def _safe_from(lim: Limiter, ds: Dataset, layout: JobLayout, value: int) -> bool:
    """Every error_buffer from `value` on is safe, not `value` alone.

    A user rounds the number we print up, so that must hold too. Safety is not monotone in
    error_buffer in two places only. The granularity is a gcd with it: 28 may be safe (g 4)
    and 29 not (g 1); but every other factor of g divides FIRST_REQUEST, so g repeats every
    FIRST_REQUEST values, while what is released only grows with error_buffer. And a `sync`
    loop's release steps down at a batch (e + spi below it, e from it). So FIRST_REQUEST
    values from `value`, and as many from the batch size when that lies above, decide it.
    """
    starts = [value] + ([ds.batch_size] if ds.batch_size > value else [])
    return all(_safe(lim.with_error_buffer(v), ds, layout)
               for start in starts for v in range(start, start + FIRST_REQUEST))


def _smaller_batch(lim: Limiter, ds: Dataset, layout: JobLayout) -> Fix | None:
    fix = _largest_smaller(lim, ds, layout, "batch_size", Knob.BATCH_SIZE,
                           Change.SMALLER_BATCH)
    if fix is None:
        return None
    below = unsafe_batches_below(lim, ds, layout, fix.value)
    if not below:
        return fix
    # Users round a batch down to a power of two, and smaller is not always safer: the
    # branch a sync loop's release takes turns on error_buffer and spi against the batch,
    # and the granularity on its gcd. Only the warning is said, not the sizes that hold:
    # the printed value is the one the fixes grid checks (make bench-grid-fixes).
    return dataclasses.replace(fix, hangs_below=tuple(below))


def unsafe_batches_below(lim: Limiter, ds: Dataset, layout: JobLayout, value: int) -> list[int]:
    """The batch sizes below `value` that the model does not call safe, largest first."""
    return [b for b in range(value - 1, 0, -1)
            if not _safe(lim, dataclasses.replace(ds, batch_size=b), layout)]


def _spans(values: list[int], most: int = 3) -> str:
    """Descending integers as runs, the first `most` of them: [55, 54, 53, 40, 39] ->
    '53-55, 39-40'."""
    runs: list[list[int]] = []
    for v in values:
        if runs and runs[-1][0] == v + 1:
            runs[-1][0] = v
        else:
            runs.append([v, v])
    text = ", ".join(f"{lo}-{hi}" if lo < hi else f"{lo}" for lo, hi in runs[:most])
    return text + (", ..." if len(runs) > most else "")


def _more_readers(lim: Limiter, ds: Dataset, layout: JobLayout) -> Fix | None:
    """After the interleave: as many threads as samplers leave none unread."""
    if not ds.after_interleave or ds.workers >= ds.samplers:
        return None
    value = next((p for p in range(ds.workers + 1, ds.samplers + 1)
                  if _safe(lim, dataclasses.replace(ds, workers=p), layout)), None)
    return None if value is None else Fix(Knob.NUM_PARALLEL_CALLS, value, ds.workers,
                                          Change.MORE_THREADS)


def _fewer_samplers(lim: Limiter, ds: Dataset, layout: JobLayout) -> Fix | None:
    """After the interleave: fewer Reverb datasets leave fewer unread (TF-Agents'
    max_cycle_length)."""
    if not ds.after_interleave:
        return None
    current = ds.samplers
    # An in-flight the job did not set follows the cycle, as TF-Agents' 3 x B / cycle does.
    for value in range(current - 1, 0, -1):
        if _safe(lim, dataclasses.replace(ds, cycle_length=value), layout):
            return Fix(Knob.CYCLE_LENGTH, value, current, Change.FEWER_SAMPLERS)
    return None


def _schedule_reading(layout: JobLayout) -> bool:
    return layout.synchronous and layout.loop_gate in (Gate.SCHEDULE, None)


def _later_first_step(lim: Limiter, ds: Dataset, layout: JobLayout) -> Fix | None:
    """A scheduled loop that starts later has released more when it first asks."""
    if not _schedule_reading(layout):
        return None
    current = (lim.min_size_to_sample if layout.first_step_at is None
               else layout.first_step_at)
    # Safe from some m on, up to where the loop's own inserts before it meet max_diff.
    high = min(current + MAX_POLICY_LAG, inserts_before_blocking(lim))
    value = _least(lambda m: _safe(lim, ds, dataclasses.replace(layout, first_step_at=m)),
                   current + 1, int(high))
    return None if value is None else Fix(Knob.FIRST_STEP_AT, value, current,
                                          Change.LATER_FIRST_STEP)


def _schedule_inserts(lim: Limiter, ds: Dataset, layout: JobLayout) -> Fix | None:
    """A scheduled loop whose steps take more than its inserts release steps less often; one
    whose inserts release more than its steps take, against a finite max_diff, steps as
    often as its ratio says (module docstring)."""
    if not _schedule_reading(layout):
        return None
    current = layout.inserts_per_step or ds.batch_size / lim.samples_per_insert

    def safe_at(k: float) -> bool:
        return _safe(lim, ds, dataclasses.replace(layout, inserts_per_step=k))

    value: int | None
    if current * lim.samples_per_insert > ds.batch_size:
        # Only the schedule the ratio pays for exactly: any other surplus piles up.
        matched = ds.batch_size / lim.samples_per_insert
        value = (int(matched) if float(matched).is_integer() and matched >= 1
                 and safe_at(matched) else None)
    else:
        value = _least(safe_at, math.floor(current) + 1, MAX_POLICY_LAG)
    return None if value is None else Fix(
        Knob.INSERTS_PER_STEP, value, current,
        Change.LOWER_RATIO if value > current else Change.RATIO_STEPS)


def _more_items_ahead(lim: Limiter, ds: Dataset, layout: JobLayout) -> Fix | None:
    if layout.kind != Kind.ASYNC_LAG or layout.max_items_ahead is None:
        return None
    value = _least(lambda n: _safe(lim, ds, dataclasses.replace(layout, max_items_ahead=n)),
                   layout.max_items_ahead + 1, MAX_POLICY_LAG)
    return None if value is None else Fix(Knob.MAX_ITEMS_AHEAD, value, layout.max_items_ahead,
                                          Change.MORE_AHEAD)


def _longer_lag(lim: Limiter, ds: Dataset, layout: JobLayout) -> Fix | None:
    if layout.kind != Kind.ASYNC_LAG or layout.max_policy_lag is None:
        return None
    value = _least(lambda v: _safe(lim, ds, dataclasses.replace(layout, max_policy_lag=v)),
                   layout.max_policy_lag + 1, MAX_POLICY_LAG)
    if value is None:
        return None
    return Fix(Knob.MAX_POLICY_LAG, value, layout.max_policy_lag, Change.LONGER_LAG)


_SEARCHES: tuple[Callable[[Limiter, Dataset, JobLayout], Fix | None], ...] = (
    _fewer_workers, _more_readers, _fewer_samplers, _more_buffer, _smaller_batch,
    _longer_lag, _more_items_ahead, _later_first_step, _schedule_inserts)


def _least(ok: Callable[[int], bool], low: int, high: int) -> int | None:
    """The least integer in [low, high] for which `ok` holds, `ok` being monotone there."""
    if low > high or not ok(high):
        return None
    while low < high:
        mid = (low + high) // 2
        if ok(mid):
            high = mid
        else:
            low = mid + 1
    return low


# Where each change's cost is said: the searches above decide, these words only say.
_STEPS = "(Acme: observations_per_step; TF-Agents: collect steps per train step)"
_COSTS: dict[Change, Callable[[Fix], str]] = {
    Change.ONE_WORKER: lambda f: f"1 sampling worker instead of {f.was}: less sampling throughput",
    Change.FEWER_WORKERS: lambda f: (f"{f.value} sampling worker(s) instead of {f.was}: less "
                                     "sampling throughput"),
    Change.MORE_THREADS: lambda f: (f"{f.value} interleave threads instead of {f.was}: more "
                                    "threads in the trainer"),
    Change.FEWER_SAMPLERS: lambda f: (f"{f.value} Reverb datasets interleaved instead of "
                                      f"{f.was} (TF-Agents: max_cycle_length): fewer sampling "
                                      "streams"),
    Change.MORE_BUFFER: lambda f: (
        f"samples and inserts may drift {f.value} samples apart"
        + (f", Acme's tolerance rate {f.tolerance:.3g}" if f.tolerance is not None else "")
        + "; any larger error_buffer holds too"),
    Change.SMALLER_BATCH: lambda f: (f"batches of {f.value}: a different learning step "
                                     "(rescale the learning rate)"),
    Change.LONGER_LAG: lambda f: f"actors may act up to {f.value} steps on a policy that old",
    Change.MORE_AHEAD: lambda f: (f"actors may insert {f.value} items ahead of what the "
                                  "learner consumed: older data"),
    Change.LATER_FIRST_STEP: lambda f: (
        f"the loop's first learner step once the table holds {f.value} items (Acme: "
        "min_observations; TF-Agents: the initial collect): training starts later"),
    Change.PAID_STRIDE: lambda f: (f"one learner step every {f.value} inserts, the schedule "
                                   f"the ratio pays for {_STEPS}"),
    Change.LOWER_RATIO: lambda f: (f"one learner step every {f.value} inserts {_STEPS}: a "
                                   "lower replay ratio"),
    Change.RATIO_STEPS: lambda f: (f"one learner step every {f.value} inserts {_STEPS}: as "
                                   "many steps as the ratio allows"),
}


def _cost(f: Fix) -> str:
    said = _COSTS[f.change](f)
    if f.hangs_below:
        said += f"; a smaller one is not always safer: {_spans(list(f.hangs_below))} can hang"
    if f.stride is not None:
        least = "at least " if f.stride_at_least else ""
        said += (f"; if the loop steps on a schedule, with {least}{f.stride:g} inserts "
                 "between its steps")
    return said


def _num(value: float | int | None) -> str:
    if value is None:
        return "unknown"
    return f"{value:g}" if isinstance(value, float) else str(value)
