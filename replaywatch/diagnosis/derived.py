"""The derived numbers shown next to each table: limiter state and rates."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from replaywatch.diagnosis import ratelimiter, rates
from replaywatch.model import TableSnapshot


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
    recent = window[rates.last_reset_index(window) :]
    return TableDerived(
        cursor=ratelimiter.cursor(latest),
        sample_headroom=ratelimiter.sample_headroom(latest),
        insert_headroom=ratelimiter.insert_headroom(latest),
        can_sample=ratelimiter.can_sample(latest, 1),
        can_insert=ratelimiter.can_insert(latest, 1),
        insert_blocking_disabled=ratelimiter.is_insert_blocking_disabled(latest),
        warming_up=ratelimiter.is_warming_up(latest),
        insert_rate=rates.insert_rate(recent),
        sample_rate=rates.sample_rate(recent),
        observed_samples_per_insert=rates.observed_samples_per_insert(recent),
        waiting_for_inserts_ms_per_s=rates.waiting_growth(recent, "waiting_for_inserts"),
        waiting_for_sampling_ms_per_s=rates.waiting_growth(recent, "waiting_for_sampling"),
        window_s=recent[-1].observed_at - recent[0].observed_at,
    )
