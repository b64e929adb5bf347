"""The budget model as a table: each row a grid cell whose verdict real runs measured.

The rows are bench/predict_grid_cells.json's boundaries with what `make bench-grid` saw
(bench/RESULTS.md, "Prediction grid"): `safe` rows never hung, `will_hang` rows hung every
run, `can_hang` rows hung in at least one run. The arithmetic is in
replaywatch/diagnosis/budget.py's docstring.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from pathlib import Path

import pytest

from replaywatch.diagnosis import budget, budget_fixes, budget_terms, budget_words
from replaywatch.diagnosis.budget import (
    CAN_HANG,
    CAN_SAMPLE,
    SAFE,
    WILL_HANG,
    Conservative,
    Dataset,
    JobLayout,
    Limiter,
)

ROOT = Path(__file__).resolve().parents[1]
LOCAL = JobLayout("sync", gate=CAN_SAMPLE)  # Acme's LocalLayout: it steps while can_sample


def cell(layout: str, workers: int, batch: int, spi: float, e: float, min_size: int = 1000,
         lag: int | None = None, iterators: int = 1
         ) -> tuple[Limiter, Dataset, JobLayout]:
    lim = Limiter.ratio(spi, min_size, e, insert_blocking=layout != budget.SYNC)
    # The grid's `sync` loop steps while can_sample (Acme's LocalLayout): its gate is known.
    gate = budget.CAN_SAMPLE if layout == budget.SYNC else None
    ds = Dataset(workers, batch, iterators_per_worker=iterators)
    return lim, ds, JobLayout(layout, lag, gate)


def sized(config: tuple[Limiter, Dataset, JobLayout], item_bytes: int
          ) -> tuple[Limiter, Dataset, JobLayout]:
    """The same configuration with its items' size known (the probe's item_bytes)."""
    lim, ds, layout = config
    return lim, Dataset(ds.workers, ds.batch_size, ds.max_in_flight, ds.prefetch,
                        ds.iterators_per_worker, item_bytes), layout


# (name, configuration, verdict, released, strandable): measured on the grid. The `sync` rows
# that the grid ran safe had small items (16 bytes), as their rows say: with the size unknown a
# thin answer cannot be ruled out (test_an_unknown_item_size_is_not_safe_for_a_sync_loop).
ROWS = [
    # One loop, finite max_diff: error_buffer is what the workers hold at each step.
    ("sync_ratio_buffer_below_a_batch_hangs_at_the_first_step",
     cell("sync-ratio", 2, 16, 4, 12), WILL_HANG, 12, 30),
    ("sync_ratio_buffer_inside_the_band_can_hang", cell("sync-ratio", 2, 16, 4, 20),
     CAN_HANG, 20, 30),
    ("sync_ratio_buffer_above_what_two_workers_hold_is_safe", cell("sync-ratio", 2, 16, 4, 40),
     SAFE, 40, 30),
    ("sync_ratio_12_workers_of_64_hang_inside_the_band", cell("sync-ratio", 12, 64, 8, 300),
     CAN_HANG, 300, 756),
    ("sync_ratio_12_workers_of_64_are_safe_above_756", cell("sync-ratio", 12, 64, 8, 800),
     SAFE, 800, 756),
    ("sync_ratio_one_worker_below_a_batch_will_hang", cell("sync-ratio", 1, 256, 128, 100),
     WILL_HANG, 100, 255),
    ("sync_ratio_acme_interleave_strands_more", cell("sync-ratio", 2, 16, 4, 260, iterators=3),
     CAN_HANG, 260, 410),
    # Insert blocking disabled, the seed's loop: the warm-up burst, only when it is a batch,
    # dealt round robin in requests of 16, 32, 64, 128 (240 each) before one reaches 256.
    ("sync_seed_numbers_one_iterator_per_worker_are_safe",
     sized(cell("sync", 12, 256, 128, 25600, 2000), 16), SAFE, 25600, 2895),
    ("sync_seed_with_a_tenth_of_the_buffer_can_hang", cell("sync", 12, 256, 128, 2560, 2000),
     CAN_HANG, 2560, 2895),
    # Two workers of 16: the first request of 16 is a whole batch, so 20 cannot strand
    # (0 of 4 grid runs hung, where two workers x 15 would have said it could).
    ("sync_a_first_request_of_a_whole_batch_cannot_strand", sized(cell("sync", 2, 16, 4, 20),
                                                                  16), SAFE, 20, 15),
    ("sync_four_workers_of_32_hold_16_each_then_complete",
     sized(cell("sync", 4, 32, 4, 100), 16), SAFE, 100, 79),
    ("sync_seed_on_acme_interleave_can_hang",
     cell("sync", 12, 256, 128, 25600, 2000, iterators=3), CAN_HANG, 25600, 39900),
    ("sync_burst_and_inserts_below_a_batch_only_take_ready_batches",
     sized(cell("sync", 12, 256, 128, 100, 2000), 16), SAFE, None, 3024),
    ("sync_one_insert_above_a_batch_releases_it_on_top", cell("sync", 4, 32, 64, 10),
     CAN_HANG, 74, 124),
    # Asynchronous.
    ("async_free_running_actors_never_hang", cell("async", 4, 16, 4, 10), SAFE, None, 60),
    # A lag bound frees spi x L after the learner's last step, whatever error_buffer is.
    ("async_lag_below_a_batch_per_step_will_hang", cell("async-lag", 4, 16, 4, 32, lag=3),
     WILL_HANG, 12, 60),
    ("async_lag_a_batch_per_step_can_hang_inside_the_band",
     cell("async-lag", 4, 16, 4, 32, lag=4), CAN_HANG, 16, 60),
    ("async_lag_twice_a_batch_per_step_still_can_hang",
     cell("async-lag", 4, 16, 4, 32, lag=8), CAN_HANG, 32, 60),
    ("async_lag_a_wide_error_buffer_does_not_help", cell("async-lag", 4, 16, 4, 6400, lag=4),
     CAN_HANG, 16, 60),
    ("async_lag_above_what_the_workers_hold_is_safe", cell("async-lag", 4, 16, 4, 32, lag=16),
     SAFE, 64, 60),
]


# Known small items: every release, request and batch is a multiple of g = gcd(spi, e, 16,
# max_in_flight, B), so an iterator holds at most B - 1 rounded down to it.
SIZED_ROWS = [
    # 4 x 16, spi 4, e 32: g = 4, each holds at most 12, so a lag of 15 (60 freed a step) is
    # safe; the grid's 8 runs of it never hung, where 4 x 15 = 60 said it could.
    ("async_lag_15_frees_more_than_four_workers_of_twelve_hold",
     sized(cell("async-lag", 4, 16, 4, 32, lag=15), 16), SAFE, 60, 48),
    ("async_lag_4_still_can_hang", sized(cell("async-lag", 4, 16, 4, 32, lag=4), 16),
     CAN_HANG, 16, 48),
    ("sync_ratio_2_workers_of_16_hold_12_each", sized(cell("sync-ratio", 2, 16, 4, 20), 16),
     CAN_HANG, 20, 24),
    # spi 1: g = 1, nothing changes.
    ("sync_ratio_spi_1_has_no_granularity", sized(cell("sync-ratio", 4, 32, 1, 64), 16),
     CAN_HANG, 64, 124),
    # Frames: 1 MiB answers 17 of them, fewer than max_in_flight, so any count can arrive.
    ("frames_end_a_response_anywhere", sized(cell("sync-ratio", 2, 16, 4, 20), 84 * 84 * 9),
     CAN_HANG, 20, 30),
]


@pytest.mark.parametrize("name,config,verdict,released,strand", SIZED_ROWS,
                         ids=[r[0] for r in SIZED_ROWS])
def test_budget_with_item_size_known(name: str, config: tuple[Limiter, Dataset, JobLayout],
                                     verdict: str, released: float | None,
                                     strand: float) -> None:
    b = budget.predict(*config)
    assert (b.verdict, b.released, b.strandable) == (verdict, released, strand)


def test_granularity_is_one_unless_every_count_shares_a_factor() -> None:
    small = Dataset(4, 16, item_bytes=16)
    assert budget.granularity(Limiter.ratio(4, 1000, 32), small) == 4
    assert budget.granularity(Limiter.ratio(4, 1000, 30), small) == 2
    assert budget.granularity(Limiter.ratio(4.5, 1000, 32), small) == 1
    assert budget.granularity(Limiter.ratio(4, 1000, 32), Dataset(4, 16)) == 1  # size unknown


@pytest.mark.parametrize("name,config,verdict,released,strand", ROWS, ids=[r[0] for r in ROWS])
def test_budget_table(name: str, config: tuple[Limiter, Dataset, JobLayout], verdict: str,
                      released: float | None, strand: float) -> None:
    b = budget.predict(*config)
    assert (b.verdict, b.released, b.strandable) == (verdict, released, strand)


def test_every_grid_cell_is_a_row_or_judged_by_the_same_arithmetic() -> None:
    # The grid's cells file is what the bench and the live-equals-offline test both read.
    cells = json.loads((ROOT / "bench" / "predict_grid_cells.json").read_text())
    assert len(cells) >= 40
    assert {c["layout"] for c in cells} == {"sync", "sync-ratio", "async", "async-lag"}
    assert {c["workers"] for c in cells} >= {1, 2, 4, 12}
    assert {c["shape"] for c in cells} == {"per-worker", "repeat"}
    assert {c["item"] for c in cells} == {"small", "frames"}


@pytest.mark.parametrize("name,config,verdict,released,strand", ROWS, ids=[r[0] for r in ROWS])
def test_every_fix_is_proven_safe_and_changes_the_value(
        name: str, config: tuple[Limiter, Dataset, JobLayout], verdict: str,
        released: float | None, strand: float) -> None:
    lim, ds, layout = config
    fixes = budget_fixes.fixes(lim, ds, layout)
    assert bool(fixes) == (verdict != SAFE)
    for fix in fixes:
        assert fix.value != fix.was
        assert budget.predict(*applied(config, fix)).verdict == SAFE, fix.text()


def applied(config: tuple[Limiter, Dataset, JobLayout], fix: budget_fixes.Fix
            ) -> tuple[Limiter, Dataset, JobLayout]:
    """The configuration with one fix's knob set to its value."""
    lim, ds, layout = config
    v = fix.value
    return {"num_parallel_calls": lambda: (lim, replace(ds, workers=v), layout),
            "cycle_length": lambda: (lim, replace(ds, cycle_length=v), layout),
            "error_buffer": lambda: (lim.with_error_buffer(v), ds, layout),
            "batch_size": lambda: (lim, replace(ds, batch_size=v), layout),
            "max_policy_lag": lambda: (lim, ds, replace(layout, max_policy_lag=v)),
            "max_items_ahead": lambda: (lim, ds, replace(layout, max_items_ahead=v)),
            "first_step_at": lambda: (lim, ds, replace(layout, first_step_at=v)),
            "inserts_per_step": lambda: (lim, ds, replace(layout, inserts_per_step=v)),
            }[fix.knob]()


