"""Queue tables (`reverb.Table.queue`) on a real Reverb server with real threads: a healthy
on-policy job whose learner is faster than its actors, then the two ways it stops.

The learner samples one item at a time as fast as it can; the actor inserts one every 10 ms,
so the queue is empty almost always. That is `drained` (info), never `warmup`. Actors that
stop leave the learner waiting: `sample_blocked`. A learner that stops lets the actors fill
the queue to its size: `insert_blocked`. Measured times are printed (`-s`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import pytest
import reverb

from replaywatch.state import Published
from tests.support.repro import (
    DEADLINE_S,
    SLACK_S,
    Loop,
    alarms,
    kinds,
    sidecar_for,
    tick_until,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

QUEUE_SIZE = 50


@pytest.fixture
def job() -> Iterator[tuple[reverb.Client, int]]:
    server = reverb.Server([reverb.Table.queue("queue", QUEUE_SIZE)])
    yield reverb.Client(f"localhost:{server.port}"), server.port
    server.stop()


def queue_actor(client: reverb.Client) -> Loop:
    return Loop(lambda: client.insert([np.zeros(2, np.float32)], {"queue": 1.0}), pause_s=0.01)


def queue_learner(client: reverb.Client) -> Loop:
    return Loop(lambda: [None for _ in client.sample("queue", num_samples=1)], pause_s=0.0)


def healthy(client: reverb.Client) -> tuple[Loop, Loop, list[Published]]:
    acting, learning = queue_actor(client), queue_learner(client)
    acting.start()
    learning.start()
    return acting, learning, []


def test_a_queue_drained_by_a_faster_learner_is_drained_not_warmup(job) -> None:
    client, port = job
    acting, learning, seen = healthy(client)
    try:
        with sidecar_for(port) as sidecar:
            took = tick_until(sidecar, lambda s: "drained" in kinds(s), 4.0, seen)
            tick_until(sidecar, lambda s: False, 2.0, seen)
    finally:
        acting.stop()
        learning.stop()
    print(f"\ndrained named after {took} s")
    assert took is not None
    assert not any("warmup" in kinds(s) for s in seen)
    assert not set().union(*(alarms(s) for s in seen))
    finding = next(f for f in seen[-1].findings if f.kind == "drained")
    assert finding.evidence["empty_polls"] >= finding.evidence["polls"] / 2
    assert finding.evidence["insert_rate_per_s"] > 0


def stop_one_side(client: reverb.Client, port: int, side: str, kind: str, timeout_s: float
                  ) -> tuple[list[Published], float | None, Published, float]:
    """A healthy queue job for 2.5 s, then its actors or its learner stop: the healthy
    states, how long until `kind`, the state then, and seconds since the stop."""
    acting, learning, seen = healthy(client)
    stopping, other = (acting, learning) if side == "actors" else (learning, acting)
    try:
        with sidecar_for(port) as sidecar:
            tick_until(sidecar, lambda s: False, 2.5, seen)
            stopping.stop()
            stopped = time.monotonic()
            took = tick_until(sidecar, lambda s: kind in kinds(s), timeout_s)
            state = sidecar.store.current()
    finally:
        other.halt.set()  # blocked on an empty or full queue: the fixture's stop ends it
    return seen, took, state, time.monotonic() - stopped


def test_a_queue_whose_actors_stop_is_sample_blocked(job) -> None:
    seen, took, state, _ = stop_one_side(*job, "actors", "sample_blocked",
                                         DEADLINE_S + SLACK_S)
    print(f"\nsample_blocked {took} s after the actors stopped (bound {DEADLINE_S} s)")
    assert not set().union(*(alarms(s) for s in seen))
    assert took is not None
    blocked = next(f for f in state.findings if f.kind == "sample_blocked")
    assert blocked.evidence["queue"] is True


def test_a_queue_whose_learner_stops_fills_and_is_insert_blocked(job) -> None:
    seen, took, state, since = stop_one_side(*job, "learner", "insert_blocked", 10.0)
    print(f"\ninsert_blocked {took} s after the learner stopped")
    assert not set().union(*(alarms(s) for s in seen))
    assert took is not None and since <= 10.0 + SLACK_S
    table = next(f for f in state.findings if f.kind == "insert_blocked")
    assert table.evidence["current_size"] == QUEUE_SIZE
