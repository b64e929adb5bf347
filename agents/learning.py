"""The TD3 learner: a pure, jitted update and a `step()` that does the I/O.

One update, for a batch of n-step transitions (o, a, R, d, o'), where
R = sum_k discount^k r_k and d = discount^n (0 if the episode terminated):

    a' = clip(pi_target(o') + clip(N(0, target_noise), +-noise_clip), -1, 1)
    y  = R + d * min(Q1_target(o', a'), Q2_target(o', a'))
    critic loss = (Q1(o, a) - y)^2 + (Q2(o, a) - y)^2
    every `policy_delay` steps: policy loss = -Q1(o, pi(o)), then polyak targets.

`step()` takes exactly one batch from the iterator per call: a learner that
takes more than Acme's `_LearningActor` budgets for can hang a synchronous
loop on its own (the first suspect in the seed thread).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import optax

from agents.config import TD3Config
from agents.networks import TD3Networks, random_crop


class Transition(NamedTuple):
    observation: Any
    action: Any
    reward: Any
    discount: Any
    next_observation: Any


class TrainingState(NamedTuple):
    encoder_params: hk.Params
    policy_params: hk.Params
    critic_params: hk.Params
    target_policy_params: hk.Params
    target_critic_params: hk.Params
    critic_opt_state: optax.OptState  # covers encoder and critic: the critic loss trains both
    policy_opt_state: optax.OptState
    key: jax.Array
    steps: jax.Array


PolicyParams = tuple[hk.Params, hk.Params]  # (encoder, policy): what an actor needs


def make_initial_state(
    networks: TD3Networks, optimizer: optax.GradientTransformation, key: jax.Array
) -> TrainingState:
    k_enc, k_pol, k_crit, key = jax.random.split(key, 4)
    dummy_obs = jnp.zeros((1, *networks.observation_shape), jnp.float32)
    encoder_params = networks.encoder.init(k_enc, dummy_obs)
    embedding = networks.encoder.apply(encoder_params, dummy_obs)
    policy_params = networks.policy.init(k_pol, embedding)
    critic_params = networks.critic.init(
        k_crit, embedding, jnp.zeros((1, networks.action_size), jnp.float32)
    )
    return TrainingState(
        encoder_params=encoder_params,
        policy_params=policy_params,
        critic_params=critic_params,
        target_policy_params=policy_params,
        target_critic_params=critic_params,
        critic_opt_state=optimizer.init((encoder_params, critic_params)),
        policy_opt_state=optimizer.init(policy_params),
        key=key,
        steps=jnp.zeros((), jnp.int32),
    )


def make_update_fn(
    networks: TD3Networks, config: TD3Config, optimizer: optax.GradientTransformation
) -> Callable[[TrainingState, Transition], tuple[TrainingState, dict[str, jax.Array]]]:
    """Returns the pure update; jit it. Same inputs, same outputs: no I/O, no clock."""

    def critic_loss(
        trainable: tuple[hk.Params, hk.Params],
        state: TrainingState,
        batch: Transition,
        key: jax.Array,
    ) -> tuple[jax.Array, jax.Array]:
        encoder_params, critic_params = trainable
        embedding = networks.encoder.apply(encoder_params, batch.observation)
        # DrQ-v2 has no target encoder: the online one, held still, encodes o'.
        next_embedding = jax.lax.stop_gradient(
            networks.encoder.apply(encoder_params, batch.next_observation)
        )
        noise = jnp.clip(
            config.target_noise * jax.random.normal(key, batch.action.shape),
            -config.noise_clip,
            config.noise_clip,
        )
        next_action = networks.policy.apply(state.target_policy_params, next_embedding)
        next_action = jnp.clip(next_action + noise, -1.0, 1.0)
        next_q1, next_q2 = networks.critic.apply(
            state.target_critic_params, next_embedding, next_action
        )
        target = batch.reward + batch.discount * jnp.minimum(next_q1, next_q2)
        target = jax.lax.stop_gradient(target)
        q1, q2 = networks.critic.apply(critic_params, embedding, batch.action)
        loss = jnp.mean(jnp.square(q1 - target) + jnp.square(q2 - target))
        return loss, (embedding, jnp.abs(q1 - target))

    def policy_loss(
        policy_params: hk.Params, critic_params: hk.Params, embedding: jax.Array
    ) -> jax.Array:
        action = networks.policy.apply(policy_params, embedding)
        q1, _ = networks.critic.apply(critic_params, embedding, action)
        return -jnp.mean(q1)

    def update(
        state: TrainingState, batch: Transition
    ) -> tuple[TrainingState, dict[str, jax.Array]]:
        key, k_noise, k_aug, k_aug_next = jax.random.split(state.key, 4)
        if config.pixels:
            batch = batch._replace(
                observation=random_crop(k_aug, batch.observation, config.crop_padding),
                next_observation=random_crop(
                    k_aug_next, batch.next_observation, config.crop_padding
                ),
            )
        batch = batch._replace(
            reward=batch.reward.astype(jnp.float32), discount=batch.discount.astype(jnp.float32)
        )
        trainable = (state.encoder_params, state.critic_params)
        (c_loss, (embedding, td_error)), grads = jax.value_and_grad(critic_loss, has_aux=True)(
            trainable, state, batch, k_noise
        )
        updates, critic_opt_state = optimizer.update(grads, state.critic_opt_state, trainable)
        encoder_params, critic_params = optax.apply_updates(trainable, updates)
        embedding = jax.lax.stop_gradient(embedding)

        def delayed(operand: None) -> tuple[hk.Params, optax.OptState, hk.Params, hk.Params]:
            p_grads = jax.grad(policy_loss)(state.policy_params, critic_params, embedding)
            p_updates, p_opt = optimizer.update(
                p_grads, state.policy_opt_state, state.policy_params
            )
            policy_params = optax.apply_updates(state.policy_params, p_updates)
            target_policy = optax.incremental_update(
                policy_params, state.target_policy_params, config.tau
            )
            target_critic = optax.incremental_update(
                critic_params, state.target_critic_params, config.tau
            )
            return policy_params, p_opt, target_policy, target_critic

        def skip(operand: None) -> tuple[hk.Params, optax.OptState, hk.Params, hk.Params]:
            return (
                state.policy_params,
                state.policy_opt_state,
                state.target_policy_params,
                state.target_critic_params,
            )

        policy_params, policy_opt_state, target_policy, target_critic = jax.lax.cond(
            state.steps % config.policy_delay == 0, delayed, skip, None
        )
        new_state = TrainingState(
            encoder_params=encoder_params,
            policy_params=policy_params,
            critic_params=critic_params,
            target_policy_params=target_policy,
            target_critic_params=target_critic,
            critic_opt_state=critic_opt_state,
            policy_opt_state=policy_opt_state,
            key=key,
            steps=state.steps + 1,
        )
        metrics = {
            "critic_loss": c_loss,
            "policy_loss": policy_loss(policy_params, critic_params, embedding),
            # Per sample: a prioritized table's new priorities (the learner sends them).
            "td_error": td_error,
        }
        return new_state, metrics

    return update


# A priority is |TD error| + this: an item whose error is 0 keeps a chance of being sampled.
PRIORITY_FLOOR = 1e-6


def send_priorities(client: Any, table: str) -> Callable[[Any, Any], None]:
    """Sends a batch's |TD errors| as its items' priorities through `client` (a Reverb client,
    the trainer probe's wrapped one, which counts the calls)."""
    def send(keys: Any, td_error: Any) -> None:
        priorities = np.asarray(td_error, np.float64).ravel() + PRIORITY_FLOOR
        client.mutate_priorities(table, dict(zip(np.asarray(keys).ravel().tolist(),
                                                 priorities.tolist())))
    return send


def transition_from_sample(data: Any) -> Transition:
    """A Reverb sample's `data` (a dict keyed like `Transition`) as a `Transition`."""
    return Transition(**{field: data[field] for field in Transition._fields})


class TD3Learner:
    """Owns the training state; `step()` pulls one batch and applies one update."""

    def __init__(
        self,
        networks: TD3Networks,
        config: TD3Config,
        iterator: Iterator[Any],
        key: jax.Array,
        on_step: Callable[[], None] | None = None,
        first_step_delay_s: float = 0.0,
        sleep: Callable[[float], None] = time.sleep,
        step_delay_s: float = 0.0,
        priorities: Callable[[Any, Any], None] | None = None,
    ):
        optimizer = optax.adam(config.learning_rate)
        self._iterator = iterator
        self._on_step = on_step
        # `--first-step-delay-s`: a stand-in for a long first jit compile (acme#212: 20 min).
        self._first_step_delay_s = first_step_delay_s
        # `--learner-step-delay-s`: every update takes this much longer (a big network on a
        # small host), after its batch is taken.
        self._step_delay_s = step_delay_s
        self._sleep = sleep
        # (keys, |TD errors|) of each batch, for a prioritized table (send_priorities).
        self._priorities = priorities
        self._state = make_initial_state(networks, optimizer, key)
        self._update = jax.jit(make_update_fn(networks, config, optimizer))
        self._steps = 0
        self._metrics: dict[str, float] = {}

    def step(self) -> None:
        sample = next(self._iterator)
        if self._steps == 0 and self._first_step_delay_s > 0:
            # After the first batch is taken, as a compile would be: the probe shows one batch
            # retrieved and no step, the dataset's prefetch fills, the actors run ahead.
            self._sleep(self._first_step_delay_s)
        if self._step_delay_s > 0:
            self._sleep(self._step_delay_s)
        self._state, metrics = self._update(self._state, transition_from_sample(sample.data))
        if self._priorities is not None:
            self._priorities(sample.info.key, metrics["td_error"])
        self._steps += 1
        self._metrics = metrics  # converted lazily: float() would sync every step
        if self._on_step is not None:
            self._on_step()

    @property
    def steps(self) -> int:
        return self._steps

    def metrics(self) -> dict[str, float]:
        return {name: float(value) for name, value in self._metrics.items()
                if getattr(value, "ndim", 0) == 0}

    def get_policy_params(self) -> PolicyParams:
        return self._state.encoder_params, self._state.policy_params

    def get_policy_params_numpy(self) -> PolicyParams:
        """Host copies, for shipping to actors in other processes."""
        return jax.tree_util.tree_map(np.asarray, self.get_policy_params())
