"""`python -m agents.run --mode sync` as a real process: Reverb, probe, startup line, stalls."""

from __future__ import annotations

import pytest

from harness.agent import AgentProcess
from harness.procs import get_json, wait_until

pytestmark = pytest.mark.agents

SMALL = [
    "--mode", "sync", "--batch-size", "64", "--samples-per-insert", "64",
    "--min-replay-size", "200", "--eval-every", "0", "--log-every", "0.5",
]  # fmt: skip


def test_sync_run_inserts_samples_and_serves_the_probe() -> None:
    # Long enough that the loop probe is still stepping when it is read twice (with 1200
    # steps flat out an idle machine finished the run between the two reads): 1500 steps
    # paced at 10 ms, as a simulator would be, take 15 s or more; 3000 flat out took 37 CPU-s.
    with AgentProcess(
        [*SMALL, "--steps", "1500", "--env-step-delay-s", "0.01", "--eval-every", "800",
         "--eval-episodes", "1", "--replay-probe-listen", "127.0.0.1:0"]
    ) as agent:
        start = agent.start_line(timeout_s=120)
        assert start["mode"] == "sync" and start["table"] == "priority_table"
        # The process that runs the Reverb server serves its memory and limit.
        replay = get_json(f"{start['replay_probe']}/probe")[1]
        assert (replay["role"], replay["pid"]) == ("replay", start["pid"])
        assert replay["rss_bytes"] > 100 << 20 and replay["limit_bytes"] > replay["rss_bytes"]
        assert start["reverb"].startswith("127.0.0.1:") and start["probe"].startswith("http://")
        learning = agent.wait_for(
            lambda r: r["event"] == "progress" and r["learner_steps"] > 0, timeout_s=90
        )
        probe = agent.probe()
        assert probe["batches_retrieved"] >= learning["learner_steps"] > 0
        assert probe["batch_size"] == 64 and probe["table"] == "priority_table"
        # The loop's actor side has its own probe: steps, the items its writer creates,
        # and its waits on the learner (the learner steps on the same thread).
        [loop_url] = start["actor_probes"]
        loop = get_json(f"{loop_url}/probe")[1]
        assert (loop["role"], loop["name"], loop["table"]) == ("actor", "loop", "priority_table")
        assert loop["pid"] == start["pid"] and loop["writers_wrapped"] == 1
        assert loop["items_created_total"] > 0 and loop["waits_total"] > 0
        # A step is counted before its item is created: wait for both to move on.
        later = wait_until(lambda: (d := get_json(f"{loop_url}/probe")[1])["steps_total"]
                           > loop["steps_total"]
                           and d["items_created_total"] > loop["items_created_total"] and d,
                           timeout_s=30)
        assert later["items_created_total"] > loop["items_created_total"]
        done = agent.wait_for(lambda r: r["event"] == "done", timeout_s=240)
        final = [r for r in agent.records if r["event"] == "progress"][-1]
    assert done["env_steps"] >= 1500 and done["learner_steps"] > 0
    assert final["inserts"] >= 1500 and final["samples"] >= 64 * done["learner_steps"]
    assert any(r["event"] == "eval" for r in agent.records)


def test_a_pixels_learner_steps_then_hangs_without_blocking_in_next() -> None:
    # One agent for two claims (an agent start-up is ~10 s of both cores): the pixels
    # networks learn (steps before the hang, injected 22 s in), and a hung learner
    # stops stepping without being blocked in next(). At 8 s the pixels networks' first
    # compile, beside make test's other two lanes, had left one step (twice, 2026-12-01);
    # at 14 s too, once the RLlib case's two jobs started beside it (2026-12-07). Paced (5 ms
    # an env step, 50 ms a learner step): the steps it needs are a few, not a core's worth;
    # 25.7 CPU-s alone against 41.4 flat out.
    flags = [*SMALL, "--pixels", "--batch-size", "16", "--samples-per-insert", "16",
             "--steps", "1000000", "--inject-stall", "learner-hang@22",
             "--env-step-delay-s", "0.005", "--learner-step-delay-s", "0.05"]
    with AgentProcess(flags) as agent:
        assert agent.start_line(timeout_s=120)["pixels"] is True
        agent.wait_for(lambda r: r["event"] == "stall_injected", timeout_s=150)
        first = agent.probe()
        assert wait_until(lambda: agent.probe()["now"] - first["now"] >= 3, timeout_s=10)
        later = agent.probe()
        assert agent.returncode is None, "a hung learner must not exit"
    assert first["learner_steps"] >= 3, first
    assert later["learner_steps"] == first["learner_steps"]
    assert later["blocked_in_next"] is False


@pytest.mark.parametrize("flag", ["--num-parallel-calls=0", "--probe-listen=nohost", "--mode=x"])
def test_bad_flags_exit_2(flag: str) -> None:
    with AgentProcess([flag]) as agent:
        assert wait_until(lambda: agent.returncode is not None, timeout_s=60)
    assert agent.returncode == 2
