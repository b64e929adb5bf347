"""A TF-Agents DQN job on Reverb, as TF-Agents' own tutorials build it, with the probe attached.

TF-Agents (0.19.0) builds everything that matters here: the replay buffer
(`ReverbReplayBuffer`), the observer that inserts (`ReverbAddTrajectoryObserver`, one item of
`sequence_length` steps once its chunk is complete, so the table trails the loop by about two
items), the driver (`PyDriver`), and the dataset (`as_dataset`: min(B, 32) Reverb datasets of
3 x B / cycle samples in flight, read by `num_parallel_calls` interleave threads, then ONE
`.batch(B)` after the interleave). The loop is TF-Agents' "collect K steps, train one": a
scheduled loop, whatever the table can sample.

The table is a `SampleToInsertRatio` limiter (finite max_diff, as TF-Agents users write it):
from min_size on it releases error_buffer samples, then samples_per_insert per item. A train
step asks for B: with error_buffer below B the first one never completes; with fewer interleave
threads than datasets, samples sit in the datasets no thread reads. The probe lines are the two
a TF-Agents user writes: the iterator, and the replay client where the observer inserts.

Run it from the repository root:

    python examples/tf_agents_dqn.py --num-parallel-calls 32 --error-buffer 256

It prints one JSON line {"reverb": ADDR, "probe": URL or null, "pid": PID} once serving, and
one at the end: {"outcome": "ran"} after --train-steps, or {"outcome": "hang"} when the loop
neither inserted nor took a batch for --hang-after seconds, inside next() or inside its own
insert (it then exits: a hung tf.data pipeline holds a normal exit).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from typing import Any

import reverb
import tensorflow as tf
from tf_agents.agents.dqn import dqn_agent
from tf_agents.drivers import py_driver
from tf_agents.environments import suite_gym, tf_py_environment
from tf_agents.networks import sequential
from tf_agents.policies import py_tf_eager_policy, random_py_policy
from tf_agents.replay_buffers import reverb_replay_buffer, reverb_utils
from tf_agents.specs import tensor_spec
from tf_agents.utils import common

from replaywatch.probe import ActorProbe, TrainerProbe

TABLE = "uniform_table"
MAX_CYCLE = 32  # ReverbReplayBuffer's default max_cycle_length


def make_agent(env: Any) -> Any:
    spec = tensor_spec.from_spec(env.action_spec())
    actions = int(spec.maximum - spec.minimum + 1)
    q_net = sequential.Sequential([tf.keras.layers.Dense(32, activation="relu"),
                                   tf.keras.layers.Dense(actions)])
    agent = dqn_agent.DqnAgent(
        env.time_step_spec(), env.action_spec(), q_network=q_net,
        optimizer=tf.keras.optimizers.Adam(learning_rate=1e-3),
        td_errors_loss_fn=common.element_wise_squared_loss,
        train_step_counter=tf.Variable(0))
    agent.initialize()
    agent.train = common.function(agent.train)
    return agent


def make_table(args: argparse.Namespace, agent: Any) -> reverb.Table:
    signature = tensor_spec.add_outer_dim(
        tensor_spec.from_spec(agent.collect_data_spec), None)
    return reverb.Table(
        TABLE, max_size=args.max_size, sampler=reverb.selectors.Uniform(),
        remover=reverb.selectors.Fifo(),
        rate_limiter=reverb.rate_limiters.SampleToInsertRatio(
            samples_per_insert=args.samples_per_insert, min_size_to_sample=args.min_size,
            error_buffer=args.error_buffer),
        signature=signature)


def watch(probe: TrainerProbe | None, hang_after: float) -> None:
    """The truth, taken in the job's own process: a loop that neither inserts nor takes a
    batch for hang_after s is hung, inside next() or inside its own insert."""
    if probe is None:
        return
    progress, since = None, time.time()
    while True:
        time.sleep(0.1)
        doc = probe.snapshot()
        now_progress = (doc["items_inserted"], doc["batches_retrieved"])
        if now_progress != progress:
            progress, since = now_progress, time.time()
        elif time.time() - since >= hang_after:
            print(json.dumps({"outcome": "hang", "hang_since": since,
                              "in": "next()" if doc["blocked_in_next"] else "insert",
                              "batches": doc["batches_retrieved"],
                              "items_inserted": doc["items_inserted"]}), flush=True)
            os._exit(0)


def collect_async(args: argparse.Namespace, py_env: Any, agent: Any, observer: Any,
                  actor: ActorProbe) -> None:
    """TF-Agents' asynchronous shape: a collector of its own that steps the environment apart
    from training, and dies after --async-collector-s seconds, as a crashed collect job does."""
    driver = py_driver.PyDriver(
        py_env, py_tf_eager_policy.PyTFEagerPolicy(agent.collect_policy, use_tf_function=True),
        [observer], max_steps=1)

    def run() -> None:
        deadline, time_step = time.monotonic() + args.async_collector_s, py_env.reset()
        while time.monotonic() < deadline:
            time_step, _ = driver.run(time_step)
            actor.step()

    threading.Thread(target=run, name="collector", daemon=True).start()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--num-parallel-calls", type=int, default=32)
    p.add_argument("--samples-per-insert", type=float, default=16.0)
    p.add_argument("--min-size", type=int, default=200)
    p.add_argument("--error-buffer", type=float, default=256.0)
    p.add_argument("--max-size", type=int, default=100_000)
    p.add_argument("--max-cycle-length", type=int, default=MAX_CYCLE)
    p.add_argument("--collect-steps", type=int, default=4, help="collect steps a train step")
    p.add_argument("--initial-collect", type=int, default=None,
                   help="random steps before training (default min_size + 4: the observer's "
                        "items trail its steps by about two)")
    p.add_argument("--train-steps", type=int, default=300)
    p.add_argument("--hang-after", type=float, default=8.0)
    p.add_argument("--start-delay", type=float, default=0.0,
                   help="seconds between the start line and the first step (a sidecar "
                        "attached from the start sees the configuration first)")
    p.add_argument("--no-probe", action="store_true")
    p.add_argument("--async-collector-s", type=float, default=None,
                   help="collect on a thread of its own (with an ActorProbe) instead of in "
                        "the loop, and stop collecting after this many seconds")
    p.add_argument("--probe-declares-nothing", action="store_true",
                   help="the probe is told nothing of the pipeline or the loop: it reads the "
                        "pipeline from the tf.data graph and learns the loop from its calls")
    p.add_argument("--probe-plain", action="store_true",
                   help="the README's plain tf.data recipe: the probe is given the batch size "
                        "and the threads only, the observer's client wrapped")
    p.add_argument("--server-process", action="store_true",
                   help="the Reverb server in a process of its own, reached over gRPC at "
                        "localhost:PORT (TF-Agents' distributed examples' replay job)")
    p.add_argument("--serve-only", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()

    env = tf_py_environment.TFPyEnvironment(suite_gym.load("CartPole-v0"))
    py_env = suite_gym.load("CartPole-v0")
    agent = make_agent(env)
    if args.serve_only:
        # The replay job of TF-Agents' distributed examples: a server alone on its port.
        server = reverb.Server([make_table(args, agent)], port=None)
        print(json.dumps({"port": server.port}), flush=True)
        server.wait()
    if args.server_process:
        # Another process's server: the datasets and the observer reach it over gRPC.
        child = subprocess.Popen([sys.executable, __file__, *sys.argv[1:], "--serve-only"],
                                 stdout=subprocess.PIPE, text=True)
        port = next(json.loads(x)["port"] for x in child.stdout or () if '"port"' in x)
        replay = reverb_replay_buffer.ReverbReplayBuffer(
            agent.collect_data_spec, table_name=TABLE, sequence_length=2,
            server_address=f"localhost:{port}", max_cycle_length=args.max_cycle_length)
        server_port = port
    else:
        server = reverb.Server([make_table(args, agent)], port=None)
        replay = reverb_replay_buffer.ReverbReplayBuffer(
            agent.collect_data_spec, table_name=TABLE, sequence_length=2, local_server=server,
            max_cycle_length=args.max_cycle_length)
        server_port = server.port

    probe = None
    client = replay.py_client
    initial = args.initial_collect if args.initial_collect is not None else args.min_size + 4
    actor = None
    if args.async_collector_s is not None:
        # The learner only trains; a collector of its own inserts (its ActorProbe's client).
        probe = TrainerProbe(batch_size=args.batch_size,
                             num_parallel_calls=args.num_parallel_calls, table=TABLE,
                             name="learner", batch_after_interleave=True)
        probe.start()
        actor = ActorProbe(table=TABLE, name="collector")
        client = actor.wrap_client(replay.py_client)
    elif args.probe_declares_nothing or args.probe_plain:
        probe = (TrainerProbe(batch_size=args.batch_size,
                              num_parallel_calls=args.num_parallel_calls, table=TABLE,
                              name="learner") if args.probe_plain
                 else TrainerProbe(table=TABLE, name="learner"))
        probe.start()
        client = probe.wrap_client(replay.py_client)
    elif not args.no_probe:
        # [README: TF-Agents]
        probe = TrainerProbe(
            batch_size=args.batch_size, num_parallel_calls=args.num_parallel_calls,
            table=TABLE, name="learner",
            # as_dataset's shape: min(B, max_cycle_length) datasets, one batch after them
            batch_after_interleave=True, cycle_length=args.max_cycle_length,
            # the loop: collect K steps (one item each), then train one, from the items its
            # initial collect left (the observer's items trail its steps by about two)
            gate="schedule", inserts_per_step=args.collect_steps, first_step_at=initial - 2)
        probe.start()                                 # GET /probe and /stacks, a daemon thread
        client = probe.wrap_client(replay.py_client)  # the observer inserts through it
        # [/README]
    observer = reverb_utils.ReverbAddTrajectoryObserver(client, TABLE, sequence_length=2,
                                                        stride_length=1)
    print(json.dumps({"reverb": f"localhost:{server_port}",
                      "probe": probe.url if probe else None, "pid": os.getpid(),
                      "actor_probe": f"http://127.0.0.1:{actor.start()}" if actor else None}),
          flush=True)
    time.sleep(args.start_delay)
    py_driver.PyDriver(py_env, random_py_policy.RandomPyPolicy(
        py_env.time_step_spec(), py_env.action_spec()), [observer],
        max_steps=initial).run(py_env.reset())
    dataset = replay.as_dataset(num_parallel_calls=args.num_parallel_calls,
                                sample_batch_size=args.batch_size, num_steps=2).prefetch(3)
    iterator = iter(dataset)
    if probe is not None:
        iterator = probe.wrap(iterator)
    collect = py_driver.PyDriver(
        py_env, py_tf_eager_policy.PyTFEagerPolicy(agent.collect_policy, use_tf_function=True),
        [observer], max_steps=args.collect_steps)
    if actor is not None:
        collect_async(args, py_env, agent, observer, actor)
    threading.Thread(target=watch, args=(probe, args.hang_after), daemon=True).start()
    time_step = py_env.reset()
    for _ in range(args.train_steps):
        if args.async_collector_s is None:
            time_step, _ = collect.run(time_step)
        experience, _ = next(iterator)
        agent.train(experience)
        if probe is not None:
            probe.step()
    print(json.dumps({"outcome": "ran", "train_steps": args.train_steps}), flush=True)
    os._exit(0)


if __name__ == "__main__":
    main()
