"""Reverb's rate-limiter arithmetic, rebuilt from one `TableInfo`, and the numbers behind fixes.

Reverb keeps a cursor per table, its sample credit (the "error" of the ratio):

    cursor = inserts * samples_per_insert - samples

A sample of `n` items may proceed once the table holds `min_size_to_sample`
items and `cursor - n >= min_diff`; an insert of `n` items may proceed while the
table is still below `min_size_to_sample` or `cursor + n * samples_per_insert
<= max_diff` (reverb/cc/rate_limiter.cc, CanSample / CanInsert). The server
counts deletes to know the table's size; `TableInfo` does not report them, so
`current_size` stands in for `inserts - deletes` (they are equal until a
`reset`, which zeroes both anyway).

Reverb's `SampleToInsertRatio(samples_per_insert, min_size_to_sample,
error_buffer)` sets, with `offset = samples_per_insert * min_size_to_sample`:

    min_diff = offset - error_buffer        max_diff = offset + error_buffer

so its slack `max_diff - min_diff` is `2 * error_buffer`. Acme computes
`error_buffer = min_replay_size * samples_per_insert * tolerance_rate`; the seed
job: 2000 * 128 * 0.1 = 25600, min_diff = 256000 - 25600 = 230400. Acme's
synchronous layout then rewrites `max_diff` to float max: inserts never wait,
and sampling is still held at `min_diff`.

Parallel batching workers each hold part of a batch; what they hold, drawn and delivered
to nobody, is what `stranded_samples` measures after the fact. Whether a configuration can
hang at all is the budget model's (`replaywatch.diagnosis.budget`): nothing here computes a
boundary. `derive` gathers the values shown next to each table.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from replaywatch.diagnosis.window import (
    insert_rate,
    last_reset_index,
    observed_samples_per_insert,
    sample_rate,
    waiting_growth,
)
from replaywatch.model import FLOAT_MAX, ProbeSnapshot, TableSnapshot

# -- the limiter: cursor, headroom, can_sample / can_insert ------------------------------------

def cursor(table: TableSnapshot) -> float:
    """`inserts * samples_per_insert - samples`: the limiter's sample credit."""
    rl = table.rate_limiter
    return rl.inserts * rl.samples_per_insert - rl.samples


def sample_headroom(table: TableSnapshot) -> float:
    """Samples the limiter would still allow now: `cursor - min_diff`."""
    return cursor(table) - table.rate_limiter.min_diff


def insert_headroom(table: TableSnapshot) -> float:
    """Sample-units of inserts still allowed: `max_diff - cursor`."""
    return table.rate_limiter.max_diff - cursor(table)


def is_insert_blocking_disabled(table: TableSnapshot) -> bool:
    """max_diff at float max: a synchronous layout where inserts never wait."""
    return table.rate_limiter.max_diff >= FLOAT_MAX * 0.5


def can_sample(table: TableSnapshot, num_samples: int = 1) -> bool:
    """Reverb's `RateLimiter::CanSample` on this snapshot."""
    if num_samples <= 0:
        raise ValueError(f"num_samples ({num_samples}) must be > 0")
    if table.current_size < table.rate_limiter.min_size_to_sample:
        return False
    return cursor(table) - num_samples >= table.rate_limiter.min_diff


def can_insert(table: TableSnapshot, num_inserts: int = 1) -> bool:
    """Reverb's `RateLimiter::CanInsert` on this snapshot."""
    if num_inserts <= 0:
        raise ValueError(f"num_inserts ({num_inserts}) must be > 0")
    rl = table.rate_limiter
    if table.current_size + num_inserts <= rl.min_size_to_sample:
        return True
    return cursor(table) + num_inserts * rl.samples_per_insert <= rl.max_diff


def limiter_slack(table: TableSnapshot) -> float:
    """`max_diff - min_diff`: how far samples and inserts may run apart."""
    return table.rate_limiter.max_diff - table.rate_limiter.min_diff


