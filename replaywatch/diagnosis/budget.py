"""The budget model: can this limiter, dataset and layout hang the learner in next()?

One question decides every prediction: once the inserting side stops, does the learner get
a batch out of what the limiter still releases? Reverb's limiter commits a sample while
`size >= min_size_to_sample` and `diff - 1 >= min_diff`, an insert while
`(inserts + 1) * spi - samples <= max_diff` (reverb/cc/rate_limiter.cc); a half-filled
sample request gets what the limiter allows (reverb/cc/table.cc), so samples are stranded
only in the client's iterators. With `error_buffer` e, SampleToInsertRatio sets
`min_diff = spi * min_size - e` and `max_diff = spi * min_size + e`: when the table reaches
min_size the limiter releases e samples at once, and from then on each insert releases spi.

**Strandable.** tf.data's `batch(B, drop_remainder=True)` runs per sampling iterator, so
an iterator the learner reads holds at most `B - 1` samples without completing a batch.
Acme's make_reverb_dataset at the seed's commit interleaves an infinite
`from_tensors(0).repeat()`, and tf.data then opens more iterators than it reads (about
three per requested worker): an unread iterator absorbs its whole bound, its sampler queue
(`max_in_flight`, reverb/cc/sampler.cc) plus the batches its interleave element buffers
(3, parallel_interleave_dataset_op.cc) plus a partial one. So

    strandable = workers * (B - 1) + workers * (iterators_per_worker - 1) * (M + 4B - 1)

and a learner blocked in next() with more than that drawn and undelivered has a batch.

**Granularity.** Samples leave the table in whole requests' worth of what the limiter
allows: the table fills the request at the head of its queue while the limiter commits
(reverb/cc/table.cc, TableWorkerLoop), and a sampler asks for twice its last answer, capped
by `max_in_flight` (LocalSamplerWorker from 16; the gRPC stream from 128,
reverb_service_impl.cc). With an integral spi and error_buffer, every release, every
request and every batch is then a multiple of

    g = gcd(spi, error_buffer, 16, max_in_flight, B)

and so is what each iterator holds: short of a batch it holds at most B - 1 rounded down to
a multiple of g (4 x 16 with spi 4: 12 each, 48 in all, not 60). A response also ends at
1 MiB of (compressed) chunks, which can end it at any count, so g is 1 when that cap can
bind (item size known, at most `max_in_flight` items in 1 MiB) or when the item size is
unknown.

The warm-up burst of a `sync` loop is dealt more tightly, when every iterator is read: all
of them wait with a request, none holds a sample, and Reverb's in-process sampler worker asks
for 16 samples first and doubles each answered request up to `max_in_flight`
(reverb/cc/sampler.cc, LocalSamplerWorker: `kInitialSampleBatchSize` 8, `2 * prev`). The
table answers waiting requests in turn, so the burst goes round in doubling rounds: each
worker holds C, the samples of the rounds before the one whose request reaches a batch, and
the first request of that round completes one. Uneven service only makes some worker reach
a batch sooner, so

    strandable (sync, burst) = (workers - 1) * C + B - 1

(12 workers of 256: rounds of 16, 32, 64, 128 hold C = 240, so 2895; 2 of 16: the first
request is a whole batch, so 15). The table ends a response at 1 MiB of chunks
(`kMaxSampleResponseSizeBytes`, reverb/cc/table.h), so with `item_bytes` known a request
takes at most ceil(1 MiB / item_bytes) items: seed-sized frames (63,504 bytes) answer 17 at
a time and C grows slower (3049 for 12 of 256). Chunks are compressed, so the uncompressed
size overstates the bytes and the bound errs toward `can_hang`.

**Released**, the samples drawn and undelivered when the inserting side stops, per layout:

    sync        insert blocking disabled (Acme's LocalLayout): the loop waits in next() only
                when `can_sample(B)` says a batch is there. That is the warm-up burst, e,
                when e >= B; when e < B, one insert's spi when spi >= B (e + spi); when
                both are below a batch, the loop only ever takes ready batches: it cannot hang.
    sync-ratio  one loop inserts and steps the learner (one step per B / spi inserts from
                min_size on) with a finite max_diff: at every step the workers hold e.
    async       actors insert on their own: held at max_diff they resume as soon as the
                learner draws; nothing is released once and for all. It cannot hang.
    async-lag   an actor inserts L items after it last saw the learner step, then waits on
                it. The learner takes every batch that completes, so when it blocks, what
                is held is whatever partial batches were left plus the actor's last L
                inserts: spi * L at the least, whatever error_buffer is (it only pads the
                first wait). When `spi * L < B` every wait frees less than a batch while
                the learner takes at least one, so the held samples shrink until no batch
                completes.

**Steady state of a `sync` loop.** The loop steps while a batch is there, so it spends the
warm-up surplus: once trained a while, the read iterators hold partial batches only, and the
loop enters next() whenever `can_sample` reads a batch's worth of credit the requests have
not taken yet (a gap between a response and the next request). That credit goes to the
waiting requests in turn, each answer at most `response_cap` items: when one answer can
carry a whole batch, the first request completes one; when it cannot (seed-sized frames,
17 a response against batches of 256) and more than one iterator is read, the credit is
dealt thinly and none may complete, whatever error_buffer is. The seed's own numbers on
that dataset hung so after 10,958 batches (bench/RESULTS.md), and a batch of 164, which the
warm-up arithmetic calls safe, hung too. So such a configuration is never `safe`, and its one
proven fix is a single sampling worker. With the items' size unknown (no signature on the
table, none declared) a thin answer cannot be ruled out, so a `sync` loop with more than one
worker is never called `safe` either: the reason names the item size from which answers are
thin and what the warm-up reading alone would say, and the one fix offered is the one that
holds under both readings.

**Verdict.** `safe` when released > strandable (pigeonhole: some iterator completes a batch)
or the layout cannot stop; `will_hang` when released < B (no batch can complete) or, with a
lag bound, `spi * L < B`; otherwise `can_hang`: whether a run hangs depends on how the
released samples split across the iterators' requests, a race, so the grid measures it
(bench/predict_grid.py). Nothing else in the core computes a boundary.

What it does not use: `prefetch` holds complete batches, which reach the learner, so it
strands nothing.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable

from replaywatch.model import FLOAT_MAX, LAYOUTS

SAFE, CAN_HANG, WILL_HANG = "safe", "can_hang", "will_hang"
SYNC, SYNC_RATIO, ASYNC, ASYNC_LAG = "sync", "sync-ratio", "async", "async-lag"
# Buffers of one interleave element (tf.data's parallel interleave keeps 3 results each).
INTERLEAVE_BUFFER_BATCHES = 3
# Fixes are searched up to these values; past them a knob is no fix worth printing.
MAX_ERROR_BUFFER = 10**9
MAX_POLICY_LAG = 10**6


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
    """The learner's pipeline: Acme's make_reverb_dataset and what it is built with."""

    workers: int  # num_parallel_calls
    batch_size: int
    max_in_flight: int | None = None  # max_in_flight_samples_per_worker; Acme: 2 x batch
    prefetch: int = 0
    iterators_per_worker: int = 1  # 3 for the repeat-interleave at the seed's commit
    item_bytes: int | None = None

    def __post_init__(self) -> None:
        for label, value, least in (("workers", self.workers, 1),
                                    ("batch_size", self.batch_size, 1),
                                    ("iterators_per_worker", self.iterators_per_worker, 1),
                                    ("prefetch", self.prefetch, 0)):
            if value < least:
                raise ValueError(f"{label} ({value}) must be >= {least}")

    @property
    def in_flight(self) -> int:
        return self.max_in_flight if self.max_in_flight else 2 * self.batch_size


@dataclasses.dataclass(frozen=True)
class Layout:
    """Who inserts and who waits; `max_policy_lag` only for async-lag."""

    kind: str
    max_policy_lag: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in LAYOUTS:
            raise ValueError(f"layout ({self.kind!r}) must be one of {', '.join(LAYOUTS)}")
        if self.kind == ASYNC_LAG and (self.max_policy_lag is None or self.max_policy_lag < 1):
            raise ValueError(f"async-lag needs max_policy_lag >= 1 (got {self.max_policy_lag})")


@dataclasses.dataclass(frozen=True)
class Budget:
    """What the model says, with the numbers that prove it."""

    verdict: str
    released: float | None  # drawn and undelivered when inserting stops; None: never stops
    strandable: float  # the most the iterators can hold with no batch complete
    reason: str

    @property
    def needed(self) -> float:
        """Released must exceed strandable: at least this much."""
        return self.strandable + 1

    def evidence(self) -> dict[str, float | str | None]:
        return {"verdict": self.verdict, "released_samples": self.released,
                "strandable_samples": self.strandable, "safe_from_samples": self.needed,
                "budget_reason": self.reason}


def granularity(lim: Limiter, ds: Dataset) -> int:
    """The multiple every release, request and batch is (module docstring); 1 when unsure."""
    spi, e = lim.samples_per_insert, lim.error_buffer
    if not ds.item_bytes or response_cap(ds) <= ds.in_flight:
        return 1
    if spi < 1 or not float(spi).is_integer() or not float(e).is_integer():
        return 1
    return math.gcd(int(spi), abs(int(e)), FIRST_REQUEST, ds.in_flight, ds.batch_size)


def _down(value: int, g: int) -> int:
    return value // g * g


def strandable(ds: Dataset, g: int = 1) -> float:
    """Samples the iterators can hold while none completes a batch (module docstring)."""
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
    """A `sync` loop whose read iterators can each be dealt less than a batch at a time
    (module docstring, steady state); with the item size unknown that cannot be ruled out."""
    return layout.kind == SYNC and ds.workers > 1 and (ds.item_bytes is None
                                                      or response_cap(ds) < ds.batch_size)


def thin_item_bytes(batch_size: int) -> int:
    """The least item size at which one answer (1 MiB) carries less than a batch."""
    return MAX_RESPONSE_BYTES // max(batch_size - 1, 1) + 1


def predict(lim: Limiter, ds: Dataset, layout: Layout) -> Budget:
    """The verdict for this configuration (module docstring)."""
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
                      f"smaller items: the warm-up reading, {warm.verdict.replace('_', ' ')})")
    return Budget(CAN_HANG, released, warm.strandable,
                  f"{warm.reason}; once trained, credit for one batch is dealt at most "
                  f"{response_cap(ds)} samples an answer across {ds.workers} read iterators, "
                  f"so none may complete a batch of {ds.batch_size}")


def _predict_warm_up(lim: Limiter, ds: Dataset, layout: Layout) -> Budget:
    b, e, spi = ds.batch_size, lim.error_buffer, lim.samples_per_insert
    s = strandable(ds, granularity(lim, ds))
    if layout.kind == ASYNC:
        return Budget(SAFE, None, s, "actors never wait on the learner: blocked at max_diff, "
                      "they resume as soon as it draws")
    if layout.kind == ASYNC_LAG:
        lag = layout.max_policy_lag or 0
        released = spi * lag
        if released < b:
            return Budget(WILL_HANG, released, s, f"each learner step takes {b} samples and "
                          f"lets the actors insert only {lag} x {spi:g} = {released:g}")
        return _judge(released, s, b, f"{lag} x {spi:g} inserted after the learner's last "
                      "step, before the actors wait on it again")
    if layout.kind == SYNC_RATIO:
        return _judge(e, s, b, f"error_buffer {e:g}: the credit the workers hold at each "
                      "learner step")
    if e >= b:
        burst = burst_strandable(ds) if ds.iterators_per_worker == 1 else s
        return _judge(e, burst, b, f"the warm-up burst (error_buffer {e:g}) lets "
                      f"can_sample({b}) send the loop into next()")
    if spi >= b:
        return _judge(e + spi, s, b, f"one insert releases {spi:g} >= a batch, on top of "
                      f"error_buffer {e:g}")
    return Budget(SAFE, None, s, f"error_buffer {e:g} and samples_per_insert {spi:g} are "
                  f"each below a batch of {b}: the loop only takes ready batches")


def _judge(released: float, strand: float, batch: int, why: str) -> Budget:
    if released > strand:
        return Budget(SAFE, released, strand, why)
    if released < batch:
        return Budget(WILL_HANG, released, strand, why)
    return Budget(CAN_HANG, released, strand, why)


# -- fixes the model proves ------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Fix:
    """One change the model calls safe, and what it costs."""

    knob: str  # num_parallel_calls, error_buffer, batch_size, max_policy_lag
    value: int
    was: float | int | None
    cost: str
    # A second knob that must change with this one: no single knob suffices.
    together: Fix | None = None

    def document(self) -> dict[str, object]:
        doc: dict[str, object] = {"knob": self.knob, "value": self.value, "was": self.was,
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
def fixes(lim: Limiter, ds: Dataset, layout: Layout) -> tuple[Fix, ...]:
    """For each knob, the smallest change the model calls safe (never the current value).
    Empty when the configuration is safe already.

    One knob suffices but in one case: error_buffer raises what is released without bound
    in the synchronous layouts, and a longer lag under a lag bound (where error_buffer never
    helps). The case is a race of thin answers, which only one worker removes, where one
    worker still has unread iterators (Acme's repeat-interleave) that warm-up can strand:
    then the pair, one worker together with the least error_buffer safe for it.
    """
    if predict(lim, ds, layout).verdict == SAFE:
        return ()
    if steady_race(ds, layout):
        # No error_buffer or batch size removes a race of thin answers that the grid has
        # run; one read iterator takes every answer.
        one = _fewer_workers(lim, ds, layout)
        if one is not None:
            return (one,)
        single = dataclasses.replace(ds, workers=1)
        more = _more_buffer(lim, single, layout)
        if more is None:
            return ()
        return (Fix("num_parallel_calls", 1, ds.workers,
                    f"1 sampling worker instead of {ds.workers}: less sampling throughput",
                    together=more),)
    return tuple(f for f in (_fewer_workers(lim, ds, layout), _more_buffer(lim, ds, layout),
                             _smaller_batch(lim, ds, layout), _longer_lag(lim, ds, layout))
                 if f is not None)


def _safe(lim: Limiter, ds: Dataset, layout: Layout) -> bool:
    return predict(lim, ds, layout).verdict == SAFE


def _fewer_workers(lim: Limiter, ds: Dataset, layout: Layout) -> Fix | None:
    return _largest_smaller(lim, ds, layout, "workers", "num_parallel_calls",
                            lambda w: f"{w} sampling worker(s) instead of {ds.workers}: less "
                                      "sampling throughput")


def _largest_smaller(lim: Limiter, ds: Dataset, layout: Layout, field: str, knob: str,
                     cost: Callable[[int], str]) -> Fix | None:
    """The largest value of a dataset field below its current one that the model calls safe."""
    current = getattr(ds, field)
    for value in range(current - 1, 0, -1):
        if _safe(lim, dataclasses.replace(ds, **{field: value}), layout):
            return Fix(knob, value, current, cost(value))
    return None


def _more_buffer(lim: Limiter, ds: Dataset, layout: Layout) -> Fix | None:
    e = lim.error_buffer
    value = _least(lambda v: _safe_from(lim, ds, layout, v), math.floor(e) + 1,
                   MAX_ERROR_BUFFER)
    if value is None:
        return None
    offset = lim.samples_per_insert * lim.min_size_to_sample
    rate = f", Acme's tolerance rate {value / offset:.3g}" if offset > 0 else ""
    return Fix("error_buffer", value, e,
               f"samples and inserts may drift {value} samples apart{rate}; any larger "
               "error_buffer holds too")


def _safe_from(lim: Limiter, ds: Dataset, layout: Layout, value: int) -> bool:
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


def _smaller_batch(lim: Limiter, ds: Dataset, layout: Layout) -> Fix | None:
    fix = _largest_smaller(lim, ds, layout, "batch_size", "batch_size",
                           lambda b: f"batches of {b}: a different learning step (rescale "
                                     "the learning rate)")
    if fix is None:
        return None
    below = unsafe_batches_below(lim, ds, layout, fix.value)
    if not below:
        return fix
    # Users round a batch down to a power of two, and smaller is not always safer: the
    # branch a sync loop's release takes turns on error_buffer and spi against the batch,
    # and the granularity on its gcd. Only the warning is said, not the sizes that hold:
    # the grid ran the printed value.
    return dataclasses.replace(fix, cost=f"{fix.cost}; a smaller one is not always safer: "
                                         f"{_spans(below)} can hang")


def unsafe_batches_below(lim: Limiter, ds: Dataset, layout: Layout, value: int) -> list[int]:
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


def _longer_lag(lim: Limiter, ds: Dataset, layout: Layout) -> Fix | None:
    if layout.kind != ASYNC_LAG or layout.max_policy_lag is None:
        return None
    value = _least(lambda v: _safe(lim, ds, Layout(ASYNC_LAG, v)), layout.max_policy_lag + 1,
                   MAX_POLICY_LAG)
    if value is None:
        return None
    return Fix("max_policy_lag", value, layout.max_policy_lag,
               f"actors may act up to {value} steps on a policy that old")


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


def _num(value: float | int | None) -> str:
    if value is None:
        return "-"
    return f"{value:g}" if isinstance(value, float) else str(value)
