"""Times one jitted learner update of the agents/ workload on this machine."""

from __future__ import annotations


def measure_learner_step_ms(batch_size: int = 256, steps: int = 200) -> float:
    """Median wall time of the agent's jitted update on a fixed random batch.

    Falls back to a conservative 1 ms when the agent cannot be built, so the
    probe's share is never understated by a slow stand-in.
    """
    try:
        from agents.bench_support import time_learner_update_ms
    except ImportError:
        return 1.0
    return time_learner_update_ms(batch_size=batch_size, steps=steps)
