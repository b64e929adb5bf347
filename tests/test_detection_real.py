"""The diagnosis on real runs of the agents/ workload, each fault produced for real.

Each scenario runs the JAX agent with two sidecars (with the probe, and with the
Reverb address alone) and checks the expected finding appears within the stall
window plus three polls of the fault's onset, taken from the trainer itself,
with no other warning or critical finding. bench/detection.py repeats these
runs and reports the latencies.

Here only warmup, the one scenario no other test runs on the real agent; `make bench` runs
all five. batch_headroom (a Ray agent whose batch exceeds what its policy-lag bound frees)
is judged from the configuration on the first poll: its real reproductions are cheaper
without the agent (tests/test_bundle_kinds.py: a real server and TrainerProbe;
tests/test_loop_layout.py: the loop workload before its first next()), and the agent's
start-up made it make test's slowest test (139 s). The other three faults have their own
tests on the real agent, where more is asserted than the finding: seed_hang in
tests/test_alerting_e2e.py (the alert reaches the webhook) and tests/test_ray_cluster.py
(with and without probes), actor_exit in tests/test_agents_distributed.py and
tests/test_ray_cluster.py (recovery after replacements), learner_hang in
tests/test_ray_cluster.py. Each of the three cost 30-75 s here again.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from agents import seed_hang
from bench.detection import SCENARIOS, run_once
from bench.results_md import replace_sections, write_sections
from bench.watched import INTERVAL_S, STALL_WINDOW_S

pytestmark = pytest.mark.agents

DEADLINE_S = STALL_WINDOW_S + 3 * INTERVAL_S


@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", ["warmup"])
def test_each_fault_is_named_within_the_stall_window_and_three_polls(name: str,
                                                                    tmp_path: Path) -> None:
    scenario = SCENARIOS[name]
    result = run_once(scenario, tmp_path)
    assert result["onset"] is not None, result
    for side, expected in (("probe", scenario.expect_probe), ("reverb", scenario.expect_reverb)):
        for kind in expected:
            latency = result[f"{side}:{kind}"]
            assert latency is not None, f"{side} sidecar never reported {kind}: {result}"
            assert latency <= DEADLINE_S, f"{side} {kind} after {latency:.1f}s: {result}"
        assert result[f"{side}:false_alarms"] == [], result


# -- the pieces the benchmark's healthy runs rest on (fast: no agent started) ------------------

def test_first_step_delay_sleeps_once_after_the_first_batch_is_taken() -> None:
    # --first-step-delay-s (bench/healthy.py's first_step_60s): a stand-in for a long first
    # compile, inside the first update only, after its batch is taken.
    import jax
    import numpy as np

    from agents.config import RunConfig, TD3Config
    from agents.environments import make_environment, make_environment_spec
    from agents.learning import TD3Learner, Transition
    from agents.networks import make_networks
    from agents.run import configs_from_args

    config = TD3Config(hidden_sizes=(32, 32))
    networks = make_networks(make_environment_spec(make_environment(0)), config)
    rng = np.random.default_rng(0)
    taken: list[int] = []
    slept: list[tuple[float, int, int]] = []
    steps: list[int] = []

    def batches() -> Iterator[Any]:
        while True:
            taken.append(1)
            data = Transition(rng.normal(size=(8, 3)).astype(np.float32),
                              rng.uniform(-1, 1, size=(8, 1)).astype(np.float32),
                              rng.normal(size=(8,)).astype(np.float32),
                              np.full((8,), 0.9, np.float32),
                              rng.normal(size=(8, 3)).astype(np.float32))
            yield SimpleNamespace(data=data._asdict())

    learner = TD3Learner(networks, config, batches(), jax.random.PRNGKey(0),
                         on_step=lambda: steps.append(len(slept)), first_step_delay_s=60.0,
                         sleep=lambda s: slept.append((s, len(taken), len(steps))))
    for _ in range(3):
        learner.step()
    assert slept == [(60.0, 1, 0)], "one 60 s sleep, one batch taken, no step finished"
    assert steps == [1, 1, 1] and learner.steps == 3
    assert configs_from_args(["--first-step-delay-s", "60"])[2].first_step_delay_s == 60.0
    assert configs_from_args([])[2].first_step_delay_s == 0.0
    with pytest.raises(ValueError, match=r"first_step_delay_s \(-1\) must be >= 0"):
        RunConfig(first_step_delay_s=-1)


def test_the_async_healthy_run_is_the_async_starvation_layout_with_one_worker() -> None:
    from bench.healthy import RUNS

    # One worker, and a lag bound of 8 (2 hangs at an episode's start: bench/healthy.py).
    flags, starving = RUNS["async"].flags, list(seed_hang.ASYNC_FLAGS)
    changed = {flags[i - 1]: v for i, v in enumerate(flags) if v != starving[i]}
    assert changed == {"--num-parallel-calls": "1", "--max-policy-lag": "8"}
    assert len(flags) == len(starving) and RUNS["first_step_60s"].first_step


def test_results_sections_are_replaced_in_place_and_the_rest_kept() -> None:
    old = ("# Benchmark results\n\nMachine: x.\n\n## Detection latency (5 runs, 22.7 min)\n\n"
           "old table\n\n## False alarms on healthy runs (10 minutes)\n\n- sync: none\n\n"
           "## Cost to the trainer (4.1 min)\n\nkept\n")
    new = replace_sections(old, ["## Detection latency (1 runs, 5.0 min)\n\nnew table\n",
                                 "## False alarms on healthy runs (sync, async)\n\nnew rows\n"])
    assert new == ("# Benchmark results\n\nMachine: x.\n\n## Detection latency (1 runs, 5.0 min)"
                   "\n\nnew table\n\n## False alarms on healthy runs (sync, async)\n\nnew rows\n\n"
                   "## Cost to the trainer (4.1 min)\n\nkept\n")
    appended = replace_sections("# R\n", ["## False alarms on healthy runs (x)\n\nrows\n"])
    assert appended == "# R\n\n## False alarms on healthy runs (x)\n\nrows\n"


def test_a_results_file_not_there_yet_is_started_with_the_section(tmp_path) -> None:
    path = tmp_path / "fleet.md"
    write_sections(path, ["## A fleet (x)\n\nrows\n"])
    assert path.read_text() == "## A fleet (x)\n\nrows\n"
    write_sections(path, ["## A fleet (y)\n\nnew rows\n"])
    assert path.read_text() == "## A fleet (y)\n\nnew rows\n"


def test_summary_rows_keep_scenarios_apart_that_expect_the_same_kind() -> None:
    from bench.results_md import summarize

    results = [{"scenario": "seed_hang", "fed": False, "reverb:sample_blocked": 11.0,
                "reverb:false_alarms": []},
               {"scenario": "actor_exit", "fed": False, "reverb:sample_blocked": 12.0,
                "reverb:false_alarms": ["probe_down"]},
               {"scenario": "seed_hang", "fed": True, "reverb:sample_blocked": None}]
    rows = {(r["scenario"], r["finding"]): r for r in summarize(results)}
    assert rows[("seed_hang", "sample_blocked")]["runs"] == 1
    assert rows[("seed_hang", "sample_blocked")]["p50_s"] == 11.0
    assert rows[("actor_exit", "sample_blocked")]["p50_s"] == 12.0
    assert rows[("actor_exit", "sample_blocked")]["false_alarms"] == ["probe_down"]


def test_a_fed_seed_hang_start_is_started_again_with_a_new_seed_and_counted_apart(
        tmp_path: Path) -> None:
    from bench.detection import run_lanes

    calls: list[tuple[str, int]] = []
    fed_seeds = {1, 2, 5}  # run 1: two fed starts, then a hang; run 2: one fed, then a hang

    def run(scenario: Any, tmp: Path, seed: int) -> dict[str, Any]:
        calls.append((scenario.name, seed))
        return {"scenario": scenario.name, "fed": scenario.name == "seed_hang"
                and seed in fed_seeds}

    results = run_lanes([["seed_hang", "warmup"]], 2, tmp_path, run=run)
    assert calls == [("seed_hang", 1), ("seed_hang", 2), ("seed_hang", 3), ("warmup", 4),
                     ("seed_hang", 5), ("seed_hang", 6), ("warmup", 7)]
    assert [r["fed"] for r in results] == [True, True, False, False, True, False, False]


def test_seed_hang_starts_stop_after_the_attempts_when_every_start_is_fed(tmp_path: Path) -> None:
    from bench.detection import run_lanes

    results = run_lanes([["seed_hang"]], 1, tmp_path,
                        run=lambda scenario, tmp, seed: {"scenario": "seed_hang", "fed": True})
    assert len(results) == seed_hang.ATTEMPTS and all(r["fed"] for r in results)
