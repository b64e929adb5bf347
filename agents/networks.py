"""Haiku networks: an observation encoder, a deterministic policy, twin critics.

State observations pass through an identity encoder (no parameters). Pixel
observations go through a DrQ-v2 style conv encoder that only the critic's
loss trains; the policy reads its output through `stop_gradient`, as in
DrQ-v2, so one encoder serves both heads.
"""

from __future__ import annotations

import dataclasses

import haiku as hk
import jax
import jax.numpy as jnp

from agents.config import TD3Config
from agents.environments import EnvironmentSpec


@dataclasses.dataclass(frozen=True)
class TD3Networks:
    encoder: hk.Transformed  # observation -> embedding
    policy: hk.Transformed  # embedding -> action in [-1, 1]
    critic: hk.Transformed  # (embedding, action) -> (q1, q2)
    observation_shape: tuple[int, ...]
    action_size: int


def _conv_encoder(channels: int, embedding_size: int) -> hk.Module:
    return hk.Sequential(
        [
            lambda x: x.astype(jnp.float32) / 255.0 - 0.5,
            hk.Conv2D(channels, 3, stride=2, padding="VALID"),
            jax.nn.relu,
            hk.Conv2D(channels, 3, stride=2, padding="VALID"),
            jax.nn.relu,
            hk.Conv2D(channels, 3, stride=1, padding="VALID"),
            jax.nn.relu,
            hk.Flatten(),
            # DrQ-v2's trunk: a small normalised embedding keeps the heads' inputs tame.
            hk.Linear(embedding_size),
            hk.LayerNorm(axis=-1, create_scale=True, create_offset=True),
            jnp.tanh,
        ]
    )


def make_networks(spec: EnvironmentSpec, config: TD3Config) -> TD3Networks:
    hidden = list(config.hidden_sizes)

    def encoder_fn(observation: jnp.ndarray) -> jnp.ndarray:
        if config.pixels:
            return _conv_encoder(config.encoder_channels, config.embedding_size)(observation)
        return hk.Flatten()(observation.astype(jnp.float32))

    def policy_fn(embedding: jnp.ndarray) -> jnp.ndarray:
        mlp = hk.nets.MLP(hidden + [spec.action_size], activate_final=False)
        return jnp.tanh(mlp(embedding))

    def critic_fn(embedding: jnp.ndarray, action: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
        inputs = jnp.concatenate([embedding, action], axis=-1)
        q1 = hk.nets.MLP(hidden + [1], name="q1")(inputs)
        q2 = hk.nets.MLP(hidden + [1], name="q2")(inputs)
        return jnp.squeeze(q1, -1), jnp.squeeze(q2, -1)

    return TD3Networks(
        encoder=hk.without_apply_rng(hk.transform(encoder_fn)),
        policy=hk.without_apply_rng(hk.transform(policy_fn)),
        critic=hk.without_apply_rng(hk.transform(critic_fn)),
        observation_shape=spec.observation_shape,
        action_size=spec.action_size,
    )


def random_crop(key: jax.Array, images: jnp.ndarray, padding: int) -> jnp.ndarray:
    """DrQ-v2's augmentation: edge-pad each image by `padding`, crop back at a random shift."""
    if padding == 0:
        return images

    def crop_one(key: jax.Array, image: jnp.ndarray) -> jnp.ndarray:
        offset = jax.random.randint(key, (2,), 0, 2 * padding + 1)
        padded = jnp.pad(image, ((padding, padding), (padding, padding), (0, 0)), mode="edge")
        start = (offset[0], offset[1], jnp.zeros((), offset.dtype))
        return jax.lax.dynamic_slice(padded, start, image.shape)

    keys = jax.random.split(key, images.shape[0])
    return jax.vmap(crop_one)(keys, images)
