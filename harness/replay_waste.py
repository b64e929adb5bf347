"""Replay loops that waste experience, or do not, on a real Reverb table, polled as the
sidecar polls it: the ground truth for wasted_experience (bench/waste.py, tests).

Two shapes of job, each on one real server, its table's TableInfo read every POLL_S by the
sidecar's own conversion (sources/reverb.py):

    collect   one loop (TF-Agents' collect/train, Acme's older Agent): insert `burst` items,
              then sample `spi` x burst of them (carried over when fractional); a
              prioritized table gets each sampled key a new priority, as a learner's TD
              errors would
    actors    `actors` threads inserting `insert_rate` items a second between them, and a
              learner thread sampling batches of `batch` at spi x insert_rate, or as fast as
              a SampleToInsertRatio limiter lets it (`limiter_spi`); it may pause
              `pause_s` every `pause_every_s` (an evaluation, a checkpoint) while the actors
              go on

The truth each run keeps: its inserts, the unique samples and the samples the server counted
over the stretch where the table stayed full (the measured share of items evicted never
sampled), and the largest burst of inserts between two of the learner's samples.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

import numpy as np

POLL_S = 0.5


@dataclasses.dataclass(frozen=True)
class Shape:
    name: str
    family: str
    max_size: int
    spi: float  # samples per insert the learner aims at (collect; actors without a limiter)
    mode: str = "collect"  # collect | actors
    burst: int = 1  # collect: items inserted between two sampling rounds
    sampler: str = "uniform"  # uniform | prioritized
    inserts: int = 12_000
    actors: int = 2
    insert_rate: float = 2000.0  # actors: items a second between them
    batch: int = 32
    limiter_spi: float | None = None  # actors: a SampleToInsertRatio limiter at this ratio
    error_buffer: float = 200.0
    pause_every_s: float = 0.0  # actors: the learner pauses this often ...
    pause_s: float = 0.0  # ... for this long

    def with_fix(self, spi: float | None = None, max_size: int | None = None) -> Shape:
        """This shape with a printed fix applied: a limiter at `spi` (the actors then wait
        for the learner) or a collect loop sampling `spi` per insert; `max_size`."""
        out = self
        if max_size is not None:
            out = dataclasses.replace(out, max_size=max_size)
        if spi is not None:
            out = (dataclasses.replace(out, spi=spi) if out.mode == "collect" else
                   dataclasses.replace(out, limiter_spi=spi))
        return out


@dataclasses.dataclass(frozen=True)
class Run:
    shape: Shape
    snapshots: tuple  # TableSnapshot, one per poll
    inserts: int  # over the stretch the table stayed full
    unique_samples: int
    samples: int

    @property
    def share(self) -> float:
        return max(0, self.inserts - self.unique_samples) / self.inserts

    @property
    def spi(self) -> float:
        return self.samples / self.inserts


def _table(shape: Shape) -> Any:
    import reverb

    sampler = (reverb.selectors.Prioritized(0.8) if shape.sampler == "prioritized"
               else reverb.selectors.Uniform())
    limiter = (reverb.rate_limiters.SampleToInsertRatio(
        shape.limiter_spi, min_size_to_sample=shape.batch, error_buffer=max(
            shape.error_buffer, 2 * shape.batch)) if shape.limiter_spi
        else reverb.rate_limiters.MinSize(1))
    return reverb.Table("replay", sampler, reverb.selectors.Fifo(), shape.max_size, limiter)


def _insert(writer: Any, n: int) -> None:
    for _ in range(n):
        writer.append({"x": np.float32(0.0)})
        writer.create_item("replay", 1.0, {"x": writer.history["x"][-1:]})
    writer.flush()


def _sample(client: Any, shape: Shape, n: int, rng: np.random.Generator) -> None:
    keys = [int(s[0].info.key) for s in client.sample("replay", num_samples=n)]
    if shape.sampler == "prioritized":
        # TD errors: most small, a few large
        client.mutate_priorities("replay", dict(zip(keys, rng.lognormal(0.0, 1.0, len(keys)))))


def _collect(client: Any, shape: Shape, rng: np.random.Generator) -> None:
    owed, done = 0.0, 0
    with client.trajectory_writer(1) as writer:
        while done < shape.inserts:
            n = min(shape.burst, shape.inserts - done)
            _insert(writer, n)
            done += n
            owed += shape.spi * n
            while owed >= 1:
                k = min(int(owed), 4096)
                _sample(client, shape, k, rng)
                owed -= k


def _actors(address: str, shape: Shape, rng: np.random.Generator) -> None:
    import reverb

    stop = threading.Event()
    per_actor = shape.inserts // shape.actors
    chunk = 20

    def actor() -> None:
        client = reverb.Client(address)
        start, done = time.monotonic(), 0
        with client.trajectory_writer(1) as writer:
            while done < per_actor and not stop.is_set():
                _insert(writer, chunk)
                done += chunk
                ahead = done / (shape.insert_rate / shape.actors) - (time.monotonic() - start)
                if ahead > 0:  # at most insert_rate; a limiter may hold them below it
                    time.sleep(ahead)

    def learner() -> None:
        client = reverb.Client(address)
        start = last_pause = time.monotonic()
        taken = 0
        while not stop.is_set():
            now = time.monotonic()
            if shape.pause_every_s and now - last_pause >= shape.pause_every_s:
                time.sleep(shape.pause_s)
                last_pause = time.monotonic()
                continue
            if not shape.limiter_spi:
                due = shape.spi * shape.insert_rate * (now - start) - taken
                if due < shape.batch:
                    time.sleep(shape.batch / (shape.spi * shape.insert_rate))
                    continue
            try:
                _sample(client, shape, shape.batch, rng)
            except Exception:  # the server stops under a sampler the limiter holds
                if stop.is_set():
                    return
                raise
            taken += shape.batch

    threads = [threading.Thread(target=actor, daemon=True) for _ in range(shape.actors)]
    sampler = threading.Thread(target=learner, daemon=True)
    for t in (*threads, sampler):
        t.start()
    for t in threads:
        t.join()
    stop.set()
    sampler.join(timeout=5.0)


def start(shape: Shape) -> Any:
    """A real Reverb server holding `shape`'s table "replay"."""
    import reverb

    return reverb.Server([_table(shape)], port=None)


