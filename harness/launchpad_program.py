"""Seed 002's Launchpad topology, probed by replaywatch, for the Launchpad tier of the tests.

Runs under the Launchpad venv (Python 3.10, dm-launchpad 0.5.2, Reverb 0.7.2, TensorFlow 2.8:
`make launchpad-venv`), never under the main one. Two forms, both as Acme's distributed
agents build them (`../shared/seeds/002_*.txt`):

    separate    a `ReverbNode` in group `replay`, `--producers` producer `CourierNode`s that
                insert (each with an `ActorProbe` around its writer), and a learner
                `CourierNode` that samples through a tf.data pipeline of `--workers` parallel
                TrajectoryDatasets, each batching on its own (with a `TrainerProbe`).
                Asynchronous: the table's limiter blocks the producers at max_diff.
    colocated   the learner and the `ReverbNode` in one `MultiThreadingColocation` (Acme's
                `_multithreading_colocate_learner_and_reverb`), and the seed's synchronous
                shape: the learner inserts in its own loop (its writer wrapped by the
                `TrainerProbe`, which proves the loop) and steps once per batch_size /
                samples_per_insert inserts, as Acme 0.4.0's `Agent` does, with insert
                blocking disabled (Acme's `_disable_insert_blocking`). With 12 workers the
                limiter's samples spread over workers that each hold part of a batch: the seed.

    python harness/launchpad_program.py --form separate --control-dir DIR
    python harness/launchpad_program.py --form colocated --workers 12 --control-dir DIR

Every node prints one JSON line when it serves, {"node", "pid", "reverb", "probe"}, and
appends it to the control directory's `nodes.jsonl`: the addresses replaywatch attaches to,
as a user's nodes would log them. The learner takes the
control directory's `hang` file as "hang now" (it stops asking for batches, as hung compute
does: its probe still answers) and its removal as "go on". Launched with
`lp.launch(..., launch_type="local_mp", terminal="current_terminal")`: one process per node,
all in this process's group, so the caller ends the program by killing the group.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import launchpad as lp
import numpy as np
import reverb
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from replaywatch.probe import ActorProbe, TrainerProbe  # noqa: E402  (after the path)

TABLE = "replay"
ITEM_SHAPE = (4,)
FLOAT_MAX = sys.float_info.max


def announce(control_dir: str, node: str, reverb_address: str, probe: str | None) -> None:
    """The line a user's node would log, where its Reverb and its probe are, appended to
    `nodes.jsonl` too: Launchpad pipes each node's output through `sed`, which holds it in a
    block buffer when the terminal is a file."""
    line = json.dumps({"node": node, "pid": os.getpid(), "reverb": reverb_address,
                       "probe": probe})
    print(line, flush=True)
    with open(os.path.join(control_dir, "nodes.jsonl"), "a") as f:
        f.write(line + "\n")  # one short write: whole lines, whichever node writes first


def make_tables(args: argparse.Namespace) -> list[reverb.Table]:
    offset = args.samples_per_insert * args.min_size
    max_diff = FLOAT_MAX if args.form == "colocated" else offset + args.error_buffer
    limiter = reverb.rate_limiters.RateLimiter(
        samples_per_insert=args.samples_per_insert, min_size_to_sample=args.min_size,
        min_diff=offset - args.error_buffer, max_diff=max_diff)
    return [reverb.Table(name=TABLE, sampler=reverb.selectors.Uniform(),
                         remover=reverb.selectors.Fifo(), max_size=100_000,
                         rate_limiter=limiter,
                         signature={"x": tf.TensorSpec(ITEM_SHAPE, tf.float32)})]


def make_dataset(address: str, args: argparse.Namespace) -> tf.data.Dataset:
    """Acme's make_reverb_dataset: parallel TrajectoryDatasets, each batching on its own."""
    def one(_: Any) -> tf.data.Dataset:
        ds = reverb.TrajectoryDataset.from_table_signature(
            server_address=address, table=TABLE,
            max_in_flight_samples_per_worker=2 * args.batch_size)
        return ds.batch(args.batch_size, drop_remainder=True)

    return tf.data.Dataset.range(args.workers).interleave(
        one, cycle_length=args.workers, num_parallel_calls=args.workers, deterministic=False)


