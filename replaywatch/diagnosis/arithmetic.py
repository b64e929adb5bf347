"""The numbers behind the fixes: slack, stranded samples, the limiter's tolerance.

Reverb's `SampleToInsertRatio(samples_per_insert, min_size_to_sample,
error_buffer)` sets, with `offset = samples_per_insert * min_size_to_sample`:

    min_diff = offset - error_buffer        max_diff = offset + error_buffer

so its slack `max_diff - min_diff` is `2 * error_buffer`. Acme computes
`error_buffer = min_replay_size * samples_per_insert * tolerance_rate`; the seed
job: 2000 * 128 * 0.1 = 25600, min_diff = 256000 - 25600 = 230400. Acme's
synchronous layout then rewrites `max_diff` to float max: inserts never wait,
and sampling is still held at `min_diff`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from replaywatch.diagnosis.ratelimiter import cursor
from replaywatch.model import FLOAT_MAX, ProbeSnapshot, TableSnapshot


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


def required_slack(workers: int, batch_size: int, samples_per_insert: float) -> float:
    """`workers * (batch_size - 1) + samples_per_insert`: slack that rules out stranding.

    Each of `workers` batching workers can hold `batch_size - 1` samples without
    finishing a batch, so `workers * (batch_size - 1)` samples can be drawn and
    delivered to nobody. One more sample completes some batch; to be sure it can
    be drawn, the cursor must reach `min_diff + workers * (batch_size - 1) + 1`
    while inserts are blocked, and inserts stop as soon as one more insert would
    pass max_diff, i.e. up to `samples_per_insert` below it.
    """
    return workers * (batch_size - 1) + samples_per_insert


def error_buffer_for(slack: float) -> int:
    """The SampleToInsertRatio error_buffer giving at least this slack (slack = 2x)."""
    return math.ceil(slack / 2)


def workers_within(slack: float, batch_size: int, samples_per_insert: float) -> int:
    """The most num_parallel_calls this slack keeps safe (at least 1)."""
    if batch_size <= 1:
        return 1
    return max(1, math.floor((slack - samples_per_insert) / (batch_size - 1)))


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


@dataclasses.dataclass(frozen=True)
class Stranded:
    """Samples the table handed out that no learner has received as a batch."""

    samples: float  # drawn - delivered - held
    drawn: float  # table samples since the iterators started
    delivered: float  # sum of batches_retrieved * batch_size
    held: float  # what prefetch buffers of iterators not blocked in next() may hold
    capacity: float | None  # most that parallel workers can hold: sum of workers * batch
    basis: str  # "since_iterator_start" or "table_lifetime"


def stranded_samples(
    history: Sequence[TableSnapshot], probes: Sequence[ProbeSnapshot]
) -> Stranded | None:
    """`drawn - batches * batch_size - prefetched`, over every iterator reading the table.

    `drawn` counts from the table snapshot taken just before the first iterator
    started; if history does not reach back that far, from the table's own
    start (true in a synchronous layout, where the trainer owns the server). An
    iterator blocked in `next()` has empty buffers (a FIFO chain whose consumer
    waits holds nothing), so only the others' `prefetch_size` batches count.
    None when a batch size is unknown or the estimate exceeds what the workers
    can hold (then the basis was wrong, e.g. samples from an earlier trainer).

    Only meaningful while next() blocks: a healthy synchronous loop with 12
    workers, batch 256 and 2 * 256 in-flight samples per worker keeps ~12,000
    samples drawn and undelivered (measured on Reverb 0.14: completed batches
    in interleave buffers, sampler queues, partial batches). Once the learner
    waits, every completed batch reaches it, so what is left is partial batches:
    at most `workers * (batch_size - 1)`.
    """
    if not history or not probes or any(p.batch_size is None for p in probes):
        return None
    start = min(p.started_at for p in probes)
    before = [s for s in history if s.observed_at <= start]
    base, basis = (before[-1].rate_limiter.samples, "since_iterator_start") if before else (
        0, "table_lifetime")
    drawn = float(history[-1].rate_limiter.samples - base)
    delivered = float(sum(p.batches_retrieved * (p.batch_size or 0) for p in probes))
    held = float(sum((p.prefetch_size or 0) * (p.batch_size or 0)
                     for p in probes if not p.blocked_in_next))
    capacity = None
    if all(p.num_parallel_calls for p in probes):
        capacity = float(sum((p.num_parallel_calls or 0) * (p.batch_size or 0) for p in probes))
    samples = max(0.0, drawn - delivered - held)  # buffers hold less than they could
    if capacity is not None and samples > capacity:
        return None
    return Stranded(samples, drawn, delivered, held, capacity, basis)
