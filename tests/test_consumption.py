"""The ratio the learner really trains at, on real Reverb and a real tf.data pipeline.

A table with a signature, an inserting thread, and a learner loop that takes batches of 16
from `TrajectoryDataset.from_table_signature` batched and prefetched, through a TrainerProbe.
The test keeps its own count of inserts and of the samples its loop consumed. The sidecar's
poller (over HTTP to the probe, ServerInfo to the server) must give the consumed samples per
insert within 2% of the test's count over the same window (plus the share of it by which the
probe's readings and the server's were apart), with the samples the server drew
ahead of it (the prefetch, the sampler queues) as its backlog; once the loop stops taking
batches and sampling stops, the samples drawn and not consumed must be exactly the server's
samples less the loop's.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest
import reverb
import tensorflow as tf

from replaywatch.config import PollConfig, ProbeTarget, WatchConfig
from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.metrics import render_published
from replaywatch.probe import TrainerProbe
from replaywatch.wiring import build_sidecar

pytestmark = pytest.mark.long

BATCH = 16
WINDOW_S = 10.0


def test_the_consumed_ratio_matches_the_loops_count_and_the_unconsumed_is_exact(
        tmp_path: Path) -> None:
    signature = {"x": tf.TensorSpec([8], tf.float32)}
    server = reverb.Server([reverb.Table(
        "replay", reverb.selectors.Uniform(), reverb.selectors.Fifo(), max_size=100_000,
        rate_limiter=reverb.rate_limiters.MinSize(100), signature=signature)], port=None)
    address = f"127.0.0.1:{server.port}"
    client = reverb.Client(address)
    stop, learning = threading.Event(), threading.Event()
    learning.set()
    counts = {"inserts": 0, "consumed": 0}
    # (time, inserts, consumed) after every insert and every batch: the test's own count at
    # any instant, read at the instants the sidecar polled
    events: list[tuple[float, int, int]] = [(time.time(), 0, 0)]

    def insert() -> None:
        with client.trajectory_writer(num_keep_alive_refs=1) as writer:
            while not stop.is_set():
                writer.append({"x": np.ones(8, np.float32)})
                writer.create_item("replay", 1.0, {"x": writer.history["x"][-1]})
                writer.flush()
                counts["inserts"] += 1
                events.append((time.time(), counts["inserts"], counts["consumed"]))
                time.sleep(0.005)

    dataset = reverb.TrajectoryDataset.from_table_signature(
        server_address=address, table="replay", max_in_flight_samples_per_worker=32,
    ).batch(BATCH, drop_remainder=True).prefetch(2)
    probe = TrainerProbe(table="replay", batch_size=BATCH)
    batches = probe.wrap(iter(dataset))
    probe.start()

    def learn() -> None:
        while not stop.is_set():
            if not learning.is_set():
                time.sleep(0.05)
                continue
            next(batches)
            counts["consumed"] += BATCH
            events.append((time.time(), counts["inserts"], counts["consumed"]))
            probe.step()
            time.sleep(0.02)

    threads = [threading.Thread(target=f, daemon=True) for f in (insert, learn)]
    for t in threads:
        t.start()
    th = Thresholds(spi_window_s=WINDOW_S)
    config = WatchConfig(targets=(address,), probes=(ProbeTarget(str(probe.url), address),),
                         poll=PollConfig(interval_s=1.0, history_s=300.0), thresholds=th)
    try:
        with build_sidecar(config, incidents_path=str(tmp_path / "i.db")) as sidecar:
            state = None
            for _ in range(int(WINDOW_S) + 6):
                t0 = time.monotonic()
                state = sidecar.poller.tick()
                time.sleep(max(0.0, 1.0 - (time.monotonic() - t0)))
            assert state is not None
            c = state.figures[(address, "replay")].consumption
            assert c is not None
            # The test's own count over the window the sidecar judged, between the instants
            # of its first and last snapshot in it.
            end = sidecar.history.table(address, "replay")[-1].observed_at
            first, last = at(events, end - c.window_s), at(events, end)
            own = (last[2] - first[2]) / (last[1] - first[1])
            assert c.consumed_per_insert is not None
            # The probe's reading of a cycle and the server's are taken side by side, not at
            # one instant: on loaded cores the probe's thread may answer a good part of a
            # second late. Each reading's count must be one the loop really had, and the
            # figure within 2% of the loop's own plus the share of the window by which the
            # readings (probe and server) were apart from the instants the window is timed at.
            (probed,) = [b.source.name for b in sidecar.poller.bindings
                         if b.source.kind == "probe"]
            readings = sidecar.history.probe(probed)
            tables = sidecar.history.table(address, "replay")
            offset = 0.0
            for t in (end - c.window_s, end):
                reading = min(readings, key=lambda r: abs(r.observed_at - t))
                offset += reflected_offset(events, 2, reading.batches_retrieved * BATCH, t)
                snap = min(tables, key=lambda s: abs(s.observed_at - t))
                offset += reflected_offset(events, 1, snap.rate_limiter.inserts, t)
            bound = own * (0.02 + offset / c.window_s)
            assert abs(c.consumed_per_insert - own) <= bound, (c, own, offset)
            # The server's count includes what the prefetch and the sampler queues drew ahead:
            # in steady state the same rate, a backlog ahead of the learner.
            assert c.server_per_insert is not None
            assert c.unconsumed_samples is not None and c.unconsumed_samples >= BATCH
            assert c.unconsumed_s is not None and c.unconsumed_s > 0
            text = render_published(state).decode()
            assert f'replaywatch_table_consumed_samples_per_insert{{table="replay",target="' \
                   f'{address}"}}' in text

            # The learner stops taking batches, then the inserts stop: sampling stops once
            # the pipeline's buffers are full, and what is drawn and not consumed is exact.
            learning.clear()
            time.sleep(0.5)
            stop.set()
            for t in threads:
                t.join(timeout=10)
            drawn = -1
            for _ in range(20):  # until the server's sample count settles
                now = client.server_info()["replay"].rate_limiter_info.sample_stats.completed
                if now == drawn:
                    break
                drawn = now
                time.sleep(0.5)
            state = sidecar.poller.tick()
            c = state.figures[(address, "replay")].consumption
            assert c is not None
            assert c.unconsumed_samples == drawn - counts["consumed"], (c, drawn, counts)
    finally:
        stop.set()
        probe.stop()
        server.stop()


def reflected_offset(events: list[tuple[float, int, int]], column: int, count: int,
                     t: float) -> float:
    """Seconds between `t` (a snapshot's instant) and the span in which the loop's own count
    (column 1: inserts, 2: samples consumed) equalled `count`, a reading's (0 inside it)."""
    held = [e[0] for e in events if e[column] == count]
    assert held, f"a reading of {count} (column {column}), a count the loop never had"
    after = [e[0] for e in events if e[column] > count]
    until = min(after) if after else float("inf")
    return max(0.0, min(held) - t, t - until)


def at(events: list[tuple[float, int, int]], t: float) -> tuple[float, int, int]:
    """The count as it stood at `t`: the last event at or before it."""
    return max((e for e in events if e[0] <= t), key=lambda e: e[0])
