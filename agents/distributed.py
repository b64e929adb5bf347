"""Distributed mode on Ray: a Reverb server, N actors and a learner, each its own process.

The shape of Acme's distributed program (Launchpad's replay, learner and actor
nodes), on Ray actors. Unlike sync mode, the rate limiter blocks both ways:
actors wait in `flush()` when they run ahead of the learner, the learner waits
in `next()` when the actors fall behind, or die. Actors pull policy parameters
from the learner every `actor_update_period` environment steps.

The driver (this process) supervises: it logs progress, evaluates the latest
parameters, and replaces an actor `replace_dead_actors_after_s` seconds after
it dies, so a dead actor shows up as a learner waiting in `next()`, then a
recovery. `ray.init()` starts a local Ray here; `--ray-address` joins a cluster,
where `--replay-resource`/`--learner-resource`/`--actor-resource` put each role on
the nodes offering that custom resource (agents/placement.py).

Each actor serves an ActorProbe ("actor-<slot>"): its Reverb writer is wrapped, each
environment step is a heartbeat, and every wait on the learner (a parameter fetch,
the `--max-policy-lag` bound) is inside `waiting("learner")`. The start line lists
their URLs (`actor_probes`) and the Ray node of every role (`nodes`).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # never phone home

import jax  # noqa: E402
import ray  # noqa: E402

from agents import builder, placement, reporting  # noqa: E402
from agents import replay as replay_lib  # noqa: E402
from agents.acting import PolicyLagBound, run_episode  # noqa: E402
from agents.config import ReplayConfig, RunConfig, StallInjection, StallKind, TD3Config  # noqa: E402
from agents.environments import EnvironmentSpec, make_environment_spec  # noqa: E402
from agents.learning import PolicyParams  # noqa: E402
from agents.stalls import StallTimer  # noqa: E402
from agents.supervision import RAY_TIMEOUT_S as _RAY_TIMEOUT_S  # noqa: E402
from agents.supervision import ActorSlots, slot_name  # noqa: E402

Emit = Callable[[dict[str, Any]], None]
_START_TIMEOUT_S = 180.0  # a process's import and start-up, on a loaded machine


def _node_id() -> str:
    return ray.get_runtime_context().get_node_id()


def _emit_stderr(record: dict[str, Any]) -> None:
    # Workers' stdout is forwarded into the driver's; keep it for the driver's JSON lines.
    sys.stderr.write(json.dumps(record) + "\n")
    sys.stderr.flush()


@ray.remote(num_cpus=0)
class ReplayProcess:
    """Owns the Reverb server; the table's rate limiter blocks inserts and samples."""

    def __init__(self, replay: ReplayConfig, spec: EnvironmentSpec, run: RunConfig):
        import reverb

        self._table = builder.make_replay_table(replay, spec, insert_blocking=True)
        self._server = reverb.Server([self._table], port=run.reverb_port or None,
                                     checkpointer=builder.make_checkpointer(run))
        self._replay_probe = builder.start_replay_probe(run.replay_probe_listen)
        self._stop_checkpoints = threading.Event()
        if run.checkpoint_every_s:
            replay_lib.checkpoint_every(f"127.0.0.1:{self._server.port}",
                                        run.checkpoint_every_s, self._stop_checkpoints,
                                        _emit_stderr)

    def where(self, loopback: bool) -> dict[str, Any]:
        """Its Reverb address and its Ray node. On a cluster the address has this node's IP
        (the learner and actors may be elsewhere); a local Ray runs everything here, and
        Reverb listens on loopback too."""
        host = "127.0.0.1" if loopback else ray.util.get_node_ip_address()
        return {"reverb": f"{host}:{self._server.port}", "node_id": _node_id(),
                "replay_probe": self._replay_probe}

    def info(self) -> dict[str, Any]:
        return reporting.table_counts(self._table.info)


def _replay_address(replay: Any, loopback: bool) -> str:
    """The Reverb address, from inside a process that started beside the replay process.

    The learner and the actors are created at once with the replay's handle and ask here
    once their own start-up (TensorFlow, JAX, networks) is done: the three start-ups overlap
    instead of running one after another (start line 13 -> 10 s here: local Ray, 2 actors).
    """
    return ray.get(replay.where.remote(loopback), timeout=_START_TIMEOUT_S)["reverb"]


