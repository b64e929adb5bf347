"""Findings open, update and resolve: a pure reconcile of one evaluation.

    active, transitions = reconcile(active, diagnosis.findings, evaluated={target}, now=now)
    incidents.apply(transitions, context)

A finding continues while the same key (kind, target, table) is found again;
it keeps its first `since`. "updated" is written when severity or summary
change, and otherwise once per `update_every_s` of its life, so a one-second
poll does not write the incident log every second.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable, Mapping
from typing import Literal, NamedTuple

from replaywatch.model import Finding

Key = tuple[str, str, str]
# "gone": closed because its target is no longer watched (a targets file or discovery dropped
# it) or its RLlib job ended, never because what it named was fixed.
TransitionKind = Literal["opened", "updated", "resolved", "gone"]


@dataclasses.dataclass(frozen=True)
class Transition:
    kind: TransitionKind
    finding: Finding


class Reconciled(NamedTuple):
    active: dict[Key, Finding]
    transitions: list[Transition]


def is_due(previous: Finding, now: float, update_every_s: float) -> bool:
    """A periodic update is due when `now` enters a new `update_every_s` slot of its life."""
    slot = lambda at: int((at - previous.since) // update_every_s)  # noqa: E731
    return slot(now) > slot(previous.last_seen)


def reconcile(
    active: Mapping[Key, Finding],
    found: Iterable[Finding],
    evaluated: Collection[str],
    now: float,
    update_every_s: float = 30.0,
) -> Reconciled:
    """The new active map and the transitions, sorted by key.

    Findings of targets not in `evaluated` stay as they are: a target skipped
    this round (its poll still running) proves nothing resolved.
    """
    if update_every_s <= 0:
        raise ValueError(f"update_every_s ({update_every_s}) must be > 0")
    current = {f.key: f for f in found}
    new: dict[Key, Finding] = {k: f for k, f in active.items() if f.target not in evaluated}
    transitions: list[Transition] = []
    for key in sorted(set(active) | set(current)):
        before, after = active.get(key), current.get(key)
        if after is not None and before is None:
            new[key] = dataclasses.replace(after, last_seen=now, resolved_at=None)
            transitions.append(Transition("opened", new[key]))
        elif after is not None and before is not None:
            new[key] = dataclasses.replace(after, since=before.since, last_seen=now,
                                           resolved_at=None)
            changed = (after.severity, after.summary) != (before.severity, before.summary)
            if changed or is_due(before, now, update_every_s):
                transitions.append(Transition("updated", new[key]))
        elif before is not None and before.target in evaluated:
            transitions.append(Transition("resolved", dataclasses.replace(before, resolved_at=now)))
    return Reconciled(new, transitions)
