"""The agent's `progress` and `eval` lines, built here for both modes.

Sync and distributed mode used to build these dicts each on their own and drifted apart
(min/max return in one, `episodes` in one, `actors_alive` in the other). Every field is a
required keyword, so both modes pass the same facts and print the same fields; tests and
bench/ read them (agents/README.md lists them). No JAX, Reverb or Ray here: the unit test
of the fields starts nothing.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from typing import Any


@dataclasses.dataclass(frozen=True)
class Reading:
    """Where the run stood at `at` (monotonic seconds): the rates are between two of these."""

    at: float
    env_steps: int
    learner_steps: int


def table_counts(info: Any) -> dict[str, int]:
    """`table_size`, `inserts`, `samples` from a `reverb.TableInfo`."""
    limiter = info.rate_limiter_info
    return {
        "table_size": info.current_size,
        "inserts": limiter.insert_stats.completed,
        "samples": limiter.sample_stats.completed,
    }


def progress_event(
    *,
    elapsed_s: float,
    now: Reading,
    last: Reading,
    episodes: int,
    train_return: float | None,
    actors_alive: int,
    table: dict[str, int],
) -> dict[str, Any]:
    """One progress line; `train_return` is the latest training episode's return (the mean
    over actors in distributed mode), None before the first episode ends."""
    dt = max(now.at - last.at, 1e-9)
    return {
        "event": "progress",
        "elapsed_s": round(elapsed_s, 1),
        "env_steps": now.env_steps,
        "env_steps_per_s": round((now.env_steps - last.env_steps) / dt, 1),
        "learner_steps": now.learner_steps,
        "learner_steps_per_s": round((now.learner_steps - last.learner_steps) / dt, 1),
        "episodes": episodes,
        "train_return": None if train_return is None else round(float(train_return), 1),
        "actors_alive": actors_alive,
        "table_size": table["table_size"],
        "inserts": table["inserts"],
        "samples": table["samples"],
    }


def eval_event(*, env_steps: int, learner_steps: int, returns: Sequence[float]) -> dict[str, Any]:
    """One eval line: greedy episodes with the latest parameters."""
    values = [float(r) for r in returns]
    return {
        "event": "eval",
        "env_steps": env_steps,
        "learner_steps": learner_steps,
        "episodes": len(values),
        "mean_return": round(statistics.fmean(values), 2),
        "min_return": round(min(values), 2),
        "max_return": round(max(values), 2),
    }
