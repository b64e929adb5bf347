"""Distributed mode on a local Ray: 4 actor processes, a learner, a Reverb server.

One run (Ray's start-up costs tens of seconds here) proves four things: data
flows through the real server; every actor serves an ActorProbe that counts its
steps and the items its writer creates; when every actor dies the learner waits
in `next()` without crashing; when replacements start it learns again, and each
replacement's probe answers under its slot's name. A second run shows actors held
by `--max-policy-lag` waiting on a hung learner, as their probes say.
"""

from __future__ import annotations

from typing import Any

from harness.agent import AgentProcess
from harness.procs import get_json, wait_until

SMALL = [
    "--mode", "distributed", "--batch-size", "64", "--samples-per-insert", "64",
    "--min-replay-size", "200", "--steps", "1000000", "--eval-every", "0", "--log-every", "1",
]  # fmt: skip
FLAGS = [
    *SMALL, "--num-actors", "4",
    # Counted from the start line; actor processes take ~10 s to import and start.
    "--inject-stall", "actors-exit@25", "--replace-dead-actors-after", "8",
]  # fmt: skip


def actor_doc(url: str) -> dict[str, Any]:
    status, doc = get_json(f"{url}/probe", timeout_s=5)
    assert status == 200, (url, doc)
    return doc


def grew(url: str, first: dict[str, Any]) -> bool:
    doc = actor_doc(url)
    return (doc["steps_total"] > first["steps_total"]
            and doc["items_created_total"] > first["items_created_total"])


def test_learner_waits_for_dead_actors_and_recovers_with_replacements() -> None:
    with AgentProcess(FLAGS) as agent:
        start = agent.start_line(timeout_s=150)
        assert start["mode"] == "distributed" and start["num_actors"] == 4
        urls = start["actor_probes"]
        assert len(urls) == 4 and len(start["nodes"]["actors"]) == 4
        flowing = agent.wait_for(
            lambda r: r["event"] == "progress" and r["learner_steps"] > 0, timeout_s=90
        )
        assert flowing["inserts"] > 0 and flowing["samples"] >= 64 * flowing["learner_steps"]
        assert flowing["actors_alive"] == 4

        before = [actor_doc(url) for url in urls]
        assert [d["name"] for d in before] == [f"actor-{i}" for i in range(4)]
        assert {d["role"] for d in before} == {"actor"}
        assert {d["writers_wrapped"] for d in before} == {1}
        assert wait_until(lambda: all(grew(u, d) for u, d in zip(urls, before)), timeout_s=20)

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
        announced = agent.wait_for(lambda r: r["event"] == "actor_probe", timeout_s=30)
        replacement = actor_doc(announced["url"])
        assert replacement["name"] == f"actor-{announced['slot']}"
        assert replacement["pid"] != before[announced["slot"]]["pid"]
        assert agent.returncode is None
        died = [r for r in agent.records if r["event"] == "actor_died"]
    assert len(died) == 4


def test_actors_held_by_the_policy_lag_bound_wait_on_a_hung_learner() -> None:
    # A wide limiter window (tolerance 50) lets actors run far ahead of the learner, as in
    # IMPALA-style jobs: the bound, not Reverb, is what stops them.
    flags = [*SMALL, "--num-actors", "2", "--tolerance", "50", "--max-policy-lag", "20",
             "--inject-stall", "learner-hang@15"]
    with AgentProcess(flags) as agent:
        urls = agent.start_line(timeout_s=150)["actor_probes"]
        agent.wait_for(lambda r: r["event"] == "progress" and r["learner_steps"] > 0,
                       timeout_s=90)
        assert all(actor_doc(url)["steps_total"] > 0 for url in urls)
        assert wait_until(lambda: agent.event(lambda r: r["event"] == "stall_injected"),
                          timeout_s=60)
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
