"""Statistics the benchmarks share, so every table's p99 means the same thing."""

from __future__ import annotations

import math


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank percentile: the smallest value with at least q of them at or below
    it (p99 of 100 samples is the second largest; of fewer than 100, the largest)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered), math.ceil(q * len(ordered))) - 1)]