def drive(address: str, shape: Shape, seed: int = 0) -> None:
    """`shape`'s loop against the server at `address`, to its last insert."""
    import reverb

    rng = np.random.default_rng(seed)
    if shape.mode == "collect":
        _collect(reverb.Client(address), shape, rng)
    else:
        _actors(address, shape, rng)


def run(shape: Shape, seed: int = 0) -> Run:
    """One run of `shape` to its last insert, its table polled every POLL_S."""
    from replaywatch.sources.reverb import ReverbSource

    server = start(shape)
    address = f"127.0.0.1:{server.port}"
    source = ReverbSource(address, timeout_s=5.0)
    snapshots: list = []
    done = threading.Event()

    def poll() -> None:
        while True:
            stop = done.wait(POLL_S)
            outcome = source.poll()
            if outcome.error:
                raise RuntimeError(outcome.error)
            snapshots.extend(outcome.tables)
            if stop:
                return

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    try:
        drive(address, shape, seed)
    finally:
        done.set()
        poller.join(timeout=10.0)
        source.close()
        server.stop()
    return measured(shape, snapshots)


def measured(shape: Shape, snapshots: list) -> Run:
    """The truth over the stretch the table stayed full in `snapshots`."""
    full = [s for s in snapshots if s.current_size >= s.max_size]
    if len(full) < 2:
        raise RuntimeError(f"{shape.name}: the table never stayed full over two polls")
    first, last = full[0], full[-1]
    return Run(shape, tuple(snapshots),
               inserts=int(last.rate_limiter.inserts - first.rate_limiter.inserts),
               unique_samples=last.num_unique_samples - first.num_unique_samples,
               samples=int(last.rate_limiter.samples - first.rate_limiter.samples))
