"""Why a verdict is conservative, in words: each `Conservative` term a budget carries, with
its numbers, and what settles it.

A race (`Conservative.race`) is settled only by a change of the job, so its answer names a
fix the budget model proves (`budget_fixes`); a term the model was not told is settled by
telling it, so its answer says what to declare and the verdict that would follow. The
arithmetic behind each term is in docs/predict.md ("The budget model, derived").
"""

from __future__ import annotations

import dataclasses
import functools

from replaywatch.diagnosis import budget, budget_fixes
from replaywatch.diagnosis.budget import Budget, Conservative, Dataset, JobLayout, Limiter
from replaywatch.diagnosis.budget_fixes import Knob
from replaywatch.diagnosis.budget_reasons import Verdict
from replaywatch.diagnosis.budget_words import said
from replaywatch.diagnosis.layout import GATE_STRIDES
from replaywatch.probe.protocol import Gate

# The knobs whose fix removes each race itself (fewer read iterators, every sampler read);
# where none was found, any fix the model proves settles it too.
_REMOVES = {Conservative.WORKER_SPLIT: (Knob.NUM_PARALLEL_CALLS,),
            Conservative.THIN_ANSWERS: (Knob.NUM_PARALLEL_CALLS,),
            Conservative.UNREAD_SAMPLERS: (Knob.NUM_PARALLEL_CALLS, Knob.CYCLE_LENGTH)}
_GATE_WORDS = {Gate.CAN_SAMPLE: "steps only while can_sample(batch)",
               Gate.SCHEDULE: "steps on a schedule"}
LAYOUT_UNKNOWN_WHY = ("the layout is unknown and judged as a synchronous loop: actors that "
                      "insert from their own processes and never wait on the learner cannot "
                      "hang it")
LAYOUT_UNKNOWN_SETTLES = ("declaring the layout: --layout, TrainerProbe(layout=...), or the "
                          "loop's writer wrapped by the trainer probe")


@dataclasses.dataclass(frozen=True)
class Explained:
    """One term of a verdict: what the model cannot decide, and what settles it."""

    term: Conservative
    why: str
    settled_by: str

    def document(self) -> dict[str, object]:
        return {"term": self.term.value, "race": self.term.race, "why": self.why,
                "settled_by": self.settled_by}


# The rules explain again on every poll while a finding stays open; the arguments are
# frozen, as for budget_fixes.fixes.
@functools.lru_cache(maxsize=256)
def explain(lim: Limiter, ds: Dataset, layout: JobLayout) -> tuple[Explained, ...]:
    """Each term that keeps this configuration's verdict from a better one, first to settle
    first; empty when the verdict is certain."""
    b = budget.predict(lim, ds, layout)
    if not b.conservative:
        return ()
    fixes = budget_fixes.fixes(lim, ds, layout)
    return tuple(Explained(term, _why(term, lim, ds, layout, b), _settles(term, lim, ds,
                                                                          layout, fixes))
                 for term in b.conservative)


def layout_unknown() -> Explained:
    """The engine's term: a layout nobody declared, judged by its synchronous reading."""
    return Explained(Conservative.LAYOUT_UNKNOWN, LAYOUT_UNKNOWN_WHY, LAYOUT_UNKNOWN_SETTLES)