@ray.remote(num_cpus=0)
class LearnerProcess:
    """The learner, its probe-wrapped iterator, and the parameters actors fetch.

    Threaded (max_concurrency, set at creation): `run()` holds one thread for good,
    `get_params()`/`stats()` must still answer while it is blocked in `next()`, and
    each actor held by `--max-policy-lag` holds one in `wait_for_step()`.
    """

    def __init__(
        self,
        td3: TD3Config,
        replay: ReplayConfig,
        spec: EnvironmentSpec,
        replay_process: Any,
        loopback: bool,
        seed: int,
        probe_listen: str,
        first_step_delay_s: float = 0.0,
        step_delay_s: float = 0.0,
    ):
        networks = builder.make_networks(spec, td3)
        key = jax.random.PRNGKey(seed)
        self._parts = builder.make_learner(networks, td3, replay,
                                           _replay_address(replay_process, loopback), key,
                                           probe_listen, first_step_delay_s, step_delay_s)
        self._parts.probe.start()
        self._params = self._parts.learner.get_policy_params_numpy()
        self._params_at = 0

    def where(self) -> dict[str, Any]:
        return {"probe": self._parts.probe.url, "node_id": _node_id()}

    def run(self, stall: StallInjection | None, started_at: float) -> None:
        learner = self._parts.learner
        timer = StallTimer(stall, started_at, clock=time.time)
        while True:
            timer.maybe_hang_learner(_emit_stderr)
            learner.step()
            if learner.steps - self._params_at >= 20:
                # A reference swap is atomic; get_params() never sees a half update.
                self._params = learner.get_policy_params_numpy()
                self._params_at = learner.steps

    def get_params(self) -> tuple[int, PolicyParams]:
        return self._params_at, self._params

    def stats(self) -> dict[str, Any]:
        return {"learner_steps": self._parts.learner.steps}

    def wait_for_step(self, after: int, timeout_s: float) -> int:
        """The learner's step count once it exceeds `after`, or after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while self._parts.learner.steps <= after and time.monotonic() < deadline:
            time.sleep(0.01)  # one thread per waiting actor (max_concurrency), never run()'s
        return self._parts.learner.steps


@ray.remote(num_cpus=0, max_concurrency=2)
class ActorProcess:
    """Steps its own environment, inserts n-step transitions, refreshes parameters."""

    def __init__(
        self,
        slot: int,
        index: int,
        td3: TD3Config,
        replay: ReplayConfig,
        replay_process: Any,
        loopback: bool,
        learner: Any,
        run: RunConfig,
        probe_listen: str,
    ):
        import reverb

        self._slot = slot
        self._env = builder.make_environment_factory(td3, run.env_step_delay)(
            run.seed + 1 + index)
        spec = make_environment_spec(self._env)
        networks = builder.make_networks(spec, td3)
        probe = builder.make_actor_probe(replay.table, slot_name(slot), probe_listen,
                                         enabled=run.actor_probes,
                                         max_policy_lag=builder.lag_in_inserts(
                                             run.max_policy_lag, td3.n_step))
        self._probe = probe
        address = _replay_address(replay_process, loopback)
        self._adder = builder.make_adder(probe.wrap_client(reverb.Client(address)), td3, replay)

        def fetch() -> PolicyParams:
            with probe.waiting("learner"):
                return ray.get(learner.get_params.remote(), timeout=_RAY_TIMEOUT_S)[1]

        def learner_steps(after: int, timeout_s: float) -> int:
            return ray.get(learner.wait_for_step.remote(after, timeout_s),
                           timeout=timeout_s + _RAY_TIMEOUT_S)

        self._actor = builder.make_actor(networks, td3, fetch,
                                         jax.random.PRNGKey(run.seed + 1 + index), self._adder,
                                         run.actor_update_period)
        self._lag = PolicyLagBound(run.max_policy_lag, learner_steps,
                                   lambda: probe.waiting("learner"),
                                   lambda: self._actor.update(wait=True))
        self._steps = 0
        self._episodes = 0
        self._last_return: float | None = None

    def where(self) -> dict[str, Any]:
        return {"probe": self._probe.url, "node_id": _node_id()}

    def run(self, stall: StallInjection | None, started_at: float) -> None:
        timer = StallTimer(stall, started_at, clock=time.time)
        kinds = (StallKind.ACTORS_EXIT,) + ((StallKind.ACTOR_EXIT,) if self._slot == 0 else ())

        def after_step() -> None:
            self._steps += 1
            self._probe.step()
            self._actor.update()
            self._lag.after_step()
            timer.maybe_exit_actor(_emit_stderr, kinds)

        while True:
            self._last_return, _ = run_episode(self._env, self._actor, update=after_step)
            self._episodes += 1

    def stats(self) -> dict[str, Any]:
        return {
            "env_steps": self._steps,
            "episodes": self._episodes,
            "train_return": self._last_return,
        }


def run_distributed(td3: TD3Config, replay: ReplayConfig, run: RunConfig, emit: Emit) -> None:
    spec = make_environment_spec(builder.make_environment_factory(td3)(run.seed))
    # SIGTERM (a supervisor, a test's teardown) must still reach ray.shutdown() below,
    # or the local Ray's workers outlive the driver for a while.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    placement.init_ray(run)
    try:
        _drive(td3, replay, run, spec, emit)
    finally:
        ray.shutdown()


def _started(ref: Any, role: str, resource: str | None) -> dict[str, Any]:
    """A process's `where()`, or one line saying why it never came."""
    try:
        return ray.get(ref, timeout=_START_TIMEOUT_S)
    except ray.exceptions.GetTimeoutError:
        hint = f": does a node offer the Ray resource {resource!r}?" if resource else ""
        raise RuntimeError(f"the {role} did not start in {_START_TIMEOUT_S:g}s{hint}") from None