def inserter(client: reverb.Client, probe: Any) -> Any:
    """One step's insert: an item of the last appended step, flushed."""
    writer = probe.wrap_writer(client.trajectory_writer(num_keep_alive_refs=1))
    step = {"x": np.zeros(ITEM_SHAPE, np.float32)}

    def insert() -> None:
        writer.append(step)
        writer.create_item(TABLE, priority=1.0, trajectory={"x": writer.history["x"][-1]})
        writer.flush()

    return insert


class Producer:
    """A producer node: an actor stepping an environment and inserting every step."""

    def __init__(self, replay: reverb.Client, index: int, args: argparse.Namespace):
        self._replay, self._args = replay, args
        self._name = f"producer-{index}"

    def run(self) -> None:
        probe = ActorProbe(table=TABLE, name=self._name)
        insert = inserter(self._replay, probe)
        announce(self._args.control_dir, self._name, self._replay.server_address,
                 f"http://127.0.0.1:{probe.start()}")
        while True:
            time.sleep(self._args.env_step_s)  # the environment's step
            insert()
            probe.step()


class Learner:
    """The learner node: next() on the dataset, one step per batch; hangs on request."""

    def __init__(self, replay: reverb.Client, args: argparse.Namespace):
        self._replay, self._args = replay, args
        self._hang = os.path.join(args.control_dir, "hang")

    def _probe(self) -> TrainerProbe:
        a = self._args
        return TrainerProbe(batch_size=a.batch_size, num_parallel_calls=a.workers,
                            table=TABLE, name="learner", max_in_flight=2 * a.batch_size)

    def _hold_while_hung(self) -> None:
        # Hung compute (a collective that never returns): no next(), no step, while the
        # probe's own thread goes on answering.
        while os.path.exists(self._hang):
            time.sleep(0.05)

    def run(self) -> None:
        probe = self._probe()
        address = self._replay.server_address
        iterator = probe.wrap(make_dataset(address, self._args).as_numpy_iterator())
        announce(self._args.control_dir, "learner", address,
                 f"http://127.0.0.1:{probe.start()}")
        if self._args.form == "colocated":
            self._run_sync(probe, iterator)
        while True:
            self._hold_while_hung()
            next(iterator)
            time.sleep(self._args.learner_step_s)  # the update
            probe.step()

    def _run_sync(self, probe: TrainerProbe, iterator: Any) -> None:
        """Acme 0.4.0's Agent: act, insert, and one learner step per batch_size /
        samples_per_insert inserts once min_size are in, without asking can_sample."""
        a = self._args
        insert = inserter(self._replay, probe)
        per_step, owed, inserts = a.batch_size / a.samples_per_insert, 0.0, 0
        while True:
            insert()
            inserts += 1
            if inserts < a.min_size:
                continue
            owed += per_step if inserts == a.min_size else 1.0
            while owed >= per_step:
                next(iterator)
                probe.step()
                owed -= per_step


def make_program(args: argparse.Namespace) -> lp.Program:
    program = lp.Program("replaywatch_seed002")
    replay_node = lp.ReverbNode(lambda: make_tables(args))
    if args.form == "colocated":
        replay = replay_node.create_handle()
        learner_node = lp.CourierNode(Learner, replay, args)
        with program.group("learner"):
            program.add_node(lp.MultiThreadingColocation([learner_node, replay_node]))
        return program
    with program.group("replay"):
        replay = program.add_node(replay_node)
    with program.group("producer"):
        for index in range(args.producers):
            program.add_node(lp.CourierNode(Producer, replay, index, args))
    with program.group("learner"):
        program.add_node(lp.CourierNode(Learner, replay, args))
    return program


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--form", choices=("separate", "colocated"), required=True)
    p.add_argument("--control-dir", required=True)
    p.add_argument("--producers", type=int, default=2)
    p.add_argument("--workers", type=int, default=2, help="num_parallel_calls")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--samples-per-insert", type=float, default=4.0)
    p.add_argument("--min-size", type=int, default=200)
    p.add_argument("--error-buffer", type=float, default=80.0)
    p.add_argument("--env-step-s", type=float, default=0.004)
    p.add_argument("--learner-step-s", type=float, default=0.01)
    args = p.parse_args()
    # As a user's launcher does: lp.launch returns, and Launchpad's worker manager waits for
    # the nodes at exit (a node that dies does not stop the others: it watches the wrapper
    # processes of the current terminal, whose exit codes it cannot read).
    lp.launch(make_program(args), launch_type="local_mp", terminal="current_terminal")


if __name__ == "__main__":
    main()
