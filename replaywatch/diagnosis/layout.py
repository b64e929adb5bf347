"""Which layout a table's job runs, known from what it declares or proves, never from max_diff.

The budget model needs to know who inserts and who waits. In order of strength:

    declared        the trainer probe's `layout=`, or the sidecar's --layout setting (a
                    DeclaredLayout spec, which may say the loop's gate too)
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

A synchronous loop's **gate** (when it calls next(), budget.py) is known the same way:

    declared        TrainerProbe(gate=..., inserts_per_step=..., first_step_at=...), or a
                    declared `sync-ratio` (the scheduled loop by its definition)
    asked early     the loop is inside next() for a batch the limiter has not released (its
                    releases, `inserts * spi - min_diff`, less the batches it consumed, are
                    short of one): a loop that waits on can_sample never asks so, so it
                    steps on a schedule, proven on one poll (at its first step, the table's
                    count is where it first asked); its stride is not (`stride_known`
                    False): one ask shows no K, and a K guessed as B / spi fed fixes that
                    hung (budget.py)
    learned         from the loop's inserts between next() calls (the probe's next_strides)
                    over at least GATE_STRIDES calls: a schedule of K inserts a step moves
                    in strides of floor(K) and ceil(K), so strides that never differ by more
                    than one are a schedule, K their mean (its first step left at min_size:
                    the loop's count runs ahead of the table's by its writer's items);
                    a next() with no insert before it beside strides of two or more is no
                    schedule (a K >= 2 schedule never steps twice without inserting): the
                    loop waits on can_sample or ready()
    unknown         anything else: the budget model judges both readings and gives the worse
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from replaywatch.diagnosis import budget
from replaywatch.diagnosis.actors import Actor
from replaywatch.model import DeclaredLayout, NextStrides, ProbeSnapshot, TableSnapshot
from replaywatch.probe.protocol import Gate
from replaywatch.probe.protocol import Layout as Kind  # budget.JobLayout is the model's

DECLARED, LOOP_WRITER, ACTOR_PROBES = "declared", "loop writer", "actor probes"
LEARNED = "learned"
# next() calls whose strides decide a gate: fewer could be a warm-up accident.
GATE_STRIDES = 8
# A loop this long inside next() inserts nothing meanwhile, so the table's newest counters
# (polled after the wait began) are what it asked against; a shorter wait may be compared
# with counters from before its last inserts.
ASKED_EARLY_S = 2.0


@dataclasses.dataclass(frozen=True)
class KnownLayout:
    """A layout and how it is known; `kind` None: unknown."""

    kind: Kind | None
    basis: str | None
    max_policy_lag: int | None = None
    max_items_ahead: int | None = None
    gate: Gate | None = None  # a synchronous loop's, where known
    gate_basis: str | None = None  # declared, or learned from N strides of ...
    inserts_per_step: float | None = None
    first_step_at: int | None = None
    stride_known: bool = True  # False: a schedule proven by one early ask, K not yet seen

    @property
    def known(self) -> bool:
        return self.kind is not None and self.basis is not None

    @property
    def synchronous(self) -> bool:
        """One loop inserts and samples: when next() blocks, nothing inserts."""
        return self.kind in (Kind.SYNC, Kind.SYNC_RATIO)

    def model(self) -> budget.JobLayout | None:
        if not self.known or self.kind is None:
            return None
        lagged = self.kind == Kind.ASYNC_LAG
        return budget.JobLayout(self.kind, self.max_policy_lag if lagged else None,
                             self.gate if self.synchronous else None,
                             self.inserts_per_step, self.first_step_at,
                             self.max_items_ahead if lagged else None, self.stride_known)

    def fix_model(self, lim: budget.Limiter) -> budget.JobLayout | None:
        """The layout a fix is searched under: the fixed run as the sidecar will judge it
        from its first poll. What was declared holds there too, and a gate learned from
        enough of the loop's strides is the loop's; but a gate one early ask proved, and the
        first step it read, are this run's: the fixed run is judged with both gates at
        min_size until it asks, so a fix is printed only where that reading is safe too
        (TF-Agents' DQN job: error_buffer 238 with one step every 8 inserts, not the 222 its
        own first step at 202 items would allow). A gate nobody declared or proved leaves
        the stride unknown too (`budget.JobLayout.for_fixes`)."""
        model = self.model()
        if model is None:
            return None
        if not self.stride_known and self.gate_basis != DECLARED:
            model = dataclasses.replace(model, gate=None, first_step_at=None)
        return model.for_fixes(lim)

    def evidence(self) -> dict[str, object]:
        doc: dict[str, object] = {"layout": self.kind or "unknown", "layout_basis": self.basis,
                                  "max_policy_lag": self.max_policy_lag}
        if self.max_items_ahead is not None:
            doc["max_items_ahead"] = self.max_items_ahead
        if self.synchronous:
            doc.update(gate=self.gate or "unknown", gate_basis=self.gate_basis,
                       inserts_per_step=self.inserts_per_step,
                       first_step_at=self.first_step_at)
        return doc


UNKNOWN = KnownLayout(None, None)


def resolve(table: TableSnapshot, probes: tuple[ProbeSnapshot, ...], actors: tuple[Actor, ...],
            declared: str | None = None) -> KnownLayout:
    """The table's layout from the newest snapshots (module docstring)."""
    bound = _actor_bound(actors)
    said = DeclaredLayout.parse(declared)
    for kind in [p.layout for p in probes if p.layout] + ([said.kind] if said else []):
        if kind in tuple(Kind):
            lag, ahead = bound if kind == Kind.ASYNC_LAG else (None, None)
            return _with_gate(KnownLayout(kind, DECLARED, lag, ahead), probes, table, said)
    if any((p.writers_wrapped or p.items_inserted) and p.inserts_on_next_thread is not False
           for p in probes):
        # The kind says only that the loop is the learner; its gate says when it asks.
        return _with_gate(KnownLayout(Kind.SYNC, LOOP_WRITER), probes, table, said)
    if bound != (None, None):
        return KnownLayout(Kind.ASYNC_LAG, ACTOR_PROBES, *bound)
    if actors and not any(s.waits_total > 0 or s.waiting_on is not None
                          for a in actors for s in a.history[-1:]):
        return KnownLayout(Kind.ASYNC, ACTOR_PROBES)
    return UNKNOWN