def is_queue(table: TableSnapshot) -> bool:
    """Reverb's `Table.queue`: the Queue limiter (one sample per insert, min_size 1, min_diff
    0, max_diff the table's size), so every item is sampled once, in order."""
    rl = table.rate_limiter
    return (rl.samples_per_insert == 1.0 and rl.min_size_to_sample == 1
            and rl.min_diff == 0.0 and rl.max_diff == float(table.max_size))


def is_warming_up(table: TableSnapshot) -> bool:
    """Below `min_size_to_sample`: sampling waits by design, not a stall."""
    return table.current_size < table.rate_limiter.min_size_to_sample


# -- the numbers behind the fixes: slack, tolerance, stranded samples --------------------------

def is_sample_limited(table: TableSnapshot) -> bool:
    """A finite min_diff: the limiter holds samples back (MinSize's -float max does not)."""
    return table.rate_limiter.min_diff > -FLOAT_MAX * 0.5


def error_buffer(table: TableSnapshot) -> float:
    """`samples_per_insert * min_size_to_sample - min_diff`, the lower half of the slack."""
    rl = table.rate_limiter
    return rl.samples_per_insert * rl.min_size_to_sample - rl.min_diff


def spi_tolerance(table: TableSnapshot) -> float | None:
    """Acme's `samples_per_insert_tolerance_rate`: error_buffer / (spi * min_size)."""
    rl = table.rate_limiter
    offset = rl.samples_per_insert * rl.min_size_to_sample
    if offset <= 0 or error_buffer(table) <= 0:
        return None
    return error_buffer(table) / offset


def inserts_to_sample(table: TableSnapshot, num_samples: int = 1) -> int:
    """Inserts needed before `num_samples` more may be sampled (`cursor - n >= min_diff`)."""
    rl = table.rate_limiter
    below_min = max(0, rl.min_size_to_sample - table.current_size)
    if rl.samples_per_insert <= 0:
        return below_min
    short = rl.min_diff + num_samples - cursor(table)
    return max(below_min, math.ceil(short / rl.samples_per_insert)) if short > 0 else below_min


def samples_to_insert(table: TableSnapshot) -> int:
    """Samples needed before one more insert passes (`cursor + spi <= max_diff`)."""
    rl = table.rate_limiter
    return max(0, math.ceil(cursor(table) + rl.samples_per_insert - rl.max_diff))


# Acme's make_reverb_dataset before google-deepmind/acme dea9307 (June 2022) interleaves an
# infinite `from_tensors(0).repeat()`, and tf.data then creates about three sampling iterators
# per requested worker ("36 of them being created by default instead of 12").
ITERATORS_PER_WORKER_UP_TO = 3


@dataclasses.dataclass(frozen=True)
class Stranded:
    """Samples the table handed out that no learner has received as a batch."""

    samples: float  # drawn - delivered - held
    drawn: float  # table samples since the iterators started
    delivered: float  # sum of batches_retrieved * batch_size
    held: float  # what prefetch buffers of iterators not blocked in next() may hold
    capacity: float | None  # what the requested workers' partial batches hold: workers * batch
    basis: str  # "since_iterator_start" or "table_lifetime"
    workers: int | None = None  # num_parallel_calls requested, summed over the iterators

    @property
    def sampling_iterators_up_to(self) -> int | None:
        """How many sampling iterators can exist behind `workers` (Acme's interleave: ~3x)."""
        return None if self.workers is None else self.workers * ITERATORS_PER_WORKER_UP_TO

    @property
    def beyond_requested_workers(self) -> bool:
        """More is stranded than the requested workers' partial batches can hold: more
        sampling iterators (or sampler queues) exist than `num_parallel_calls` says."""
        return self.capacity is not None and self.samples > self.capacity

    def evidence(self) -> dict[str, float | int | str | bool | None]:
        """The arithmetic as a finding shows it."""
        return {"stranded_samples": self.samples, "drawn": self.drawn,
                "delivered": self.delivered, "prefetched": self.held,
                "stranded_basis": self.basis, "workers": self.workers,
                "sampling_iterators_up_to": self.sampling_iterators_up_to,
                "stranded_beyond_requested_workers": self.beyond_requested_workers}


