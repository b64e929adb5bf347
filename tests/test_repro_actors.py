"""The actor-side verdicts (worker_starvation, writer_stalled, dead actors), reproduced on a
real Reverb server with real threads.

Each test starts an in-process `reverb.Server` with a blocking limiter (asynchronous layout:
actors insert from their own threads), actor threads whose real `ActorProbe` wraps real
`TrajectoryWriter`s, and, where a learner is needed, a learner thread reading a real tf.data
Reverb dataset with 4 parallel batching workers (Acme's make_reverb_dataset shape) through a
real `TrainerProbe`. The sidecar core (`build_sidecar`) reads the Reverb server and every probe
over HTTP and is ticked every 0.2 s with a 1.5 s stall window.

The actors obey a policy-lag bound: they may insert `MIN_SIZE + CREDIT + batch x learner
steps` items. CREDIT (40) is dealt round robin to the 4 workers, 10 each, less than a batch of
16, so the learner blocks in next() with 40 samples stranded and never steps. What the actors
do then is the whole difference:

    they die (probe gone)               -> sample_blocked (restart them), never starvation
    they wait on the learner            -> worker_starvation (the asynchronous circular wait)

writer_stalled: an actor whose Reverb server goes away blocks in flush() forever (reverb#4).
Measured detection times are printed (`-s`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import numpy as np
import pytest
import reverb
import tensorflow as tf

from replaywatch.config import PollConfig, ProbeTarget, WatchConfig
from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.model import Finding
from replaywatch.probe import ActorProbe, TrainerProbe
from replaywatch.state import Published
from replaywatch.wiring import Sidecar, build_sidecar
from tests.support.repro import assert_replays

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

TABLE = "replay"
POLL_S = 0.2
WINDOW_S = 1.5
DEADLINE_S = WINDOW_S + 2 * POLL_S  # the acceptance bound: the stall window plus two polls
SLACK_S = 1.0  # a 2-core machine shared by several test runs: scheduling jitter
MIN_SIZE, CREDIT, WORKERS, BATCH = 10, 40, 4, 16
CONNECT_S = 2.0  # time for the dataset's workers to connect before the credit arrives


def blocking_server() -> reverb.Server:
    """min_diff = MIN_SIZE (spi 1): after MIN_SIZE + n inserts, n samples may be drawn;
    max_diff far above, so inserts block only in theory (an asynchronous layout)."""
    limiter = reverb.rate_limiters.RateLimiter(
        samples_per_insert=1.0, min_size_to_sample=MIN_SIZE, min_diff=float(MIN_SIZE),
        max_diff=float(MIN_SIZE + 10_000))
    return reverb.Server([reverb.Table(TABLE, reverb.selectors.Fifo(), reverb.selectors.Fifo(),
                                       max_size=100_000, rate_limiter=limiter)])


def dataset(address: str) -> tf.data.Dataset:
    """Acme's make_reverb_dataset: each parallel worker batches its own samples."""

    def one_worker(_: tf.Tensor) -> tf.data.Dataset:
        return reverb.TrajectoryDataset(
            server_address=address, table=TABLE, dtypes={"x": tf.float32},
            shapes={"x": tf.TensorShape([4])}, max_in_flight_samples_per_worker=1,
        ).batch(BATCH, drop_remainder=True)

    return tf.data.Dataset.range(WORKERS).interleave(
        one_worker, cycle_length=WORKERS, num_parallel_calls=WORKERS, deterministic=False)


class Learner(threading.Thread):
    """Takes batches from the probed iterator and steps; counts its steps for the actors."""

    def __init__(self, address: str) -> None:
        super().__init__(daemon=True, name="learner")
        self.probe = TrainerProbe(batch_size=BATCH, num_parallel_calls=WORKERS, table=TABLE)
        self.iterator = self.probe.wrap(dataset(address).as_numpy_iterator())
        self.steps = 0

    def run(self) -> None:
        for _ in self.iterator:  # blocks once the credit is spread across the workers
            self.probe.step()
            self.steps += 1


