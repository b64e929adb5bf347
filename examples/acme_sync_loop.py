"""The seed incident on Acme's own code: `make_reverb_dataset` read by a synchronous loop.

Acme (dm-acme 0.4.0) builds everything that matters here: the dataset
(`acme.datasets.make_reverb_dataset`: `num_parallel_calls` TrajectoryDatasets that each
batch on their own, interleaved), the adder that inserts (`NStepTransitionAdder`), the
prefetch thread (`acme.jax.utils.prefetch`), the synchronous loop (`acme.EnvironmentLoop`
driving `acme.agents.agent.Agent`: act, insert, and every `batch / samples_per_insert`
observations one `learner.step()`, which calls `next()`). The user's parts are small: an
environment, an actor, a learner and the builder that makes it.

The table is the seed's: `SampleToInsertRatio` with insert blocking disabled (`max_diff` at
float max, what Acme's LocalLayout does since the seed's commit: an insert waiting for samples
on the learner's own thread would never return). From `min_size` on the limiter allows a small
error buffer plus 128 samples (one `samples_per_insert`) per insert, and Reverb deals them out
to whichever workers are waiting. With 12 workers each holds part of a batch of 256: a few
batches complete (4 or 5 in our runs), then none can, `next()` blocks, and the inserts that would
complete one would come from the blocked thread. With one worker every sample the limiter
allows lands in the one batch and the loop runs.

Acme 0.4.0's LocalLayout is out of reach (its imports need at least sonnet, TF Probability,
Pillow and gym, none in our stack), so the builder is called here the way LocalLayout calls
it: `builder.make_learner(random_key=..., networks=..., dataset=..., ...)`. Run it from the
repository root; `tests/support/acme_compat.py` applies the shims Acme 0.4.0 needs on our stack:

    python -m tests.support.acme_compat examples/acme_sync_loop.py --num-parallel-calls 12

It prints one JSON line {"reverb": ADDR, "probe": URL or null, "pid": PID} once serving.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator
from typing import Any

import dm_env
import jax
import jax.numpy as jnp
import numpy as np
import reverb
from acme import EnvironmentLoop, core, datasets, make_environment_spec, specs
from acme.adders import reverb as adders
from acme.agents.agent import Agent
from acme.jax import utils as jax_utils
from acme.utils import loggers

from replaywatch.probe import TrainerProbe

TABLE = adders.DEFAULT_PRIORITY_TABLE
BATCH = 256
SAMPLES_PER_INSERT = 128.0
MIN_REPLAY = 1000
# Samples the limiter lets the workers draw ahead of the learner: about ERROR_BUFFER + 128 x
# (MIN_OBSERVATIONS - MIN_REPLAY) = 1280. More than one worker needs to complete a batch
# (256), fewer than 12 can hold with none complete (12 x 255).
ERROR_BUFFER = 256.0
# Acme 0.4.0's Agent counts observations, not inserts; the adder's items trail them (a few
# in flight, one step per episode start). Stepping the learner at exactly MIN_REPLAY could
# wait for an insert that comes after the step, so it starts a few observations later.
MIN_OBSERVATIONS = MIN_REPLAY + 8
EPISODE_STEPS = 100


class Counting(dm_env.Environment):
    """Small observations, fixed-length episodes: the test is about the replay, not the task."""

    def __init__(self) -> None:
        self._t = 0

    def _observation(self) -> np.ndarray:
        return np.full((4,), self._t, np.float32)

    def reset(self) -> dm_env.TimeStep:
        self._t = 0
        return dm_env.restart(self._observation())

    def step(self, action: np.ndarray) -> dm_env.TimeStep:
        self._t += 1
        if self._t >= EPISODE_STEPS:
            return dm_env.termination(0.0, self._observation())
        return dm_env.transition(0.0, self._observation())

    def observation_spec(self) -> dm_env.specs.Array:
        return dm_env.specs.Array((4,), np.float32, "observation")

    def action_spec(self) -> dm_env.specs.BoundedArray:
        return dm_env.specs.BoundedArray((1,), np.float32, -1.0, 1.0, "action")


class Actor(core.Actor):
    """Acts and inserts through Acme's adder: in this layout the loop is the only inserter."""

    def __init__(self, spec: specs.EnvironmentSpec, adder: adders.NStepTransitionAdder):
        self._action = np.zeros(spec.actions.shape, spec.actions.dtype)
        self._adder = adder

    def select_action(self, observation: Any) -> np.ndarray:
        return self._action

    def observe_first(self, timestep: dm_env.TimeStep) -> None:
        self._adder.add_first(timestep)

    def observe(self, action: np.ndarray, next_timestep: dm_env.TimeStep) -> None:
        self._adder.add(action, next_timestep)

    def update(self, wait: bool = False) -> None:
        pass


