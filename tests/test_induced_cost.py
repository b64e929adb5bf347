"""bench/induced_cost.py and bench/trainer_cost.py's arithmetic, and the accounting itself.

The accounting test runs a real probe in its own process and reads its CPU clock
from outside, as the benchmark does.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import pytest

from bench.induced_cost import _probe, bounds, cpu_seconds, induced_per_call, induced_per_poll
from bench.trainer_cost import ci95
from bench.trainer_paired import paired_ratios
from replaywatch.sources.probe_http import HttpProbeSource


def test_bounds_are_rate_times_cpu_per_poll_and_the_shared_one_is_spread_over_cores() -> None:
    one_hz, ten_hz = bounds(induced_ms=0.5, sidecar_ms=9.5, cores=2)
    assert one_hz["hz"] == 1 and ten_hz["hz"] == 10
    assert one_hz["in_process_pct"] == pytest.approx(0.05)  # 0.5 ms a second
    assert ten_hz["in_process_pct"] == pytest.approx(0.5)
    assert ten_hz["shared_worst_pct"] == pytest.approx(10.0)  # (0.5 + 9.5) ms x 10 a second
    assert ten_hz["shared_spread_pct"] == pytest.approx(5.0)


def test_ci95_is_students_t_half_width_and_unknown_from_one_run() -> None:
    assert math.isinf(ci95([1.0]))
    assert ci95([1.0, 1.0, 1.0]) == 0.0
    # two runs: t(1) = 12.71, sd = 0.1414, n = 2 -> 12.71 * 0.1
    assert ci95([0.9, 1.1]) == pytest.approx(1.271, abs=1e-3)


def test_cpu_seconds_reads_another_process_clock_and_grows_with_its_work() -> None:
    pid = os.fork()
    if pid == 0:  # the child spins for 0.3 s of CPU, then waits to be reaped
        while time.process_time() < 0.3:
            pass
        time.sleep(30)
        os._exit(0)
    try:
        deadline = time.monotonic() + 20
        while cpu_seconds(pid) < 0.3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert 0.3 <= cpu_seconds(pid) < 1.0
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)


def test_a_poll_induces_cpu_in_the_probed_process_and_a_call_that_does_not_touch_it_none(
        tmp_path: Path) -> None:
    proc, url = _probe("trainer", tmp_path)
    try:
        source = HttpProbeSource(url, timeout_s=2.0)
        # At least 30 polls, however long they take: a loaded host made 8 in the second.
        polled = induced_per_call(proc.pid, source.poll, seconds=1.0, idle_s=0.3, min_calls=30)
        source.close()
        untouched = induced_per_call(proc.pid, lambda: sum(range(100)), seconds=0.5, idle_s=0.3)
    finally:
        proc.kill()
    assert 0.005 < polled["target_ms"] < 20 and polled["calls"] >= 30
    assert untouched["target_ms"] < polled["target_ms"] / 10


def test_the_induced_cost_per_poll_takes_the_larger_of_the_10hz_run_and_the_rows() -> None:
    rows = [{"key": "server_info_1", "target_ms": 0.07},
            {"key": "server_info_100", "target_ms": 0.40},
            {"key": "probe_trainer", "target_ms": 0.13}]
    cycle = {"tables": 1, "reverb_ms": 0.36, "trainer_probe_ms": 0.37}
    induced, widest = induced_per_poll(rows, cycle)
    # 0.36 per cycle at one table, + 0.33 more for 100 tables, + the probe's 0.37 per cycle
    assert widest == 100 and induced == pytest.approx(0.36 + 0.33 + 0.37)
    quiet = {"tables": 1, "reverb_ms": 0.01, "trainer_probe_ms": 0.01}
    assert induced_per_poll(rows, quiet)[0] == pytest.approx(0.40 + 0.13)


def test_paired_ratios_cancel_a_linear_drift_and_see_a_real_slowdown() -> None:
    # The agent speeds up 1 step/s per phase: an on-phase at the drift's own value is 1.0.
    assert paired_ratios([10.0, 11.0, 12.0, 13.0, 14.0]) == [1.0, 1.0]
    # A 2% slowdown in the on-phases, under the same drift.
    assert paired_ratios([10.0, 11.0 * 0.98, 12.0]) == pytest.approx([0.98])
    with pytest.raises(ValueError, match="off, on"):
        paired_ratios([10.0, 11.0])
