"""One training loop on a real Reverb table, in one of the four layouts the budget model knows.

The prediction grid (bench/predict_grid.py) runs this once per cell and run: a Reverb server
in this process, a table with a SampleToInsertRatio limiter, a tf.data pipeline shaped like
Acme's `make_reverb_dataset` (parallel TrajectoryDatasets, each batching on its own,
interleaved), and a loop that inserts and steps a learner as the layout says:

    sync        insert blocking disabled (max_diff at float max, Acme's LocalLayout); after
                each insert the loop steps the learner while its prefetching iterator is
                ready() or the table can_sample(batch_size): `_has_data_for_training` at the
                seed's commit (`--acme-bound`: can_sample(samples drawn per step so far),
                its `_batch_size_upper_bounds`). `--gate schedule`: the same table, but the
                loop steps on sync-ratio's schedule whatever the table can sample (Acme's
                older `Agent`, TF-Agents' "collect K steps, train one")
    sync-ratio  the table's own finite max_diff; the loop inserts and, from min_size on,
                steps the learner once per batch_size / samples_per_insert inserts (Acme's
                classic `agent.Agent` with `observations_per_step`); `--first-step-at` and
                `--inserts-per-step` move the schedule
    async       an actor thread inserts as fast as the limiter lets it; the learner thread
                calls next() in a loop
    async-lag   as async, but the actor waits on the learner after `--max-policy-lag`
                inserts without a learner step (after warm-up), as a parameter hand-off does,
                or (`--max-items-ahead N`) while it is N items ahead of what the learner's
                batches consumed (consumed samples / samples_per_insert, from min_size on)

`--pipeline after-interleave` reads the table as TF-Agents' `make_reverb_dataset` does:
`--cycle-length` unbatched TrajectoryDatasets interleaved by `--workers` threads, one batch
after the interleave.

The truth is taken here, in the workload's own process: the learner inside one next() for
`--hang-after` seconds is a hang. Otherwise the run trains for `--train-s` seconds after its
first batch. One JSON line at the start ({"reverb", "probe", "actor_probe", "pid"}) and one
at the end ({"outcome": "hang"|"ran", ...}) go to stdout.

    python harness/loop_workload.py --layout sync --workers 12 --batch-size 256 \
        --samples-per-insert 128 --min-size 2000 --error-buffer 2560
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import queue
import sys
import threading
import time
from typing import Any

import numpy as np
import reverb
import tensorflow as tf

from replaywatch.probe import ActorProbe, TrainerProbe

FRAME_SHAPE = (84, 84, 9)  # the seed's DrQ-v2 observation: 63,504 bytes of uint8
SMALL_SHAPE = (4,)
FLOAT_MAX = sys.float_info.max
TABLE = "replay"


def make_table(args: argparse.Namespace, shape: tuple[int, ...], dtype: Any) -> reverb.Table:
    offset = args.samples_per_insert * args.min_size
    min_diff, max_diff = offset - args.error_buffer, offset + args.error_buffer
    if args.layout == "sync":
        max_diff = FLOAT_MAX  # Acme's _disable_insert_blocking
    limiter = reverb.rate_limiters.RateLimiter(
        samples_per_insert=args.samples_per_insert, min_size_to_sample=args.min_size,
        min_diff=min_diff, max_diff=max_diff)
    return reverb.Table(
        name=TABLE, sampler=reverb.selectors.Uniform(), remover=reverb.selectors.Fifo(),
        max_size=args.max_size, rate_limiter=limiter,
        signature={"x": tf.TensorSpec(shape, dtype)})


def in_flight(args: argparse.Namespace) -> int:
    """Samples one TrajectoryDataset may have requested and not yet yielded: Acme's default
    is 2 x batch; TF-Agents' is 3 x the batch's share of one interleaved dataset."""
    if args.max_in_flight:
        return args.max_in_flight
    if args.pipeline == "after-interleave":
        # A cycle longer than the batch would make the share 0, which Reverb refuses.
        return max(1, 3 * (args.batch_size // args.cycle_length))
    return 2 * args.batch_size


def make_dataset(address: str, args: argparse.Namespace) -> tf.data.Dataset:
    """Acme's make_reverb_dataset (`--pipeline per-worker`): `--shape per-worker` as today,
    `repeat` as at the seed's commit (an infinite `from_tensors(0).repeat()` interleaved,
    before acme dea9307). TF-Agents' (`after-interleave`): its datasets yield single
    samples, so a batch is gathered across them after the interleave."""
    def trajectories(_: Any) -> tf.data.Dataset:
        return reverb.TrajectoryDataset.from_table_signature(
            server_address=address, table=TABLE, max_in_flight_samples_per_worker=in_flight(args),
            num_workers_per_iterator=args.workers_per_iterator)

    if args.pipeline == "after-interleave":
        # --workers is the interleave's num_parallel_calls: fewer threads than datasets leave
        # some datasets' samplers filled and unread while a batch waits on the others.
        ds = tf.data.Dataset.range(args.cycle_length).interleave(
            trajectories, cycle_length=args.cycle_length, num_parallel_calls=args.workers,
            deterministic=False)
        ds = ds.batch(args.batch_size, drop_remainder=True)
    else:
        def one(i: Any) -> tf.data.Dataset:
            return trajectories(i).batch(args.batch_size, drop_remainder=True)

        source = (tf.data.Dataset.range(args.workers) if args.shape == "per-worker"
                  else tf.data.Dataset.from_tensors(0).repeat())
        ds = source.interleave(one, cycle_length=args.workers, num_parallel_calls=args.workers,
                               deterministic=False)
    return ds.prefetch(args.prefetch) if args.prefetch else ds


class Prefetching:
    """Acme's `utils.prefetch` in small: a thread keeps `size` batches ready; `ready()` says
    whether next() would return at once."""

    def __init__(self, iterator: Any, size: int = 1):
        self._queue: queue.Queue = queue.Queue(maxsize=size)
        self._inner = iterator
        threading.Thread(target=self._fill, daemon=True).start()

    def _fill(self) -> None:
        for item in self._inner:
            self._queue.put(item)

    def ready(self) -> bool:
        return not self._queue.empty()

    def __iter__(self) -> Prefetching:
        return self

    def __next__(self) -> Any:
        return self._queue.get()


class Loop:
    """The layouts' loops, sharing one table, one writer and one probed iterator."""

    def __init__(self, args: argparse.Namespace, table: reverb.Table, client: reverb.Client,
                 iterator: Any, trainer: TrainerProbe, actor: ActorProbe | None):
        self.args, self.table, self.iterator = args, table, iterator
        self.trainer, self.actor = trainer, actor
        # The loop's own writer is the trainer probe's in synchronous layouts: the thread
        # that inserts is the thread that waits in next(), which is what proves the layout.
        self.client = client
        self.writer = self.make_writer()
        # Frames are random bytes, as camera frames are to a compressor: Reverb compresses
        # chunks, and a table answers at most 1 MiB of them per sample response, so
        # all-zero frames would travel as if they were small items.
        rng = np.random.default_rng(0)
        self.items = ([rng.integers(0, 256, FRAME_SHAPE, np.uint8) for _ in range(16)]
                      if args.item == "frames" else [np.zeros(SMALL_SHAPE, np.float32)])
        self.inserts = 0
        self.batches = 0
        self.learner_steps = 0
        self.stop = threading.Event()
        self.began = self.evaluated_at = time.time()

    def make_writer(self) -> Any:
        writer = self.client.trajectory_writer(num_keep_alive_refs=1)
        return (self.trainer.wrap_writer(writer) if self.args.layout.startswith("sync")
                else self.actor.wrap_writer(writer) if self.actor else writer)

    def insert(self, writer: Any = None) -> None:
        w = writer if writer is not None else self.writer
        w.append({"x": self.items[self.inserts % len(self.items)]})
        w.create_item(TABLE, priority=1.0, trajectory={"x": w.history["x"][-1]})
        # Acme's adders flush(max_in_flight_items) after each item: up to that many inserts
        # are still on their way when the loop goes on (0: it waits for each).
        w.flush(self.args.adder_in_flight)
        self.inserts += 1

    def learn(self) -> None:
        self.evaluate_when_due()
        next(self.iterator)
        self.batches += 1
        self.learner_steps += 1
        if self.args.learner_step_s:
            time.sleep(self.args.learner_step_s)  # a device step: the GIL is free meanwhile
        self.trainer.step()

    def evaluate_when_due(self) -> None:
        """--eval-every-s: the learner pauses --eval-s (no batch, no step), in a section of
        its probe with --eval-section; --learner-hang-at-s: from then on it hangs for good
        outside next() (a stuck device step)."""
        a, now = self.args, time.time()
        if a.learner_hang_at_s is not None and now - self.began >= a.learner_hang_at_s:
            threading.Event().wait()
        if not a.eval_every_s or now - self.evaluated_at < a.eval_every_s:
            return
        marked = self.trainer.section("evaluate") if a.eval_section else contextlib.nullcontext()
        with marked:
            time.sleep(a.eval_s)
        self.evaluated_at = time.time()

    def run_sync(self) -> None:
        bound = self.args.batch_size
        while not self.stop.is_set():
            self.insert()
            while not self.stop.is_set() and (self.iterator.ready()
                                              or self.table.can_sample(bound)):
                self.learn()
                if self.args.acme_bound:
                    drawn = self.table.info.rate_limiter_info.sample_stats.completed
                    bound = math.ceil(drawn / self.batches)

    def run_schedule(self) -> None:
        """Steps on a schedule, not on what the table can sample: sync-ratio's loop, and
        sync's with `--gate schedule` (the limiter then never blocks the loop's inserts)."""
        first, per_step = self.args.first_step_at, self.args.inserts_per_step
        owed = 0.0
        while not self.stop.is_set():
            self.insert()
            if self.inserts < first:
                continue
            if self.inserts == first:
                owed = per_step  # Acme's Agent steps once min_observations are in
            else:
                owed += 1.0
            # Under one insert a step (per_step < 1), several steps follow one insert.
            while owed >= per_step and not self.stop.is_set():
                self.learn()
                owed -= per_step

    def may_insert(self) -> bool:
        """`--max-items-ahead N`: past min_size, the actor stays under N items ahead of the
        items the learner's batches consumed (consumed samples / samples_per_insert)."""
        ahead = self.inserts - self.args.min_size
        consumed = self.batches * self.args.batch_size / self.args.samples_per_insert
        return ahead < 0 or ahead < self.args.max_items_ahead + consumed

    def run_actor(self, own_writer: bool = False) -> None:
        """One actor; `--actors N` runs N, each with its own writer (`own_writer`) on the
        one client; from `--actors-hang-at-s` on, every one hangs for good."""
        lag, seen, since = self.args.max_policy_lag, self.learner_steps, 0
        writer = self.make_writer() if own_writer else None
        hang_at = self.args.actors_hang_at_s
        while not self.stop.is_set():
            if hang_at is not None and time.time() - self.began >= hang_at:
                threading.Event().wait()
            if self.args.max_items_ahead is not None and not self.may_insert():
                assert self.actor is not None
                with self.actor.waiting("learner"):
                    while not self.may_insert() and not self.stop.is_set():
                        time.sleep(0.0005)
                continue  # the stop flag is checked again before inserting
            self.insert(writer)
            if self.actor is not None:
                self.actor.step()
            if lag is None or self.inserts < self.args.min_size:
                continue
            since = 0 if self.learner_steps != seen else since + 1
            seen = self.learner_steps
            if since >= lag:
                assert self.actor is not None
                with self.actor.waiting("learner"):
                    while self.learner_steps == seen and not self.stop.is_set():
                        time.sleep(0.0005)
                seen, since = self.learner_steps, 0

    def run_learner(self) -> None:
        while not self.stop.is_set():
            self.learn()


