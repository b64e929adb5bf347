"""The Reverb table, its rate limiter, and the dataset that samples it, as Acme builds them.

The dataset is Acme's `make_reverb_dataset`: `num_parallel_calls` workers, each
a `TrajectoryDataset` that *batches on its own*, interleaved, then prefetched.
That shape is the seed incident: the rate limiter releases samples to the
table, not to the learner, so with 12 workers the samples it allows can be
spread over 12 half-filled batches and none completes. A synchronous loop that
then calls `next()` waits for a batch that needs an insert its own thread
would have made.
"""

from __future__ import annotations

import contextlib
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import reverb
import tensorflow as tf

from agents.config import ReplayConfig


def make_signature(example: dict[str, Any]) -> dict[str, tf.TensorSpec]:
    return {
        name: tf.TensorSpec(getattr(value, "shape", ()), tf.as_dtype(value.dtype), name=name)
        for name, value in example.items()
    }


def make_rate_limiter(config: ReplayConfig) -> reverb.rate_limiters.SampleToInsertRatio:
    """Keeps `inserts * spi - samples` within `min_size * spi +/- error_buffer`."""
    return reverb.rate_limiters.SampleToInsertRatio(
        samples_per_insert=config.samples_per_insert,
        min_size_to_sample=config.min_replay_size,
        error_buffer=config.error_buffer,
    )


def make_replay_table(config: ReplayConfig, signature: dict[str, tf.TensorSpec]) -> reverb.Table:
    if config.queue:
        return reverb.Table.queue(config.table, config.max_replay_size, signature=signature)
    return reverb.Table(
        name=config.table,
        sampler=(reverb.selectors.Prioritized(config.priority_exponent)
                 if config.sampler == "prioritized" else reverb.selectors.Uniform()),
        remover=reverb.selectors.Fifo(),
        max_size=config.max_replay_size,
        rate_limiter=make_rate_limiter(config),
        signature=signature,
    )


def checkpoint_every(address: str, seconds: float, stop: threading.Event,
                     emit: Callable[[dict[str, Any]], None],
                     section: Callable[[], Any] = contextlib.nullcontext) -> threading.Thread:
    """Checkpoints the server at `address` every `seconds` until `stop`, on a daemon thread;
    each checkpoint is reported as an event (its path and how long it took) and runs inside
    `section()` (a probe's section: the sidecar waits for it)."""
    def loop() -> None:
        client = reverb.Client(address)
        while not stop.wait(seconds):
            t0 = time.monotonic()
            try:
                with section():
                    path = client.checkpoint()
            except Exception as error:  # a server going away at the end of the run
                emit({"event": "checkpoint_failed", "error": str(error)[:200]})
                continue
            emit({"event": "checkpoint", "path": path,
                  "seconds": round(time.monotonic() - t0, 3)})

    thread = threading.Thread(target=loop, name="checkpoints", daemon=True)
    thread.start()
    return thread


def disable_insert_blocking(table: reverb.Table) -> reverb.Table:
    """The same table with `max_diff` at float max, as Acme's `_disable_insert_blocking`.

    In sync mode the actor's inserts and the learner's samples run on one thread;
    an insert blocked waiting for samples would never be unblocked.
    """
    info = table.info.rate_limiter_info
    limiter = reverb.rate_limiters.RateLimiter(
        samples_per_insert=info.samples_per_insert,
        min_size_to_sample=info.min_size_to_sample,
        min_diff=info.min_diff,
        max_diff=sys.float_info.max,
    )
    return table.replace(rate_limiter=limiter)


def make_reverb_dataset(server_address: str, config: ReplayConfig) -> tf.data.Dataset:
    """Acme's make_reverb_dataset: per-worker batching, interleaved, prefetched."""

    @tf.autograph.experimental.do_not_convert  # plain Python; AutoGraph only warns about it
    def make_worker(unused_index: tf.Tensor) -> tf.data.Dataset:
        dataset = reverb.TrajectoryDataset.from_table_signature(
            server_address=server_address,
            table=config.table,
            max_in_flight_samples_per_worker=config.max_in_flight_samples_per_worker,
        )
        return dataset.batch(config.batch_size, drop_remainder=True)

    dataset = tf.data.Dataset.range(config.num_parallel_calls).interleave(
        map_func=make_worker,
        cycle_length=config.num_parallel_calls,
        num_parallel_calls=config.num_parallel_calls,
        deterministic=False,
    )
    if config.prefetch_size:
        dataset = dataset.prefetch(config.prefetch_size)
    return dataset


class PrefetchingIterator:
    """Acme's `utils.prefetch`: a thread fills a bounded queue; `ready()` says it is non-empty.

    `ready()` is what lets a synchronous loop ask "would `next()` block?".
    """

    _END = object()

    def __init__(self, iterable: Iterator[Any], buffer_size: int = 1):
        self._source = iter(iterable)
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=buffer_size)
        self._retrieved = 0
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._fill, name="prefetch", daemon=True)
        self._thread.start()

    def _fill(self) -> None:
        try:
            for item in self._source:
                self._queue.put(item)
        except BaseException as error:  # surfaced to the consumer on its next()
            self._error = error
        self._queue.put(self._END)

    def __iter__(self) -> PrefetchingIterator:
        return self

    def __next__(self) -> Any:
        item = self._queue.get()
        if item is self._END:
            self._queue.put(self._END)  # later calls end too
            if self._error is not None:
                raise self._error
            raise StopIteration
        self._retrieved += 1
        return item

    def ready(self) -> bool:
        return not self._queue.empty()

    def retrieved_elements(self) -> int:
        return self._retrieved


def make_dataset_iterator(server_address: str, config: ReplayConfig) -> PrefetchingIterator:
    dataset = make_reverb_dataset(server_address, config)
    return PrefetchingIterator(dataset.as_numpy_iterator(), buffer_size=1)
