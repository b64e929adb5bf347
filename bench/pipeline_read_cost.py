"""Benchmark: what reading the learner's tf.data graph costs (replaywatch/probe/pipeline.py).

The probe reads the pipeline once, on a thread of its own, when it wraps the iterator; the
learner's `next()` never waits on it. Timed here: the read itself (serializing the graph and
walking it) on the pipelines the probe is tested on, TF-Agents' `as_dataset` (B = 64, 32
datasets), Acme's shape (12 workers batching on their own) and the seed commit's
repeat-interleave, each on a real Reverb server; and how long `probe.wrap()` keeps the
learner's thread (it only starts the reader).

    python -m bench.pipeline_read_cost [--repeats 20]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import reverb
import tensorflow as tf

from replaywatch.probe import TrainerProbe
from replaywatch.probe import pipeline as pipe

TABLE = "replay"


def pipelines(address: str) -> dict[str, Callable[[], Any]]:
    def trajectories(in_flight: int) -> Any:
        return reverb.TrajectoryDataset.from_table_signature(
            server_address=address, table=TABLE, max_in_flight_samples_per_worker=in_flight)

    return {
        "TF-Agents' as_dataset shape (32 datasets, 3 threads, one batch of 64)":
            lambda: tf.data.Dataset.range(32).interleave(
                lambda _: trajectories(6), cycle_length=32, num_parallel_calls=3,
                deterministic=False).batch(64, drop_remainder=True).prefetch(3),
        "Acme's shape (12 workers, each a batch of 256)":
            lambda: tf.data.Dataset.range(12).interleave(
                lambda _: trajectories(512).batch(256, drop_remainder=True), cycle_length=12,
                num_parallel_calls=12, deterministic=False).prefetch(4),
        "the seed's repeat-interleave (12 workers)":
            lambda: tf.data.Dataset.from_tensors(0).repeat().interleave(
                lambda _: trajectories(512).batch(256, drop_remainder=True), cycle_length=12,
                num_parallel_calls=12, deterministic=False),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=20)
    args = p.parse_args()
    table = reverb.Table(TABLE, sampler=reverb.selectors.Uniform(),
                         remover=reverb.selectors.Fifo(), max_size=1000,
                         rate_limiter=reverb.rate_limiters.MinSize(1),
                         signature={"x": tf.TensorSpec((84, 84, 9), tf.uint8)})
    server = reverb.Server([table], port=None)
    address = f"localhost:{server.port}"
    print(f"{'pipeline':72} {'read ms (median, max)':>22} {'wrap() ms':>10}")
    for name, make in pipelines(address).items():
        reads, wraps = [], []
        for _ in range(args.repeats):
            ds = make()
            started = time.perf_counter()
            doc = pipe.read(ds)
            reads.append(1000 * (time.perf_counter() - started))
            assert doc["read"], doc
            iterator = iter(ds)
            started = time.perf_counter()
            TrainerProbe().wrap(iterator)
            wraps.append(1000 * (time.perf_counter() - started))
        print(f"{name:72} {statistics.median(reads):>12.1f} {max(reads):>8.1f} "
              f"{statistics.median(wraps):>10.2f}")
    server.stop()


if __name__ == "__main__":
    main()