def watch(loop: Loop, args: argparse.Namespace, started: float) -> dict[str, Any]:
    """Waits for the outcome: a hang (one next() over --hang-after s) or --train-s of training
    after the first batch, or --timeout-s overall."""
    first_batch_at = None
    while True:
        time.sleep(0.05)
        now = time.time()
        doc = loop.trainer.snapshot()
        if first_batch_at is None and doc["batches_retrieved"] > 0:
            first_batch_at = now
        if doc["blocked_in_next"] and doc["blocked_for_s"] >= args.hang_after:
            return {"outcome": "hang", "hang_since": doc["blocked_since"],
                    "hang_at_s": doc["blocked_since"] - started}
        # A loop a while inside next() at the end is not done: it is a hang or a slow batch,
        # and the hang check above tells which. A learner fed by a trickle is often inside
        # next() for moments: that is training.
        if (first_batch_at is not None and now - first_batch_at >= args.train_s
                and (not doc["blocked_in_next"] or doc["blocked_for_s"] < 1.0)):
            return {"outcome": "ran"}
        if now - started > args.timeout_s:
            return {"outcome": "timeout"}


def check_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuses options the chosen layout would ignore, and fills the defaults that depend on
    other options."""
    if args.layout == "async-lag" and bool(args.max_policy_lag) == (args.max_items_ahead
                                                                     is not None):
        p.error("--layout async-lag needs one of --max-policy-lag, --max-items-ahead")
    if args.max_items_ahead is not None and (args.layout != "async-lag"
                                             or args.max_items_ahead < 0):
        p.error("--max-items-ahead is a number >= 0 for --layout async-lag")
    if (args.actors != 1 or args.actors_hang_at_s is not None) and not args.layout.startswith(
            "async"):
        p.error("--actors and --actors-hang-at-s are for the async layouts")
    if args.actors < 1:
        p.error("--actors must be >= 1")
    if args.gate == "schedule" and args.layout != "sync":
        p.error("--gate is for --layout sync (sync-ratio steps on its schedule already)")
    scheduled = args.layout == "sync-ratio" or args.gate == "schedule"
    if not scheduled and (args.first_step_at is not None or args.inserts_per_step is not None):
        p.error("--first-step-at and --inserts-per-step are for a loop on a schedule "
                "(--layout sync-ratio, or sync with --gate schedule)")
    if args.acme_bound and scheduled:
        p.error("--acme-bound is the can-sample gate's")
    args.given_first_step_at, args.given_inserts_per_step = (args.first_step_at,
                                                             args.inserts_per_step)
    if args.first_step_at is None:
        args.first_step_at = args.min_size
    if args.inserts_per_step is None:
        args.inserts_per_step = args.batch_size / args.samples_per_insert
    if scheduled and (args.first_step_at < 1 or not args.inserts_per_step > 0):
        p.error("--first-step-at must be >= 1 and --inserts-per-step > 0")
    if args.pipeline == "after-interleave":
        if args.shape != "per-worker":
            p.error("--shape repeat is Acme's pipeline (--pipeline per-worker)")
        if args.cycle_length is None:
            args.cycle_length = min(args.batch_size, 32)
        if args.cycle_length < 1:
            p.error("--cycle-length must be >= 1")
    elif args.cycle_length is not None:
        p.error("--cycle-length is for --pipeline after-interleave")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--layout", choices=("sync", "sync-ratio", "async", "async-lag"),
                   required=True)
    p.add_argument("--workers", type=int, default=12)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--samples-per-insert", type=float, default=128.0)
    p.add_argument("--min-size", type=int, default=1000)
    p.add_argument("--error-buffer", type=float, required=True)
    p.add_argument("--max-size", type=int, default=100_000)
    p.add_argument("--max-in-flight", type=int, default=None,
                   help="default 2 x batch; after-interleave: 3 x (batch // cycle length)")
    p.add_argument("--prefetch", type=int, default=0, help="tf.data prefetch after interleave")
    p.add_argument("--max-policy-lag", type=int, default=None)
    p.add_argument("--max-items-ahead", type=int, default=None,
                   help="async-lag: the actor's bound in items ahead of the consumed samples "
                        "/ samples_per_insert (instead of --max-policy-lag)")
    p.add_argument("--gate", choices=("can-sample", "schedule"), default="can-sample",
                   help="sync: step while the table can sample (Acme's LocalLayout), or on "
                        "sync-ratio's schedule whatever it can")
    p.add_argument("--undeclared-gate", action="store_true",
                   help="the probe is not told the loop's gate: the sidecar learns it")
    p.add_argument("--first-step-at", type=int, default=None,
                   help="schedule: inserts before the first next() (default --min-size)")
    p.add_argument("--inserts-per-step", type=float, default=None,
                   help="schedule: inserts between next() calls, under 1 for several steps an "
                        "insert (default batch / samples_per_insert)")
    p.add_argument("--pipeline", choices=("per-worker", "after-interleave"),
                   default="per-worker",
                   help="each interleaved dataset batches (Acme), or one batch after the "
                        "interleave (TF-Agents; --workers is its num_parallel_calls)")
    p.add_argument("--cycle-length", type=int, default=None,
                   help="after-interleave: datasets interleaved (default min(batch, 32))")
    p.add_argument("--workers-per-iterator", type=int, default=-1,
                   help="each TrajectoryDataset's num_workers_per_iterator (-1: Reverb's)")
    p.add_argument("--probe-reads-pipeline", action="store_true",
                   help="declare nothing of the dataset to the probe: it reads the graph")
    p.add_argument("--shape", choices=("per-worker", "repeat"), default="per-worker")
    p.add_argument("--item", choices=("small", "frames"), default="small")
    p.add_argument("--item-size-from-signature", action="store_true",
                   help="the probe does not declare item_bytes: the table's signature tells it")
    p.add_argument("--hang-after", type=float, default=8.0)
    p.add_argument("--train-s", type=float, default=10.0)
    p.add_argument("--timeout-s", type=float, default=120.0)
    p.add_argument("--adder-in-flight", type=int, default=0,
                   help="inserts left unconfirmed after each one (Acme's max_in_flight_items)")
    p.add_argument("--learner-step-s", type=float, default=0.0,
                   help="seconds a learner step takes after its batch")
    p.add_argument("--acme-bound", action="store_true",
                   help="sync: can_sample(ceil(drawn / batches)), the seed's commit's gate")
    p.add_argument("--eval-every-s", type=float, default=0.0,
                   help="the learner evaluates (pauses) every this many seconds")
    p.add_argument("--eval-s", type=float, default=60.0, help="each evaluation's length")
    p.add_argument("--eval-section", action="store_true",
                   help="mark each evaluation with probe.section('evaluate')")
    p.add_argument("--learner-hang-at-s", type=float, default=None,
                   help="the learner hangs for good (outside next()) this long after start")
    p.add_argument("--actors", type=int, default=1,
                   help="actor threads of the async layouts, each with its own writer")
    p.add_argument("--actors-hang-at-s", type=float, default=None,
                   help="from then on every actor hangs for good (before an insert)")
    p.add_argument("--start-delay", type=float, default=0.0,
                   help="seconds between the start line and the first insert (a sidecar "
                        "attached from the start sees the configuration first)")
    args = p.parse_args()
    check_args(p, args)

    item = (FRAME_SHAPE, tf.uint8) if args.item == "frames" else (SMALL_SHAPE, tf.float32)
    table = make_table(args, *item)
    server = reverb.Server(tables=[table], port=None)
    address = f"localhost:{server.port}"
    client = reverb.Client(address)
    item_bytes = int(np.prod(item[0])) * (1 if args.item == "frames" else 4)
    # The probes' newer declarations go in where this checkout's probes take them.
    scheduled = args.layout == "sync-ratio" or args.gate == "schedule"
    # The loop says when it calls next(), as a job that knows its loop does; with
    # --undeclared-gate the sidecar has only the loop's calls to learn it from.
    gate: dict[str, Any] = {}
    if args.layout.startswith("sync") and not args.undeclared_gate:
        # The schedule's numbers only where given: unsaid, they follow the batch and the
        # limiter (batch / spi, min_size) as the loop's own defaults do.
        gate = ({"gate": "schedule", "inserts_per_step": args.given_inserts_per_step,
                 "first_step_at": args.given_first_step_at} if scheduled
                else {"gate": "can_sample"})
    after = args.pipeline == "after-interleave"
    # With --probe-reads-pipeline nothing of the dataset is said: the probe reads it from
    # the tf.data graph it is handed, as it does for a job that declares nothing.
    dataset_said: dict[str, Any] = {} if args.probe_reads_pipeline else dict(
        batch_size=args.batch_size, num_parallel_calls=args.workers,
        prefetch_size=args.prefetch or None, max_in_flight=in_flight(args),
        iterators_per_worker=3 if args.shape == "repeat" else 1,
        item_bytes=None if args.item_size_from_signature else item_bytes,
        batch_after_interleave=after, cycle_length=args.cycle_length if after else None)
    trainer = TrainerProbe(table=TABLE, name="learner", **dataset_said, **gate)
    bound = {"max_policy_lag": args.max_policy_lag, "max_items_ahead": args.max_items_ahead}
    actor = (ActorProbe(table=TABLE, name="actor", **bound)
             if args.layout.startswith("async") else None)
    iterator = make_dataset(address, args).as_numpy_iterator()
    if args.layout == "sync" and not scheduled:
        iterator = Prefetching(iterator)  # the can-sample gate asks it whether it is ready()
    loop = Loop(args, table, client, trainer.wrap(iterator), trainer, actor)
    probe_port = trainer.start()
    actor_port = actor.start() if actor else None
    start = {"reverb": address, "pid": os.getpid(),
             "probe": f"http://127.0.0.1:{probe_port}",
             "actor_probe": f"http://127.0.0.1:{actor_port}" if actor_port else None}
    if args.pipeline == "after-interleave":
        start.update(pipeline=args.pipeline, cycle_length=args.cycle_length,
                     in_flight=in_flight(args), workers_per_iterator=args.workers_per_iterator)
    print(json.dumps(start), flush=True)
    time.sleep(args.start_delay)
    started = time.time()
    targets = ([loop.run_schedule] if scheduled
               else [loop.run_sync] if args.layout == "sync"
               else [loop.run_actor, loop.run_learner])
    for target in targets:
        threading.Thread(target=target, daemon=True).start()
    if args.layout.startswith("async"):
        for _ in range(args.actors - 1):
            threading.Thread(target=loop.run_actor, args=(True,), daemon=True).start()
    result = watch(loop, args, started)
    info = table.info.rate_limiter_info
    drawn = info.sample_stats.completed
    result.update(inserts=info.insert_stats.completed, drawn=drawn, batches=loop.batches,
                  undelivered=drawn - loop.batches * args.batch_size,
                  seconds=time.time() - started)
    print(json.dumps(result), flush=True)
    os._exit(0)  # a hung tf.data pipeline would hold a normal exit


if __name__ == "__main__":
    main()
