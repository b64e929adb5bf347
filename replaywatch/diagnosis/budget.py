"""The budget model: can this limiter, dataset, loop and pacing hang the learner in next()?

One question decides every prediction: when the learner asks for a batch and nothing will
insert until it gets one, do the samples the limiter has released reach a batch? The model
is composed from the parts that decide it, each with the code it comes from:

**The limiter** (reverb/cc/rate_limiter.cc) commits a sample while `size >= min_size` and
`diff - 1 >= min_diff`, an insert while `(inserts + 1) * spi - samples <= max_diff`, with
`diff = inserts * spi - samples`. A half-filled sample request gets what the limiter allows
(reverb/cc/table.cc), so samples are stranded only in the client. With `error_buffer` e,
SampleToInsertRatio sets `min_diff = spi * min_size - e` and `max_diff = spi * min_size + e`,
so after `n >= min_size` inserts the limiter has released `spi * (n - min_size) + e`
samples in all: e at once when the table reaches min_size, spi with each insert after it.

**The pipeline** decides how many drawn samples can sit undelivered with no batch complete
("strandable"). Two shapes:

    per-worker batching   Acme's make_reverb_dataset (acme/datasets/reverb.py): P datasets,
                          each `.batch(B, drop_remainder=True)` on its own, interleaved. An
                          iterator the learner reads holds at most B - 1 short of a batch.
                          At the seed's commit a `from_tensors(0).repeat()` interleave opened
                          about three iterators per worker, and an unread one absorbs its
                          sampler queue (`max_in_flight`) plus its interleave element's
                          buffered batches (3, parallel_interleave_dataset_op.cc) plus a
                          partial one:
        strandable = P * (B - 1) + P * (iterators_per_worker - 1) * (M + 4B - 1)
    batch after the       TF-Agents' make_reverb_dataset (tf_agents/replay_buffers/
    interleave            reverb_replay_buffer.py): C = min(B, 32) Reverb datasets, each its
                          own sampler holding up to `M x workers_per_iterator` samples (M =
                          3B / C), read by P interleave threads, then ONE `.batch(B)`. A
                          thread inside an empty sampler's GetNext blocks there, so with
                          every thread so held the other C - P samplers keep what they drew:
        strandable = (B - 1) + max(0, C - P) * M * workers_per_iterator
                          The same over gRPC: a sampler's queue holds M x workers samples
                          whether its workers are the in-process ones (a client at
                          `localhost:PORT` in the server's own process, as TF-Agents builds
                          it, gets the table itself, reverb/cc/client.cc NewSampler) or gRPC
                          ones (each request at most M, reverb/cc/sampler.cc); an auto
                          `num_workers_per_iterator` (-1, TF-Agents' default) is one worker
                          (kDefaultNumWorkers); and the interleave's per-element buffers
                          (2 x block_length + 1 results, parallel_interleave_dataset_op.cc)
                          hold samples the batch takes as they come (deterministic off), so
                          they strand none. Measured on TF-Agents 0.19.0's DQN job (B 64, P 3,
                          M 6): 238 released at its first step trained 300 steps.

**Granularity.** Samples leave the table in whole requests' worth of what the limiter
allows: the table fills the request at the head of its queue while the limiter commits
(reverb/cc/table.cc, TableWorkerLoop), and a sampler asks for twice its last answer, capped
by `max_in_flight` (LocalSamplerWorker from 16; the gRPC stream from 128,
reverb_service_impl.cc). With an integral spi and error_buffer, every release, request and
per-worker batch is then a multiple of

    g = gcd(spi, error_buffer, 16, max_in_flight, B)

and so is what each iterator holds: short of a batch at most B - 1 rounded down to a
multiple of g (4 x 16 with spi 4: 12 each, 48 in all, not 60). A response also ends at
1 MiB of (compressed) chunks, which can end it at any count, so g is 1 when that cap can
bind (item size known, at most `max_in_flight` items in 1 MiB), when the item size is
unknown, and for a batch after the interleave (no per-worker batch to be a multiple of).

**The loop's gate**, when a synchronous loop (the loop that inserts is the learner) calls
next():

    can_sample  Acme's LocalLayout and run_experiment (acme/jax/experiments/
                run_experiment.py, `_LearningActor`): it steps while `iterator.ready()` or
                `can_sample(B)`. It enters next() with a batch's credit in the limiter: the
                warm-up burst e when e >= B; when e < B, one insert's spi when spi >= B
                (e + spi); when both are below a batch it only ever takes ready batches.
    schedule    Acme's `Agent` before LocalLayout (`min_observations`, then a step every
                `observations_per_step`), TF-Agents' "collect K steps, train one", most
                hand-written loops: the first next() when the table holds m items
                (`first_step_at`, default min_size), then one every K inserts
                (`inserts_per_step`, default B / spi), whatever the table can sample. At
                its j-th next() the loop has consumed j batches of what the limiter
                released, so the credit held for the batch it asks for is
        H_j = e + spi * (m - min_size) + j * (K * spi - B)
                constant when K * spi = B, growing when larger (the first step decides),
                and falling by B - K * spi a step when smaller: then some step finds less
                than a batch, every run (m below min_size: the first one already). With a
                finite max_diff a growing surplus is no better: the pipeline holds only so
                many samples, the rest piles up in the limiter until max_diff blocks the
                loop's own insert (reverb/cc/rate_limiter.cc), and a loop blocked inserting
                never asks for a batch (Acme's run_experiment disables insert blocking for
                this reason): only K * spi = B runs for good there.
    unknown     both readings are judged and the worse is given, both said: a loop whose
                gate is not known is never called safe on the can_sample reading alone.

A schedule's stride K may itself be unknown (`Layout.stride_known` False): a loop proven to
step on a schedule by one early ask (layout.py) has shown no stride yet. Only K * spi = B
runs for good under a finite max_diff, and any smaller K runs its credit down, so the model
judges that K alone: a `will_hang` there holds at every K (its first step is short, or
max_diff blocks the loop's inserts before it), and anything better is at most `can_hang`
(`stride_unknown`). TF-Agents' DQN job, spi 8, batch 64, one collect step a train step,
asked at its first step for 64 of 56 released: a default K of B / spi = 8 fed the fixes
error_buffer 222 and batch_size 10 (K following the batch to 1.25), and both hung, since its
K is 1; only a fix that sets K is proven there (budget_fixes).

The warm-up burst of a can_sample loop is dealt more tightly, when every iterator is read:
all of them wait with a request, none holds a sample, and Reverb's in-process sampler
worker asks for 16 samples first and doubles each answered request up to `max_in_flight`
(reverb/cc/sampler.cc, LocalSamplerWorker: `kInitialSampleBatchSize` 8, `2 * prev`). The
table answers waiting requests in turn, so the burst goes round in doubling rounds: each
worker holds C, the samples of the rounds before the one whose request reaches a batch, and
the first request of that round completes one. Uneven service only makes some worker reach
a batch sooner, so

    strandable (can_sample, burst) = (workers - 1) * C + B - 1

(12 workers of 256: rounds of 16, 32, 64, 128 hold C = 240, so 2895; 2 of 16: the first
request is a whole batch, so 15). The table ends a response at 1 MiB of chunks
(`kMaxSampleResponseSizeBytes`, reverb/cc/table.h), so with `item_bytes` known a request
takes at most ceil(1 MiB / item_bytes) items: seed-sized frames (63,504 bytes) answer 17 at
a time and C grows slower (3049 for 12 of 256). Chunks are compressed, so the uncompressed
size overstates the bytes and the bound errs toward `can_hang`.

**Steady state of a can_sample loop.** The loop steps while a batch is there, so it spends
the warm-up surplus: once trained a while, the read iterators hold partial batches only, and
the loop enters next() whenever `can_sample` reads a batch's worth of credit the requests
have not taken yet. That credit goes to the waiting requests in turn, each answer at most
`response_cap` items: when one answer can carry a whole batch, the first request completes
one; when it cannot (seed-sized frames, 17 a response against batches of 256) and more than
one per-worker batching iterator is read, the credit is dealt thinly and none may complete,
whatever error_buffer is. The seed's own numbers on that dataset hung so after 10,958
batches (bench/RESULTS.md), and a batch of 164, which the warm-up arithmetic calls safe,
hung too. So such a configuration is never `safe`, and its one proven fix is a single
sampling worker. With the items' size unknown a thin answer cannot be ruled out either.

**The actors' pacing**, when actors insert on their own:

    async           held at max_diff they resume as soon as the learner draws: nothing is
                    released once and for all. It cannot hang.
    max_items_ahead an actor may insert N items ahead of what the learner consumed:
                    `inserts - min_size <= N + consumed / spi`. When they all wait on that
                    bound the credit held is exactly `e + spi * N`; when the limiter holds
                    them at max_diff instead, the samplers draw its credit and they go on,
                    so a hang finds them on the bound. Released: `e + spi * N`.
    max_policy_lag  an actor inserts L items after it last saw a learner step, then waits
                    on the next one. The learner takes every batch that completes, so
                    when it blocks what is held is whatever partial batches were left plus
                    the last L inserts: `spi * L` at the least, whatever error_buffer is.
                    When `spi * L < B` every wait frees less than a batch while the learner
                    takes one, so the held samples shrink until no batch completes.

**Verdict.** `safe` when released > strandable (pigeonhole: some iterator completes a batch)
or nothing waits on the learner; `will_hang` when released < B (no batch can complete) or
the credit falls every step; otherwise `can_hang`: whether a run hangs depends on how the
released samples split across the iterators' requests, a race, so the grid measures it
(bench/predict_grid.py). Nothing else in the core computes a boundary.

**What keeps a verdict from a better one** (every `can_hang`, and a `will_hang` that only
an unknown gate's scheduled reading gives) is carried with it as `Conservative` terms, what
saying settles first, each either something the model was not told or a race that only a
change of the job removes:

    worker_split       which read iterator's request the released samples reach: the table
                       answers requests in the order tf.data's threads send them
    unread_samplers    samplers the learner is not reading (the repeat-interleave's extra
                       iterators, the datasets no interleave thread is in) keep what they drew
    thin_answers       1 MiB answers carry less than a batch and deal its credit thinly
    item_size_unknown  a known small size would use the whole-insert granularity and rule
                       out thin answers, and be safe
    gate_unknown       the loop's gate is not known, and the other reading is better
    stride_unknown     a scheduled loop whose inserts a step are not known: only B / spi of
                       them runs for good
    layout_unknown     (the engine's, never the model's) no layout declared, judged as a
                       synchronous loop: actors that never wait on the learner cannot hang

A race stays a race at the pigeonhole's edge: released = strandable needs every iterator
at its most at once. Two workers of 16, spi 4, error_buffer 24, scheduled (a step every 4
inserts): each insert's 4 samples go to one request, so each holds a multiple of 4, at most
12, and 24 strand only as 12 and 12. With both requests waiting the table answers them in
turn, 8 each a step, and the two stay 8 apart, so it takes a worker missing its turn (its
next request not yet sent when an insert lands) to meet 12 and 12: a scheduling race that
a user's runs of that configuration (min_size 100) never met, and that the arithmetic
cannot rule out (at error_buffer 20, turn by turn already meets 12 and 8: every grid run
of it hung).

What it does not use: `prefetch` holds complete batches, which reach the learner, so it
strands nothing.
"""

