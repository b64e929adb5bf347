"""throughput_drop on a real Reverb server with real threads: actors whose environment step
grows, nothing ever blocked.

Thresholds are scaled to seconds (a 30 s look-back, 6 s of baseline, 5 s below half, so 1 s
below a fifth; the coarse history then keeps one snapshot per 0.5 s): the shape of the
default 30 min / 3 min / 300 s / 60 s. The bound is the span the drop must last plus two
buckets, and a second more for a loaded machine. Measured times are printed (`-s`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import numpy as np
import pytest
import reverb

from tests.support.repro import SLACK_S, alarms, kinds, sidecar_for, table, tick_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120), pytest.mark.long]

DROP_FOR_S = 5.0
BUCKET_S = DROP_FOR_S / 10
SCALED = dict(throughput_baseline_s=30.0, throughput_min_baseline_s=6.0,
              throughput_drop_for_s=DROP_FOR_S)


class Paced(threading.Thread):
    """Calls `step` once per `step_s`, paced by the clock, not by a sleep after each call.

    On a loaded machine a thread of this process waits for the GIL and the CPU, and a
    sleep-paced loop's rate then falls with the load, which moved the baseline a drop is
    measured against (a 3x step was once only 0.6 of a baseline taken while the machine was
    busy), and a learner paced by sleeps once fell below a fifth of its rate for a second on
    a loaded CI host, a drop in the healthy phase. A thread held back catches up, for at
    most a second of steps.
    """

    def __init__(self, step: Callable[[], object], step_s: float) -> None:
        super().__init__(daemon=True)
        self.step, self.step_s, self.halt = step, step_s, threading.Event()

    def run(self) -> None:
        due = time.monotonic()
        while not self.halt.is_set():
            due = max(due + self.step_s, time.monotonic() - 1.0)
            self.halt.wait(max(0.0, due - time.monotonic()))
            try:
                self.step()
            except Exception:  # the server went away: the test is over
                return

    def stop(self) -> None:
        self.halt.set()
        self.join(timeout=2)


def slowing_actor(client: reverb.Client, step_s: float) -> Paced:
    """An actor inserting one item per environment step; `step_s` is the step's duration."""
    return Paced(lambda: client.insert([np.zeros(2, np.float32)], {"replay": 1.0}), step_s)


@pytest.fixture
def job() -> Iterator[tuple[reverb.Client, int]]:
    server = reverb.Server([table(reverb.rate_limiters.MinSize(1), max_size=100_000)])
    yield reverb.Client(f"localhost:{server.port}"), server.port
    server.stop()


# 8x, not 5x: paced by the clock, a step five times longer is a rate of exactly a fifth,
# on the severe line rather than under it; an eighth is well under.
@pytest.mark.parametrize("factor", [10, 8, 3], ids=["10x", "8x", "3x"])
def test_actors_that_slow_down_are_a_throughput_drop(job, factor: float) -> None:
    client, port = job
    actors = [slowing_actor(client, 0.02) for _ in range(2)]
    learning = Paced(lambda: [None for _ in client.sample("replay", num_samples=4)], 0.02)
    for a in actors:
        a.start()
    learning.start()
    try:
        with sidecar_for(port, **SCALED) as sidecar:
            healthy: list = []
            tick_until(sidecar, lambda s: False, 9.0, healthy,  # the baseline
                       replay_each=False)
            for a in actors:
                a.step_s = 0.02 * factor
            slowed = time.monotonic()
            took = tick_until(sidecar, lambda s: "throughput_drop" in kinds(s),
                              2 * DROP_FOR_S + 3.0, replay_each=False)
            state = sidecar.store.current()
    finally:
        for a in actors:
            a.stop()
        learning.stop()
    span = DROP_FOR_S / 5 if factor >= 5 else DROP_FOR_S
    print(f"\nthroughput_drop at {factor}x: {took} s after the step slowed "
          f"(the span and two buckets: {span + 2 * BUCKET_S} s)")
    assert not set().union(*(alarms(s) for s in healthy))
    # A second for a loaded machine's late ticks. Which span named it is read from the
    # evidence, not the clock: the half line's 5 s span can name a drop before 5 s have
    # passed (with most of its buckets slow), and it is the fifth's that must name one here.
    bound = span + 2 * BUCKET_S + SLACK_S + 1.0
    assert took is not None and took <= bound, _why(state)
    # Named once the span's rate and its median bucket are under the line: most of the span
    # slow (a 3x drop: four fifths of it), never a moment's slowness. A quarter of the span
    # (2.5 buckets) since the step slowed: on a loaded host the actors, paced by threads of
    # this process, already ran slower before it (named 1.6 s after, beside TF-Agents' job
    # and the status page's Chromium; 2.5 s was the bound).
    assert time.monotonic() - slowed >= span / 4
    drop = next(f for f in state.findings if f.kind == "throughput_drop")
    inserts = drop.evidence["series"]["inserts"]
    assert inserts["ratio"] < (0.2 if factor >= 5 else 0.5)
    # A 5x step and more is said below a fifth. A 3x step may be too on a loaded host, where
    # the paced threads fall further behind (a fresh clone's make test, the host slowed: the
    # 3x drop was measured and said below a fifth), so its severity is not asserted.
    if factor >= 5:
        assert inserts["below_a_fifth"]
    assert drop.evidence["attribution"] == "clients"  # the server is not slower per insert


def _why(state) -> str:
    """What the sidecar held when no drop was named in time: the baselines it judged against
    and how often its polls failed (a starved machine's ServerInfo can miss its timeout)."""
    sources = {name: (src.failures_total, src.polls_total) for name, src in state.sources.items()}
    baselines = {k: f.baselines for k, f in state.figures.items()}
    return f"baselines {baselines}; (failed, total) polls {sources}"
