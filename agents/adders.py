"""An n-step transition adder on Reverb's TrajectoryWriter.

Each item is one whole transition (o_t, a_t, R_t, d_t, o_{t+n}) with

    R_t = sum_{k<n} discount^k r_{t+k},   d_t = discount^n, or 0 if the episode terminated

so the learner needs no knowledge of n. Near the end of an episode the window
shortens (n' < n, d = discount^n'); truncation (Pendulum's 200-step limit)
still bootstraps, termination does not.

`flush(max_in_flight_items)` after each item is what makes a blocking rate
limiter push back on the actor (distributed mode). In sync mode insert
blocking is disabled, so it never waits for long.
"""

from __future__ import annotations

import collections
from typing import Any

import numpy as np
import reverb


class NStepTransitionAdder:
    def __init__(
        self,
        client: reverb.Client,
        table: str,
        n_step: int,
        discount: float,
        max_in_flight_items: int,
    ):
        self._writer = client.trajectory_writer(num_keep_alive_refs=1)
        self._table = table
        self._n_step = n_step
        self._discount = discount
        self._max_in_flight_items = max_in_flight_items
        # (o_t, a_t, r_t) for the steps whose n-step window is still open.
        self._window: collections.deque[tuple[np.ndarray, np.ndarray, float]] = collections.deque()
        self._observation: np.ndarray | None = None

    def add_first(self, observation: np.ndarray) -> None:
        self._window.clear()
        self._observation = observation

    def add(
        self,
        action: np.ndarray,
        reward: float,
        next_observation: np.ndarray,
        terminated: bool,
        truncated: bool,
    ) -> None:
        assert self._observation is not None, "add_first() must start each episode"
        self._window.append((self._observation, action, reward))
        self._observation = next_observation
        if len(self._window) == self._n_step:
            self._emit(next_observation, terminated=terminated)
        if terminated or truncated:
            while self._window:
                self._emit(next_observation, terminated=terminated)
            self._writer.end_episode(clear_buffers=True)
            self._observation = None

    def _emit(self, next_observation: np.ndarray, terminated: bool) -> None:
        observation, action, _ = self._window[0]
        rewards = np.array([r for _, _, r in self._window], np.float32)
        powers = self._discount ** np.arange(len(rewards), dtype=np.float32)
        discount = 0.0 if terminated else self._discount ** len(rewards)
        self._window.popleft()
        self._writer.append(
            {
                "observation": observation,
                "action": np.asarray(action, np.float32),
                "reward": np.float32(rewards @ powers),
                "discount": np.float32(discount),
                "next_observation": next_observation,
            }
        )
        trajectory = {name: column[-1] for name, column in self._writer.history.items()}
        self._writer.create_item(self._table, priority=1.0, trajectory=trajectory)
        self._writer.flush(self._max_in_flight_items)

    def close(self) -> None:
        self._writer.close()


def transition_example(
    observation_shape: tuple[int, ...], obs_dtype: Any, action_size: int
) -> dict:
    """Zeros shaped like one item, for building the table's signature."""
    return {
        "observation": np.zeros(observation_shape, obs_dtype),
        "action": np.zeros((action_size,), np.float32),
        "reward": np.float32(0),
        "discount": np.float32(0),
        "next_observation": np.zeros(observation_shape, obs_dtype),
    }
