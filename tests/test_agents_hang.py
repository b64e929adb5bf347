"""The seed incident's layout with one batching worker: the synchronous learner keeps learning.

With 12 workers the samples the rate limiter releases are spread over 12 half-filled
batches, the learner blocks in `next()` and the insert that would fill one never comes (it
would come from the blocked thread): tests/test_alerting_e2e.py runs that hang end to end and
reads it from the probe. With 1 worker every released sample lands in one batch, and the probe
shows batches delivered every few seconds, never `blocked_in_next` for the 10 s timeout.
"""

from __future__ import annotations

import time

import pytest

from agents import seed_hang
from harness.agent import AgentProcess

pytestmark = pytest.mark.agents

HANG_TIMEOUT_S = 10.0
# The parameters recorded in agents/README.md: error_buffer = 4000 * 128 * 0.002 = 1024
# samples, released at once when the table reaches min_replay_size: enough for
# can_sample(256), too few for 12 workers to complete a batch of 256.
# A later flag wins (argparse), so the one-worker run appends `--num-parallel-calls 1`.
SEED_SHAPE = [*seed_hang.FLAGS, "--steps", "1000000", "--eval-every", "0", "--log-every", "2"]


def test_one_worker_keeps_delivering_batches() -> None:
    # The learner paced at 50 ms a step (a bigger network's): batches still come every few
    # seconds, as asserted, and the case costs 15.3 CPU-s alone, not 25.4 flat out.
    with AgentProcess([*SEED_SHAPE, "--num-parallel-calls", "1",
                       "--learner-step-delay-s", "0.05"]) as agent:
        agent.start_line(timeout_s=120)
        agent.wait_for(lambda r: r["event"] == "progress" and r["learner_steps"] > 0, 90)
        seen = [agent.probe()]
        for _ in range(4):  # 8 s: batches in every 2 s, never blocked for the 10 s timeout
            time.sleep(2)
            seen.append(agent.probe())
    batches = [p["batches_retrieved"] for p in seen]
    assert all(later > earlier for earlier, later in zip(batches, batches[1:])), batches
    assert max(p["blocked_for_s"] for p in seen) < HANG_TIMEOUT_S