@jax.jit
def _update(observation: jnp.ndarray) -> jnp.ndarray:
    return jnp.mean(observation)


class Learner(core.Learner):
    """Keeps its iterator in `_iterator` and calls next() on it in step(), as Acme's do."""

    def __init__(self, iterator: Iterator[reverb.ReplaySample]):
        self._iterator = iterator
        self._mean = 0.0

    def step(self) -> None:
        sample = next(self._iterator)
        self._mean = float(_update(sample.data.observation))

    def get_variables(self, names: Any) -> list[Any]:
        return [self._mean for _ in names]


class Builder:
    """The part of Acme's builder interface the probe uses: `make_learner`."""

    def make_learner(self, random_key: Any, networks: Any, dataset: Iterator[Any],
                     replay_client: reverb.Client | None = None, counter: Any = None) -> Learner:
        return Learner(dataset)


def make_table(spec: specs.EnvironmentSpec) -> reverb.Table:
    limiter = reverb.rate_limiters.SampleToInsertRatio(
        samples_per_insert=SAMPLES_PER_INSERT, min_size_to_sample=MIN_REPLAY,
        error_buffer=ERROR_BUFFER)
    table = reverb.Table(
        name=TABLE, sampler=reverb.selectors.Uniform(), remover=reverb.selectors.Fifo(),
        max_size=100_000, rate_limiter=limiter,
        signature=adders.NStepTransitionAdder.signature(spec))
    # Acme's LocalLayout `_disable_insert_blocking`: the loop that inserts is the learner's.
    info = table.info.rate_limiter_info
    return table.replace(rate_limiter=reverb.rate_limiters.RateLimiter(
        samples_per_insert=info.samples_per_insert, min_size_to_sample=info.min_size_to_sample,
        min_diff=info.min_diff, max_diff=sys.float_info.max))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--num-parallel-calls", type=int, default=12)
    parser.add_argument("--no-probe", action="store_true")
    parser.add_argument("--steps", type=int, default=1_000_000)
    args = parser.parse_args()
    workers = args.num_parallel_calls

    environment = Counting()
    spec = make_environment_spec(environment)
    server = reverb.Server([make_table(spec)], port=None)
    address = f"127.0.0.1:{server.port}"
    client = reverb.Client(address)
    dataset = datasets.make_reverb_dataset(
        address, batch_size=BATCH, table=TABLE, num_parallel_calls=workers, prefetch_size=1)
    iterator = jax_utils.prefetch(dataset.as_numpy_iterator(), buffer_size=2)
    key, builder, probe = jax.random.PRNGKey(0), Builder(), None

    if not args.no_probe:
        # [README: Acme]
        probe = TrainerProbe(batch_size=BATCH, num_parallel_calls=workers, table=TABLE,
                             name="learner")
        probe.start()                          # GET /probe and /stacks, a daemon thread
        builder = probe.wrap_builder(builder)  # the same object: give it to LocalLayout
        # [/README]
    # What LocalLayout and run_experiment do with the builder; the learner is probe-wrapped.
    learner = builder.make_learner(random_key=key, networks=None, dataset=iterator,
                                   replay_client=client)
    actor = Actor(spec, adders.NStepTransitionAdder(client, n_step=1, discount=1.0))
    agent = Agent(actor, learner, min_observations=MIN_OBSERVATIONS,
                  observations_per_step=BATCH / SAMPLES_PER_INSERT)
    print(json.dumps({"reverb": address, "probe": probe.url if probe else None,
                      "pid": os.getpid()}), flush=True)
    EnvironmentLoop(environment, agent, logger=loggers.NoOpLogger()).run(num_steps=args.steps)


if __name__ == "__main__":
    main()
