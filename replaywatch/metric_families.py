"""A metric family, declared once: its name, type, help text and label names.

Both of replaywatch's renderers (the fast text path in metrics.py and the prometheus_client
collector) are built from these declarations, so they cannot drift apart.

    UP = gauge("target_up", "1 if the last ServerInfo poll of the target succeeded.", ("target",))
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

# One sample: label values in the family's declared label order, and the value.
Row = tuple[tuple[str, ...], float]
Group = Iterator[tuple["Family", list[Row]]]


@dataclass(frozen=True, slots=True)
class Family:
    """One metric family: the single source of its name, type, help text and label names."""

    name: str  # without the `_total` a counter's samples get
    type: str  # "gauge" or "counter"
    doc: str
    labels: tuple[str, ...] = ()


def gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> Family:
    return Family(f"replaywatch_{name}", "gauge", doc, labels)


def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Family:
    return Family(f"replaywatch_{name}", "counter", doc, labels)
