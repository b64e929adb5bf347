"""Reverb's rate-limiter arithmetic, rebuilt from one `TableInfo`.

Reverb keeps a cursor per table:

    cursor = inserts * samples_per_insert - samples

A sample of `n` items may proceed once the table holds `min_size_to_sample`
items and `cursor - n >= min_diff`; an insert of `n` items may proceed while the
table is still below `min_size_to_sample` or `cursor + n * samples_per_insert
<= max_diff` (reverb/cc/rate_limiter.cc, CanSample / CanInsert). The server
counts deletes to know the table's size; `TableInfo` does not report them, so
`current_size` stands in for `inserts - deletes` (they are equal until a
`reset`, which zeroes both anyway).
"""

from __future__ import annotations

from replaywatch.model import FLOAT_MAX, TableSnapshot


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


def is_warming_up(table: TableSnapshot) -> bool:
    """Below `min_size_to_sample`: sampling waits by design, not a stall."""
    return table.current_size < table.rate_limiter.min_size_to_sample
