"""Factories that wire the agent's parts; both run loops (sync, distributed) use them.

Like Acme's builder: tables, dataset iterator, adder, learner, actor, each made
from the frozen configs and the environment spec. The learner's iterator is
wrapped with `TrainerProbe`, exactly as a user's trainer would do it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import tempfile
from collections.abc import Callable
from typing import Any

import jax
import reverb

from agents import replay as replay_lib
from agents.acting import TD3Actor
from agents.adders import NStepTransitionAdder, transition_example
from agents.config import ReplayConfig, RunConfig, StepDelay, TD3Config
from agents.environments import EnvironmentSpec, make_environment
from agents.learning import PolicyParams, TD3Learner, send_priorities
from agents.networks import TD3Networks, make_networks
from replaywatch.probe import ActorProbe, TrainerProbe


def make_environment_factory(config: TD3Config, delay: StepDelay | None = None
                             ) -> Callable[[int], object]:
    def factory(seed: int):
        return make_environment(seed, config.pixels, config.image_size, config.frame_stack,
                                delay)

    return factory


def make_replay_table(
    config: ReplayConfig, spec: EnvironmentSpec, insert_blocking: bool
) -> reverb.Table:
    """The table; with `insert_blocking=False` for a loop that inserts and samples on one thread."""
    example = transition_example(spec.observation_shape, spec.observation_dtype, spec.action_size)
    table = replay_lib.make_replay_table(config, replay_lib.make_signature(example))
    return table if insert_blocking else replay_lib.disable_insert_blocking(table)


def make_checkpointer(run: RunConfig) -> reverb.checkpointers.CheckpointerBase | None:
    """A checkpointer into a fresh temporary directory when the run checkpoints."""
    if not run.checkpoint_every_s:
        return None
    return reverb.checkpointers.DefaultCheckpointer(
        tempfile.mkdtemp(prefix="replaywatch-agent-checkpoints-"))


def make_probe(config: ReplayConfig, listen: str) -> TrainerProbe:
    return TrainerProbe(
        batch_size=config.batch_size,
        num_parallel_calls=config.num_parallel_calls,
        listen=listen,
        name="learner",
        prefetch_size=config.prefetch_size,
        table=config.table,
        # The synchronous loop (local.LearningActor) steps while the iterator is ready() or
        # the table can_sample: said, so the sidecar judges that gate, not both.
        gate="can_sample",
    )


class NoActorProbe:
    """`--no-actor-probes`: the ActorProbe calls the agent makes, doing nothing."""

    url = None

    def wrap_client(self, client: Any) -> Any:
        return client

    def waiting(self, on: str) -> contextlib.nullcontext[None]:
        return contextlib.nullcontext()

    def section(self, name: str, timeout_s: float | None = None
                ) -> contextlib.nullcontext[None]:
        return contextlib.nullcontext()

    def step(self) -> None:
        pass

    def start(self) -> int:
        return 0

    def stop(self) -> None:
        pass


def any_port(listen: str) -> str:
    """`HOST:0` for `HOST:PORT`: actor probes share the learner probe's host, not its port."""
    return f"{listen.rpartition(':')[0]}:0"


def lag_in_inserts(max_policy_lag: int, n_step: int) -> int | None:
    """The actor probe's bound, in inserts: `--max-policy-lag` steps of an n-step adder
    insert at least steps - (n - 1) items (none on an episode's first n - 1 steps); None
    without a bound. At least 1: the budget model then says what fewer than a batch means."""
    return max(1, max_policy_lag - (n_step - 1)) if max_policy_lag else None


def make_actor_probe(table: str, name: str, listen: str, enabled: bool = True,
                     max_policy_lag: int | None = None) -> ActorProbe | NoActorProbe:
    """An actor's probe, started: on `listen`, or any port of its host if that one is taken.

    A replacement actor asks for its predecessor's port, so the URL a sidecar was given
    for the slot keeps answering; another process may hold it by then.
    """
    if not enabled:
        return NoActorProbe()
    # The lag bound goes to the probe so the sidecar can predict from its first poll.
    probe = ActorProbe(table=table, name=name, listen=listen, max_policy_lag=max_policy_lag)
    try:
        probe.start()
    except OSError:
        probe = ActorProbe(table=table, name=name, listen=any_port(listen),
                           max_policy_lag=max_policy_lag)
        probe.start()
    return probe