from __future__ import annotations

import dataclasses
import enum
import math

from replaywatch.model import FLOAT_MAX, GATES, LAYOUTS

SAFE, CAN_HANG, WILL_HANG = "safe", "can_hang", "will_hang"
SYNC, SYNC_RATIO, ASYNC, ASYNC_LAG = "sync", "sync-ratio", "async", "async-lag"
CAN_SAMPLE, SCHEDULE = GATES
PER_WORKER, AFTER_INTERLEAVE = "per-worker", "after-interleave"
# Buffers of one interleave element (tf.data's parallel interleave keeps 3 results each).
INTERLEAVE_BUFFER_BATCHES = 3
# TF-Agents' ReverbReplayBuffer: max_cycle_length, and 3 x the batch per interleave in flight.
TF_AGENTS_MAX_CYCLE = 32
TF_AGENTS_IN_FLIGHT_BATCHES = 3
_RANK = {SAFE: 0, CAN_HANG: 1, WILL_HANG: 2}


class Conservative(enum.StrEnum):
    """A term that keeps a verdict from being settled (module docstring); the words and what
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
    iterators_per_worker: int = 1  # 3 for the repeat-interleave at the seed's commit
    item_bytes: int | None = None
    shape: str = PER_WORKER  # or AFTER_INTERLEAVE: one batch after the interleave
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
        if self.shape not in (PER_WORKER, AFTER_INTERLEAVE):
            raise ValueError(f"shape ({self.shape!r}) must be {PER_WORKER} or "
                             f"{AFTER_INTERLEAVE}")

    @property
    def after_interleave(self) -> bool:
        return self.shape == AFTER_INTERLEAVE

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
class Layout:
    """Who inserts and who waits: the loop's gate for a synchronous loop, the actors' bound
    for an asynchronous one (module docstring)."""

    kind: str
    max_policy_lag: int | None = None  # async-lag: inserts after a seen step, then wait
    gate: str | None = None  # sync: CAN_SAMPLE, SCHEDULE; None unknown (loop_gate)
    inserts_per_step: float | None = None  # schedule: K (None: batch / spi)
    first_step_at: int | None = None  # schedule: items in the table at the first next()
    max_items_ahead: int | None = None  # async-lag: items ahead of what was consumed
    # schedule: False where inserts_per_step is unknown rather than B / spi by definition
    # (a gate proven by one early ask, before the loop showed a stride: module docstring)
    stride_known: bool = True

    def __post_init__(self) -> None:
        if self.kind not in LAYOUTS:
            raise ValueError(f"layout ({self.kind!r}) must be one of {', '.join(LAYOUTS)}")
        if self.kind == ASYNC_LAG:
            if (self.max_policy_lag is None) == (self.max_items_ahead is None):
                raise ValueError("async-lag needs one bound: max_policy_lag or "
                                 "max_items_ahead")
            if self.max_policy_lag is not None and self.max_policy_lag < 1:
                raise ValueError(f"max_policy_lag ({self.max_policy_lag}) must be >= 1")
            if self.max_items_ahead is not None and self.max_items_ahead < 0:
                raise ValueError(f"max_items_ahead ({self.max_items_ahead}) must be >= 0")
        if self.gate is not None and self.gate not in GATES:
            raise ValueError(f"gate ({self.gate!r}) must be one of {', '.join(GATES)}")
        if self.inserts_per_step is not None and not self.inserts_per_step > 0:
            raise ValueError(f"inserts_per_step ({self.inserts_per_step:g}) must be > 0")
        if self.first_step_at is not None and self.first_step_at < 0:
            raise ValueError(f"first_step_at ({self.first_step_at}) must be >= 0")

    @property
    def synchronous(self) -> bool:
        return self.kind in (SYNC, SYNC_RATIO)

    @property
    def loop_gate(self) -> str | None:
        """A synchronous loop's gate; `sync-ratio` is the scheduled loop by its definition
        (one step per B / spi inserts from min_size on), `sync` says it with `gate`."""
        return self.gate or (SCHEDULE if self.kind == SYNC_RATIO else None)

    def gated(self, gate: str) -> Layout:
        return dataclasses.replace(self, gate=gate)

    def for_fixes(self, lim: Limiter) -> Layout:
        """The layout a fix is searched under. A verdict may judge an unknown gate's
        scheduled reading at K = B / spi (a loop that waits on can_sample is never paged
        for it), but a fix must hold for the loop as it is: with neither the gate nor K
        said and a finite max_diff, where K = B / spi is the one schedule that runs, K is
        unknown and only a fix that sets it is proven (module docstring). With insert
        blocking disabled (Acme's rewrite) a fix found at B / spi holds at every larger K,
        and a smaller K is a loop no fix but K's can save: judged so, as before."""
        if (self.synchronous and self.gate is None and self.kind != SYNC_RATIO
                and self.inserts_per_step is None and not lim.insert_blocking_disabled):
            return dataclasses.replace(self, stride_known=False)
        return self


@dataclasses.dataclass(frozen=True)
class Budget:
    """What the model says, with the numbers that prove it."""

    verdict: str
    released: float | None  # drawn and undelivered when inserting stops; None: never stops
    strandable: float  # the most the iterators can hold with no batch complete
    reason: str
    gate: str | None = None  # the gate reading this verdict is (a synchronous loop's)
    # What keeps it from a better verdict, the first to settle first; empty when certain.
    conservative: tuple[Conservative, ...] = ()

    @property
    def needed(self) -> float:
        """Released must exceed strandable: at least this much."""
        return self.strandable + 1

    def evidence(self) -> dict[str, float | str | list[str] | None]:
        return {"verdict": self.verdict, "released_samples": self.released,
                "strandable_samples": self.strandable, "safe_from_samples": self.needed,
                "budget_reason": self.reason, "judged_gate": self.gate,
                "conservative": [term.value for term in self.conservative]}


def granularity(lim: Limiter, ds: Dataset) -> int:
    """The multiple every release, request and batch is (module docstring); 1 when unsure."""
    spi, e = lim.samples_per_insert, lim.error_buffer
    if ds.after_interleave or not ds.item_bytes or response_cap(ds) <= ds.in_flight:
        return 1
    if spi < 1 or not float(spi).is_integer() or not float(e).is_integer():
        return 1
    return math.gcd(int(spi), abs(int(e)), FIRST_REQUEST, ds.in_flight, ds.batch_size)


def _down(value: int, g: int) -> int:
    return value // g * g


def strandable(ds: Dataset, g: int = 1) -> float:
    """Samples the pipeline can hold while no batch completes (module docstring)."""
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
    """What a fresh burst can leave with every read iterator short of a batch (docstring)."""
    cap = min(ds.in_flight, response_cap(ds))
    held, request = 0, min(cap, FIRST_REQUEST)
    while held + request < ds.batch_size:
        held += request
        request = min(cap, 2 * request)
    return float((ds.workers - 1) * held + ds.batch_size - 1)


def steady_race(ds: Dataset, layout: Layout) -> bool:
    """A can_sample loop (or one whose gate is unknown) whose per-worker batching iterators
    can each be dealt less than a batch at a time (module docstring, steady state); with the
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


def predict(lim: Limiter, ds: Dataset, layout: Layout) -> Budget:
    """The verdict for this configuration (module docstring)."""
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


def _predict_read(lim: Limiter, ds: Dataset, layout: Layout) -> Budget:
    if layout.synchronous and layout.loop_gate is None:
        return _worse_reading(lim, ds, layout)
    return _predict_gated(lim, ds, layout)


def _predict_gated(lim: Limiter, ds: Dataset, layout: Layout) -> Budget:
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
                      f"{warm.reason}; the items' size is unknown: from "
                      f"{thin_item_bytes(ds.batch_size):,} bytes an item, an answer (1 MiB) "
                      f"carries less than a batch of {ds.batch_size}, and once trained the "
                      f"credit for one batch is dealt across {ds.workers} read iterators so "
                      "that none may complete it (a table signature or "
                      "TrainerProbe(item_bytes=...) settles it, --item-bytes to predict; "
                      f"smaller items: the warm-up reading, {warm.verdict.replace('_', ' ')})",
                      CAN_SAMPLE, warm.conservative)
    return Budget(CAN_HANG, released, warm.strandable,
                  f"{warm.reason}; once trained, credit for one batch is dealt at most "
                  f"{response_cap(ds)} samples an answer across {ds.workers} read iterators, "
                  f"so none may complete a batch of {ds.batch_size}", CAN_SAMPLE,
                  _terms((Conservative.THIN_ANSWERS,), warm.conservative))


def _worse_reading(lim: Limiter, ds: Dataset, layout: Layout) -> Budget:
    """The gate unknown: the can_sample and the scheduled readings, the worse given and the
    other said beside it (a tie goes to the scheduled one, whose arithmetic is plainer)."""
    sampled = _predict_gated(lim, ds, layout.gated(CAN_SAMPLE))
    scheduled = _predict_gated(lim, ds, layout.gated(SCHEDULE))
    worse, other = ((sampled, scheduled) if _RANK[sampled.verdict] > _RANK[scheduled.verdict]
                    else (scheduled, sampled))
    words = {CAN_SAMPLE: "a loop that steps only while can_sample(batch)",
             SCHEDULE: "a loop that steps on a schedule"}
    # A better other reading is what declaring the gate would give; on a tie a fix must
    # hold under both, so both readings' races are said.
    terms = (_terms((Conservative.GATE_UNKNOWN,), worse.conservative)
             if _RANK[other.verdict] < _RANK[worse.verdict]
             else _terms(worse.conservative, other.conservative))
    return dataclasses.replace(
        worse, reason=f"the loop's gate is unknown, so both readings are judged: as "
                      f"{words[worse.gate or SCHEDULE]}, {worse.reason}; as "
                      f"{words[other.gate or SCHEDULE]}, {other.verdict.replace('_', ' ')} "
                      f"({other.reason})", conservative=terms)


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


def _predict_schedule(lim: Limiter, ds: Dataset, layout: Layout) -> Budget:
    """A loop that calls next() at m items, then every K inserts (module docstring); K
    unknown, judged at B / spi, the one K that can run for good."""
    judged = _predict_paced(lim, ds, layout)
    if layout.stride_known or judged.verdict == WILL_HANG:
        return judged  # at K = B / spi a will_hang is the first step's, whatever K is
    return Budget(CAN_HANG, judged.released, judged.strandable,
                  f"{judged.reason}; but how many items the loop inserts a step is unknown, "
                  f"and one step every {ds.batch_size / lim.samples_per_insert:g} inserts is "
                  "the only schedule that runs for good", SCHEDULE,
                  _terms((Conservative.STRIDE_UNKNOWN,), judged.conservative))


def _predict_paced(lim: Limiter, ds: Dataset, layout: Layout) -> Budget:
    b, e, spi = ds.batch_size, lim.error_buffer, lim.samples_per_insert
    s = strandable(ds, granularity(lim, ds))
    k = (layout.inserts_per_step if layout.stride_known else None) or b / spi
    m = lim.min_size_to_sample if layout.first_step_at is None else layout.first_step_at
    if m < lim.min_size_to_sample:
        return Budget(WILL_HANG, 0.0, s, f"the loop first asks for a batch at {m} items, "
                      f"below min_size_to_sample {lim.min_size_to_sample}: nothing is "
                      "released and the loop never inserts again", SCHEDULE)
    first = e + spi * (m - lim.min_size_to_sample)
    per_step = k * spi
    if m > inserts_before_blocking(lim):
        return Budget(WILL_HANG, first, s, f"the loop inserts {m} items before its first "
                      f"step, but with nothing drawn before it (tf.data opens its Reverb "
                      f"datasets at the first next()) max_diff ({lim.max_diff:g}) blocks its "
                      f"own insert at {inserts_before_blocking(lim):g}", SCHEDULE)
    every = (f"a step every {k:g} inserts" if layout.stride_known else
             f"a step on a schedule of unknown stride (judged at every {k:g} inserts)")
    at = (f"{every} from {m} items on; at the first the limiter has "
          f"released {first:g} (error_buffer {e:g}"
          + (f" + {spi:g} x {m - lim.min_size_to_sample} inserts past min_size" if m >
             lim.min_size_to_sample else "") + ")")
    if per_step < b - 1e-9:
        fall = b - per_step
        steps = 0 if first < b else math.floor((first - b) / fall) + 1
        return Budget(WILL_HANG, first, s, f"{at}, and each step takes {b} while its "
                      f"{k:g} inserts release {per_step:g}: the credit falls by {fall:g} a "
                      "step and is below a batch "
                      + (f"by step {steps}" if steps else "at the first"), SCHEDULE)
    if per_step > b + 1e-9 and not lim.insert_blocking_disabled:
        # The surplus piles up in the limiter, the pipeline holds only so much, so the loop's
        # own insert meets max_diff; blocked there it never asks for the batch that frees it.
        held = drawable(ds, s)
        room = lim.max_diff - spi * (m + 1) + held
        steps = max(0, math.ceil(room / (per_step - b)))
        return Budget(WILL_HANG, first, s, f"{at}, and each step's {k:g} inserts release "
                      f"{per_step:g} while it takes {b}: the surplus grows by "
                      f"{per_step - b:g} a step until max_diff ({lim.max_diff:g}) blocks the "
                      f"loop's own insert, by about step {steps}, and a loop blocked inserting "
                      "never asks for the batch that would free it", SCHEDULE)
    more = ("and more at each later step" if per_step > b + 1e-9
            else "and as much at every step" if layout.stride_known
            else "its later steps unknown")
    return _judge(first, s, ds, f"{at}, {more}", SCHEDULE)


def _predict_warm_up(lim: Limiter, ds: Dataset, layout: Layout) -> Budget:
    b, e, spi = ds.batch_size, lim.error_buffer, lim.samples_per_insert
    s = strandable(ds, granularity(lim, ds))
    if layout.kind == ASYNC:
        return Budget(SAFE, None, s, "actors never wait on the learner: blocked at max_diff, "
                      "they resume as soon as it draws")
    if layout.kind == ASYNC_LAG and layout.max_items_ahead is not None:
        ahead = layout.max_items_ahead
        return _judge(e + spi * ahead, s, ds, f"actors wait {ahead} items ahead of what the "
                      f"learner consumed: error_buffer {e:g} + {ahead} x {spi:g}")
    if layout.kind == ASYNC_LAG:
        lag = layout.max_policy_lag or 0
        released = spi * lag
        if released < b:
            return Budget(WILL_HANG, released, s, f"each learner step takes {b} samples and "
                          f"lets the actors insert only {lag} x {spi:g} = {released:g}")
        return _judge(released, s, ds, f"{lag} x {spi:g} inserted after the learner's last "
                      "step, before the actors wait on it again")
    if e >= b:
        burst = (burst_strandable(ds) if ds.iterators_per_worker == 1
                 and not ds.after_interleave else s)
        return _judge(e, burst, ds, f"the warm-up burst (error_buffer {e:g}) lets "
                      f"can_sample({b}) send the loop into next()", CAN_SAMPLE)
    if spi >= b:
        return _judge(e + spi, s, ds, f"one insert releases {spi:g} >= a batch, on top of "
                      f"error_buffer {e:g}", CAN_SAMPLE)
    return Budget(SAFE, None, s, f"error_buffer {e:g} and samples_per_insert {spi:g} are "
                  f"each below a batch of {b}: the loop only takes ready batches", CAN_SAMPLE)


def _judge(released: float, strand: float, ds: Dataset, why: str,
           gate: str | None = None) -> Budget:
    if released > strand:
        return Budget(SAFE, released, strand, why, gate)
    if released < ds.batch_size:
        return Budget(WILL_HANG, released, strand, why, gate)
    # Between a batch and what can strand: one place alone would complete a batch, so
    # there are several (race_terms is never empty here), and how the samples split is
    # the run's.
    return Budget(CAN_HANG, released, strand, why, gate, race_terms(ds))