def test_fixes_are_the_smallest_change_the_model_calls_safe() -> None:
    lim, ds, layout = cell("sync-ratio", 12, 64, 8, 300)
    by_knob = {f.knob: f.value for f in budget_fixes.fixes(lim, ds, layout)}
    # 4 x 63 = 252 < 300 but 5 x 63 = 315 > 300; 12 x 63 = 756 needs 757; 12 x 25 = 300.
    # A first step 58 inserts past min_size would have released 300 + 8 x 58 = 764 > 756,
    # but with nothing drawn before it max_diff (8300) stops the loop's inserts at 1037.
    assert by_knob == {"num_parallel_calls": 4, "error_buffer": 757, "batch_size": 25}
    assert budget.inserts_before_blocking(lim) == 1037
    late = budget.predict(lim, ds, replace(layout, first_step_at=1058))
    assert late.verdict == WILL_HANG
    assert "blocks its own insert at 1037" in budget_words.reason(late)


def test_an_error_buffer_fix_holds_for_every_larger_value_too() -> None:
    # Users round the value up. 28 is safe (g = gcd(4, 28, 16, 16) = 4: each of 2 workers
    # holds 12) but 29 is not (g = 1: 15 each, 30 > 29), so the fix is 30, from which every
    # value holds; 748 (g 4) and 749 (g 1) likewise give 756.
    assert _buffer_fix(sized(cell("sync-ratio", 2, 16, 4, 20), 16)) == 30
    assert _buffer_fix(sized(cell("sync-ratio", 12, 64, 8, 300), 16)) == 756


