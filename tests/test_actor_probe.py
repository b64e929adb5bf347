"""The actor probe on real Reverb writers, read over real HTTP.

One in-process Reverb server for the module (importing reverb takes ~5 s):
`free` never blocks inserts; `blocking` admits 3 inserts and then blocks the
writer until something samples (the limiter's max_diff), the way a
rate-limited actor stalls when its learner stops.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import reverb

from harness.procs import get_json, wait_until
from replaywatch.probe import ActorProbe

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def server() -> Iterator[reverb.Server]:
    def table(name: str, limiter: Any) -> reverb.Table:
        return reverb.Table(name, sampler=reverb.selectors.Uniform(),
                            remover=reverb.selectors.Fifo(), max_size=1000,
                            rate_limiter=limiter)

    server = reverb.Server(tables=[
        table("free", reverb.rate_limiters.MinSize(1)),
        # samples - inserts * 1.0 must stay in [-3, 0]: the 4th insert waits for a sample.
        table("blocking", reverb.rate_limiters.SampleToInsertRatio(
            samples_per_insert=1.0, min_size_to_sample=1, error_buffer=(0, 3))),
    ], port=None)
    yield server
    server.stop()


@pytest.fixture
def client(server: reverb.Server) -> reverb.Client:
    return server.localhost_client()


@pytest.fixture
def probe() -> Iterator[ActorProbe]:
    p = ActorProbe(table="replay", name="actor-0", listen="127.0.0.1:0")
    p.start()
    yield p
    p.stop()


def doc(probe: ActorProbe) -> dict[str, Any]:
    status, body = get_json(f"{probe.url}/probe", timeout_s=5)
    assert status == 200
    return body


def step_data(i: int) -> dict[str, np.ndarray]:
    return {"x": np.full((2,), i, np.float32)}


def test_trajectory_writer_calls_are_counted_and_pending_items_clear_on_flush(
        client: reverb.Client, probe: ActorProbe) -> None:
    with probe.wrap_writer(client.trajectory_writer(num_keep_alive_refs=2)) as writer:
        for i in range(5):
            writer.append(step_data(i))
            probe.step()
        assert writer.episode_steps == 5  # proxied attributes still reachable
        for _ in range(3):
            writer.create_item("free", 1.0, {"x": writer.history["x"][-2:]})
        before = doc(probe)
        writer.flush()
        after = doc(probe)
        writer.end_episode()
    assert (before["items_created_total"], before["appends_total"]) == (3, 5)
    assert before["pending_items"] == 3 and after["pending_items"] == 0
    assert (before["steps_total"], before["in_call"], before["blocked_for_s"]) == (5, None, 0.0)
    final = doc(probe)
    assert final["calls"]["end_episode"]["count"] == 1
    assert final["calls"]["flush"]["count"] == 2  # flush() and the with-block's exit
    assert final["calls"]["append"]["seconds_total"] > 0
    assert (final["role"], final["name"], final["table"]) == ("actor", "actor-0", "replay")
    assert final["writers_wrapped"] == 1 and final["last_error"] is None
    assert client.server_info()["free"].current_size >= 3


def test_legacy_writer_from_a_wrapped_client_is_counted_too(client: reverb.Client,
                                                           probe: ActorProbe) -> None:
    # Acme's adders make their own writers: wrapping the client they get is the hook.
    wrapped_client = probe.wrap_client(client)
    assert "free" in wrapped_client.server_info()
    writer = wrapped_client.writer(max_sequence_length=2)
    for i in range(4):
        writer.append(step_data(i))
        writer.create_item("free", num_timesteps=1, priority=1.0)
    writer.flush()
    writer.close()
    got = doc(probe)
    assert (got["appends_total"], got["items_created_total"], got["pending_items"]) == (4, 4, 0)
    assert got["calls"]["close"]["count"] == 1 and got["writers_wrapped"] == 1
    assert got["calls"]["append"]["last_at"] <= got["calls"]["flush"]["last_at"] <= got["now"]


def test_a_flush_blocked_by_the_rate_limiter_shows_in_call_and_returns_to_idle(
        client: reverb.Client, probe: ActorProbe) -> None:
    writer = probe.wrap_writer(client.trajectory_writer(num_keep_alive_refs=1))
    done = threading.Event()

    def actor() -> None:
        for i in range(4):
            writer.append(step_data(i))
            writer.create_item("blocking", 1.0, {"x": writer.history["x"][-1:]})
            writer.flush()
            probe.step()
        done.set()

    thread = threading.Thread(target=actor, name="actor-loop", daemon=True)
    thread.start()
    try:
        # The first three flushes pass the limiter and are only briefly "in flush": wait for
        # the fourth (three steps done), the one the limiter holds.
        first = wait_until(lambda: (d := doc(probe))["in_call"] == "flush"
                           and d["steps_total"] == 3 and d, timeout_s=10)
        time.sleep(0.4)
        later = doc(probe)
        assert later["in_call"] == "flush"
        assert later["in_call_since"] == pytest.approx(first["in_call_since"], abs=0.005)
        assert later["blocked_for_s"] >= first["blocked_for_s"] + 0.3
        assert later["now"] - later["in_call_since"] == pytest.approx(later["blocked_for_s"],
                                                                      abs=0.05)
        assert (later["steps_total"], later["pending_items"], later["items_created_total"]) == (
            3, 1, 4)
        assert later["calls"]["flush"]["seconds_total"] >= later["blocked_for_s"]
        stacks = get_json(f"{probe.url}/stacks", timeout_s=5)[1]
        frames = next(t for t in stacks["threads"] if t["name"] == "actor-loop")["frames"]
        assert "flush" in [f["function"] for f in frames]
    finally:
        sampler = client.sample("blocking", num_samples=1)
        next(sampler)  # one sample makes room for the 4th insert
    assert done.wait(timeout=10)
    idle = doc(probe)
    assert (idle["in_call"], idle["blocked_for_s"], idle["pending_items"]) == (None, 0.0, 0)
    assert idle["steps_total"] == 4
    assert idle["calls"]["flush"]["seconds_total"] >= 0.4


def test_waiting_on_the_learner_shows_over_http(probe: ActorProbe) -> None:
    release = threading.Event()

    def actor() -> None:
        with probe.waiting("learner"):
            release.wait(timeout=20)

    thread = threading.Thread(target=actor, daemon=True)
    thread.start()
    first = wait_until(lambda: (d := doc(probe))["waiting"] and d, timeout_s=5)
    time.sleep(0.3)
    later = doc(probe)
    assert later["waiting_on"] == "learner"
    assert later["waiting_since"] == pytest.approx(first["waiting_since"], abs=0.005)
    assert later["waiting_for_s"] >= first["waiting_for_s"] + 0.25
    assert later["in_call"] is None and later["waits_total"] == 0
    release.set()
    thread.join(timeout=5)
    after = doc(probe)
    assert (after["waiting"], after["waiting_on"], after["waiting_for_s"]) == (False, None, 0.0)
    assert after["waits_total"] == 1 and after["waiting_seconds_total"] >= 0.3


def test_step_heartbeat_ages_between_steps(probe: ActorProbe) -> None:
    assert doc(probe)["last_step_at"] is None and doc(probe)["seconds_since_last_step"] is None
    for _ in range(3):
        probe.step()
    fresh = doc(probe)
    time.sleep(0.3)
    stale = doc(probe)
    assert fresh["steps_total"] == stale["steps_total"] == 3
    assert stale["seconds_since_last_step"] >= fresh["seconds_since_last_step"] + 0.25
    assert stale["last_step_at"] == pytest.approx(fresh["last_step_at"], abs=0.01)
    assert stale["os_threads"] is None or stale["os_threads"] >= stale["thread_count"]


def test_a_failing_writer_call_is_counted_and_raised(client: reverb.Client,
                                                     probe: ActorProbe) -> None:
    writer = probe.wrap_writer(client.trajectory_writer(num_keep_alive_refs=1))
    writer.append(step_data(0))
    with pytest.raises(ValueError) as raised:
        writer.create_item("nope", 1.0, {"x": writer.history["x"][-1:]})  # no such table
    got = doc(probe)
    create_item = got["calls"]["create_item"]
    assert (create_item["count"], create_item["errors"]) == (1, 1)
    assert create_item["last_at"] == pytest.approx(got["now"], abs=2.0)
    assert got["items_created_total"] == 0 and got["pending_items"] == 0
    assert got["last_error"]["call"] == "create_item"
    assert got["last_error"]["type"] == type(raised.value).__name__
    assert got["in_call"] is None
    writer.close()


def test_times_survive_a_wall_clock_jump() -> None:
    wall, mono = [1_000_000.0], [50.0]
    probe = ActorProbe(clock=lambda: wall[0], monotonic=lambda: mono[0])
    with probe.waiting("learner"):
        mono[0] += 30.0
        wall[0] -= 3600.0  # NTP steps the clock back an hour mid-wait
        got = probe.snapshot()
    assert got["waiting_for_s"] == 30.0
    assert got["waiting_since"] == got["now"] - 30.0


@pytest.mark.parametrize("kwargs", [{"listen": "nope"}, {"name": ""}, {"table": 3}])
def test_bad_arguments_raise_value_error(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        ActorProbe(**kwargs)


def test_wrap_writer_rejects_what_is_not_a_writer(probe: ActorProbe) -> None:
    with pytest.raises(ValueError, match="not a Reverb writer"):
        probe.wrap_writer(object())
    with pytest.raises(ValueError):
        probe.waiting("")
