"""The actor: a jitted deterministic policy plus Gaussian exploration noise.

It reads parameters from a `variable_source` (a zero-argument callable: the
learner itself in sync mode, a Ray call to the learner process in distributed
mode) and writes experience through an adder. Its `update()` fetches only every
`update_period` calls, because in distributed mode each fetch is a round trip.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

import jax
import jax.numpy as jnp
import numpy as np

from agents.adders import NStepTransitionAdder
from agents.learning import PolicyParams
from agents.networks import TD3Networks


def make_policy(
    networks: TD3Networks,
) -> Callable[[PolicyParams, jax.Array, jax.Array, float], jax.Array]:
    """A jitted `(params, key, observation, sigma) -> action`; sigma 0 evaluates."""

    def policy(params: PolicyParams, key: jax.Array, observation: jax.Array, sigma: float):
        encoder_params, policy_params = params
        embedding = networks.encoder.apply(encoder_params, observation[None])
        action = networks.policy.apply(policy_params, embedding)[0]
        noise = sigma * jax.random.normal(key, action.shape)
        return jnp.clip(action + noise, -1.0, 1.0)

    return jax.jit(policy)


class TD3Actor:
    def __init__(
        self,
        networks: TD3Networks,
        variable_source: Callable[[], PolicyParams],
        key: jax.Array,
        sigma: float,
        adder: NStepTransitionAdder | None = None,
        update_period: int = 1,
    ):
        self._policy = make_policy(networks)
        self._variable_source = variable_source
        self._key = key
        self._sigma = sigma
        self._adder = adder
        self._update_period = update_period
        self._calls = 0
        self._params = variable_source()

    def select_action(self, observation: np.ndarray) -> np.ndarray:
        self._key, key = jax.random.split(self._key)
        action = self._policy(self._params, key, observation, self._sigma)
        return np.asarray(action)

    def observe_first(self, observation: np.ndarray) -> None:
        if self._adder is not None:
            self._adder.add_first(observation)

    def observe(
        self,
        action: np.ndarray,
        reward: float,
        next_observation: np.ndarray,
        terminated: bool,
        truncated: bool,
    ) -> None:
        if self._adder is not None:
            self._adder.add(action, reward, next_observation, terminated, truncated)

    def update(self, wait: bool = False) -> None:
        """Refreshes parameters every `update_period` calls, or now if `wait`."""
        self._calls += 1
        if wait or self._calls % self._update_period == 0:
            self._params = self._variable_source()


class PolicyLagBound:
    """`--max-policy-lag STEPS`: an actor may not run more than STEPS steps ahead of its learner.

    After `max_steps` environment steps without seeing the learner's step count grow,
    the actor waits (inside `waiting()`, the probe's `waiting("learner")`) until it
    does, then takes the new parameters (`on_advance`): a parameter hand-off. It is the
    asynchronous form of the seed's circular wait: a learner blocked in `next()` for
    samples that only these actors would insert. Before the learner's first step (the
    table is still filling to `min_replay_size`) an actor never waits, or no job could
    start. `learner_steps(after, timeout_s)` returns the learner's step count once it
    exceeds `after`, or after `timeout_s` seconds (0: at once).
    """

    def __init__(
        self,
        max_steps: int,
        learner_steps: Callable[[int, float], int],
        waiting: Callable[[], AbstractContextManager[object]],
        on_advance: Callable[[], None],
        poll_s: float = 1.0,
    ):
        self._max_steps = max_steps
        self._learner_steps = learner_steps
        self._waiting = waiting
        self._on_advance = on_advance
        self._poll_s = poll_s
        self._since = 0  # environment steps since the learner was last seen to step
        self._seen = 0  # the learner's step count then

    def after_step(self) -> None:
        if not self._max_steps:
            return
        self._since += 1
        if self._since < self._max_steps:
            return
        self._since = 0
        steps = self._learner_steps(self._seen, 0.0)
        if steps == 0 or steps > self._seen:  # warming up, or it stepped meanwhile
            self._seen = steps
            return
        with self._waiting():
            while steps <= self._seen:
                steps = self._learner_steps(self._seen, self._poll_s)
            self._on_advance()
        self._seen = steps


def run_episode(
    env, actor: TD3Actor, update: Callable[[], None] | None = None
) -> tuple[float, int]:
    """One episode; `update` runs after each step (learning, parameter refresh)."""
    observation, _ = env.reset()
    actor.observe_first(observation)
    episode_return, steps, done = 0.0, 0, False
    while not done:
        action = actor.select_action(observation)
        observation, reward, terminated, truncated, _ = env.step(action)
        actor.observe(action, float(reward), observation, terminated, truncated)
        episode_return += float(reward)
        steps += 1
        done = terminated or truncated
        if update is not None:
            update()
    return episode_return, steps