# Some 2,700 configurations, each checked at a few hundred values: a sweep for make test,
# not the edit-test loop (make test-fast keeps the two cases above).
@pytest.mark.slow
def test_every_error_buffer_fix_of_the_sweep_holds_for_every_larger_value_too() -> None:
    checked = 0
    for layout in ("sync", "sync-ratio"):
        for workers, batch, spi, e, iters, item in itertools.product(
                (2, 4, 12), (16, 32, 64, 256), (1, 4, 8, 16, 64, 128, 256), (0, 12, 40, 300),
                (1, 3), (16, 4096)):
            config = sized(cell(layout, workers, batch, spi, e, iterators=iters), item)
            value = _buffer_fix(config)
            if value is None:
                continue
            lim, ds, lay = config
            # A batch above the fix: the strand arithmetic repeats every g <= batch values, so
            # one batch is a whole period (two cost make test 8 s of CPU and found nothing more).
            above = [*range(value, value + batch + 1), *range(batch, batch + 64)]
            unsafe = [v for v in above
                      if v >= value and budget.predict(lim.with_error_buffer(v), ds,
                                                       lay).verdict != SAFE]
            assert not unsafe, (config, value, unsafe[:5])
            assert budget.predict(lim.with_error_buffer(value - 1), ds, lay).verdict != SAFE
            checked += 1
    assert checked > 200


