"""The budget model: can this limiter, dataset, loop and pacing hang the learner in next()?

When the learner asks for a batch and nothing will insert until it gets one, it hangs
unless the samples the limiter has released complete a batch somewhere. The model weighs
two numbers:

    released    what the limiter lets the samplers draw by then (Reverb's
                `diff = inserts * spi - samples` against min_diff and max_diff, set by
                SampleToInsertRatio's error_buffer): decided by the loop's gate
                (`can_sample`, or a schedule of K inserts a step) when the learner's own
                loop inserts, by the actors' pacing (max_items_ahead, max_policy_lag)
                when actors insert on their own
    strandable  what the pipeline can hold with no batch complete: batches per worker
                (Acme: every read iterator B - 1 short, and what unread ones keep) or one
                batch after the interleave (TF-Agents: B - 1, and the samplers no thread
                reads), counted in the multiples Reverb hands samples out in

`safe` when released > strandable (some iterator completes a batch) or nothing waits on the
learner; `will_hang` when released < B or the credit falls every step; otherwise `can_hang`:
how the samples split across the requests is a race, which the prediction grid measures
(bench/predict_grid.py). What keeps a verdict from a better one travels with it as
`Conservative` terms. Nothing else in the core computes a boundary.

The derivation, each part with the Reverb, tf.data, Acme and TF-Agents code it comes from,
is in docs/predict.md ("The budget model, derived"); the runs it is checked against are in
bench/RESULTS.md. Each verdict carries the case that decided it (`budget_reasons`), said in
words by `budget_words`.
"""

from __future__ import annotations

import dataclasses
import enum
import math

from replaywatch.diagnosis import budget_reasons as why
from replaywatch.diagnosis.budget_reasons import Later, Reason, Verdict
from replaywatch.model import FLOAT_MAX
from replaywatch.probe.protocol import Gate
from replaywatch.probe.protocol import Layout as Kind

# The words by their short names, for the arithmetic below and the modules that read it.
SAFE, CAN_HANG, WILL_HANG = Verdict
SYNC, SYNC_RATIO, ASYNC, ASYNC_LAG = Kind
CAN_SAMPLE, SCHEDULE = Gate
LAYOUTS = tuple(Kind)
# Buffers of one interleave element (tf.data's parallel interleave keeps 3 results each).
INTERLEAVE_BUFFER_BATCHES = 3
# TF-Agents' ReverbReplayBuffer: max_cycle_length, and 3 x the batch per interleave in flight.
TF_AGENTS_MAX_CYCLE = 32
TF_AGENTS_IN_FLIGHT_BATCHES = 3


class Batching(enum.StrEnum):
    """Where the learner's batch forms (docs/predict.md, the pipeline)."""

    PER_WORKER = "per-worker"  # Acme: each sampling worker batches on its own
    AFTER_INTERLEAVE = "after-interleave"  # TF-Agents: one batch after the interleave


PER_WORKER, AFTER_INTERLEAVE = Batching


class Conservative(enum.StrEnum):
    """A term that keeps a verdict from being settled (docs/predict.md); the words and what
    settles each are in `budget_terms`."""

    WORKER_SPLIT = "worker_split"
    UNREAD_SAMPLERS = "unread_samplers"
    THIN_ANSWERS = "thin_answers"
    ITEM_SIZE_UNKNOWN = "item_size_unknown"
    GATE_UNKNOWN = "gate_unknown"
    STRIDE_UNKNOWN = "stride_unknown"
    # The engine's, never the model's: `predict` is always told the layout.
    LAYOUT_UNKNOWN = "layout_unknown"

    @property
    def race(self) -> bool:
        """Only a change of the job removes it; the others are settled by saying more."""
        return self in (Conservative.WORKER_SPLIT, Conservative.UNREAD_SAMPLERS,
                        Conservative.THIN_ANSWERS)


