"""The budget model on shapes outside Acme's LocalLayout: a loop that steps on a schedule, a
gate nobody declared, one batch after the interleave (TF-Agents), actors paced by what the
learner consumed. Each row is a configuration real runs of that shape hung or ran clean in
(runs by hand of shapes the grid did not have, and bench/RESULTS.md's tables per shape
family)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from replaywatch.diagnosis import budget, budget_fixes, budget_terms, budget_words
from replaywatch.diagnosis.budget import (
    AFTER_INTERLEAVE,
    CAN_HANG,
    CAN_SAMPLE,
    SAFE,
    SCHEDULE,
    WILL_HANG,
    Conservative,
    Dataset,
    JobLayout,
    Limiter,
)


def blocking_off(spi: float, min_size: int, e: float) -> Limiter:
    return Limiter.ratio(spi, min_size, e, insert_blocking=False)


SCHEDULED = JobLayout("sync", gate=SCHEDULE)
UNKNOWN = JobLayout("sync")

# (name, limiter, dataset, layout, verdict): a scheduled loop with insert blocking disabled
# holds e (plus spi per insert past min_size) at every step, dealt across the workers.
ROWS = [
    ("one_worker_asks_256_of_100_released", blocking_off(1, 1000, 100), Dataset(1, 256),
     SCHEDULED, WILL_HANG),
    ("four_workers_of_16_share_40", blocking_off(4, 1000, 40), Dataset(4, 16), SCHEDULED,
     CAN_HANG),
    ("two_workers_of_16_share_20", blocking_off(4, 1000, 20), Dataset(2, 16), SCHEDULED,
     CAN_HANG),
    ("twelve_workers_of_16_share_40", blocking_off(4, 1000, 40), Dataset(12, 16), SCHEDULED,
     CAN_HANG),
    ("twelve_workers_of_16_share_120", blocking_off(4, 1000, 120), Dataset(12, 16), SCHEDULED,
     CAN_HANG),
    ("four_workers_of_64_ask_more_than_50", blocking_off(1, 1000, 50), Dataset(4, 64),
     SCHEDULED, WILL_HANG),
    ("one_worker_of_16_holds_40", blocking_off(4, 200, 40), Dataset(1, 16), SCHEDULED, SAFE),
    # The same numbers with the gate unknown: the worse reading, never the can_sample one.
    ("unknown_gate_one_worker_asks_256_of_100", blocking_off(1, 1000, 100), Dataset(1, 256),
     UNKNOWN, WILL_HANG),
    ("unknown_gate_four_workers_of_16_share_40", blocking_off(4, 1000, 40), Dataset(4, 16),
     UNKNOWN, CAN_HANG),
    # Steps that take more than their inserts release: the credit runs out, every run.
    ("one_collect_step_of_spi_8_for_batches_of_14", Limiter.ratio(8, 200, 40),
     Dataset(1, 14), JobLayout("sync", gate=SCHEDULE, inserts_per_step=1), WILL_HANG),
    # TF-Agents' pipeline, B = 64: 32 datasets of 6 in flight, one batch after the interleave.
    ("tf_agents_32_threads_read_every_sampler", Limiter.ratio(16, 200, 256),
     Dataset(32, 64, shape=AFTER_INTERLEAVE), JobLayout("sync", gate=SCHEDULE, inserts_per_step=4),
     SAFE),
    ("tf_agents_limiter_releases_40_of_64", Limiter.ratio(8, 200, 40),
     Dataset(3, 64, shape=AFTER_INTERLEAVE), JobLayout("sync", gate=SCHEDULE, inserts_per_step=8),
     WILL_HANG),
    ("tf_agents_3_threads_read_3_of_32_samplers", Limiter.ratio(16, 200, 32),
     Dataset(3, 64, shape=AFTER_INTERLEAVE),
     JobLayout("sync", gate=SCHEDULE, inserts_per_step=4, first_step_at=202), CAN_HANG),
    # Actors paced N items ahead of what the learner consumed: e + spi x N is held.
    ("actors_8_ahead_hold_72_of_4_x_16", Limiter.ratio(4, 200, 40), Dataset(4, 16),
     JobLayout("async-lag", max_items_ahead=8), SAFE),
    ("actors_2_ahead_hold_48_of_4_x_16", Limiter.ratio(4, 200, 40), Dataset(4, 16),
     JobLayout("async-lag", max_items_ahead=2), CAN_HANG),
    ("actors_0_ahead_below_a_batch", Limiter.ratio(4, 200, 8), Dataset(1, 16),
     JobLayout("async-lag", max_items_ahead=1), WILL_HANG),
]


@pytest.mark.parametrize("name,lim,ds,layout,verdict", ROWS, ids=[r[0] for r in ROWS])
def test_shape_table(name: str, lim: Limiter, ds: Dataset, layout: JobLayout,
                     verdict: str) -> None:
    assert budget.predict(lim, ds, layout).verdict == verdict


@pytest.mark.parametrize("name,lim,ds,layout,verdict", ROWS, ids=[r[0] for r in ROWS])
def test_every_fix_of_every_shape_is_safe_by_the_model(name: str, lim: Limiter, ds: Dataset,
                                                       layout: JobLayout, verdict: str) -> None:
    from tests.test_budget import applied

    fixes = budget_fixes.fixes(lim, ds, layout)
    assert bool(fixes) == (verdict != SAFE)
    for fix in fixes:
        assert budget.predict(*applied((lim, ds, layout), fix)).verdict == SAFE, fix.text()


# What keeps each shape's `can_hang` (and a will_hang only an unknown gate gives) from a better
# verdict: the row's name -> the model's terms; every other row is certain.
TERMS = {
    "four_workers_of_16_share_40": (Conservative.WORKER_SPLIT,),
    "two_workers_of_16_share_20": (Conservative.WORKER_SPLIT,),
    "twelve_workers_of_16_share_40": (Conservative.WORKER_SPLIT,),
    "twelve_workers_of_16_share_120": (Conservative.WORKER_SPLIT,),
    # On can_sample a loop only takes ready batches: declaring the gate settles it.
    "unknown_gate_one_worker_asks_256_of_100": (Conservative.GATE_UNKNOWN,),
    # Both readings can hang, so the gate settles nothing; nor would small items, which the
    # scheduled reading still races with (4 x 12 = 48 against 40).
    "unknown_gate_four_workers_of_16_share_40": (Conservative.WORKER_SPLIT,),
    # One batch after the interleave: only the 29 datasets no thread is in keep samples.
    "tf_agents_3_threads_read_3_of_32_samplers": (Conservative.UNREAD_SAMPLERS,),
    "actors_2_ahead_hold_48_of_4_x_16": (Conservative.WORKER_SPLIT,),
}


@pytest.mark.parametrize("name,lim,ds,layout,verdict", ROWS, ids=[r[0] for r in ROWS])
def test_each_shape_names_what_keeps_its_verdict_from_a_better_one(
        name: str, lim: Limiter, ds: Dataset, layout: JobLayout, verdict: str) -> None:
    assert budget.predict(lim, ds, layout).conservative == TERMS.get(name, ())


def test_the_after_interleave_race_is_settled_by_reading_every_sampler() -> None:
    lim, ds = Limiter.ratio(16, 200, 64), Dataset(3, 64, shape=AFTER_INTERLEAVE)
    (term,) = budget_terms.explain(lim, ds, SCHEDULED)
    assert term.term == Conservative.UNREAD_SAMPLERS and term.term.race
    assert "29 of the 32 Reverb datasets" in term.why and "3 thread(s)" in term.why
    assert term.settled_by.startswith("a change: num_parallel_calls=32 (now 3)")


def test_a_loop_whose_gate_is_unknown_is_never_safe_on_the_can_sample_reading() -> None:
    # Acme's LocalLayout takes only ready batches here; a scheduled loop asks for 256 of 100.
    lim, ds = blocking_off(1, 1000, 100), Dataset(1, 256, item_bytes=16)
    assert budget.predict(lim, ds, JobLayout("sync", gate=CAN_SAMPLE)).verdict == SAFE
    b = budget.predict(lim, ds, UNKNOWN)
    assert (b.verdict, b.gate, b.released) == (WILL_HANG, SCHEDULE, 100)
    said = budget_words.reason(b)
    assert "gate is unknown" in said and "can_sample" in said and "safe" in said
    # Its fixes hold under both readings: starting later, or a larger error_buffer.
    knobs = {f.knob: f.value for f in budget_fixes.fixes(lim, ds, UNKNOWN)}
    assert knobs["error_buffer"] == 256 and knobs["first_step_at"] == 1156
    assert "num_parallel_calls" not in knobs


def test_the_seed_still_gets_one_worker_with_the_gate_unknown() -> None:
    lim = blocking_off(128, 2000, 25_600)
    frames = Dataset(12, 256, iterators_per_worker=3, item_bytes=84 * 84 * 9)
    fixes = budget_fixes.fixes(lim, frames, UNKNOWN)
    assert [(f.knob, f.value) for f in fixes] == [("num_parallel_calls", 1)]
    assert budget.predict(lim, frames, UNKNOWN).verdict == CAN_HANG


def test_a_schedule_that_outruns_its_inserts_hangs_after_the_credit_runs_out() -> None:
    # 1 insert of spi 8 a step against batches of 14: 40, 34, 28, ... below 14 at step 5.
    one = JobLayout("sync", gate=SCHEDULE, inserts_per_step=1)
    lim, ds = blocking_off(8, 200, 40), Dataset(1, 14)
    b = budget.predict(lim, ds, one)
    assert b.verdict == WILL_HANG and "below a batch by step 5" in budget_words.reason(b)
    knobs = {f.knob: f.value for f in budget_fixes.fixes(lim, ds, one)}
    assert knobs["inserts_per_step"] == 2 and "error_buffer" not in knobs
    # With a finite max_diff two inserts a step pile up 2 a step until the loop's own insert
    # blocks: only a batch its one insert pays for (8) runs for good.
    finite = Limiter.ratio(8, 200, 40)
    two = budget.predict(finite, ds, replace(one, inserts_per_step=2))
    assert two.verdict == WILL_HANG and "blocks the loop's own insert" in budget_words.reason(two)
    knobs = {f.knob: f.value for f in budget_fixes.fixes(finite, ds, one)}
    assert knobs == {"batch_size": 8}
    # A first step below min_size never gets a sample (TF-Agents' table trails its loop).
    early = budget.predict(lim, ds, JobLayout("sync", gate=SCHEDULE, first_step_at=199))
    assert (early.verdict, early.released) == (WILL_HANG, 0.0)


def test_after_the_interleave_unread_samplers_strand_and_more_threads_fix_it() -> None:
    ds = Dataset(3, 64, shape=AFTER_INTERLEAVE)
    assert (ds.samplers, ds.in_flight) == (32, 6)
    assert budget.strandable(ds) == 63 + 29 * 6
    assert budget.strandable(replace(ds, workers=32)) == 63
    lim = Limiter.ratio(16, 200, 128)
    fixes = {f.knob: f.value for f in budget_fixes.fixes(lim, ds, JobLayout("sync", gate=SCHEDULE))}
    # 63 + (32 - P) x 6 < 128 from P = 22; 4 datasets of 3 x 16 in flight, one unread, hold
    # 63 + 48 = 111 (5 of 36 hold 135).
    assert fixes["num_parallel_calls"] == 22 and fixes["cycle_length"] == 4
    assert fixes["error_buffer"] == 238


def test_bad_gate_and_pacing_are_refused_with_the_value() -> None:
    with pytest.raises(ValueError, match="gate"):
        JobLayout("sync", gate="sometimes")
    with pytest.raises(ValueError, match=r"inserts_per_step \(0\)"):
        JobLayout("sync", gate=SCHEDULE, inserts_per_step=0)
    with pytest.raises(ValueError, match="one bound"):
        JobLayout("async-lag", max_policy_lag=2, max_items_ahead=3)
    with pytest.raises(ValueError, match="shape"):
        Dataset(1, 16, shape="sideways")


# TF-Agents' DQN job: spi 8, min_size 200, error_buffer 40, batch 64, 3 threads over
# as_dataset's 32 datasets, one collect step a train step, finite max_diff.
TFA_LIM = Limiter.ratio(8, 200, 40)
TFA_DS = Dataset(3, 64, shape=AFTER_INTERLEAVE, cycle_length=32)


def chain(fix: budget_fixes.Fix) -> list[tuple[str, int, float | int | None]]:
    out, part = [], fix
    while part is not None:
        out.append((part.knob, part.value, part.was))
        part = part.together
    return out


# (name, layout the fixes are searched under, the chain of each fix): a stride nobody said or
# proved feeds no fix but one that sets it. The old model took K = B / spi = 8 and printed
# error_buffer 222 and batch_size 10 (K following the batch), and both hung at the job's K of 1.
STRIDE_ROWS = [
    # Proven a schedule by one early ask (layout.fix_model: gate and first step dropped, as
    # the fixed run is judged from its first poll): K set, and 238 > 237 strandable at
    # min_size under both gates.
    ("asked_early_gets_k_and_the_buffer_for_both_gates",
     JobLayout("sync", stride_known=False), [[("inserts_per_step", 8, None),
                                           ("error_buffer", 238, 40.0)]]),
    # The gate unknown, max_diff finite: the same (JobLayout.for_fixes).
    ("unknown_gate_and_finite_max_diff_sets_k_too", JobLayout("sync").for_fixes(TFA_LIM),
     [[("inserts_per_step", 8, None), ("error_buffer", 238, 40.0)]]),
    # Declared K of 1 (the README's TF-Agents recipe): proven single and pair fixes.
    ("declared_k_of_1_keeps_its_fixes",
     JobLayout("sync-ratio", inserts_per_step=1, first_step_at=202),
     [[("batch_size", 8, 64)], [("inserts_per_step", 8, 1), ("error_buffer", 222, 40.0)]]),
]


@pytest.mark.parametrize("name,layout,chains", STRIDE_ROWS, ids=[r[0] for r in STRIDE_ROWS])
def test_a_stride_nobody_said_feeds_only_fixes_that_set_it(
        name: str, layout: JobLayout, chains: list[list[tuple[str, int, float | int | None]]]
) -> None:
    found = budget_fixes.fixes(TFA_LIM, TFA_DS, layout)
    assert [chain(f) for f in found] == chains
    for f in found:  # each, applied with its stride, is safe by the model
        applied = layout
        lim, ds = TFA_LIM, TFA_DS
        for knob, value, _ in chain(f):
            if knob == "inserts_per_step":
                applied = replace(applied, inserts_per_step=value, stride_known=True)
            elif knob == "error_buffer":
                lim = lim.with_error_buffer(value)
            else:
                ds = replace(ds, batch_size=value)
        assert budget.predict(lim, ds, applied).verdict == SAFE


def test_a_schedule_of_unknown_stride_is_judged_at_the_one_k_that_runs() -> None:
    asked = JobLayout("sync", gate=SCHEDULE, first_step_at=202, stride_known=False)
    b = budget.predict(TFA_LIM, TFA_DS, asked)
    # 40 + 8 x 2 released at its first step, short of 64 at every K.
    assert (b.verdict, b.released, b.strandable) == (WILL_HANG, 56, 237)
    said = budget_words.reason(b)
    assert "unknown stride" in said and "a step every 8 inserts" not in said
    # Enough at its first step, it is never safe: only K = 8 runs for good.
    wide = budget.predict(TFA_LIM.with_error_buffer(238), TFA_DS, asked)
    assert (wide.verdict, wide.conservative) == (CAN_HANG, (Conservative.STRIDE_UNKNOWN,))
    (term,) = budget_terms.explain(TFA_LIM.with_error_buffer(238), TFA_DS, asked)
    assert "one step every 8 inserts" in term.why and "inserts_per_step" in term.settled_by
    # Told K = 8, the same numbers are safe.
    assert budget.predict(TFA_LIM.with_error_buffer(238), TFA_DS,
                          replace(asked, stride_known=True)).verdict == SAFE
    # With insert blocking disabled a fix at B / spi holds at every larger K: judged so.
    assert JobLayout("sync").for_fixes(blocking_off(8, 200, 40)).stride_known


def test_a_fix_found_at_a_stride_nobody_said_says_the_stride_it_rests_on() -> None:
    # Insert blocking disabled, gate unknown: the scheduled reading takes B / spi inserts a
    # step, and a fix found so holds for a scheduled loop only at that stride or more.
    lim, ds = blocking_off(8, 200, 40), TFA_DS
    found = {f.knob: f for f in budget_fixes.fixes(lim, ds, UNKNOWN)}
    assert found["error_buffer"].cost.endswith(
        "if the loop steps on a schedule, with at least 8 inserts between its steps")
    # A batch fix moves the stride its ratio pays for with it.
    batch = found["batch_size"]
    assert batch.cost.endswith(f"with at least {batch.value / 8:g} inserts between its steps")
    # Declared, nothing is added.
    said = budget_fixes.fixes(lim, ds, replace(UNKNOWN, gate=SCHEDULE))
    assert said and not any("between its steps" in f.cost for f in said)