def test_a_batch_fix_warns_where_a_smaller_batch_can_hang_again() -> None:
    # sync, 2 workers of 64, spi 64, error_buffer 40: 56 is the largest safe batch (g 8: each
    # worker holds at most 48, 96 < 104 released), but 53-55 are not (g 1) and from 40 down
    # the release is error_buffer alone (40) against 2 x (b - 1): a user who rounds 56 down
    # to 32 would hang.
    lim, ds, layout = sized(cell("sync", 2, 64, 64, 40), 16)
    (fix,) = [f for f in budget_fixes.fixes(lim, ds, layout) if f.knob == "batch_size"]
    assert fix.value == 56
    assert fix.text().endswith("a smaller one is not always safer: 53-55, 25-40 can hang)")
    for b in (*range(53, 56), *range(25, 41)):
        assert budget.predict(lim, replace(ds, batch_size=b), layout).verdict != SAFE, b
    assert budget.predict(lim, replace(ds, batch_size=48), layout).verdict == SAFE
    # Where every smaller batch is safe, nothing is added (the seed's cell: 164).
    seed = sized(cell("sync", 12, 256, 128, 25600, 2000, iterators=3), 16)
    (seed_fix,) = [f for f in budget_fixes.fixes(*seed) if f.knob == "batch_size"]
    assert seed_fix.value == 164 and "not always safer" not in seed_fix.text()
    assert budget_fixes._spans([55, 54, 53, 40, 39, 30, 20, 19, 10]) == "53-55, 39-40, 30, ..."


def _buffer_fix(config: tuple[Limiter, Dataset, JobLayout]) -> int | None:
    return next((f.value for f in budget_fixes.fixes(*config) if f.knob == "error_buffer"), None)


