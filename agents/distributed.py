"""Distributed mode on Ray: a Reverb server, N actors and a learner, each its own process.

The shape of Acme's distributed program (Launchpad's replay, learner and actor
nodes), on Ray actors. Unlike sync mode, the rate limiter blocks both ways:
actors wait in `flush()` when they run ahead of the learner, the learner waits
in `next()` when the actors fall behind, or die. Actors pull policy parameters
from the learner every `actor_update_period` environment steps.

The driver (this process) supervises: it logs progress, evaluates the latest
parameters, and replaces an actor `replace_dead_actors_after_s` seconds after
it dies, so a dead actor shows up as a learner waiting in `next()`, then a
recovery. `ray.init()` starts a local Ray here; `--ray-address` joins a cluster.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # never phone home

import jax  # noqa: E402
import numpy as np  # noqa: E402
import ray  # noqa: E402

from agents import builder, reporting  # noqa: E402
from agents.acting import run_episode  # noqa: E402
from agents.config import ReplayConfig, RunConfig, StallInjection, StallKind, TD3Config  # noqa: E402
from agents.environments import EnvironmentSpec, make_environment_spec  # noqa: E402
from agents.learning import PolicyParams  # noqa: E402
from agents.stalls import StallTimer  # noqa: E402

Emit = Callable[[dict[str, Any]], None]
_RAY_TIMEOUT_S = 30.0  # every ray.get has one: the driver must never hang with the job


def _emit_stderr(record: dict[str, Any]) -> None:
    # Workers' stdout is forwarded into the driver's; keep it for the driver's JSON lines.
    sys.stderr.write(json.dumps(record) + "\n")
    sys.stderr.flush()


@ray.remote(num_cpus=0)
class ReplayProcess:
    """Owns the Reverb server; the table's rate limiter blocks inserts and samples."""

    def __init__(self, replay: ReplayConfig, spec: EnvironmentSpec, port: int):
        import reverb

        self._table = builder.make_replay_table(replay, spec, insert_blocking=True)
        self._server = reverb.Server([self._table], port=port or None)

    def port(self) -> int:
        return self._server.port

    def info(self) -> dict[str, Any]:
        return reporting.table_counts(self._table.info)


@ray.remote(num_cpus=0, max_concurrency=4)
class LearnerProcess:
    """The learner, its probe-wrapped iterator, and the parameters actors fetch.

    Threaded (max_concurrency): `run()` holds one thread for good, and
    `get_params()`/`stats()` must still answer while it is blocked in `next()`.
    """

    def __init__(
        self,
        td3: TD3Config,
        replay: ReplayConfig,
        spec: EnvironmentSpec,
        server_address: str,
        seed: int,
        probe_listen: str,
    ):
        networks = builder.make_networks(spec, td3)
        key = jax.random.PRNGKey(seed)
        self._parts = builder.make_learner(networks, td3, replay, server_address, key, probe_listen)
        self._parts.probe.start()
        self._params = self._parts.learner.get_policy_params_numpy()
        self._params_at = 0

    def probe_url(self) -> str | None:
        return self._parts.probe.url

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


@ray.remote(num_cpus=0, max_concurrency=2)
class ActorProcess:
    """Steps its own environment, inserts n-step transitions, refreshes parameters."""

    def __init__(
        self,
        index: int,
        td3: TD3Config,
        replay: ReplayConfig,
        server_address: str,
        learner: Any,
        seed: int,
        update_period: int,
    ):
        import reverb

        self._index = index
        self._env = builder.make_environment_factory(td3)(seed)
        spec = make_environment_spec(self._env)
        networks = builder.make_networks(spec, td3)
        self._adder = builder.make_adder(reverb.Client(server_address), td3, replay)

        def fetch() -> PolicyParams:
            return ray.get(learner.get_params.remote(), timeout=_RAY_TIMEOUT_S)[1]

        self._actor = builder.make_actor(
            networks, td3, fetch, jax.random.PRNGKey(seed), self._adder, update_period
        )
        self._steps = 0
        self._episodes = 0
        self._last_return: float | None = None

    def run(self, stall: StallInjection | None, started_at: float) -> None:
        timer = StallTimer(stall, started_at, clock=time.time)
        kinds = (StallKind.ACTORS_EXIT,) + ((StallKind.ACTOR_EXIT,) if self._index == 0 else ())

        def after_step() -> None:
            self._steps += 1
            self._actor.update()
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


