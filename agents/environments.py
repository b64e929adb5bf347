"""Pendulum-v1, from its state or from small rendered frames.

The seed incident is a pixel agent (84x84x9 frames, DrQ-v2); `--pixels` keeps
its shape at a size two CPU cores can train: the pendulum drawn with numpy
into `image_size` x `image_size` grayscale frames, the last `frame_stack`
stacked as channels. No OpenGL, no pygame.

Actions are rescaled to [-1, 1] so the policy's tanh output is the action.
"""

from __future__ import annotations

import collections
import dataclasses
import time
import warnings
from typing import Any

import gymnasium as gym
import numpy as np

from agents.config import StepDelay

ENV_ID = "Pendulum-v1"


@dataclasses.dataclass(frozen=True)
class EnvironmentSpec:
    observation_shape: tuple[int, ...]
    observation_dtype: np.dtype
    action_size: int


def render_pendulum(theta: float, size: int) -> np.ndarray:
    """A `size` x `size` uint8 frame: a bright rod from the centre at angle `theta`.

    Pendulum-v1 measures theta from upright, so the rod's tip is at
    (sin theta, -cos theta) in image coordinates (rows grow downward).
    """
    grid = (np.arange(size, dtype=np.float32) + 0.5) / size * 2.0 - 1.0  # [-1, 1]
    ys, xs = np.meshgrid(grid, grid, indexing="ij")
    tip = np.array([np.sin(theta), -np.cos(theta)], dtype=np.float32) * 0.8
    # Distance from each pixel to the rod segment [0, tip].
    along = np.clip((xs * tip[0] + ys * tip[1]) / float(tip @ tip), 0.0, 1.0)
    dist = np.hypot(xs - along * tip[0], ys - along * tip[1])
    frame = np.where(dist < 0.08, 255, 0).astype(np.uint8)
    frame[np.hypot(xs, ys) < 0.06] = 128  # the pivot, so a frame shows where "centre" is
    return frame


class PixelPendulum(gym.Wrapper):
    """Replaces the state observation with the last `frame_stack` rendered frames."""

    def __init__(self, env: gym.Env, size: int, frame_stack: int):
        super().__init__(env)
        self._size = size
        self._frames: collections.deque[np.ndarray] = collections.deque(maxlen=frame_stack)
        self.observation_space = gym.spaces.Box(
            0, 255, shape=(size, size, frame_stack), dtype=np.uint8
        )

    def _frame(self) -> np.ndarray:
        theta = float(self.env.unwrapped.state[0])  # type: ignore[attr-defined]
        return render_pendulum(theta, self._size)

    def _observation(self) -> np.ndarray:
        return np.stack(self._frames, axis=-1)

    def reset(self, **kwargs: Any) -> tuple[np.ndarray, dict[str, Any]]:
        _, info = self.env.reset(**kwargs)
        frame = self._frame()
        for _ in range(self._frames.maxlen or 1):
            self._frames.append(frame)
        return self._observation(), info

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        _, reward, terminated, truncated, info = self.env.step(action)
        self._frames.append(self._frame())
        return self._observation(), float(reward), terminated, truncated, info


class SlowSteps(gym.Wrapper):
    """Sleeps `delay.at(seconds since made)` before each step; a paced delay also holds each
    step until FACTOR times the loop's mean step interval of the minute before the slow-down
    has passed since the last one (`Pacer`)."""

    def __init__(self, env: gym.Env, delay: StepDelay):
        super().__init__(env)
        self._delay, self._made = delay, time.monotonic()
        self._pacer = Pacer(delay) if delay.paced else None

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        time.sleep(self._delay.at(time.monotonic() - self._made))
        if self._pacer is not None:
            time.sleep(self._pacer.wait(time.monotonic() - self._made))
        return self.env.step(action)


class Pacer:
    """How long a step waits so that, after `delay.after_s`, the loop steps `delay.factor`
    times slower than its mean over the `PACE_WINDOW_S` before (time as an argument)."""

    PACE_WINDOW_S = 60.0

    def __init__(self, delay: StepDelay):
        self._delay = delay
        self._starts: list[float] = []  # step starts in the window before the slow-down
        self._last: float | None = None

    def wait(self, elapsed_s: float) -> float:
        d, last = self._delay, self._last
        if elapsed_s <= d.after_s or len(self._starts) < 2 or last is None:
            if elapsed_s >= d.after_s - self.PACE_WINDOW_S:
                self._starts.append(elapsed_s)
            self._last = elapsed_s
            return 0.0
        before = (self._starts[-1] - self._starts[0]) / (len(self._starts) - 1)
        wait = max(0.0, last + d.factor * before - elapsed_s)
        self._last = elapsed_s + wait
        return wait


def make_environment(
    seed: int, pixels: bool = False, image_size: int = 64, frame_stack: int = 3,
    delay: StepDelay | None = None,
) -> gym.Env:
    with warnings.catch_warnings():
        # RescaleAction's float64 bounds make Box warn about casting to float32: harmless.
        warnings.simplefilter("ignore", UserWarning)
        env: gym.Env = gym.make(ENV_ID)
        env = gym.wrappers.RescaleAction(env, min_action=-1.0, max_action=1.0)
    if pixels:
        env = PixelPendulum(env, image_size, frame_stack)
    if delay is not None and delay.base_s > 0:
        env = SlowSteps(env, delay)
    env.reset(seed=seed)
    env.action_space.seed(seed)
    return env


def make_environment_spec(env: gym.Env) -> EnvironmentSpec:
    obs_space = env.observation_space
    assert obs_space.shape is not None and env.action_space.shape is not None
    dtype = np.dtype(np.uint8) if obs_space.dtype == np.uint8 else np.dtype(np.float32)
    return EnvironmentSpec(tuple(obs_space.shape), dtype, int(np.prod(env.action_space.shape)))
