"""A learner that starves its own batching workers: a real worker_starvation hang.

The synchronous layout of the seed incident, made small and deterministic: a
Reverb table whose limiter never blocks inserts (`max_diff` = float max) and
allows `credit` samples in all, read by `workers` parallel TrajectoryDatasets
that each batch on their own (Acme's make_reverb_dataset). The workers connect
first; the credit then arrives one insert at a time, so the table hands it out
round robin and every worker holds `credit / workers` samples, fewer than a
batch. With `batch <= credit < workers * batch` no batch completes and next()
blocks forever while the table says it has nothing left to give.

Prints one JSON line {"reverb": ADDR, "probe": URL, "pid": PID} once serving.

    python tests/support/starved_learner.py --workers 4 --batch 16 --credit 40
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

import numpy as np
import reverb
import tensorflow as tf

from replaywatch.probe import TrainerProbe

TABLE = "replay"
MIN_SIZE = 10


def make_server(min_diff: float) -> reverb.Server:
    limiter = reverb.rate_limiters.RateLimiter(
        samples_per_insert=1.0, min_size_to_sample=MIN_SIZE, min_diff=min_diff,
        max_diff=sys.float_info.max)
    table = reverb.Table(name=TABLE, sampler=reverb.selectors.Fifo(),
                         remover=reverb.selectors.Fifo(), max_size=10_000, rate_limiter=limiter)
    return reverb.Server(tables=[table], port=None)


def make_dataset(address: str, workers: int, batch: int) -> tf.data.Dataset:
    """Acme's make_reverb_dataset: each parallel worker batches its own samples."""

    def one_worker(_: tf.Tensor) -> tf.data.Dataset:
        # One sample in flight per worker keeps the table's hand-out round robin.
        dataset = reverb.TrajectoryDataset(
            server_address=address, table=TABLE, dtypes={"x": tf.float32},
            shapes={"x": tf.TensorShape([4])}, max_in_flight_samples_per_worker=1)
        return dataset.batch(batch, drop_remainder=True)

    return tf.data.Dataset.range(workers).interleave(
        one_worker, cycle_length=workers, num_parallel_calls=workers, deterministic=False)


def insert(address: str, count: int, delay_s: float) -> None:
    client = reverb.Client(address)
    with client.trajectory_writer(num_keep_alive_refs=1) as writer:
        for step in range(count):
            writer.append({"x": np.full((4,), step, np.float32)})
            writer.create_item(TABLE, priority=1.0, trajectory={"x": writer.history["x"][-1]})
            writer.flush()
            time.sleep(delay_s)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--credit", type=int, default=40, help="samples the limiter allows in all")
    p.add_argument("--name", default="starved-learner", help="the probe's learner name")
    p.add_argument("--connect-s", type=float, default=2.0,
                   help="time for the workers to connect before the credit arrives")
    args = p.parse_args()
    if not args.batch <= args.credit < args.workers * args.batch:
        p.error(f"credit ({args.credit}) must be in [batch, workers * batch) to starve")
    # min_diff = MIN_SIZE: after MIN_SIZE + credit inserts, cursor - min_diff = credit.
    server = make_server(min_diff=float(MIN_SIZE))
    address = f"127.0.0.1:{server.port}"
    probe = TrainerProbe(batch_size=args.batch, num_parallel_calls=args.workers,
                         name=args.name, table=TABLE)
    iterator = probe.wrap(make_dataset(address, args.workers, args.batch).as_numpy_iterator())
    probe.start()
    print(json.dumps({"reverb": address, "probe": probe.url, "pid": os.getpid()}), flush=True)

    def grant_credit() -> None:
        time.sleep(args.connect_s)
        insert(address, MIN_SIZE + args.credit, delay_s=0.01)

    threading.Thread(target=grant_credit, name="inserter", daemon=True).start()
    for _ in iterator:  # blocks forever once the credit is spread across the workers
        probe.step()
        print(json.dumps({"batch": probe.snapshot()["batches_retrieved"]}), flush=True)


if __name__ == "__main__":
    main()