def stranded_samples(
    history: Sequence[TableSnapshot], probes: Sequence[ProbeSnapshot]
) -> Stranded | None:
    """`drawn - batches * batch_size - prefetched`, over every iterator reading the table.

    `drawn` counts from the table snapshot taken just before the first iterator
    started; if history does not reach back that far, from the table's own
    start (true in a synchronous layout, where the trainer owns the server). An
    iterator blocked in `next()` has empty buffers (a FIFO chain whose consumer
    waits holds nothing), so only the others' `prefetch_size` batches count.
    None when a batch size is unknown.

    Any number is evidence: `workers * batch_size` is not a bound. Acme's
    make_reverb_dataset (before acme dea9307) runs ~3 sampling iterators per
    requested worker, and each iterator's sampler queue holds samples too: on the
    seed's configuration ~32,000 samples sat undelivered behind 12 workers of 256.

    Only meaningful while next() blocks: a healthy synchronous loop with 12
    workers, batch 256 and 2 * 256 in-flight samples per worker keeps ~12,000
    samples drawn and undelivered (measured on Reverb 0.14: completed batches
    in interleave buffers, sampler queues, partial batches). Once the learner
    waits, every completed batch reaches it, so what is left is partial batches.
    """
    shapes = [p.pipeline for p in probes]
    if not history or not probes or any(s.batch_size is None for s in shapes):
        return None
    start = min(p.started_at for p in probes)
    before = [s for s in history if s.observed_at <= start]
    base, basis = (before[-1].rate_limiter.samples, "since_iterator_start") if before else (
        0, "table_lifetime")
    drawn = float(history[-1].rate_limiter.samples - base)
    delivered = float(sum(p.batches_retrieved * (s.batch_size or 0)
                          for p, s in zip(probes, shapes, strict=True)))
    held = float(sum((s.prefetch_size or 0) * (s.batch_size or 0)
                     for p, s in zip(probes, shapes, strict=True) if not p.blocked_in_next))
    capacity, workers = None, None
    if all(s.num_parallel_calls for s in shapes):
        workers = sum(s.num_parallel_calls or 0 for s in shapes)
        capacity = float(sum((s.num_parallel_calls or 0) * (s.batch_size or 0) for s in shapes))
    samples = max(0.0, drawn - delivered - held)  # buffers hold less than they could
    return Stranded(samples, drawn, delivered, held, capacity, basis, workers)


# -- the derived values shown next to each table ---------------------------------------------

@dataclasses.dataclass(frozen=True)
class TableDerived:
    """What one table's latest snapshot and its recent window imply."""

    cursor: float
    sample_headroom: float
    insert_headroom: float
    can_sample: bool  # one item, as Reverb's `can_sample(1)`
    can_insert: bool
    insert_blocking_disabled: bool
    warming_up: bool
    insert_rate: float | None  # items/s over the rate window
    sample_rate: float | None
    observed_samples_per_insert: float | None
    waiting_for_inserts_ms_per_s: float | None
    waiting_for_sampling_ms_per_s: float | None
    window_s: float


def derive(window: Sequence[TableSnapshot]) -> TableDerived:
    """Derived values for the newest snapshot of a non-empty, time-ordered window.

    Rates use only the part of the window after the newest counter reset, so a
    restarted Reverb server never shows a negative or inflated rate.
    """
    if not window:
        raise ValueError("derive needs at least one snapshot")
    latest = window[-1]
    recent = window[last_reset_index(window) :]
    return TableDerived(
        cursor=cursor(latest),
        sample_headroom=sample_headroom(latest),
        insert_headroom=insert_headroom(latest),
        can_sample=can_sample(latest, 1),
        can_insert=can_insert(latest, 1),
        insert_blocking_disabled=is_insert_blocking_disabled(latest),
        warming_up=is_warming_up(latest),
        insert_rate=insert_rate(recent),
        sample_rate=sample_rate(recent),
        observed_samples_per_insert=observed_samples_per_insert(recent),
        waiting_for_inserts_ms_per_s=waiting_growth(recent, "waiting_for_inserts"),
        waiting_for_sampling_ms_per_s=waiting_growth(recent, "waiting_for_sampling"),
        window_s=recent[-1].observed_at - recent[0].observed_at,
    )
