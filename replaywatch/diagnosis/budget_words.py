"""The budget model's verdicts in words: the reason each case of `budget_reasons` gives,
said from its numbers, and a budget as a finding says it (summary, fix, evidence).

Nothing here decides anything: the case and its numbers come from `budget.predict`, so
the words can change without the arithmetic, and the arithmetic be tested without them.
"""

from __future__ import annotations

from replaywatch.diagnosis import budget_reasons as why
from replaywatch.diagnosis.budget import Budget, Dataset
from replaywatch.diagnosis.budget_fixes import Fix
from replaywatch.diagnosis.budget_reasons import Later, Reason, Verdict
from replaywatch.probe.protocol import Gate
from replaywatch.probe.protocol import Layout as Kind

# How each gate's loop is named where both readings are said.
LOOPS = {Gate.CAN_SAMPLE: "a loop that steps only while can_sample(batch)",
         Gate.SCHEDULE: "a loop that steps on a schedule"}
_LATER = {Later.MORE: "and more at each later step", Later.SAME: "and as much at every step",
          Later.UNKNOWN: "its later steps unknown"}


def said(verdict: Verdict) -> str:
    """`can_hang` as a sentence says it: can hang."""
    return verdict.replace("_", " ")


def reason(b: Budget) -> str:
    """Why the model gave this budget's verdict, with its numbers."""
    return explain(b.why)


def evidence(b: Budget) -> dict[str, float | str | list[str] | None]:
    """The budget as a finding's evidence carries it: its numbers, the reason in words."""
    return {"verdict": b.verdict, "released_samples": b.released,
            "strandable_samples": b.strandable, "safe_from_samples": b.needed,
            "budget_reason": reason(b), "judged_gate": b.gate,
            "conservative": [term.value for term in b.conservative]}


def summary(table: str, b: Budget, ds: Dataset, judged_as: Kind | None = None) -> str:
    """A deadlock_risk or batch_exceeds_headroom summary; `judged_as` is the synchronous
    layout an unknown one was judged as (None: the layout is known)."""
    holders = (f"{ds.samplers} Reverb datasets read by {ds.workers} interleave thread(s), "
               f"one batch of {ds.batch_size} after them," if ds.after_interleave else
               f"{ds.workers} batching worker(s) of {ds.batch_size}")
    said_so = (f"'{table}' {said(b.verdict)} in next(): once inserting stops the limiter "
               f"releases {b.released:g} samples ({reason(b)}) and {holders} can hold "
               f"{b.strandable:g} without completing a batch.")
    if judged_as is None:
        return said_so
    return (f"If this is a synchronous loop ({judged_as}), {said_so[0].lower()}{said_so[1:]} "
            "If actors insert from their own processes and never wait on the learner, it "
            "cannot hang.")


def fix(fixes: tuple[Fix, ...], layout_known: bool = True) -> str:
    """The fixes the model proves, any one of them; and, the layout unknown, how to say it."""
    proven = ("Any one of: " + "; ".join(f.text() for f in fixes) + "."
              if fixes else "No single change the model proves; see the evidence.")
    if layout_known:
        return proven
    return (f"{proven} To settle the layout: wrap the loop's writer with the trainer probe "
            "(probe.wrap_writer / wrap_client / wrap_builder), declare it "
            "(TrainerProbe(layout=...), ActorProbe(max_policy_lag=...)) or run the sidecar "
            "with --layout.")


def explain(r: Reason) -> str:
    """One case's words (budget_reasons names the cases)."""
    match r:
        case why.ActorsFree():
            return ("actors never wait on the learner: blocked at max_diff, they resume as "
                    "soon as it draws")
        case why.ItemsAhead(ahead, e, spi):
            return (f"actors wait {ahead} items ahead of what the learner consumed: "
                    f"error_buffer {e:g} + {ahead} x {spi:g}")
        case why.LagShort(b, lag, spi, released):
            return (f"each learner step takes {b} samples and lets the actors insert only "
                    f"{lag} x {spi:g} = {released:g}")
        case why.Lag(lag, spi):
            return (f"{lag} x {spi:g} inserted after the learner's last step, before the "
                    "actors wait on it again")
        case why.WarmBurst(e, b):
            return (f"the warm-up burst (error_buffer {e:g}) lets can_sample({b}) send the "
                    "loop into next()")
        case why.OneInsert(spi, e):
            return f"one insert releases {spi:g} >= a batch, on top of error_buffer {e:g}"
        case why.ReadyOnly(e, spi, b):
            return (f"error_buffer {e:g} and samples_per_insert {spi:g} are each below a "
                    f"batch of {b}: the loop only takes ready batches")
        case _:
            return _scheduled(r)