def test_a_lag_bound_below_a_batch_per_step_is_fixed_by_the_lag_not_the_buffer() -> None:
    # 4 workers, batch 16, spi 4, lag 3: each step frees 12 < 16, so no error_buffer helps
    # (the old fix suggested 32, which still hung), nor does a lag of 8 (grid: it hung);
    # a lag of 16 frees 64 > 4 x 15 after every step.
    lim, ds, layout = cell("async-lag", 4, 16, 4, 32, lag=3)
    by_knob = {f.knob: f.value for f in budget_fixes.fixes(lim, ds, layout)}
    assert "error_buffer" not in by_knob and "num_parallel_calls" not in by_knob
    assert by_knob["max_policy_lag"] == 16


def test_every_unsafe_grid_cell_has_a_single_knob_fix() -> None:
    for c in json.loads((ROOT / "bench" / "predict_grid_cells.json").read_text()):
        config = sized(cell(c["layout"], c["workers"], c["batch_size"], c["spi"],
                            c["error_buffer"], c["min_size"], c["lag"],
                            3 if c["shape"] == "repeat" else 1),
                       84 * 84 * 9 if c["item"] == "frames" else 16)
        if budget.predict(*config).verdict != SAFE:
            assert budget_fixes.fixes(*config), c


def test_bad_model_input_is_refused_with_the_value() -> None:
    with pytest.raises(ValueError, match=r"workers \(0\)"):
        Dataset(0, 16)
    with pytest.raises(ValueError, match="async-lag needs one bound"):
        JobLayout("async-lag")
    with pytest.raises(ValueError, match="layout"):
        JobLayout("pipelined")


def test_large_items_answer_fewer_samples_a_request_so_the_burst_strands_more() -> None:
    # 1 MiB of chunks a response: 17 frames of 63,504 bytes, so rounds of 16 then 17s.
    small = Dataset(12, 256, item_bytes=16)
    frames = Dataset(12, 256, item_bytes=84 * 84 * 9)
    assert budget.burst_strandable(small) == 11 * 240 + 255
    assert budget.burst_strandable(frames) == 11 * 254 + 255
    lim = Limiter.ratio(128, 2000, 2950, insert_blocking=False)
    assert budget.predict(lim, small, LOCAL).verdict == SAFE
    assert budget.predict(lim, frames, LOCAL).verdict == CAN_HANG


def test_a_sync_loop_dealt_thin_answers_is_never_safe_and_is_fixed_by_one_worker() -> None:
    # Seed-sized frames answer 17 a response: once trained, credit for one batch of 256 is
    # dealt across the read iterators and none may complete one, whatever error_buffer is
    # (the seed's numbers hung so after 10,958 batches; a batch of 164 hung too).
    frames = Dataset(12, 256, iterators_per_worker=3, item_bytes=84 * 84 * 9)
    lim = Limiter.ratio(128, 2000, 50_000, insert_blocking=False)  # above 39,900 strandable
    b = budget.predict(lim, frames, LOCAL)
    assert b.verdict == CAN_HANG and "17 samples an answer" in budget_words.reason(b)
    fixes = budget_fixes.fixes(lim, frames, LOCAL)
    assert [(f.knob, f.value) for f in fixes] == [("num_parallel_calls", 1)]
    # Small items: one answer carries a batch, so the warm-up arithmetic decides.
    small = Dataset(12, 256, iterators_per_worker=3, item_bytes=16)
    assert budget.predict(lim, small, LOCAL).verdict == SAFE
    # A loop that steps by count keeps error_buffer held, so frames change nothing there.
    ratio = Limiter.ratio(128, 2000, 50_000)
    assert budget.predict(ratio, frames, JobLayout("sync-ratio")).verdict == SAFE