@dataclasses.dataclass(frozen=True)
class LearnerParts:
    learner: TD3Learner
    iterator: replay_lib.PrefetchingIterator  # the probe-wrapped one: ready(), next()
    probe: TrainerProbe


def make_learner(
    networks: TD3Networks,
    td3: TD3Config,
    replay: ReplayConfig,
    server_address: str,
    key: jax.Array,
    probe_listen: str,
    first_step_delay_s: float = 0.0,
    step_delay_s: float = 0.0,
) -> LearnerParts:
    """Dataset iterator -> probe wrapper -> learner. The probe is not started here."""
    probe = make_probe(replay, probe_listen)
    iterator = probe.wrap(replay_lib.make_dataset_iterator(server_address, replay))
    # A prioritized table: the learner sends each batch's |TD error| back, through a client
    # its probe counts (inserts=False: this client inserts nothing, the loop is not proven
    # synchronous by it).
    priorities = (send_priorities(probe.wrap_client(reverb.Client(server_address),
                                                    inserts=False), replay.table)
                  if replay.sampler == "prioritized" else None)
    learner = TD3Learner(networks, td3, iterator, key, on_step=probe.step,
                         first_step_delay_s=first_step_delay_s, step_delay_s=step_delay_s,
                         priorities=priorities)
    return LearnerParts(learner, iterator, probe)  # type: ignore[arg-type]


def make_adder(client: reverb.Client, td3: TD3Config, replay: ReplayConfig) -> NStepTransitionAdder:
    return NStepTransitionAdder(
        client, replay.table, td3.n_step, td3.discount, replay.max_in_flight_items
    )


def make_actor(
    networks: TD3Networks,
    td3: TD3Config,
    variable_source: Callable[[], PolicyParams],
    key: jax.Array,
    adder: NStepTransitionAdder | None = None,
    update_period: int = 1,
) -> TD3Actor:
    """An exploring actor with an adder, or (adder None) a greedy evaluator."""
    sigma = td3.exploration_sigma if adder is not None else 0.0
    return TD3Actor(networks, variable_source, key, sigma, adder, update_period)


__all__ = [
    "LearnerParts",
    "NoActorProbe",
    "any_port",
    "make_actor",
    "make_actor_probe",
    "make_adder",
    "make_environment_factory",
    "make_learner",
    "make_networks",
    "make_probe",
    "make_replay_table",
]


def start_replay_probe(listen: str | None) -> str | None:
    """A ReplayProbe in this process, the one running the Reverb server; its URL."""
    if listen is None:
        return None
    from replaywatch.probe import ReplayProbe

    probe = ReplayProbe(listen=listen)
    probe.start()
    return probe.url


def start_record(mode: str, reverb: str, probe: str | None, replay: ReplayConfig,
                 td3: TD3Config, actor_probes: list[str], **extra: Any) -> dict[str, Any]:
    """The first JSON line of a run: what `replaywatch watch` needs to attach.

    `probe` is the learner's TrainerProbe; `actor_probes` the ActorProbes' URLs (one per
    actor slot in distributed mode, the loop's in sync mode; empty with --no-actor-probes),
    for `replaywatch watch --probe URL` (each
    probe's document says its role and name).
    """
    return {
        "event": "start",
        "mode": mode,
        "reverb": reverb,
        "probe": probe,
        "actor_probes": actor_probes,
        "table": replay.table,
        "pid": os.getpid(),
        **extra,
        "num_parallel_calls": replay.num_parallel_calls,
        "batch_size": replay.batch_size,
        "samples_per_insert": replay.samples_per_insert,
        "min_replay_size": replay.min_replay_size,
        "tolerance": replay.tolerance,
        "pixels": td3.pixels,
    }