class Actors:
    """Actor threads sharing a policy-lag bound; at the bound they wait on the learner or die."""

    def __init__(self, address: str, learner: Learner, count: int, at_bound: str) -> None:
        self.address, self.learner, self.at_bound = address, learner, at_bound
        self.lock = threading.Lock()
        self.inserted = 0
        self.bound_reached_at: float | None = None  # monotonic
        self.halt = threading.Event()
        self.probes = [ActorProbe(table=TABLE, name=f"actor-{i}") for i in range(count)]
        for p in self.probes:
            p.start()
        self.threads = [threading.Thread(target=self._act, args=(p,), daemon=True)
                        for p in self.probes]

    def allowed(self) -> int:
        return MIN_SIZE + CREDIT + BATCH * self.learner.steps

    def _take_turn(self) -> bool:
        with self.lock:
            if self.inserted >= self.allowed():
                if self.bound_reached_at is None:
                    self.bound_reached_at = time.monotonic()
                return False
            self.inserted += 1
            return True

    def _act(self, probe: ActorProbe) -> None:
        client = reverb.Client(self.address)
        with probe.wrap_writer(client.trajectory_writer(num_keep_alive_refs=1)) as writer:
            while not self.halt.is_set():
                if not self._take_turn():
                    if self.at_bound == "die":
                        probe.stop()  # the actor process is gone, and its probe with it
                        return
                    with probe.waiting("learner"):  # a policy-lag bound
                        self.halt.wait(0.1)
                    continue
                writer.append({"x": np.full((4,), self.inserted, np.float32)})
                writer.create_item(TABLE, 1.0, {"x": writer.history["x"][-1]})
                writer.flush()
                probe.step()
                time.sleep(0.01)

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def stop(self) -> None:
        self.halt.set()
        for t in self.threads:
            t.join(timeout=5)
        for p in self.probes:
            p.stop()


def sidecar(port: int, probe_urls: list[str]) -> Sidecar:
    target = f"127.0.0.1:{port}"
    # A learner that never completed a batch is "starting" for startup_grace_s (H10's
    # learner_starting); 1 s keeps these tests short without hiding the verdict.
    th = Thresholds(stall_window_s=WINDOW_S, min_history_s=0.5, startup_grace_s=1.0)
    config = WatchConfig(targets=(target,), probes=tuple(ProbeTarget(u, target)
                                                         for u in probe_urls),
                         poll=PollConfig(interval_s=POLL_S, history_s=300.0), thresholds=th)
    return build_sidecar(config, incidents_path=":memory:")


def tick_until(core: Sidecar, done: Callable[[Published], bool], timeout_s: float,
               seen: list[Published]) -> Published | None:
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        t0 = time.monotonic()
        state = core.poller.tick()
        assert_replays(core, state)
        seen.append(state)
        if done(state):
            return state
        time.sleep(max(0.0, POLL_S - (time.monotonic() - t0)))
    return None


def finding(state: Published | None, kind: str) -> Finding | None:
    return next((f for f in state.findings if f.kind == kind), None) if state else None


@pytest.fixture
def job() -> Iterator[dict]:
    server = blocking_server()
    parts: dict = {"server": server, "address": f"127.0.0.1:{server.port}"}
    yield parts
    if "actors" in parts:
        parts["actors"].stop()
    if "learner" in parts:
        parts["learner"].probe.stop()
    server.stop()


def start_job(job: dict, at_bound: str) -> tuple[Learner, Actors]:
    learner = Learner(job["address"])
    learner.probe.start()
    learner.start()
    time.sleep(CONNECT_S)  # the workers connect, so the credit is dealt round robin
    actors = Actors(job["address"], learner, count=2, at_bound=at_bound)
    job["learner"], job["actors"] = learner, actors
    actors.start()
    return learner, actors


def kinds_seen(seen: list[Published]) -> set[str]:
    return {f.kind for s in seen for f in s.findings}


