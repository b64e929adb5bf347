"""make test's RLlib case: one real RLlib job (Ray 2.60, torch on the CPU, .venv-rllib) on a
local cluster, watched from outside with `--ray` and no code change in the job. A DQN with its
replay buffer and one EnvRunner trains, then its environment hangs in `step()`: nothing is
paged while it trains, and the hang is `env_runner_stalled` within the window the finding
states plus two polls of the job's last trained step, with its fix; its bundle carries the hung
runner's stacks, taken through the dashboard, and replays to the same verdict.

The rest of the RLlib tier (a healthy APPO, a hung learner, dropped env steps, a warm-up that
cannot end, a training_intensity the job cannot reach) takes about 25 minutes here and runs in
`make test-ray` (tests/test_rllib_tier.py). make test builds .venv-rllib beside the other
venvs; where it cannot (no Python 3.11, no CPU build of torch), this case skips with one line.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from harness.procs import Proc
from replaywatch import bundle as bd
from replaywatch.model import Name
from tests.support.rllib_jobs import INTERVAL_S, RLLIB_READY, SLACK_S, start_job, watch, windows_in

pytestmark = [
    pytest.mark.slow,
    pytest.mark.frameworks,
    pytest.mark.rllib,
    pytest.mark.timeout(300),
    pytest.mark.skipif(not RLLIB_READY.exists(), reason="no .venv-rllib: make rllib-venv says why"),
]
# The cheapest job that has an EnvRunner actor: its Learner in the driver, short iterations
# (a rhythm of a few seconds), two logical CPUs.
JOB = ["--algo", "dqn", "--num-learners", "0", "--num-env-runners", "1",
       "--min-steps-per-iteration", "100", "--learning-starts", "100", "--num-cpus", "2"]
HANG_AFTER = 450  # env steps: four iterations of 100, three of them training, before it


def test_a_dqn_job_trains_unpaged_then_its_hung_env_runner_is_named_in_its_window(
        spawn: Callable[..., Proc], tmp_path: Path, short_temp: Path) -> None:
    announced, temp = start_job(spawn, tmp_path, short_temp, "--hang-env-after",
                                str(HANG_AFTER), "--hang-env-runner", "1", algo=JOB)
    kind = Name("env_runner_stalled")
    paged, moved, began = watch(tmp_path, announced, temp, 200.0,
                                until=lambda f: f.kind == kind, bundle_within_s=30.0)
    named = [(t, f) for t, f in paged if f.kind == kind]
    assert named, [(round(t - began), f.kind) for t, f in paged[:5]]
    at, finding = named[0]
    # Ray reports its counters every 10 s: two iterations may show as one move
    assert len([t for t in moved if t < at]) >= 2, "it never trained: the case proves nothing"
    assert [f.kind for t, f in paged if t < at] == [], "something was paged while it trained"
    window = max(windows_in(finding.evidence))
    last_progress = max(t for t in moved if t < at)
    print(f"\n{kind}: trained {len(moved)} times over {last_progress - began:.0f} s unpaged, "
          f"named {at - last_progress:.1f} s after its last trained step (window "
          f"{window:.1f} s + 2 polls), {at - began:.0f} s into watching")
    assert at - last_progress <= window + 2 * INTERVAL_S + SLACK_S, (
        at - last_progress, window, finding.evidence)
    assert finding.fix
    # Its bundle holds the hung runner's stacks, taken by the dashboard's py-spy: the frame it
    # hangs in (the environment's step) is there, and `analyze` gives the same verdict.
    written = sorted((tmp_path / "bundles").glob("*.json"))
    assert written, "no bundle written for a critical finding"
    b = bd.read(str(written[0]))
    pid = finding.evidence["runner_pids"][0]
    taken = (b.doc.get("stacks") or {}).get(f"ray:{pid}")
    assert taken is not None, (b.doc.get("missing"), list(b.doc.get("stacks") or {}))
    # Ray 2.60's dashboard serves py-spy only with RAY_DASHBOARD_ENABLE_PROFILING=1: refused
    # here, the same pid is dumped with this host's py-spy (the cluster is on this host).
    said = json.dumps(taken)
    assert "HangAfterSteps.step" in said and "harness/rllib_job.py" in said, said[:2000]
    assert {f.kind for f in bd.verdict(b.inputs)} >= {kind}