def _drive(
    td3: TD3Config, replay: ReplayConfig, run: RunConfig, spec: EnvironmentSpec, emit: Emit
) -> None:
    # All three roles are created at once and start up side by side; the learner and the
    # actors take the Reverb address from the replay process's handle when they need it.
    loopback = not run.ray_address
    replay_process = ReplayProcess.options(**placement.role_options(run.replay_resource)).remote(
        replay, spec, run)
    learner = LearnerProcess.options(
        max_concurrency=run.num_actors + 4, **placement.role_options(run.learner_resource)
    ).remote(td3, replay, spec, replay_process, loopback, run.seed, run.probe_listen,
             run.first_step_delay_s, run.learner_step_delay_s)

    def start_actor(slot: int, index: int, listen: str | None) -> Any:
        return ActorProcess.options(**placement.role_options(run.actor_resource)).remote(
            slot, index, td3, replay, replay_process, loopback, learner, run,
            listen or builder.any_port(run.probe_listen))

    actors = ActorSlots(start_actor, emit)
    replay_at = _started(replay_process.where.remote(loopback), "replay", run.replay_resource)
    address = replay_at["reverb"]
    learner_at = _started(learner.where.remote(), "learner", run.learner_resource)
    actors_at = actors.create(run.num_actors, _START_TIMEOUT_S)
    emit(builder.start_record(
        "distributed", address, learner_at["probe"], replay, td3,
        actor_probes=[a["probe"] for a in actors_at if a["probe"]],
        num_actors=run.num_actors, ray_address=run.ray_address,
        replay_probe=replay_at["replay_probe"],
        nodes={"driver": _node_id(), "replay": replay_at["node_id"],
               "learner": learner_at["node_id"], "actors": [a["node_id"] for a in actors_at]},
    ))
    started_at = time.time()  # injected stalls count from the start line
    for slot in range(run.num_actors):
        actors.run(slot, run.stall, started_at)
    learner_run = learner.run.remote(run.stall, started_at)
    evaluator = _Evaluator(td3, spec, run, learner)
    last = reporting.Reading(time.monotonic(), 0, 0)
    next_eval = run.eval_every
    while actors.env_steps < run.steps:
        time.sleep(0.5)
        now = time.monotonic()
        actors.check_deaths(now, run.replace_dead_actors_after_s)
        actors.replace_due(now, started_at)
        actors.announce_started()
        actors.poll()
        _raise_if_finished(learner_run)
        if now - last.at >= run.log_every_s:
            learner_steps = ray.get(learner.stats.remote(), timeout=_RAY_TIMEOUT_S)["learner_steps"]
            table = ray.get(replay_process.info.remote(), timeout=_RAY_TIMEOUT_S)
            reading = reporting.Reading(now, actors.env_steps, learner_steps)
            emit(
                reporting.progress_event(
                    elapsed_s=time.time() - started_at,
                    now=reading,
                    last=last,
                    episodes=actors.episodes,
                    train_return=actors.train_return(),
                    actors_alive=actors.alive,
                    table=table,
                )
            )
            last = reading
        if run.eval_every and actors.env_steps >= next_eval:
            next_eval += run.eval_every
            evaluator.evaluate(actors.env_steps, emit)
    emit(
        {
            "event": "done",
            "env_steps": actors.env_steps,
            "learner_steps": ray.get(learner.stats.remote(), timeout=_RAY_TIMEOUT_S)[
                "learner_steps"
            ],
        }
    )


def _raise_if_finished(learner_run: Any) -> None:
    """The learner's run() never returns; if it did, it crashed: fail loudly."""
    ready, _ = ray.wait([learner_run], timeout=0)
    if ready:
        ray.get(learner_run, timeout=_RAY_TIMEOUT_S)
        raise RuntimeError("the learner's run() returned")


class _Evaluator:
    """Greedy episodes with the learner's latest parameters, in the driver."""

    def __init__(self, td3: TD3Config, spec: EnvironmentSpec, run: RunConfig, learner: Any):
        self._env = builder.make_environment_factory(td3)(run.seed + 1000)
        self._episodes = run.eval_episodes
        self._learner = learner
        self._actor = builder.make_actor(
            builder.make_networks(spec, td3), td3, self._fetch, jax.random.PRNGKey(run.seed)
        )

    def _fetch(self) -> PolicyParams:
        return ray.get(self._learner.get_params.remote(), timeout=_RAY_TIMEOUT_S)[1]

    def evaluate(self, env_steps: int, emit: Emit) -> None:
        learner_steps, _ = ray.get(self._learner.get_params.remote(), timeout=_RAY_TIMEOUT_S)
        self._actor.update(wait=True)
        returns = [run_episode(self._env, self._actor)[0] for _ in range(self._episodes)]
        emit(reporting.eval_event(env_steps=env_steps, learner_steps=learner_steps,
                                  returns=returns))
