"""Every finding kind's bundle replays to the live verdict, on real Reverb.

tests/support/repro.py's tick_until checks, at every cycle of every reproduction, that the
cycle's bundle (through JSON) gives the published verdict byte for byte offline. The
reproductions there reach these kinds (a run with REPLAYS_LOG=file lists them):

    test_repro_startup     learner_starting, learner_stalled, insert_blocked, stale_data,
                           target_down, server_restarted, reconnecting, warmup_impossible
    test_repro_actors      sample_blocked, writer_stalled, probe_down, worker_starvation
    test_repro_stacks      sample_blocked, worker_starvation (from two py-spy dumps)
    test_repro_queue       drained, insert_blocked
    test_repro_throughput  throughput_drop

The kinds no other in-process reproduction reaches get theirs here: an in-process Reverb
server, a TrainerProbe over real HTTP declaring its dataset, real writers and samplers, a
socket that takes connections and answers nothing. Each is ticked until its kind shows.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import reverb

from replaywatch import bundle as bd
from replaywatch.config import PollConfig, ProbeTarget, WatchConfig
from replaywatch.diagnosis import kinds as kinds_module
from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.probe import TrainerProbe
from replaywatch.wiring import build_sidecar
from tests.support.repro import (
    POLL_S,
    WINDOW_S,
    Loop,
    actor,
    kinds,
    sidecar_for,
    table,
    tick_until,
    wait_for_bundles,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]

REPRODUCED_ELSEWHERE = {
    "learner_starting", "learner_stalled", "insert_blocked", "stale_data", "target_down",
    "server_restarted", "reconnecting", "warmup_impossible", "sample_blocked",
    "writer_stalled", "probe_down", "worker_starvation", "drained", "throughput_drop",
    # tests/test_memory_cgroup.py and test_memory_leak.py (make test-memory) replay theirs
    "memory_exhaustion", "memory_leak",
    # tests/test_priorities.py replays the cycle each opens in
    "priorities_ignored", "priority_collapse", "repeated_batches", "priority_updates_rejected",
    # tests/test_waste.py replays the cycle that names it
    "wasted_experience",
    # tests/test_checkpoints.py replays each cycle that names them, on replay processes
    # whose probe was handed the server
    "restoring", "checkpoint_failed", "checkpoint_unrestorable", "restore_config_override",
    # tests/test_repro_shards.py replays each cycle whose findings change, on servers of one
    # job in a targets file
    "shard_not_sampled", "waits_on_shard", "shard_config_differs",
    # An RLlib job's, judged by rules_rllib.judge_rllib on a Ray cluster's snapshots, not by
    # diagnose on a Reverb table: tests/test_rules_rllib.py holds them, on documents recorded
    # off real Ray jobs among others
    "env_runner_stalled", "driver_stalled", "rllib_actor_down", "env_steps_dropped"}


def _probed(limiter: reverb.rate_limiters.RateLimiter,
            pipeline: Callable[[str], Any] | None = None, **declared: Any
            ) -> Callable[[], Iterator[tuple[int, str | None, dict[str, float]]]]:
    """A server with `limiter` and a trainer probe declaring its dataset, nothing flowing;
    with `pipeline` (the server's address -> a tf.data dataset), wrapping its iterator."""
    def make() -> Iterator[tuple[int, str | None, dict[str, float]]]:
        server = reverb.Server([table(limiter)], port=None)
        # Told its shape (one iterator per worker, Acme's): a probe told only the batch and
        # the threads gives no verdict before it reads its graph (rules_config.shape_pending).
        probe = TrainerProbe(table="replay", listen="127.0.0.1:0",
                             **{"iterators_per_worker": 1, **declared})
        if pipeline is not None:
            probe.wrap(iter(pipeline(f"127.0.0.1:{server.port}")))
        probe.start()
        try:
            yield server.port, str(probe.url), {}
        finally:
            probe.stop()
            server.stop()
    return make


def _too_many_threads() -> Iterator[tuple[int, str | None, dict[str, float]]]:
    # This test process runs Reverb's and gRPC's threads: more than two.
    yield from _probed(reverb.rate_limiters.MinSize(1), batch_size=4)()


def _warmup() -> Iterator[tuple[int, str | None, dict[str, float]]]:
    server = reverb.Server([table(reverb.rate_limiters.MinSize(100_000), max_size=200_000)],
                           port=None)
    inserting = actor(reverb.Client(f"localhost:{server.port}"))
    inserting.start()
    try:
        yield server.port, None, {}
    finally:
        inserting.stop()
        server.stop()


def _spi_drift() -> Iterator[tuple[int, str | None, dict[str, float]]]:
    # Inserts never block (max_diff at float max) and the learner samples one item per
    # 50 ms against hundreds of inserts a second: samples per insert far below 1.
    limiter = reverb.rate_limiters.RateLimiter(samples_per_insert=1.0, min_size_to_sample=200,
                                               min_diff=150.0, max_diff=sys.float_info.max)
    server = reverb.Server([table(limiter, max_size=100_000)], port=None)
    client = reverb.Client(f"localhost:{server.port}")
    for _ in range(250):
        client.insert([np.zeros(2, np.float32)], {"replay": 1.0})
    loops = [actor(client), Loop(lambda: [None for _ in client.sample("replay", num_samples=1)],
                                 pause_s=0.05)]
    for loop in loops:
        loop.start()
    try:
        yield server.port, None, {"spi_window_s": 2.0, "spi_min_inserts": 20}
    finally:
        for loop in loops:
            loop.stop()
        server.stop()


def _checkpointing() -> Iterator[tuple[int, str | None, dict[str, float]]]:
    # A server whose table lock is held answers no ServerInfo call, though it takes the
    # connection: a listening socket that reads nothing is the same on the wire.
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                held.append(sock.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield sock.getsockname()[1], None, {}
    finally:
        sock.close()
        for conn in held:
            conn.close()


def _three_threads_of_32(address: str) -> Any:
    """TF-Agents' shape as a real tf.data graph: 32 datasets, 3 threads, one batch of 64."""
    import tensorflow as tf

    def one(_: Any) -> Any:
        return reverb.TrajectoryDataset(
            server_address=address, table="replay", dtypes={"x": tf.float32},
            shapes={"x": tf.TensorShape([4])}, max_in_flight_samples_per_worker=6)

    return tf.data.Dataset.range(32).interleave(one, cycle_length=32, num_parallel_calls=3,
                                                deterministic=False).batch(64, True)


def _in_section() -> Iterator[tuple[int, str | None, dict[str, float]]]:
    # A learner inside a section it marks ("evaluate") for longer than the stall window.
    server = reverb.Server([table(reverb.rate_limiters.MinSize(1))], port=None)
    probe = TrainerProbe(table="replay", listen="127.0.0.1:0", batch_size=4)
    probe.start()
    leave = threading.Event()

    def evaluate() -> None:
        with probe.section("evaluate"):
            leave.wait(30)

    threading.Thread(target=evaluate, daemon=True).start()
    try:
        yield server.port, str(probe.url), {"learned_windows": True}  # a section's window
    finally:
        leave.set()
        probe.stop()
        server.stop()


def _pipeline_draining() -> Iterator[tuple[int, str | None, dict[str, float]]]:
    # Actors held at max_diff; the learner's pipeline draws 20 batches at once, then the
    # learner lives on them, a step every 0.3 s: the table rests while it trains.
    server = reverb.Server([table(reverb.rate_limiters.SampleToInsertRatio(1.0, 10, 20.0))],
                           port=None)
    client = reverb.Client(f"localhost:{server.port}")
    probe = TrainerProbe(table="replay", listen="127.0.0.1:0", batch_size=4)
    probe.start()

    def pipeline() -> Iterator[list[Any]]:
        while True:
            drawn = list(client.sample("replay", num_samples=80))
            yield from (drawn[i:i + 4] for i in range(0, 80, 4))

    batches = probe.wrap(pipeline())

    def step() -> None:
        next(batches)
        time.sleep(0.3)
        probe.step()

    loops = [actor(client), Loop(step, pause_s=0.0)]
    for loop in loops:
        loop.start()
    try:
        # The rest is judged against the window the learner's rhythm sets.
        yield server.port, str(probe.url), {"learned_windows": True}
    finally:
        for loop in loops:
            loop.stop()
        probe.stop()
        server.stop()


CASES: dict[str, Callable[[], Iterator[tuple[int, str | None, dict[str, float]]]]] = {
    # sync-ratio, 2 workers of 16, error_buffer 20: the grid's hang, predicted from the
    # declared dataset before any batch.
    "deadlock_risk": _probed(reverb.rate_limiters.SampleToInsertRatio(4, 1000, 20),
                             batch_size=16, num_parallel_calls=2, layout="sync-ratio"),
    # batch 256 against 100 samples of credit: no batch can ever complete.
    "batch_exceeds_headroom": _probed(reverb.rate_limiters.RateLimiter(
        samples_per_insert=128, min_size_to_sample=1000, min_diff=128_000 - 100,
        max_diff=128_000 + 100), batch_size=256, num_parallel_calls=1, layout="sync-ratio"),
    "too_many_threads": _too_many_threads,
    "warmup": _warmup,
    "spi_drift": _spi_drift,
    "checkpointing": _checkpointing,
    # The graph read by a probe that was told 12 workers.
    "declared_pipeline_differs": _probed(reverb.rate_limiters.MinSize(1),
                                         _three_threads_of_32, batch_size=64,
                                         num_parallel_calls=12),
    "in_section": _in_section,
    "pipeline_draining": _pipeline_draining,
}


def test_every_kind_has_a_reproduction_that_replays() -> None:
    assert set(CASES) | REPRODUCED_ELSEWHERE == {k.name for k in kinds_module.ALL}
    assert not set(CASES) & REPRODUCED_ELSEWHERE


@pytest.mark.parametrize("kind", sorted(CASES))
def test_the_kinds_bundle_replays_to_the_live_verdict(kind: str) -> None:
    thresholds = {"too_many_threads": 2} if kind == "too_many_threads" else {}
    setup = CASES[kind]()
    port, probe, more = next(setup)
    try:
        with sidecar_for(port, probe=probe, **{**thresholds, **more}) as sidecar:
            # tick_until replays every cycle's bundle against the published verdict
            took = tick_until(sidecar, lambda s: kind in kinds(s), 8.0)
    finally:
        setup.close()
    assert took is not None, f"{kind} never showed"


def test_a_bundle_whose_stack_dump_failed_says_why(tmp_path: Path) -> None:
    # A critical with --trainer-pid naming a process that is gone: py-spy fails for real, and
    # the bundle written after it says so beside the probe's stacks, not silently.
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    port, probe, _ = next(setup := CASES["batch_exceeds_headroom"]())
    assert probe is not None
    th = Thresholds(stall_window_s=WINDOW_S, min_history_s=0.5)
    config = WatchConfig(targets=(f"127.0.0.1:{port}",), probes=(ProbeTarget(probe, None),),
                         trainer_pid=gone.pid, thresholds=th,
                         poll=PollConfig(interval_s=POLL_S, history_s=300.0))
    try:
        with build_sidecar(config, incidents_path=str(tmp_path / "i.db")) as sidecar:
            tick_until(sidecar, lambda s: "batch_exceeds_headroom" in kinds(s), 8.0)
            (path,) = wait_for_bundles(sidecar, 1)
    finally:
        setup.close()
    b = bd.read(path)
    assert list(b.doc["stacks"]) == [probe]  # the probe's /stacks answered
    (why,) = [m for m in b.doc["missing"] if m["what"] == f"stacks from py-spy:{gone.pid}"]
    assert why["why"].startswith("py-spy dump")