def test_an_unknown_item_size_is_not_safe_for_a_sync_loop() -> None:
    # With no signature and no declared item_bytes, an answer may be thinner than a batch
    # (the seed's frames): the seed's numbers are not called safe, the reason says from
    # which size and what small items would read, and the one fix holds either way.
    lim, ds, layout = cell("sync", 12, 256, 128, 25600, 2000)
    b = budget.predict(lim, ds, layout)
    assert b.verdict == CAN_HANG
    said = budget_words.reason(b)
    assert "from 4,113 bytes an item" in said and "smaller items: the warm-up reading, safe" in said
    assert [(f.knob, f.value) for f in budget_fixes.fixes(lim, ds, layout)] == [
        ("num_parallel_calls", 1)]
    assert budget.thin_item_bytes(256) == 4113
    assert budget.response_cap(replace(ds, item_bytes=4113)) < 256
    assert budget.response_cap(replace(ds, item_bytes=4112)) >= 256
    # One worker, or a loop that steps by count, or actors: the size does not matter.
    assert budget.predict(lim, replace(ds, workers=1), layout).verdict == SAFE
    assert budget.predict(Limiter.ratio(128, 2000, 3200), ds, JobLayout("sync-ratio")).verdict \
        == SAFE


def test_where_one_worker_alone_still_strands_the_fix_is_a_pair() -> None:
    # Frames race past warm-up, so only one worker; on Acme's repeat-interleave one worker
    # still has two unread iterators, which warm-up's 100 can be stranded in (15 + 2 x ...):
    # one worker together with the least error_buffer that is safe for it.
    lim = Limiter.ratio(4, 1000, 100, insert_blocking=False)
    frames = Dataset(2, 64, iterators_per_worker=3, item_bytes=84 * 84 * 9)
    (fix,) = budget_fixes.fixes(lim, frames, LOCAL)
    assert (fix.knob, fix.value) == ("num_parallel_calls", 1)
    assert fix.together is not None and fix.together.knob == "error_buffer"
    one = replace(frames, workers=1)
    value = fix.together.value
    assert budget.predict(lim.with_error_buffer(value), one, LOCAL).verdict == SAFE
    assert budget.predict(lim.with_error_buffer(value - 1), one, LOCAL).verdict != SAFE
    # Neither knob alone is safe.
    assert budget.predict(lim, one, LOCAL).verdict != SAFE
    assert budget.predict(lim.with_error_buffer(value), frames, LOCAL).verdict != SAFE
    assert "together with error_buffer=" in fix.text()
    assert fix.document()["together_with"]["value"] == value  # type: ignore[index]


def test_a_loop_that_only_takes_ready_batches_at_warm_up_still_races_once_trained() -> None:
    # error_buffer and spi below a batch: warm-up never sends the loop into next() undrawn,
    # but once trained can_sample reads a batch's credit, dealt thinly: that batch is what
    # is released (the rules print it).
    lim = Limiter.ratio(1, 10, 30, insert_blocking=False)
    for item_bytes in (None, 84 * 84 * 9):
        b = budget.predict(lim, Dataset(4, 64, item_bytes=item_bytes), LOCAL)
        assert (b.verdict, b.released) == (CAN_HANG, 64)
    assert budget.predict(lim, Dataset(4, 64, item_bytes=16), LOCAL).released is None


# -- what keeps a verdict from a better one ----------------------------------------------------

SPLIT, UNREAD, THIN = (Conservative.WORKER_SPLIT, Conservative.UNREAD_SAMPLERS,
                       Conservative.THIN_ANSWERS)
SIZE, GATE = Conservative.ITEM_SIZE_UNKNOWN, Conservative.GATE_UNKNOWN
# At the pigeonhole's edge: 2 workers of 16, spi 4, min_size 100, error_buffer 24, small
# items, a scheduled loop whose runs never hung where the model says can_hang.
EDGE = sized(cell("sync-ratio", 2, 16, 4, 24, 100), 16)
EDGE_GATE_UNKNOWN = (Limiter.ratio(4, 100, 24, insert_blocking=False),
                         Dataset(2, 16, item_bytes=16), JobLayout("sync"))