@dataclasses.dataclass(frozen=True)
class Limiter:
    """The rate limiter as ServerInfo reports it (or as `replaywatch predict` is told)."""

    samples_per_insert: float
    min_size_to_sample: int
    min_diff: float
    max_diff: float

    @classmethod
    def ratio(cls, samples_per_insert: float, min_size_to_sample: int, error_buffer: float,
              insert_blocking: bool = True) -> Limiter:
        """SampleToInsertRatio; `insert_blocking=False` is Acme's max_diff rewrite."""
        offset = samples_per_insert * min_size_to_sample
        return cls(samples_per_insert, min_size_to_sample, offset - error_buffer,
                   offset + error_buffer if insert_blocking else float("inf"))

    @property
    def error_buffer(self) -> float:
        """The credit released when the table reaches min_size: `spi * min_size - min_diff`."""
        return self.samples_per_insert * self.min_size_to_sample - self.min_diff

    @property
    def insert_blocking_disabled(self) -> bool:
        return self.max_diff >= FLOAT_MAX * 0.5

    def with_error_buffer(self, error_buffer: float) -> Limiter:
        return Limiter.ratio(self.samples_per_insert, self.min_size_to_sample, error_buffer,
                             insert_blocking=not self.insert_blocking_disabled)


@dataclasses.dataclass(frozen=True)
class Dataset:
    """The learner's pipeline: how many samplers, who reads them, where the batch forms."""

    workers: int  # num_parallel_calls: batching workers, or the interleave's threads
    batch_size: int
    max_in_flight: int | None = None  # max_in_flight_samples_per_worker
    prefetch: int = 0
    iterators_per_worker: int = 1  # 3 where Acme's make_reverb_dataset interleaves a repeat
    item_bytes: int | None = None
    shape: Batching = Batching.PER_WORKER
    cycle_length: int | None = None  # after-interleave: at most this many datasets (32)
    workers_per_iterator: int = 1  # a sampler's workers, each with max_in_flight

    def __post_init__(self) -> None:
        for label, value, least in (("workers", self.workers, 1),
                                    ("batch_size", self.batch_size, 1),
                                    ("iterators_per_worker", self.iterators_per_worker, 1),
                                    ("workers_per_iterator", self.workers_per_iterator, 1),
                                    ("cycle_length", self.cycle_length or 1, 1),
                                    ("prefetch", self.prefetch, 0)):
            if value < least:
                raise ValueError(f"{label} ({value}) must be >= {least}")
        if self.shape not in tuple(Batching):
            raise ValueError(f"shape ({self.shape!r}) must be {' or '.join(Batching)}")
        object.__setattr__(self, "shape", Batching(self.shape))

    @property
    def after_interleave(self) -> bool:
        return self.shape is Batching.AFTER_INTERLEAVE

    @property
    def samplers(self) -> int:
        """Reverb datasets the pipeline opens: one per worker, or the interleave's cycle."""
        if not self.after_interleave:
            return self.workers
        # TF-Agents: min(B, max_cycle_length); a cycle longer than the batch is never read.
        return min(self.batch_size, self.cycle_length or TF_AGENTS_MAX_CYCLE)

    @property
    def in_flight(self) -> int:
        """Acme's default is 2 x batch; TF-Agents' 3 x the batch per interleaved dataset."""
        if self.max_in_flight:
            return self.max_in_flight
        if self.after_interleave:
            return max(1, TF_AGENTS_IN_FLIGHT_BATCHES * (self.batch_size // self.samplers))
        return 2 * self.batch_size


@dataclasses.dataclass(frozen=True)
class JobLayout:
    """Who inserts and who waits: the loop's gate for a synchronous loop, the actors' bound
    for an asynchronous one (docs/predict.md)."""

    kind: Kind
    max_policy_lag: int | None = None  # async-lag: inserts after a seen step, then wait
    gate: Gate | None = None  # sync: None unknown (loop_gate)
    inserts_per_step: float | None = None  # schedule: K (None: batch / spi)
    first_step_at: int | None = None  # schedule: items in the table at the first next()
    max_items_ahead: int | None = None  # async-lag: items ahead of what was consumed
    # schedule: False where inserts_per_step is unknown rather than B / spi by definition
    # (a gate proven by one early ask, before the loop showed a stride: docs/predict.md)
    stride_known: bool = True

    def __post_init__(self) -> None:
        if self.kind not in LAYOUTS:
            raise ValueError(f"layout ({self.kind!r}) must be one of {', '.join(LAYOUTS)}")
        object.__setattr__(self, "kind", Kind(self.kind))
        if self.kind == ASYNC_LAG:
            if (self.max_policy_lag is None) == (self.max_items_ahead is None):
                raise ValueError("async-lag needs one bound: max_policy_lag or "
                                 "max_items_ahead")
            if self.max_policy_lag is not None and self.max_policy_lag < 1:
                raise ValueError(f"max_policy_lag ({self.max_policy_lag}) must be >= 1")
            if self.max_items_ahead is not None and self.max_items_ahead < 0:
                raise ValueError(f"max_items_ahead ({self.max_items_ahead}) must be >= 0")
        if self.gate is not None:
            if self.gate not in tuple(Gate):
                raise ValueError(f"gate ({self.gate!r}) must be one of {', '.join(Gate)}")
            object.__setattr__(self, "gate", Gate(self.gate))
        if self.inserts_per_step is not None and not self.inserts_per_step > 0:
            raise ValueError(f"inserts_per_step ({self.inserts_per_step:g}) must be > 0")
        if self.first_step_at is not None and self.first_step_at < 0:
            raise ValueError(f"first_step_at ({self.first_step_at}) must be >= 0")

    @property
    def synchronous(self) -> bool:
        return self.kind in (SYNC, SYNC_RATIO)

    @property
    def loop_gate(self) -> Gate | None:
        """A synchronous loop's gate; `sync-ratio` is the scheduled loop by its definition
        (one step per B / spi inserts from min_size on), `sync` says it with `gate`."""
        return self.gate or (SCHEDULE if self.kind == SYNC_RATIO else None)

    def gated(self, gate: Gate) -> JobLayout:
        return dataclasses.replace(self, gate=gate)

    def for_fixes(self, lim: Limiter) -> JobLayout:
        """The layout a fix is searched under. A verdict may judge an unknown gate's
        scheduled reading at K = B / spi (a loop that waits on can_sample is never paged
        for it), but a fix must hold for the loop as it is: with neither the gate nor K
        said and a finite max_diff, where K = B / spi is the one schedule that runs, K is
        unknown and only a fix that sets it is proven (docs/predict.md). With insert
        blocking disabled (Acme's rewrite) a fix found at B / spi holds at every larger K,
        and a smaller K is a loop no fix but K's can save: judged at B / spi."""
        if (self.synchronous and self.gate is None and self.kind != SYNC_RATIO
                and self.inserts_per_step is None and not lim.insert_blocking_disabled):
            return dataclasses.replace(self, stride_known=False)
        return self


@dataclasses.dataclass(frozen=True)
class Budget:
    """What the model says, with the numbers that prove it."""

    verdict: Verdict
    released: float | None  # drawn and undelivered when inserting stops; None: never stops
    strandable: float  # the most the iterators can hold with no batch complete
    why: Reason  # the case that decided it, with its numbers (budget_words says it)
    gate: Gate | None = None  # the gate reading this verdict is (a synchronous loop's)
    # What keeps it from a better verdict, the first to settle first; empty when certain.
    conservative: tuple[Conservative, ...] = ()

    @property
    def needed(self) -> float:
        """Released must exceed strandable: at least this much."""
        return self.strandable + 1


def granularity(lim: Limiter, ds: Dataset) -> int:
    """The multiple every release, request and batch is (docs/predict.md); 1 when unsure."""
    spi, e = lim.samples_per_insert, lim.error_buffer
    if ds.after_interleave or not ds.item_bytes or response_cap(ds) <= ds.in_flight:
        return 1
    if spi < 1 or not float(spi).is_integer() or not float(e).is_integer():
        return 1
    return math.gcd(int(spi), abs(int(e)), FIRST_REQUEST, ds.in_flight, ds.batch_size)


def _down(value: int, g: int) -> int:
    return value // g * g


def strandable(ds: Dataset, g: int = 1) -> float:
    """Samples the pipeline can hold while no batch completes (docs/predict.md)."""
    if ds.after_interleave:
        unread = max(0, ds.samplers - ds.workers)
        return float(ds.batch_size - 1 + unread * ds.in_flight * ds.workers_per_iterator)
    read = ds.workers * _down(ds.batch_size - 1, g)
    unread = ds.workers * (ds.iterators_per_worker - 1)
    return float(read + unread * _down(ds.in_flight + (INTERLEAVE_BUFFER_BATCHES + 1)
                                       * ds.batch_size - 1, g))


# Reverb's in-process sampler worker: its first request is 2 x kInitialSampleBatchSize.
FIRST_REQUEST = 16
MAX_RESPONSE_BYTES = 1024 * 1024  # the table's kMaxSampleResponseSizeBytes


def response_cap(ds: Dataset) -> int:
    """The most items one answer carries: 1 MiB of them, when their size is known."""
    if not ds.item_bytes:
        return ds.in_flight
    return max(1, math.ceil(MAX_RESPONSE_BYTES / ds.item_bytes))


def burst_strandable(ds: Dataset) -> float:
    """What a fresh burst can leave with every read iterator short of a batch (docs/predict.md)."""
    cap = min(ds.in_flight, response_cap(ds))
    held, request = 0, min(cap, FIRST_REQUEST)
    while held + request < ds.batch_size:
        held += request
        request = min(cap, 2 * request)
    return float((ds.workers - 1) * held + ds.batch_size - 1)


def steady_race(ds: Dataset, layout: JobLayout) -> bool:
    """A can_sample loop (or one whose gate is unknown) whose per-worker batching iterators
    can each be dealt less than a batch at a time (docs/predict.md, steady state); with the
    item size unknown that cannot be ruled out."""
    return (layout.synchronous and layout.loop_gate != SCHEDULE
            and not ds.after_interleave and ds.workers > 1
            and (ds.item_bytes is None or response_cap(ds) < ds.batch_size))


def thin_item_bytes(batch_size: int) -> int:
    """The least item size at which one answer (1 MiB) carries less than a batch."""
    return MAX_RESPONSE_BYTES // max(batch_size - 1, 1) + 1


def race_terms(ds: Dataset) -> tuple[Conservative, ...]:
    """Where released samples can sit short of a batch, when more than one place can hold
    them: the split between those places is what a `can_hang` leaves to the run."""
    if ds.after_interleave:  # one batch: only the samplers no thread reads keep samples
        return (Conservative.UNREAD_SAMPLERS,) if ds.samplers > ds.workers else ()
    return (((Conservative.WORKER_SPLIT,) if ds.workers > 1 else ())
            + ((Conservative.UNREAD_SAMPLERS,) if ds.iterators_per_worker > 1 else ()))


def _terms(*groups: tuple[Conservative, ...]) -> tuple[Conservative, ...]:
    """Once each, what saying settles before the races only a change removes."""
    every = dict.fromkeys(term for group in groups for term in group)
    return (tuple(t for t in every if not t.race) + tuple(t for t in every if t.race))


def predict(lim: Limiter, ds: Dataset, layout: JobLayout) -> Budget:
    """The verdict for this configuration (docs/predict.md)."""
    judged = _predict_read(lim, ds, layout)
    if judged.verdict != CAN_HANG or ds.item_bytes is not None:
        return judged
    # The size unknown, responses may end at any count: a known small size uses the
    # whole-insert granularity and rules out thin answers, so it is never worse. Judged
    # here, over both gates' readings, so that it is named only where saying it helps.
    small = _predict_read(lim, dataclasses.replace(ds, item_bytes=1), layout)
    if small.verdict == CAN_HANG:
        return judged
    return dataclasses.replace(judged, conservative=_terms(
        judged.conservative, (Conservative.ITEM_SIZE_UNKNOWN,)))


def _predict_read(lim: Limiter, ds: Dataset, layout: JobLayout) -> Budget:
    if layout.synchronous and layout.loop_gate is None:
        return _worse_reading(lim, ds, layout)
    return _predict_gated(lim, ds, layout)


def _predict_gated(lim: Limiter, ds: Dataset, layout: JobLayout) -> Budget:
    if layout.synchronous and layout.loop_gate == SCHEDULE:
        return _predict_schedule(lim, ds, layout)
    warm = _predict_warm_up(lim, ds, layout)
    if warm.verdict == WILL_HANG or not steady_race(ds, layout):
        return warm
    # Said whether or not warm-up can hang too: it is why only one worker is offered. A
    # loop that only took ready batches at warm-up still enters next() once trained when
    # can_sample reads a batch's credit: that batch is what is released then.
    released = warm.released if warm.released is not None else float(ds.batch_size)
    if ds.item_bytes is None:
        return Budget(CAN_HANG, released, warm.strandable,
                      why.ThinSizeUnknown(warm.why, warm.verdict,
                                          thin_item_bytes(ds.batch_size), ds.batch_size,
                                          ds.workers), CAN_SAMPLE, warm.conservative)
    return Budget(CAN_HANG, released, warm.strandable,
                  why.ThinAnswers(warm.why, response_cap(ds), ds.workers, ds.batch_size),
                  CAN_SAMPLE, _terms((Conservative.THIN_ANSWERS,), warm.conservative))


def _worse_reading(lim: Limiter, ds: Dataset, layout: JobLayout) -> Budget:
    """The gate unknown: the can_sample and the scheduled readings, the worse given and the
    other said beside it (a tie goes to the scheduled one, whose arithmetic is plainer)."""
    sampled = _predict_gated(lim, ds, layout.gated(CAN_SAMPLE))
    scheduled = _predict_gated(lim, ds, layout.gated(SCHEDULE))
    worse, other = ((sampled, scheduled) if sampled.verdict.worse_than(scheduled.verdict)
                    else (scheduled, sampled))
    # A better other reading is what declaring the gate would give; on a tie a fix must
    # hold under both, so both readings' races are said.
    terms = (_terms((Conservative.GATE_UNKNOWN,), worse.conservative)
             if worse.verdict.worse_than(other.verdict)
             else _terms(worse.conservative, other.conservative))
    return dataclasses.replace(
        worse, why=why.GateUnknown(worse.gate or SCHEDULE, worse.why, other.gate or SCHEDULE,
                                   other.verdict, other.why), conservative=terms)


def drawable(ds: Dataset, strand: float) -> float:
    """What the pipeline takes off the limiter while the loop does not step: its strandable
    samples and a batch in each prefetch slot and in the one being formed."""
    return strand + ds.batch_size * (ds.prefetch + 1)


def inserts_before_blocking(lim: Limiter) -> float:
    """The most items a loop can insert before its first step: past them its own insert
    meets a finite max_diff, as nothing is drawn meanwhile (tf.data opens the Reverb datasets
    of an interleave at the first GetNext, so a pipeline that was never asked holds none)."""
    if lim.insert_blocking_disabled:
        return math.inf
    return math.floor(lim.max_diff / lim.samples_per_insert)


def _predict_schedule(lim: Limiter, ds: Dataset, layout: JobLayout) -> Budget:
    """A loop that calls next() at m items, then every K inserts (docs/predict.md); K
    unknown, judged at B / spi, the one K that can run for good."""
    judged = _predict_paced(lim, ds, layout)
    if layout.stride_known or judged.verdict == WILL_HANG:
        return judged  # at K = B / spi a will_hang is the first step's, whatever K is
    return Budget(CAN_HANG, judged.released, judged.strandable,
                  why.StrideUnknown(judged.why, ds.batch_size / lim.samples_per_insert),
                  SCHEDULE, _terms((Conservative.STRIDE_UNKNOWN,), judged.conservative))


def _predict_paced(lim: Limiter, ds: Dataset, layout: JobLayout) -> Budget:
    b, e, spi = ds.batch_size, lim.error_buffer, lim.samples_per_insert
    s = strandable(ds, granularity(lim, ds))
    k = (layout.inserts_per_step if layout.stride_known else None) or b / spi
    m = lim.min_size_to_sample if layout.first_step_at is None else layout.first_step_at
    if m < lim.min_size_to_sample:
        return Budget(WILL_HANG, 0.0, s, why.FirstStepEarly(m, lim.min_size_to_sample),
                      SCHEDULE)
    first = e + spi * (m - lim.min_size_to_sample)
    per_step = k * spi
    if m > inserts_before_blocking(lim):
        return Budget(WILL_HANG, first, s, why.FirstStepBlocked(
            m, lim.max_diff, inserts_before_blocking(lim)), SCHEDULE)
    at = why.Schedule(k, layout.stride_known, m, first, e, spi, m - lim.min_size_to_sample)
    if per_step < b - 1e-9:
        steps = 0 if first < b else math.floor((first - b) / (b - per_step)) + 1
        return Budget(WILL_HANG, first, s, why.CreditFalls(at, b, per_step, steps), SCHEDULE)
    if per_step > b + 1e-9 and not lim.insert_blocking_disabled:
        # The surplus piles up in the limiter, the pipeline holds only so much, so the loop's
        # own insert meets max_diff; blocked there it never asks for the batch that frees it.
        room = lim.max_diff - spi * (m + 1) + drawable(ds, s)
        steps = max(0, math.ceil(room / (per_step - b)))
        return Budget(WILL_HANG, first, s,
                      why.SurplusGrows(at, b, per_step, lim.max_diff, steps), SCHEDULE)
    later = (Later.MORE if per_step > b + 1e-9
             else Later.SAME if layout.stride_known else Later.UNKNOWN)
    return _judge(first, s, ds, why.ScheduleHolds(at, later), SCHEDULE)


def _predict_warm_up(lim: Limiter, ds: Dataset, layout: JobLayout) -> Budget:
    b, e, spi = ds.batch_size, lim.error_buffer, lim.samples_per_insert
    s = strandable(ds, granularity(lim, ds))
    if layout.kind == ASYNC:
        return Budget(SAFE, None, s, why.ActorsFree())
    if layout.kind == ASYNC_LAG and layout.max_items_ahead is not None:
        ahead = layout.max_items_ahead
        return _judge(e + spi * ahead, s, ds, why.ItemsAhead(ahead, e, spi))
    if layout.kind == ASYNC_LAG:
        lag = layout.max_policy_lag or 0
        released = spi * lag
        if released < b:
            return Budget(WILL_HANG, released, s, why.LagShort(b, lag, spi, released))
        return _judge(released, s, ds, why.Lag(lag, spi))
    if e >= b:
        burst = (burst_strandable(ds) if ds.iterators_per_worker == 1
                 and not ds.after_interleave else s)
        return _judge(e, burst, ds, why.WarmBurst(e, b), CAN_SAMPLE)
    if spi >= b:
        return _judge(e + spi, s, ds, why.OneInsert(spi, e), CAN_SAMPLE)
    return Budget(SAFE, None, s, why.ReadyOnly(e, spi, b), CAN_SAMPLE)


def _judge(released: float, strand: float, ds: Dataset, reason: Reason,
           gate: Gate | None = None) -> Budget:
    if released > strand:
        return Budget(SAFE, released, strand, reason, gate)
    if released < ds.batch_size:
        return Budget(WILL_HANG, released, strand, reason, gate)
    # Between a batch and what can strand: one place alone would complete a batch, so
    # there are several (race_terms is never empty here), and how the samples split is
    # the run's.
    return Budget(CAN_HANG, released, strand, reason, gate, race_terms(ds))

