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


def test_a_queue_whose_actors_stop_is_sample_blocked(job) -> None:
    client, port = job
    acting, learning, seen = healthy(client)
    try:
        with sidecar_for(port) as sidecar:
            tick_until(sidecar, lambda s: False, 2.5, seen)
            acting.stop()
            took = tick_until(sidecar, lambda s: "sample_blocked" in kinds(s),
                              DEADLINE_S + SLACK_S)
            state = sidecar.store.current()
    finally:
        learning.halt.set()  # blocked in sample() on an empty queue: the fixture's stop ends it
    print(f"\nsample_blocked {took} s after the actors stopped (bound {DEADLINE_S} s)")
    assert not set().union(*(alarms(s) for s in seen))
    assert took is not None
    blocked = next(f for f in state.findings if f.kind == "sample_blocked")
    assert blocked.evidence["queue"] is True


def test_a_queue_whose_learner_stops_fills_and_is_insert_blocked(job) -> None:
    client, port = job
    acting, learning, seen = healthy(client)
    try:
        with sidecar_for(port) as sidecar:
            tick_until(sidecar, lambda s: False, 2.5, seen)
            learning.stop()
            stopped = time.monotonic()
            took = tick_until(sidecar, lambda s: "insert_blocked" in kinds(s), 10.0)
            state = sidecar.store.current()
    finally:
        acting.halt.set()  # blocked in insert() on a full queue: the fixture's stop ends it
    print(f"\ninsert_blocked {took} s after the learner stopped")
    assert not set().union(*(alarms(s) for s in seen))
    assert took is not None and time.monotonic() - stopped <= 10.0 + SLACK_S
    table = next(f for f in state.findings if f.kind == "insert_blocked")
    assert table.evidence["current_size"] == QUEUE_SIZE