def _scheduled(r: Reason) -> str:
    match r:
        case why.FirstStepEarly(m, min_size):
            return (f"the loop first asks for a batch at {m} items, below min_size_to_sample "
                    f"{min_size}: nothing is released and the loop never inserts again")
        case why.FirstStepBlocked(m, max_diff, blocks_at):
            return (f"the loop inserts {m} items before its first step, but with nothing "
                    "drawn before it (tf.data opens its Reverb datasets at the first next()) "
                    f"max_diff ({max_diff:g}) blocks its own insert at {blocks_at:g}")
        case why.CreditFalls(at, b, per_step, steps):
            return (f"{_first_step(at)}, and each step takes {b} while its {at.stride:g} "
                    f"inserts release {per_step:g}: the credit falls by {b - per_step:g} a "
                    "step and is below a batch "
                    + (f"by step {steps}" if steps else "at the first"))
        case why.SurplusGrows(at, b, per_step, max_diff, steps):
            return (f"{_first_step(at)}, and each step's {at.stride:g} inserts release "
                    f"{per_step:g} while it takes {b}: the surplus grows by {per_step - b:g} "
                    f"a step until max_diff ({max_diff:g}) blocks the loop's own insert, by "
                    f"about step {steps}, and a loop blocked inserting never asks for the "
                    "batch that would free it")
        case why.ScheduleHolds(at, later):
            return f"{_first_step(at)}, {_LATER[later]}"
        case _:
            return _qualified(r)


def _qualified(r: Reason) -> str:
    match r:
        case why.StrideUnknown(within, paid):
            return (f"{explain(within)}; but how many items the loop inserts a step is "
                    f"unknown, and one step every {paid:g} inserts is the only schedule that "
                    "runs for good")
        case why.ThinSizeUnknown(within, verdict, thin_bytes, b, workers):
            return (f"{explain(within)}; the items' size is unknown: from {thin_bytes:,} "
                    f"bytes an item, an answer (1 MiB) carries less than a batch of {b}, and "
                    f"once trained the credit for one batch is dealt across {workers} read "
                    "iterators so that none may complete it (a table signature or "
                    "TrainerProbe(item_bytes=...) settles it, --item-bytes to predict; "
                    f"smaller items: the warm-up reading, {said(verdict)})")
        case why.ThinAnswers(within, cap, workers, b):
            return (f"{explain(within)}; once trained, credit for one batch is dealt at most "
                    f"{cap} samples an answer across {workers} read iterators, so none may "
                    f"complete a batch of {b}")
        case why.GateUnknown(worse_gate, worse, other_gate, other_verdict, other):
            return (f"the loop's gate is unknown, so both readings are judged: as "
                    f"{LOOPS[worse_gate]}, {explain(worse)}; as {LOOPS[other_gate]}, "
                    f"{said(other_verdict)} ({explain(other)})")
    raise TypeError(f"no words for {r!r}")


def _first_step(at: why.Schedule) -> str:
    """A scheduled loop's stride, its first step, and what is released at it."""
    every = (f"a step every {at.stride:g} inserts" if at.stride_known else
             f"a step on a schedule of unknown stride (judged at every {at.stride:g} inserts)")
    past = (f" + {at.spi:g} x {at.past_min_size} inserts past min_size"
            if at.past_min_size > 0 else "")
    return (f"{every} from {at.first_step_at} items on; at the first the limiter has "
            f"released {at.released:g} (error_buffer {at.error_buffer:g}{past})")
