"""Distributed mode on the agent's own local Ray (no `--ray-address`): a hung learner.

Actors held by `--max-policy-lag` wait on a learner that hangs outside `next()`, as
their probes say, and a sidecar attached to the job names `learner_stalled`, not dead
actors and not a starvation. Dead actors, replacements and their probes on a real
multi-node cluster: tests/test_ray_cluster.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harness.agent import AgentProcess
from harness.procs import Proc, get_json, wait_until

pytestmark = pytest.mark.agents

SMALL = [
    "--mode", "distributed", "--batch-size", "64", "--samples-per-insert", "64",
    "--min-replay-size", "200", "--steps", "1000000", "--eval-every", "0", "--log-every", "1",
]  # fmt: skip
INTERVAL_S = 1.0
STALL_WINDOW_S = 10.0  # the sidecar's default


def actor_doc(url: str) -> dict[str, Any]:
    status, doc = get_json(f"{url}/probe", timeout_s=5)
    assert status == 200, (url, doc)
    return doc


def kinds(base: str) -> set[str]:
    return {f["kind"] for f in get_json(f"{base}/api/v1/findings")[1]["findings"]}


def test_actors_held_by_the_policy_lag_bound_wait_on_a_hung_learner(
    sidecar: Callable[..., tuple[Proc, str]], tmp_path: Path,
) -> None:
    # A limiter window too wide to reach (tolerance 1000: max_diff = 200 * 64 * 1001 samples,
    # some 200k inserts ahead) lets actors run far ahead of the learner, as in IMPALA-style
    # jobs: the bound, not Reverb, is what stops them. Tolerance 50 (max_diff 652,800) was
    # reached before the hang once: two actors at 650 steps/s each against a learner at
    # 150 steps/s blocked in insert at 13 s, and never waited on the learner.
    # Paced as a simulator and a bigger network would be (5 ms an env step, 20 ms a learner
    # step): flat out, the actors and the learner cost the case 54 CPU-s, paced 40 and 46,
    # for nothing it needs.
    flags = [*SMALL, "--num-actors", "2", "--tolerance", "1000", "--max-policy-lag", "20",
             "--inject-stall", "learner-hang@12", "--env-step-delay-s", "0.005",
             "--learner-step-delay-s", "0.02"]
    with AgentProcess(flags, log=tmp_path / "agent.log") as agent:
        start = agent.start_line(timeout_s=150)
        urls, reverb = start["actor_probes"], start["reverb"]
        agent.wait_for(lambda r: r["event"] == "progress" and r["learner_steps"] > 0,
                       timeout_s=90)
        assert all(actor_doc(url)["steps_total"] > 0 for url in urls)
        _, base = sidecar("--reverb", reverb, "--probe", f"{reverb}={start['probe']}",
                          *[f for url in urls for f in ("--probe", f"{reverb}={url}")],
                          "--interval", str(INTERVAL_S), "--db", str(tmp_path / "i.db"))
        assert wait_until(lambda: agent.event(lambda r: r["event"] == "stall_injected"),
                          timeout_s=60)
        hung_at = time.monotonic()
        waiting = wait_until(lambda: all(
            (d := actor_doc(url))["waiting"] and d["waiting_for_s"] > 3 for url in urls),
            timeout_s=60)
        assert waiting, [actor_doc(url) for url in urls]
        docs = [actor_doc(url) for url in urls]
        assert {d["waiting_on"] for d in docs} == {"learner"}
        assert {d["in_call"] for d in docs} == {None}  # not blocked in Reverb: on the learner
        assert wait_until(lambda: actor_doc(urls[0])["now"] - docs[0]["now"] >= 2, timeout_s=10)
        later = [actor_doc(url) for url in urls]
        assert [d["steps_total"] for d in later] == [d["steps_total"] for d in docs]
        assert agent.probe()["blocked_in_next"] is False and agent.returncode is None
        # The learner is stuck outside next() while everything else waits on it: the
        # verdict names the learner, never dead actors or a starvation.
        wait_until(lambda: "learner_stalled" in kinds(base),
                   timeout_s=STALL_WINDOW_S + 10 * INTERVAL_S + 5)
        detected_s = time.monotonic() - hung_at
        found = kinds(base)
        wrong = {"sample_blocked", "worker_starvation", "insert_blocked", "writer_stalled"}
        assert not found & wrong, found
        assert agent.returncode is None
    print(f"\nlearner_stalled {detected_s:.1f}s after the hang")
