"""The seed incident on demand: 12 per-worker batchers starve a synchronous learner.

Same run, two worker counts. With 12 workers the samples the rate limiter
releases are spread over 12 half-filled batches, the learner blocks in
`next()` and the insert that would fill one never comes (it would come from
the blocked thread). With 1 worker every released sample lands in one batch.
The probe shows it from outside: `blocked_in_next` for longer than a timeout.
The stranding is a race the learner usually wins (agents/seed_hang.py), so the
12-worker run starts the agent again, up to `seed_hang.ATTEMPTS` times, when a
start's workers were fed.
"""

from __future__ import annotations

import time

from agents import seed_hang
from harness.agent import AgentProcess

HANG_TIMEOUT_S = 10.0
# The parameters recorded in agents/README.md: error_buffer = 4000 * 128 * 0.002 = 1024
# samples, released at once when the table reaches min_replay_size: enough for
# can_sample(256), too few for 12 workers to complete a batch of 256.
# A later flag wins (argparse), so the one-worker run appends `--num-parallel-calls 1`.
SEED_SHAPE = [*seed_hang.FLAGS, "--steps", "1000000", "--eval-every", "0", "--log-every", "2"]


def _start(flags: list[str]) -> AgentProcess:
    agent = AgentProcess(flags).__enter__()
    try:
        agent.start_line(timeout_s=120)
    except BaseException:
        agent.kill()
        raise
    return agent


def test_twelve_batching_workers_block_the_learner_in_next_for_good() -> None:
    agent, attempt = seed_hang.until_stranded(
        lambda attempt: _start([*SEED_SHAPE, "--seed", str(attempt)]),
        lambda agent: agent.probe(), lambda agent: agent.kill())
    try:  # already entered by _start: leaving must kill it, not start another
        deadline = time.monotonic() + 120
        probe = agent.probe()
        while probe["blocked_for_s"] <= HANG_TIMEOUT_S and time.monotonic() < deadline:
            time.sleep(1)
            probe = agent.probe()
        stacks = agent.probe("/stacks")
        assert agent.returncode is None
    finally:
        agent.kill()
    assert probe["blocked_in_next"] and probe["blocked_for_s"] > HANG_TIMEOUT_S, probe
    assert probe["ready"] is False and probe["num_parallel_calls"] == 12
    assert probe["batches_retrieved"] == 0, (probe, f"attempt {attempt}")
    main = next(t for t in stacks["threads"] if t["name"] == "MainThread")
    assert any(frame["function"] == "__next__" for frame in main["frames"])
    assert agent.returncode is not None  # killed on the way out


def test_one_worker_keeps_delivering_batches() -> None:
    with AgentProcess([*SEED_SHAPE, "--num-parallel-calls", "1"]) as agent:
        agent.start_line(timeout_s=120)
        agent.wait_for(lambda r: r["event"] == "progress" and r["learner_steps"] > 0, 90)
        seen = [agent.probe()]
        for _ in range(4):  # 8 s: batches in every 2 s, never blocked for the 10 s timeout
            time.sleep(2)
            seen.append(agent.probe())
    batches = [p["batches_retrieved"] for p in seen]
    assert all(later > earlier for earlier, later in zip(batches, batches[1:])), batches
    assert max(p["blocked_for_s"] for p in seen) < HANG_TIMEOUT_S
