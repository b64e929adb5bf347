"""The diagnosis on real runs of the agents/ workload, each fault produced for real.

Each scenario runs the JAX agent with two sidecars (with the probe, and with the
Reverb address alone) and checks the expected finding appears within the stall
window plus three polls of the fault's onset, taken from the trainer itself,
with no other warning or critical finding. bench/detection.py repeats these
runs and reports the latencies.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agents import seed_hang
from bench.detection import INTERVAL_S, SCENARIOS, STALL_WINDOW_S, run_once

DEADLINE_S = STALL_WINDOW_S + 3 * INTERVAL_S


@pytest.mark.timeout(420)  # a seed_hang start that feeds its workers ends early and reruns
@pytest.mark.parametrize("name", ["seed_hang", "actor_exit", "learner_hang", "batch_headroom",
                                  "warmup"])
def test_each_fault_is_named_within_the_stall_window_and_three_polls(name: str,
                                                                    tmp_path: Path) -> None:
    scenario = SCENARIOS[name]
    result = run_once(scenario, tmp_path)
    for _ in range(seed_hang.ATTEMPTS - 1):
        if not result["fed"]:
            break
        result = run_once(scenario, tmp_path)  # the hang is a race (agents/seed_hang.py)
    assert not result["fed"], f"the workers were fed in {seed_hang.ATTEMPTS} starts"
    assert result["onset"] is not None, result
    for side, expected in (("probe", scenario.expect_probe), ("reverb", scenario.expect_reverb)):
        for kind in expected:
            latency = result[f"{side}:{kind}"]
            assert latency is not None, f"{side} sidecar never reported {kind}: {result}"
            assert latency <= DEADLINE_S, f"{side} {kind} after {latency:.1f}s: {result}"
        assert result[f"{side}:false_alarms"] == [], result
