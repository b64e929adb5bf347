"""The prediction grid's own arithmetic: what agreement means, how a fix becomes a cell, and
the table it writes (no runs: the runs are `make bench-grid`'s)."""

from __future__ import annotations

from bench.predict_grid import (
    PAIR_CELLS,
    Cell,
    _buffer_fix,
    _fix_values,
    agrees,
    buffer_values,
    default_cells,
    render,
    render_batch_warnings,
    render_buffer_fixes,
)
from replaywatch.diagnosis import budget, budget_fixes


def test_agreement_is_strict_for_safe_and_will_hang_and_needs_a_hang_for_can_hang() -> None:
    assert agrees("safe", 0, 2) and not agrees("safe", 1, 2)
    assert agrees("will_hang", 2, 2) and not agrees("will_hang", 1, 2)
    assert agrees("can_hang", 1, 4) and not agrees("can_hang", 0, 4)


def test_a_fix_becomes_the_cell_it_names_and_the_workload_flags_follow() -> None:
    cell = Cell("async-lag", 4, 16, 4.0, 32.0, lag=3)
    fixed = cell.fixed(budget_fixes.Fix(budget_fixes.Knob.MAX_POLICY_LAG, 16, 3,
                                        budget_fixes.Change.LONGER_LAG))
    assert fixed.lag == 16 and fixed.predict().verdict == budget.SAFE
    assert fixed.args()[-2:] == ["--max-policy-lag", "16"]
    fewer = Cell("sync-ratio", 12, 64, 8.0, 300.0).fixed(
        budget_fixes.Fix(budget_fixes.Knob.NUM_PARALLEL_CALLS, 4, 12,
                         budget_fixes.Change.FEWER_WORKERS))
    assert fewer.workers == 4 and "--workers" in fewer.args()


def test_the_cells_file_loads_into_cells_with_unique_names() -> None:
    cells = default_cells()
    assert len({c.name for c in cells}) == len(cells) >= 40


def test_the_table_counts_what_it_claims() -> None:
    run_ok = {"outcome": "ran", "live": "safe", "live_at": None}
    run_hung = {"outcome": "hang", "hang_since": 10.0, "live": "can_hang", "live_at": 9.0,
                "cpus": "one"}
    rows = [
        {"cell": "a", "predicted": "safe", "released": 40.0, "strandable": 30.0,
         "runs": [run_ok, run_ok], "hangs": 0, "agrees": True, "live_equals_offline": True,
         "fixes": []},
        {"cell": "b", "predicted": "can_hang", "released": 20.0, "strandable": 30.0,
         "runs": [run_hung], "hangs": 1, "agrees": True, "live_equals_offline": True,
         "fixes": [{"fix": "error_buffer=31", "cell": "b'", "model": "safe",
                    "outcome": "hang", "held": False}]},
    ]
    text = render(rows, 60.0)
    assert "agreement: **2/2** cells (100%)" in text
    assert "hung runs predicted before the hang began: **1/1**" in text
    assert "fixes that held: **0/1**" in text and "- b': error_buffer=31 -> hang" in text
    assert "| b | can_hang | 20 | 30 | 1 | 1 (0 + 1) |" in text


def test_an_error_buffer_fix_is_run_at_its_value_the_next_and_a_round_one() -> None:
    assert buffer_values(30) == [30, 31, 100]
    assert buffer_values(3060) == [3060, 3061, 3100]
    assert buffer_values(99) == [99, 100]
    rows = [{"cell": "c", "printed": "error_buffer=30", "value": "error_buffer=31",
             "model": "safe", "outcomes": ["ran", "hang"]},
            {"cell": "c", "printed": "error_buffer=30", "value": "error_buffer=100",
             "model": "safe", "outcomes": ["ran"]}]
    text = render_buffer_fixes(rows, 60.0)
    assert "(2 configurations, 3 runs: 1.0 min" in text
    assert "runs that did not hang: **2/3**" in text
    assert "| c | error_buffer=30 | error_buffer=31 | safe | 2 | **1** |" in text
    assert "| c | error_buffer=30 | error_buffer=100 | safe | 1 | 0 |" in text


def test_a_pair_fix_is_run_with_its_error_buffer_moved_and_its_worker_kept() -> None:
    (cell,) = [c for c in PAIR_CELLS if c.workers == 4 and c.batch_size == 32]
    (fix,) = budget_fixes.fixes(*cell.model())
    assert _fix_values(fix) == "num_parallel_calls=1 + error_buffer=414"
    fixed = cell.fixed(_buffer_fix(fix, 500))
    assert (fixed.workers, fixed.error_buffer) == (1, 500)
    assert fixed.predict().verdict == budget.SAFE


def test_the_batch_warnings_table_counts_the_warned_sizes_that_hung() -> None:
    rows = [{"cell": "c", "fix": "batch_size=12", "warned": 11, "predicted": "can_hang",
             "hangs": 1, "agrees": True, "runs": 2},
            {"cell": "d", "fix": "batch_size=8", "warned": 7, "predicted": "can_hang",
             "hangs": 0, "agrees": False, "runs": 8}]
    text = render_batch_warnings(rows, 90.0)
    assert "(2 configurations, 10 runs: 1.5 min" in text
    assert "warned batch sizes seen to hang: **1/2**" in text
    assert "| c | batch_size=12 | 11 | can_hang | 2 | 1 | yes |" in text
    assert "| d | batch_size=8 | 7 | can_hang | 8 | 0 | **no** |" in text
