"""The asynchronous worker starvation (issue 11), reproduced with real Reverb on a local Ray.

`seed_hang.ASYNC_FLAGS`: one actor bounded by `--max-policy-lag 2` feeds exactly one batch
per learner step; 12 batching workers strand those samples in partial batches until the
learner blocks in `next()`, and the actor, alive, waits on the learner: a circular wait.
The learner's probe, the actor's probe and Reverb's counters all show it. (With one worker
the same flags keep learning: measured in agents/seed_hang.py, not rerun here.)
"""

from __future__ import annotations

import time

from agents.seed_hang import ASYNC_FLAGS
from harness.agent import AgentProcess
from harness.procs import get_json, wait_until

BATCH = 256


def test_a_live_actor_waiting_on_a_learner_blocked_in_next_with_samples_stranded() -> None:
    flags = [*ASYNC_FLAGS, "--steps", "10000000", "--eval-every", "0", "--log-every", "1"]
    with AgentProcess(flags) as agent:
        start = agent.start_line(timeout_s=150)
        [actor_url] = start["actor_probes"]
        agent.wait_for(lambda r: r["event"] == "progress" and r["learner_steps"] > 0,
                       timeout_s=120)
        assert wait_until(lambda: agent.probe()["blocked_for_s"] > 8, timeout_s=120), (
            agent.describe())
        learner = agent.probe()
        actor = get_json(f"{actor_url}/probe")[1]
        assert learner["blocked_in_next"] and learner["learner_steps"] > 0
        assert actor["waiting_on"] == "learner" and actor["waiting_for_s"] > 5
        assert actor["in_call"] is None and agent.returncode is None
        # Reverb's count of samples drawn, from a progress line taken while it was blocked:
        # those not in a delivered batch sit in the workers' partial batches.
        started = agent.event(lambda r: r["event"] == "start")
        assert started is not None
        since_start = time.time() - started[0]
        progress = agent.wait_for(
            lambda r: r["event"] == "progress" and r["elapsed_s"] >= since_start, timeout_s=10)
        stranded = progress["samples"] - BATCH * learner["batches_retrieved"]
        assert stranded >= BATCH, (progress, learner)