# (name, configuration, verdict, released, strandable, terms): a `can_hang` names the terms
# of the model it cannot decide, first to settle first; a certain verdict names none.
TERM_ROWS = [
    # A step every 4 inserts; each insert's 4 samples go to one request, so each worker holds
    # a multiple of 4, at most 12: 24 strand only as 12 and 12, exactly what is released.
    # Answered turn by turn the workers stay 8 apart and never meet it (its runs never hung),
    # but a worker whose next request comes late misses its turn: a race, not arithmetic.
    ("two_workers_of_16_at_error_buffer_24_race_on_the_split", EDGE, CAN_HANG,
     24, 24, (SPLIT,)),
    # The same loop undeclared: declaring can_sample settles it (the first request of 16 is a
    # whole batch), a schedule leaves the race.
    ("the_edge_with_its_gate_unknown_is_settled_first_by_the_gate", EDGE_GATE_UNKNOWN,
     CAN_HANG, 24, 24, (GATE, SPLIT)),
    ("the_edge_stepping_on_can_sample_is_safe", sized(cell("sync", 2, 16, 4, 24, 100), 16),
     SAFE, 24, 15, ()),
    # The size unknown, answers may end at any count (15 each): small items would not make
    # 24 safe either, so the size is not what keeps it.
    ("the_edge_with_the_size_unknown_is_still_the_split",
     cell("sync-ratio", 2, 16, 4, 24, 100), CAN_HANG, 24, 30, (SPLIT,)),
    # 28 released: 2 x 12 with the whole-insert granularity (safe), 2 x 15 without it; what
    # saying settles comes before the race a change would.
    ("error_buffer_28_is_safe_once_the_items_are_known_small",
     cell("sync-ratio", 2, 16, 4, 28, 100), CAN_HANG, 28, 30, (SIZE, SPLIT)),
    ("the_seed_numbers_with_the_size_unknown_wait_on_the_size",
     cell("sync", 12, 256, 128, 25600, 2000), CAN_HANG, 25600, 2895, (SIZE,)),
    # Frames answer 17 at a time: past the warm-up a batch's credit is dealt thinly.
    ("seed_frames_above_the_warm_up_race_on_thin_answers",
     sized(cell("sync", 12, 256, 128, 50_000, 2000), 84 * 84 * 9), CAN_HANG, 50_000, 3049,
     (THIN,)),
    # Acme's repeat-interleave: one worker still has 2 unread iterators to keep samples.
    ("one_worker_on_acme_interleave_races_on_its_unread_iterators",
     sized(cell("sync-ratio", 1, 16, 4, 40, iterators=3), 16), CAN_HANG, 40, 196, (UNREAD,)),
    ("two_workers_on_acme_interleave_race_on_both",
     sized(cell("sync-ratio", 2, 16, 4, 260, iterators=3), 16), CAN_HANG, 260, 392,
     (SPLIT, UNREAD)),
    ("a_lag_bound_inside_the_band_races_on_the_split", cell("async-lag", 4, 16, 4, 32, lag=4),
     CAN_HANG, 16, 60, (SPLIT,)),
    # A will_hang that only the scheduled reading gives is conservative too: on can_sample
    # the loop only takes ready batches.
    ("a_will_hang_only_on_a_schedule_waits_on_the_gate",
     (Limiter.ratio(1, 1000, 100, insert_blocking=False), Dataset(1, 256, item_bytes=16),
      JobLayout("sync")), WILL_HANG, 100, 255, (GATE,)),
    ("a_will_hang_with_the_gate_known_is_certain", cell("sync-ratio", 2, 16, 4, 12), WILL_HANG,
     12, 30, ()),
    ("a_safe_verdict_is_certain", cell("sync-ratio", 2, 16, 4, 40), SAFE, 40, 30, ()),
]


@pytest.mark.parametrize("name,config,verdict,released,strand,terms", TERM_ROWS,
                         ids=[r[0] for r in TERM_ROWS])
