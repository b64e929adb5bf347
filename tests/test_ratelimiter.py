"""Reverb's rate-limiter arithmetic and history windows, on hand-computed numbers.

The rules are tested as tables in their family's tests/test_rules_<family>.py; these pin the
formulas they rest on, so a change in one shows here with the numbers, not only as a changed
verdict.
"""

from __future__ import annotations

from typing import Any

import pytest

from replaywatch.diagnosis import ratelimiter as lim
from replaywatch.diagnosis import window as win
from replaywatch.model import FLOAT_MAX, TableSnapshot
from tests.builders import SEED_LIMITER, probe_history, seconds, table_history

# SampleToInsertRatio(spi=1, min_size=10, error_buffer=5): min_diff 5, max_diff 15, slack 10.
BLOCKING = {"spi": 1.0, "min_size": 10, "min_diff": 5.0, "max_diff": 15.0}


def one(inserts: int, samples: int, **kw: Any) -> TableSnapshot:
    """One snapshot of the BLOCKING limiter."""
    return table_history([1000.0], [inserts], [samples], **{**BLOCKING, **kw})[-1]


def test_the_cursor_is_inserts_times_spi_minus_samples() -> None:
    t = one(30, 12)
    assert lim.cursor(t) == 30 * 1.0 - 12
    assert lim.sample_headroom(t) == 18 - 5 and lim.insert_headroom(t) == 15 - 18
    assert lim.limiter_slack(t) == 10 and lim.error_buffer(t) == 1.0 * 10 - 5


@pytest.mark.parametrize("samples,can_sample,can_insert,samples_needed", [
    (24, True, True, 0),    # cursor 6: a sample leaves 5 >= min_diff; 6 + 1 <= max_diff 15
    (25, False, True, 0),   # cursor 5: a sample would take it below min_diff
    (15, True, False, 1),   # cursor 15: one more insert would pass max_diff
    (13, True, False, 3),   # cursor 17: three samples before the next insert
])
def test_can_sample_and_can_insert_follow_reverbs_rate_limiter(
        samples: int, can_sample: bool, can_insert: bool, samples_needed: int) -> None:
    t = one(30, samples, size=30)  # past min_size_to_sample: the cursor decides
    assert lim.can_sample(t, 1) is can_sample
    assert lim.can_insert(t, 1) is can_insert
    assert lim.samples_to_insert(t) == samples_needed


def test_below_min_size_inserts_pass_and_samples_wait() -> None:
    t = one(3, 0, size=3)
    assert lim.is_warming_up(t) and lim.can_insert(t, 1) and not lim.can_sample(t, 1)


def test_inserts_to_sample_counts_what_the_cursor_lacks_and_what_the_table_lacks() -> None:
    assert lim.inserts_to_sample(one(30, 25, size=30)) == 1  # cursor 5 -> 6
    assert lim.inserts_to_sample(one(3, 0, size=3)) == 7  # min_size 10, 3 items


def test_the_seed_layout_is_synchronous_and_sample_limited() -> None:
    t = table_history([1000.0], [12_000], [12_000 * 128 - 230_400], **SEED_LIMITER)[-1]
    assert t.rate_limiter.max_diff == FLOAT_MAX
    assert lim.is_insert_blocking_disabled(t) and lim.is_sample_limited(t)
    assert lim.error_buffer(t) == 25_600 and lim.spi_tolerance(t) == pytest.approx(0.1)


def test_stranded_samples_are_drawn_minus_delivered_minus_prefetched() -> None:
    times = seconds(3)
    table = table_history(times, [100] * 3, [40, 60, 76], **BLOCKING)
    probe = probe_history(times, 2, blocked_for=[1.0, 2.0, 3.0], workers=8, batch_size=8)
    stranded = lim.stranded_samples(table, [probe[-1]])
    assert stranded is not None
    assert (stranded.drawn, stranded.delivered, stranded.samples) == (76.0, 16.0, 60.0)


def test_derive_measures_rates_after_the_newest_reset_only() -> None:
    history = table_history(seconds(5), [10, 20, 3, 13, 23], [0, 10, 0, 10, 20], **BLOCKING)
    derived = lim.derive(history)
    assert derived.insert_rate == 10.0 and derived.window_s == 2.0
    assert derived.cursor == 23 - 20
    with pytest.raises(ValueError):
        lim.derive([])


def test_a_counter_drop_is_a_reset_not_a_negative_increase() -> None:
    assert win.counter_increase([(0, 10), (1, 15), (2, 3), (3, 8)]) == 5 + 3 + 5
    assert win.rate([(0, 0), (2, 10)]) == 5.0 and win.rate([(0, 1)]) is None


def test_idle_for_is_from_the_first_poll_that_saw_the_final_value() -> None:
    history = table_history(seconds(6), [1, 2, 3, 3, 3, 3], [0, 0, 1, 1, 1, 1], **BLOCKING)
    assert win.idle_for(history, win.inserts_of, win.samples_of) == 3.0
    assert win.span(win.window(history, 1003.5)) == 2.0  # from 1003, one point early
    assert win.covers(history, 1000.0) and not win.covers(history, 999.0)