def test_async_actors_that_die_holding_partial_batches_are_sample_blocked(job: dict) -> None:
    learner, actors = start_job(job, at_bound="die")
    urls = [learner.probe.url, *[p.url for p in actors.probes]]
    seen: list[Published] = []
    with sidecar(job["server"].port, [u for u in urls if u]) as core:
        state = tick_until(core, lambda s: finding(s, "sample_blocked") is not None, 30.0, seen)
        assert actors.bound_reached_at is not None
        latency = time.monotonic() - actors.bound_reached_at
        print(f"\nsample_blocked {latency:.2f}s after the actors died")
        blocked = finding(state, "sample_blocked")
        assert blocked is not None, kinds_seen(seen)
        # Actor probes that never waited: the layout is known to be asynchronous.
        assert blocked.evidence["layout"] == "async"
        assert blocked.evidence["stranded_samples"] == CREDIT
        assert set(blocked.evidence["actors"].values()) == {"down"}
        assert "restart or unblock the actors" in blocked.fix.lower()
        # A few more polls: the wrong verdict of the report never appears.
        tick_until(core, lambda s: False, 1.0, seen)
        assert "worker_starvation" not in kinds_seen(seen)
        assert latency <= DEADLINE_S + 1.0 + SLACK_S  # + the 1 s start-up grace


def test_async_actors_waiting_on_the_learner_are_worker_starvation(job: dict) -> None:
    learner, actors = start_job(job, at_bound="wait")
    urls = [learner.probe.url, *[p.url for p in actors.probes]]
    seen: list[Published] = []
    with sidecar(job["server"].port, [u for u in urls if u]) as core:
        state = tick_until(core, lambda s: finding(s, "worker_starvation") is not None, 30.0,
                           seen)
        assert actors.bound_reached_at is not None
        latency = time.monotonic() - actors.bound_reached_at
        print(f"\nworker_starvation {latency:.2f}s after the actors started waiting")
        starved = finding(state, "worker_starvation")
        assert starved is not None, kinds_seen(seen)
        assert starved.evidence["layout"].startswith("asynchronous")
        assert starved.evidence["stranded_samples"] == CREDIT
        assert set(starved.evidence["actors"].values()) == {"waiting"}
        assert starved.evidence["actors_waiting_on"] == ["learner"]
        assert finding(state, "sample_blocked") is None  # the named cause replaces it
        assert "policy-lag" in starved.fix
        assert latency <= DEADLINE_S + SLACK_S


def test_an_actor_blocked_in_flush_after_the_server_went_away_is_writer_stalled() -> None:
    server = reverb.Server([reverb.Table(TABLE, reverb.selectors.Uniform(),
                                         reverb.selectors.Fifo(), max_size=1000,
                                         rate_limiter=reverb.rate_limiters.MinSize(1))])
    address = f"127.0.0.1:{server.port}"
    probe = ActorProbe(table=TABLE, name="actor-0")
    probe.start()
    halt, errors = threading.Event(), []

    def act() -> None:
        client = reverb.Client(address)
        writer = probe.wrap_writer(client.trajectory_writer(num_keep_alive_refs=1))
        while not halt.is_set():
            try:
                writer.append({"x": np.zeros(4, np.float32)})
                writer.create_item(TABLE, 1.0, {"x": writer.history["x"][-1]})
                writer.flush()  # blocks forever once the server is gone (reverb#4)
                probe.step()
            except Exception as e:  # a call cut mid-way raises; the actor carries on
                errors.append(e)
            time.sleep(0.01)

    # Daemon: it stays blocked inside flush() after the test; the process exits anyway.
    threading.Thread(target=act, daemon=True, name="actor-0").start()
    seen: list[Published] = []
    try:
        with sidecar(server.port, [probe.url or ""]) as core:
            tick_until(core, lambda s: False, 1.5, seen)  # healthy first
            assert "writer_stalled" not in kinds_seen(seen)
            stopped_at = time.monotonic()
            server.stop()
            state = tick_until(core, lambda s: finding(s, "writer_stalled") is not None, 20.0,
                               seen)
            latency = time.monotonic() - stopped_at
            print(f"\nwriter_stalled {latency:.2f}s after the server stopped")
            stalled = finding(state, "writer_stalled")
            assert stalled is not None, kinds_seen(seen)
            assert stalled.evidence["server_down"] is True
            assert stalled.evidence["call"] in ("flush", "create_item", "append")
            assert stalled.evidence["blocked_for_s"] >= WINDOW_S
            assert stalled.table == TABLE and "reverb#4" in stalled.fix
            assert latency <= DEADLINE_S + SLACK_S
    finally:
        halt.set()
        probe.stop()