def test_a_verdict_names_the_terms_that_keep_it_from_a_better_one(
        name: str, config: tuple[Limiter, Dataset, JobLayout], verdict: str,
        released: float | None, strand: float, terms: tuple[Conservative, ...]) -> None:
    b = budget.predict(*config)
    assert (b.verdict, b.released, b.strandable, b.conservative) == (verdict, released, strand,
                                                                      terms)
    assert budget_words.evidence(b)["conservative"] == [t.value for t in terms]


def test_two_workers_of_16_at_error_buffer_24_sit_at_the_pigeonholes_edge() -> None:
    lim, ds, layout = EDGE
    assert budget.granularity(lim, ds) == 4  # gcd(spi 4, error_buffer 24, 16, 32, 16)
    assert budget.strandable(ds, 4) == 2 * 12 == budget.predict(*EDGE).released
    # 28 would be safe at g 4 but 29 is not (g 1: 2 x 15), so the buffer fix is 30.
    by_knob = {f.knob: f.value for f in budget_fixes.fixes(*EDGE)}
    assert by_knob == {"num_parallel_calls": 1, "error_buffer": 30, "batch_size": 12,
                       "first_step_at": 101}


def test_every_grid_can_hang_names_a_term_and_no_safe_cell_does() -> None:
    for c in json.loads((ROOT / "bench" / "predict_grid_cells.json").read_text()):
        config = sized(cell(c["layout"], c["workers"], c["batch_size"], c["spi"],
                            c["error_buffer"], c["min_size"], c["lag"],
                            3 if c["shape"] == "repeat" else 1),
                       84 * 84 * 9 if c["item"] == "frames" else 16)
        b = budget.predict(*config)
        assert bool(b.conservative) == (b.verdict == CAN_HANG), (c, b.conservative)


# (name, configuration, term, in its words, in what settles it): each term says why with the
# configuration's numbers; a race is settled by a fix the model proves, the fix that removes
# the race itself first, and a term not told by declaring it.
WORD_ROWS = [
    ("the_split_names_its_workers_numbers_and_one_worker", EDGE, SPLIT,
     "2 batching workers' requests", "a change: num_parallel_calls=1 (now 2) or another fix"),
    ("unread_iterators_are_counted_and_settled_by_a_buffer_for_one_worker",
     sized(cell("sync-ratio", 1, 16, 4, 40, iterators=3), 16), UNREAD,
     "2 sampling iterators the learner does not read (3 a worker", "a change: error_buffer="),
    ("thin_answers_say_how_many_items_an_answer_carries",
     sized(cell("sync", 12, 256, 128, 50_000, 2000), 84 * 84 * 9), THIN,
     "at most 17 items (1 MiB of 63,504-byte items)", "a change: num_parallel_calls=1 (now 12)"),
    # 4,112-byte items answer 256 at a time; from 4,113 an answer is thinner than a batch.
    ("an_unknown_size_says_the_largest_that_reads_better",
     cell("sync", 12, 256, 128, 25600, 2000), SIZE,
     "items of at most 4,112 bytes are safe", "--item-bytes"),
    # A scheduled loop is never dealt thin answers: only the granularity waits on the size
    # (32,767 bytes: 33 items an answer, more than 32 in flight).
    ("an_unknown_size_on_a_schedule_says_nothing_of_thin_answers",
     cell("sync-ratio", 2, 16, 4, 28, 100), SIZE,
     "not in whole inserts; items of at most 32,767 bytes are safe", "TrainerProbe(item_bytes"),
    ("an_unknown_gate_says_the_other_readings_verdict", EDGE_GATE_UNKNOWN, GATE,
     "a loop that steps only while can_sample(batch) is safe", "--gate can-sample"),
]


@pytest.mark.parametrize("name,config,term,why,settles", WORD_ROWS,
                         ids=[r[0] for r in WORD_ROWS])
def test_each_term_says_why_and_what_settles_it(
        name: str, config: tuple[Limiter, Dataset, JobLayout], term: Conservative, why: str,
        settles: str) -> None:
    (explained,) = [e for e in budget_terms.explain(*config) if e.term == term]
    assert why in explained.why and settles in explained.settled_by
    assert explained.document()["race"] == term.race