def synchronous_reading(table: TableSnapshot, probes: tuple[ProbeSnapshot, ...],
                        declared: str | None = None) -> KnownLayout:
    """The layout unknown, the reading of a synchronous loop, its gate as the probes (or the
    sidecar's --gate) know it (the rules that judge a loop only where insert blocking is
    disabled use it)."""
    return _with_gate(KnownLayout(Kind.SYNC, None), probes, table,
                      DeclaredLayout.parse(declared))


def _actor_bound(actors: tuple[Actor, ...]) -> tuple[int | None, int | None]:
    """The tightest declared bound, (max_policy_lag, None) or (None, max_items_ahead): the
    first kind declared decides which, the smallest value of it binds."""
    newest = [a.history[-1] for a in actors if a.history]
    lags = sorted(s.max_policy_lag for s in newest if s.max_policy_lag is not None)
    if lags:
        return lags[0], None
    ahead = sorted(s.max_items_ahead for s in newest if s.max_items_ahead is not None)
    return (None, ahead[0]) if ahead else (None, None)


def _with_gate(known: KnownLayout, probes: tuple[ProbeSnapshot, ...],
               table: TableSnapshot, said: DeclaredLayout | None = None) -> KnownLayout:
    """A synchronous loop's gate: declared, or learned from its strides (module docstring)."""
    if not known.synchronous:
        return known
    for p in probes:
        if p.gate is not None:
            return dataclasses.replace(known, gate=p.gate, gate_basis=DECLARED,
                                       inserts_per_step=p.inserts_per_step,
                                       first_step_at=p.first_step_at)
    if said is not None and said.gate is not None:
        return dataclasses.replace(known, gate=said.gate, gate_basis=DECLARED,
                                   inserts_per_step=said.inserts_per_step,
                                   first_step_at=said.first_step_at)
    if known.kind == Kind.SYNC_RATIO:
        return dataclasses.replace(known, gate=Gate.SCHEDULE, gate_basis=DECLARED)
    # Strides count the loop's own inserts: only a probe that wraps its writer has them.
    for p in (p for p in probes if p.writers_wrapped or p.items_inserted):
        learned = asked_early(table, p) or learned_gate(p.next_strides)
        if learned is not None:
            return dataclasses.replace(known, **learned)
    return known


def asked_early(t: TableSnapshot, p: ProbeSnapshot) -> dict[str, Any] | None:
    """A loop inside next() for a batch its limiter has not released (module docstring)."""
    batch = p.pipeline.batch_size
    if (not p.blocked_in_next or p.blocked_for_s < ASKED_EARLY_S or not batch
            or p.next_strides is None):
        return None
    rl = t.rate_limiter
    released = (math.floor(rl.inserts * rl.samples_per_insert - rl.min_diff)
                if t.current_size >= rl.min_size_to_sample else 0)
    short = released - p.batches_retrieved * batch
    if short >= batch:
        return None
    # Inside next() nothing inserts, so the table's count is what its first step met (the
    # loop's own count runs ahead of it by the items still in its writer).
    first = rl.inserts if p.batches_retrieved == 0 else None
    return {"gate": Gate.SCHEDULE, "first_step_at": first, "stride_known": False,
            "gate_basis": f"{LEARNED}: inside next() for batch {p.batches_retrieved + 1} of "
                          f"{batch} with {max(0, short)} released and unconsumed, which "
                          "a loop that waits on can_sample never does"}


def learned_gate(s: NextStrides | None) -> dict[str, Any] | None:
    """The gate the loop's strides prove, as KnownLayout fields; None: not yet, or neither."""
    if s is None or s.count < GATE_STRIDES:
        return None
    if s.most - s.least <= 1:
        # Its first step is left at min_size: the loop's count at its first next() runs
        # ahead of the table's by the items still in its writer, so it would overstate.
        k = (s.inserts_at_last - s.inserts_at_first) / s.count
        return {"gate": Gate.SCHEDULE, "inserts_per_step": k,
                "gate_basis": f"{LEARNED} from {s.count} next() calls: {s.least} to {s.most} "
                              "inserts apart"}
    if s.least == 0:
        return {"gate": Gate.CAN_SAMPLE,
                "gate_basis": f"{LEARNED} from {s.count} next() calls: some with no insert "
                              f"between, others {s.most} apart"}
    return None


