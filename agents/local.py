"""Sync mode: actor and learner interleaved on one thread, like Acme's `run_experiment`.

Because one thread both inserts and samples, insert blocking is disabled on the
rate limiter (max_diff at float max): an insert blocked waiting for samples
would wait for the very thread that is blocked. Learning is paced by the
sample side only: after each environment step `LearningActor.update()` runs
learner steps while the iterator is ready or the table can sample a batch.

That loop is the seed incident's. "The table can sample a batch" is a promise
about the table, not about the iterator: with `num_parallel_calls` workers each
batching on its own, the samples it releases can end up spread over
half-filled per-worker batches. The learner then blocks in `next()`, and the
inserts that would complete a batch never come, because they come from this
thread. Acme later replaced the `next()` with a sleep-and-recheck loop; we keep
the version from the incident so replaywatch has something real to diagnose.
"""

from __future__ import annotations

import contextlib
import math
import sys
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import jax
import reverb

from agents import builder, reporting
from agents import replay as replay_lib
from agents.acting import TD3Actor, run_episode
from agents.config import ReplayConfig, RunConfig, TD3Config
from agents.environments import make_environment_spec
from agents.learning import TD3Learner
from agents.stalls import StallTimer

Emit = Callable[[dict[str, Any]], None]


class LearningActor:
    """Acme's `_LearningActor`: after each actor step, learn while data looks available."""

    def __init__(
        self,
        actor: TD3Actor,
        learner: TD3Learner,
        iterator: Any,
        table: reverb.Table,
        batch_size: int,
        before_learner_step: Callable[[], None] = lambda: None,
        waiting: Callable[[], AbstractContextManager[object]] = contextlib.nullcontext,
    ):
        self._actor = actor
        self._learner = learner
        self._iterator = iterator
        self._table = table
        self._before_learner_step = before_learner_step
        # The actor probe's `waiting("learner")`: while the learner steps, the actor
        # (this same thread) waits on it, which is the seed's circular wait when
        # `next()` blocks.
        self._waiting = waiting
        self._learner_steps = 0
        # Before the first step, "the table can sample a batch" means exactly that.
        # Acme's later run_experiment starts at 1e9 (only a ready iterator counts)
        # and sleeps instead of calling next(); this is the loop from the incident.
        self._batch_size_upper_bound = batch_size

    def _has_data_for_training(self) -> bool:
        return self._iterator.ready() or self._table.can_sample(self._batch_size_upper_bound)

    def _maybe_train(self) -> bool:
        trained = False
        while self._has_data_for_training():
            with self._waiting():
                self._before_learner_step()
                self._learner.step()  # blocks in next() when the batch never forms
            self._learner_steps += 1
            # Samples taken per learner step so far, including those sitting in
            # prefetch buffers and partial per-worker batches: always >= batch size.
            completed = self._table.info.rate_limiter_info.sample_stats.completed
            self._batch_size_upper_bound = max(1, math.ceil(completed / self._learner_steps))
            trained = True
        return trained

    def update(self) -> None:
        if self._maybe_train():
            self._actor.update(wait=True)


