"""The agent's prioritized replay, in process: a real Reverb table with a Prioritized sampler,
the real TD3 learner (jitted update), its batches' |TD errors| sent back as priorities through
the trainer probe's wrapped client. The probe counts each step's update and Reverb holds the
new priorities; the uniform table of the same config gets none. bench-long's `prioritized`
runs watch the whole agent with the sidecar.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import pytest
import reverb

from agents import builder
from agents.adders import transition_example
from agents.config import ReplayConfig, TD3Config
from agents.environments import make_environment_spec

TD3 = TD3Config(hidden_sizes=(32, 32))


def learner_on(sampler: str) -> tuple[Any, Any, reverb.Server]:
    replay = ReplayConfig(batch_size=32, min_replay_size=64, max_replay_size=1000,
                          sampler=sampler)
    spec = make_environment_spec(builder.make_environment_factory(TD3)(0))
    server = reverb.Server([builder.make_replay_table(replay, spec, insert_blocking=False)],
                           port=None)
    address = f"127.0.0.1:{server.port}"
    client = reverb.Client(address)
    example = transition_example(spec.observation_shape, spec.observation_dtype,
                                 spec.action_size)
    rng = np.random.default_rng(0)
    with client.trajectory_writer(num_keep_alive_refs=1) as writer:
        for _ in range(200):
            writer.append({k: (rng.standard_normal(np.shape(v)).astype(np.asarray(v).dtype))
                           for k, v in example.items()})
            writer.create_item(replay.table, 1.0, {k: writer.history[k][-1] for k in example})
    parts = builder.make_learner(builder.make_networks(spec, TD3), TD3, replay, address,
                                 jax.random.PRNGKey(0), "127.0.0.1:0")
    return parts, client, server


def test_the_learner_sends_each_batchs_td_errors_as_priorities() -> None:
    parts, client, server = learner_on("prioritized")
    try:
        for _ in range(5):
            parts.learner.step()
        [sent] = parts.probe.snapshot()["priority_updates"].values()
        assert (sent["calls"], sent["errors"], sent["rejected_keys"]) == (5, 0, 0)
        assert 5 <= sent["keys"] <= 5 * 32  # a batch may draw one item twice
        priorities = [s.info.priority for s in client.sample("priority_table", 200,
                                                              emit_timesteps=False)]
        assert any(p != 1.0 for p in priorities) and all(p > 0 for p in priorities)
    finally:
        server.stop()


def test_a_uniform_table_gets_no_priorities() -> None:
    parts, _, server = learner_on("uniform")
    try:
        parts.learner.step()
        assert parts.probe.snapshot()["priority_updates"] == {}
    finally:
        server.stop()


def test_an_unknown_sampler_is_a_one_line_error() -> None:
    with pytest.raises(ValueError, match="sampler .'fifo'. must be one of uniform, prioritized"):
        ReplayConfig(sampler="fifo")
