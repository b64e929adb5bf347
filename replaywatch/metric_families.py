"""A metric family, declared once: its name, type, help text and label names.

Both of replaywatch's renderers (the fast text path in metrics.py and the prometheus_client
collector) are built from these declarations, so they cannot drift apart.

    UP = gauge("target_up", "1 if the last ServerInfo poll of the target succeeded.", ("target",))
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

# One sample: label values in the family's declared label order, and the value.
Row = tuple[tuple[str, ...], float]
Group = Iterator[tuple["Family", list[Row]]]


# The only labels a family may declare: each has a bounded set of values (a target, a table,
# a probe's URL, a source, a worker state, a kind, a severity, a role, a writer call, a
# throughput series, whether a value was measured or read from a declaration). A label of free
# text (what an actor waits on) would make a series per value; it goes to the API instead.
LABELS = frozenset({"target", "table", "probe", "source", "state", "kind", "severity", "role",
                    "call", "series", "measured"})
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


@dataclass(frozen=True, slots=True)
class Family:
    """One metric family: the single source of its name, type, help text and label names.

    Checked where it is declared, as client_python checks a metric in its constructor: a bad
    name, a gauge named like a counter (`_total`), a counter that spells its own `_total`, or a
    label that is not a valid, bounded one is refused at import, not at the first scrape.
    """

    name: str  # without the `_total` a counter's samples get
    type: str  # "gauge" or "counter"
    doc: str
    labels: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.name) or not self.name.startswith("replaywatch_"):
            raise ValueError(f"metric name {self.name!r} is not replaywatch_ and [a-zA-Z0-9_:]")
        if self.type not in ("gauge", "counter"):
            raise ValueError(f"{self.name}: type {self.type!r} is not gauge or counter")
        if self.name.endswith("_total"):
            raise ValueError(f"{self.name}: a {self.type} is not named _total (a counter's "
                             "samples get it)")
        if not self.doc:
            raise ValueError(f"{self.name}: no help text")
        for label in self.labels:
            if not _LABEL.fullmatch(label) or label.startswith("__"):
                raise ValueError(f"{self.name}: {label!r} is not a label name")
            if label not in LABELS:
                raise ValueError(f"{self.name}: label {label!r} is not one of the bounded "
                                 f"labels ({', '.join(sorted(LABELS))})")
        if len(set(self.labels)) != len(self.labels):
            raise ValueError(f"{self.name}: a label declared twice in {self.labels}")


def gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> Family:
    return Family(f"replaywatch_{name}", "gauge", doc, labels)


def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Family:
    return Family(f"replaywatch_{name}", "counter", doc, labels)