def run_sync(td3: TD3Config, replay: ReplayConfig, run: RunConfig, emit: Emit) -> None:
    env = builder.make_environment_factory(td3, run.env_step_delay)(run.seed)
    eval_env = builder.make_environment_factory(td3)(run.seed + 1000)
    spec = make_environment_spec(env)
    table = builder.make_replay_table(replay, spec, insert_blocking=False)
    server = reverb.Server([table], port=run.reverb_port or None,
                           checkpointer=builder.make_checkpointer(run))
    address = f"127.0.0.1:{server.port}"
    stop_checkpoints = threading.Event()
    client = reverb.Client(address)
    networks = builder.make_networks(spec, td3)
    key_learner, key_actor, key_eval = jax.random.split(jax.random.PRNGKey(run.seed), 3)
    parts = builder.make_learner(networks, td3, replay, address, key_learner, run.probe_listen,
                                 run.first_step_delay_s, run.learner_step_delay_s)
    parts.probe.start()
    if run.checkpoint_every_s:
        # A checkpoint holds the table's lock: the loop waits in its insert or next() till
        # it ends, a pause the learner's probe marks.
        replay_lib.checkpoint_every(address, run.checkpoint_every_s, stop_checkpoints, emit,
                                    section=lambda: parts.probe.section("checkpoint"))
    # The loop's actor side: its writer, its steps, its waits on the learner.
    loop_probe = builder.make_actor_probe(replay.table, "loop", builder.any_port(run.probe_listen),
                                          enabled=run.actor_probes)
    emit(builder.start_record("sync", address, parts.probe.url, replay, td3,
                              actor_probes=[loop_probe.url] if loop_probe.url else [],
                              replay_probe=builder.start_replay_probe(run.replay_probe_listen)))
    learner = parts.learner
    # The learner's probe wraps the loop's client too: the thread that inserts is the one
    # that waits in next(), which tells the sidecar this is a synchronous loop.
    adder = builder.make_adder(loop_probe.wrap_client(parts.probe.wrap_client(client)), td3,
                               replay)
    actor = builder.make_actor(networks, td3, learner.get_policy_params, key_actor, adder)
    evaluator = builder.make_actor(networks, td3, learner.get_policy_params, key_eval)
    stall = StallTimer(run.stall, time.monotonic())
    learning_actor = LearningActor(
        actor,
        learner,
        parts.iterator,
        table,
        replay.batch_size,
        before_learner_step=_before_step(stall, emit, table if run.seed_debug_loop else None),
        waiting=lambda: loop_probe.waiting("learner"),
    )
    progress = _Progress(emit, run.log_every_s, learner, table)
    env_steps, episodes, next_eval = 0, 0, run.eval_every

    def after_step() -> None:
        loop_probe.step()
        learning_actor.update()
        progress.tick(1)

    try:
        while env_steps < run.steps:
            episode_return, steps = run_episode(env, actor, update=after_step)
            env_steps += steps
            episodes += 1
            progress.episode(episode_return, episodes)
            if run.eval_every and env_steps >= next_eval:
                next_eval += run.eval_every
                # The loop neither inserts nor learns meanwhile: a pause it marks, so the
                # sidecar waits for it (its learned length) instead of naming a stall.
                with parts.probe.section("evaluate"), loop_probe.section("evaluate"):
                    _evaluate(eval_env, evaluator, run.eval_episodes, env_steps, learner, emit)
        progress.flush()
        emit({"event": "done", "env_steps": env_steps, "learner_steps": learner.steps})
    finally:
        stop_checkpoints.set()
        adder.close()
        loop_probe.stop()
        parts.probe.stop()
        server.stop()


def _before_step(stall: StallTimer, emit: Emit, debug_table: reverb.Table | None
                 ) -> Callable[[], None]:
    """The learner-step hook: the stall timer, and the seed's print loop if asked for."""
    if debug_table is None:
        return lambda: stall.maybe_hang_learner(emit)

    def seed_debug_loop() -> None:
        # What the seed incident's user added around every step (seeds/000): the
        # limiter's window, the cursor and can_sample, read from table.info.
        info = debug_table.info.rate_limiter_info
        cursor = (info.insert_stats.completed * info.samples_per_insert
                  - info.sample_stats.completed)
        print(info.min_diff, cursor, info.max_diff, debug_table.can_sample(1), file=sys.stderr)
        stall.maybe_hang_learner(emit)

    return seed_debug_loop


def _evaluate(
    env: Any, evaluator: TD3Actor, episodes: int, env_steps: int, learner: TD3Learner, emit: Emit
) -> None:
    evaluator.update(wait=True)
    returns = [run_episode(env, evaluator)[0] for _ in range(episodes)]
    emit(reporting.eval_event(env_steps=env_steps, learner_steps=learner.steps, returns=returns))


class _Progress:
    """Logs env steps/s and learner steps/s every `every_s` seconds."""

    def __init__(self, emit: Emit, every_s: float, learner: TD3Learner, table: reverb.Table):
        self._emit = emit
        self._every_s = every_s
        self._learner = learner
        self._table = table
        self._started = time.monotonic()
        self._steps = 0
        self._last = reporting.Reading(self._started, 0, 0)
        self._episodes = 0
        self._last_return: float | None = None

    def tick(self, steps: int) -> None:
        self._steps += steps
        if time.monotonic() - self._last.at >= self._every_s:
            self.flush()

    def episode(self, episode_return: float, episodes: int) -> None:
        self._last_return, self._episodes = episode_return, episodes

    def flush(self) -> None:
        now = reporting.Reading(time.monotonic(), self._steps, self._learner.steps)
        self._emit(
            reporting.progress_event(
                elapsed_s=now.at - self._started,
                now=now,
                last=self._last,
                episodes=self._episodes,
                train_return=self._last_return,
                actors_alive=1,  # the one actor, on this thread
                table=reporting.table_counts(self._table.info),
            )
        )
        self._last = now