def _why(term: Conservative, lim: Limiter, ds: Dataset, layout: JobLayout, b: Budget) -> str:
    if term == Conservative.WORKER_SPLIT:
        return (f"which of the {ds.workers} batching workers' requests the released samples "
                "reach is up to tf.data's threads (the table answers requests in the order "
                f"they come): a hang needs every worker short of a batch of {ds.batch_size} "
                f"at once, and the pipeline can hold {_num(b.strandable)} so, against "
                f"{_num(b.released)} released")
    if term == Conservative.UNREAD_SAMPLERS:
        if ds.after_interleave:
            return (f"{ds.samplers - ds.workers} of the {ds.samplers} Reverb datasets have no "
                    "interleave thread in them at a time and keep what they drew: which ones "
                    f"is up to where the {ds.workers} thread(s) block")
        return (f"{ds.workers * (ds.iterators_per_worker - 1)} sampling iterators the learner "
                f"does not read ({ds.iterators_per_worker} a worker, Acme's repeat-interleave) "
                "may draw samples and keep them: whether they do is up to tf.data's interleave")
    if term == Conservative.THIN_ANSWERS:
        return (f"an answer carries at most {budget.response_cap(ds)} items (1 MiB of "
                f"{ds.item_bytes or 0:,}-byte items), fewer than a batch of {ds.batch_size}: "
                f"once trained, a batch's credit is dealt across {ds.workers} read iterators "
                "and whether one completes it is a race")
    if term == Conservative.ITEM_SIZE_UNKNOWN:
        largest, verdict = _largest_settled_item(lim, ds, layout)
        # Thin answers matter only where a loop may be dealt a batch's credit thinly.
        thin = (f", and from {budget.thin_item_bytes(ds.batch_size):,} bytes carry less than "
                "a batch" if budget.steady_race(ds, layout) else "")
        return ("the items' size is unknown: a response ends at 1 MiB of chunks, so answers "
                f"may end at any count, not in whole inserts{thin}; items of at most "
                f"{largest:,} bytes are {said(verdict)}")
    if term == Conservative.GATE_UNKNOWN:
        gate, verdict = _other_reading(lim, ds, layout)
        return (f"the loop's gate is unknown and the worse reading is given; a loop that "
                f"{_GATE_WORDS[gate]} is {said(verdict)}")
    if term == Conservative.STRIDE_UNKNOWN:
        paid = ds.batch_size / lim.samples_per_insert
        return (f"the loop steps on a schedule, but how many items it inserts a step is "
                f"unknown: one step every {paid:g} inserts is the only schedule that runs for "
                f"good (fewer run the credit down by a batch of {ds.batch_size} a step, more "
                "pile up against max_diff)")
    return LAYOUT_UNKNOWN_WHY


def _settles(term: Conservative, lim: Limiter, ds: Dataset, layout: JobLayout,
             fixes: tuple[budget_fixes.Fix, ...]) -> str:
    if term == Conservative.ITEM_SIZE_UNKNOWN:
        return ("declaring the size: --item-bytes, TrainerProbe(item_bytes=...), or the "
                "table's signature, which the sidecar reads")
    if term == Conservative.GATE_UNKNOWN:
        gate, _ = _other_reading(lim, ds, layout)
        return (f"declaring the gate if the loop {_GATE_WORDS[gate]}: --gate {_flag(gate)}, "
                f"TrainerProbe(gate=\"{gate}\"), or the loop's own next() calls, which the "
                "probe learns it from")
    if term == Conservative.LAYOUT_UNKNOWN:
        return LAYOUT_UNKNOWN_SETTLES
    if term == Conservative.STRIDE_UNKNOWN:
        return ("declaring it: --inserts-per-step, TrainerProbe(inserts_per_step=...), or "
                f"{GATE_STRIDES} of the loop's own next() calls, which the probe learns "
                "it from")
    if not fixes:
        return "no single change the model proves"
    removes = [f for f in fixes if f.knob in _REMOVES.get(term, ())]
    chosen = removes[0] if removes else fixes[0]
    more = " or another fix below" if len(fixes) > 1 else ""
    return f"a change: {_short(chosen)}{more}"


def _flag(gate: Gate) -> str:
    """The gate as `--gate` spells it."""
    return gate.replace("_", "-")


def _other_reading(lim: Limiter, ds: Dataset, layout: JobLayout) -> tuple[Gate, Verdict]:
    """The gate whose reading is better than the one given, and its verdict."""
    judged = budget.predict(lim, ds, layout).gate or Gate.SCHEDULE
    other = Gate.SCHEDULE if judged == Gate.CAN_SAMPLE else Gate.CAN_SAMPLE
    return other, budget.predict(lim, ds, layout.gated(other)).verdict


def _largest_settled_item(lim: Limiter, ds: Dataset, layout: JobLayout
                          ) -> tuple[int, Verdict]:
    """The largest item size that reads as the smallest one does, and that verdict: a
    larger item only ends an answer sooner, so the verdict never improves with size."""
    def verdict(item_bytes: int) -> Verdict:
        return budget.predict(lim, dataclasses.replace(ds, item_bytes=item_bytes),
                              layout).verdict

    best = verdict(1)
    low, high = 1, budget.MAX_RESPONSE_BYTES
    while low < high:
        mid = (low + high + 1) // 2
        if verdict(mid) == best:
            low = mid
        else:
            high = mid - 1
    return low, best


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def _short(fix: budget_fixes.Fix) -> str:
    alone = f"{fix.knob}={fix.value} (now {_num(fix.was)})"
    return alone if fix.together is None else f"{alone} together with {_short(fix.together)}"
