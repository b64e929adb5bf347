"""Which layout a table's job runs, known from what it declares or proves, never from max_diff.

The budget model needs to know who inserts and who waits. In order of strength:

    declared        the trainer probe's `layout=`, or the sidecar's --layout setting
    loop writer     the trainer probe wraps its loop's writer (the trainer inserts) and no
                    other thread than the one that calls next() is seen inserting: a
                    synchronous loop, whatever max_diff is (`sync` with insert blocking
                    disabled, `sync-ratio` with a finite max_diff), known from the moment
                    the writer is wrapped, before the first insert and the first next()
    actor probes    actors insert from their own probes: `async-lag` with the smallest
                    declared `max_policy_lag`, `async` when none declares one and none has
                    ever waited on the learner

Anything else is unknown: a max_diff at float max says inserts never block (Acme's
LocalLayout does that), but a hand-written synchronous loop may keep a finite one and an
asynchronous job may disable blocking too, so the rules that need the layout give the
readings side by side with what settles them.
"""

from __future__ import annotations

import dataclasses

from replaywatch.diagnosis import budget
from replaywatch.diagnosis.actors import Actor
from replaywatch.diagnosis.ratelimiter import is_insert_blocking_disabled
from replaywatch.model import ProbeSnapshot, TableSnapshot

DECLARED, LOOP_WRITER, ACTOR_PROBES = "declared", "loop writer", "actor probes"


@dataclasses.dataclass(frozen=True)
class KnownLayout:
    """A layout and how it is known; `kind` None: unknown."""

    kind: str | None
    basis: str | None
    max_policy_lag: int | None = None

    @property
    def known(self) -> bool:
        return self.kind is not None

    @property
    def synchronous(self) -> bool:
        """One loop inserts and samples: when next() blocks, nothing inserts."""
        return self.kind in (budget.SYNC, budget.SYNC_RATIO)

    def model(self) -> budget.Layout | None:
        if self.kind is None:
            return None
        return budget.Layout(self.kind, self.max_policy_lag if self.kind == budget.ASYNC_LAG
                             else None)

    def evidence(self) -> dict[str, object]:
        return {"layout": self.kind or "unknown", "layout_basis": self.basis,
                "max_policy_lag": self.max_policy_lag}


UNKNOWN = KnownLayout(None, None)


def resolve(table: TableSnapshot, probes: tuple[ProbeSnapshot, ...], actors: tuple[Actor, ...],
            declared: str | None = None) -> KnownLayout:
    """The table's layout from the newest snapshots (module docstring)."""
    lags = sorted(a.history[-1].max_policy_lag for a in actors
                  if a.history and a.history[-1].max_policy_lag is not None)
    for kind in [p.layout for p in probes if p.layout] + ([declared] if declared else []):
        if kind in budget.LAYOUTS:
            lag = lags[0] if kind == budget.ASYNC_LAG and lags else None
            return KnownLayout(kind, DECLARED, lag)
    if any((p.writers_wrapped or p.items_inserted) and p.inserts_on_next_thread is not False
           for p in probes):
        return KnownLayout(budget.SYNC if is_insert_blocking_disabled(table)
                           else budget.SYNC_RATIO,
                           LOOP_WRITER)
    if lags:
        return KnownLayout(budget.ASYNC_LAG, ACTOR_PROBES, lags[0])
    if actors and not any(s.waits_total > 0 or s.waiting_on is not None
                          for a in actors for s in a.history[-1:]):
        return KnownLayout(budget.ASYNC, ACTOR_PROBES)
    return UNKNOWN


