"""Distributed mode on a local Ray: 4 actor processes, a learner, a Reverb server.

One run (Ray's start-up costs tens of seconds here) proves three things: data
flows through the real server; when every actor dies the learner waits in
`next()` without crashing; when replacements start it learns again.
"""

from __future__ import annotations

from harness.agent import AgentProcess
from harness.procs import wait_until

FLAGS = [
    "--mode", "distributed", "--num-actors", "4", "--batch-size", "64",
    "--samples-per-insert", "64", "--min-replay-size", "200", "--steps", "1000000",
    "--eval-every", "0", "--log-every", "1",
    # Counted from the start line; actor processes take ~10 s to import and start.
    "--inject-stall", "actors-exit@25", "--replace-dead-actors-after", "8",
]  # fmt: skip


def test_learner_waits_for_dead_actors_and_recovers_with_replacements() -> None:
    with AgentProcess(FLAGS) as agent:
        start = agent.start_line(timeout_s=150)
        assert start["mode"] == "distributed" and start["num_actors"] == 4
        flowing = agent.wait_for(
            lambda r: r["event"] == "progress" and r["learner_steps"] > 0, timeout_s=90
        )
        assert flowing["inserts"] > 0 and flowing["samples"] >= 64 * flowing["learner_steps"]
        assert flowing["actors_alive"] == 4

        for _ in range(4):
            agent.wait_for(lambda r: r["event"] == "actor_died", timeout_s=90)
        assert wait_until(lambda: agent.probe()["blocked_for_s"] > 5, timeout_s=20)
        stalled = agent.probe()
        assert stalled["blocked_in_next"] and agent.returncode is None

        agent.wait_for(lambda r: r["event"] == "actor_replaced", timeout_s=30)
        recovered = wait_until(
            lambda: agent.probe()["batches_retrieved"] > stalled["batches_retrieved"] + 10,
            timeout_s=60,
        )
        assert recovered, agent.describe()
        assert agent.returncode is None
        died = [r for r in agent.records if r["event"] == "actor_died"]
    assert len(died) == 4