class _Actors:
    """The driver's view of the actor processes: start, poll, notice deaths, replace."""

    def __init__(self, start: Callable[[int], Any], emit: Emit):
        self._start = start
        self._emit = emit
        self._handles: dict[int, Any] = {}
        self._runs: dict[Any, int] = {}  # run() ref -> slot; it only ends when the actor dies
        self._steps_of_dead = 0
        self._episodes_of_dead = 0
        self._last_steps: dict[int, int] = {}
        self._last_episodes: dict[int, int] = {}
        self._last_returns: dict[int, float] = {}
        self._replace_at: dict[int, float] = {}
        self._next_index = 0

    def spawn(self, slot: int, stall: StallInjection | None, started_at: float) -> None:
        index = self._next_index
        self._next_index += 1
        handle = self._start(index)
        self._handles[slot] = handle
        self._last_steps[slot] = 0
        self._last_episodes[slot] = 0
        self._runs[handle.run.remote(stall, started_at)] = slot

    def check_deaths(self, now: float, replace_after_s: float) -> None:
        ready, _ = ray.wait(list(self._runs), num_returns=len(self._runs), timeout=0)
        for ref in ready:
            slot = self._runs.pop(ref)
            try:
                ray.get(ref, timeout=1)
                reason = "returned"
            except Exception as error:  # RayActorError, or whatever the actor raised
                reason = type(error).__name__
            self._steps_of_dead += self._last_steps.pop(slot, 0)
            self._episodes_of_dead += self._last_episodes.pop(slot, 0)
            self._handles.pop(slot, None)
            self._emit({"event": "actor_died", "slot": slot, "reason": reason})
            if replace_after_s >= 0:
                self._replace_at[slot] = now + replace_after_s

    def replace_due(self, now: float, started_at: float) -> None:
        for slot, at in list(self._replace_at.items()):
            if now >= at:
                del self._replace_at[slot]
                self.spawn(slot, None, started_at)
                self._emit({"event": "actor_replaced", "slot": slot})

    def poll(self) -> None:
        refs = {slot: handle.stats.remote() for slot, handle in self._handles.items()}
        for slot, ref in refs.items():
            try:
                stats = ray.get(ref, timeout=_RAY_TIMEOUT_S)
            except Exception:
                continue  # dying; check_deaths() will account for it
            self._last_steps[slot] = stats["env_steps"]
            self._last_episodes[slot] = stats["episodes"]
            if stats["train_return"] is not None:
                self._last_returns[slot] = stats["train_return"]

    @property
    def env_steps(self) -> int:
        return self._steps_of_dead + sum(self._last_steps.values())

    @property
    def episodes(self) -> int:
        return self._episodes_of_dead + sum(self._last_episodes.values())

    @property
    def alive(self) -> int:
        return len(self._handles)

    def train_return(self) -> float | None:
        returns = list(self._last_returns.values())
        return float(np.mean(returns)) if returns else None


def _init_ray(run: RunConfig) -> None:
    # Workers import `agents` by name: put this checkout on their path.
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (root, os.environ.get("PYTHONPATH", "")) if p
    )
    if run.ray_address:
        ray.init(address=run.ray_address, runtime_env={"env_vars": {"PYTHONPATH": root}})
    else:
        ray.init(num_cpus=run.num_actors + 2, include_dashboard=False, log_to_driver=True)


def run_distributed(td3: TD3Config, replay: ReplayConfig, run: RunConfig, emit: Emit) -> None:
    spec = make_environment_spec(builder.make_environment_factory(td3)(run.seed))
    # SIGTERM (a supervisor, a test's teardown) must still reach ray.shutdown() below,
    # or the local Ray's workers outlive the driver for a while.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    _init_ray(run)
    try:
        _drive(td3, replay, run, spec, emit)
    finally:
        ray.shutdown()


def _drive(
    td3: TD3Config, replay: ReplayConfig, run: RunConfig, spec: EnvironmentSpec, emit: Emit
) -> None:
    # A local Ray runs every process on this host; a cluster would need the node's IP.
    host = "127.0.0.1" if not run.ray_address else ray.util.get_node_ip_address()
    replay_process = ReplayProcess.remote(replay, spec, run.reverb_port)
    address = f"{host}:{ray.get(replay_process.port.remote(), timeout=120)}"
    learner = LearnerProcess.remote(td3, replay, spec, address, run.seed, run.probe_listen)
    probe_url = ray.get(learner.probe_url.remote(), timeout=120)

    def start_actor(index: int) -> Any:
        return ActorProcess.remote(
            index, td3, replay, address, learner, run.seed + 1 + index, run.actor_update_period
        )

    started_at = time.time()
    actors = _Actors(start_actor, emit)
    for slot in range(run.num_actors):
        actors.spawn(slot, run.stall, started_at)
    emit(builder.start_record("distributed", address, probe_url, replay, td3,
                              num_actors=run.num_actors))
    learner_run = learner.run.remote(run.stall, started_at)
    evaluator = _Evaluator(td3, spec, run, learner)
    last = reporting.Reading(time.monotonic(), 0, 0)
    next_eval = run.eval_every
    while actors.env_steps < run.steps:
        time.sleep(0.5)
        now = time.monotonic()
        actors.check_deaths(now, run.replace_dead_actors_after_s)
        actors.replace_due(now, started_at)
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
