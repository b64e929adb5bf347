"""A wasted_experience finding in words: its summary, fix and evidence, said from the
figures `waste.wasted` worked out (waste.py has the arithmetic behind each)."""

from __future__ import annotations

import math
from typing import Any

from replaywatch.diagnosis.waste import BurstFrom, Cause, Wasted

BURST_FROM = {BurstFrom.PAUSE: "a pause in sampling the polls saw",
              BurstFrom.EXCESS: "the share over e^-s",
              BurstFrom.LOOP: "the loop's inserts between next() calls"}


def evidence(x: Wasted) -> dict[str, Any]:
    w = x.waste
    found: dict[str, Any] = {
        "never_sampled": w.never_sampled, "inserted": w.inserts,
        "never_sampled_share": round(w.share, 3), "samples_per_insert": round(w.spi, 3),
        "uniform_share_at_this_ratio": round(w.uniform, 3), "max_size": w.max_size,
        "sampler": x.sampler, "stretch_s": round(w.until - w.since, 1),
        "burst": None if x.burst is None else round(x.burst),
        "burst_from": None if x.burst_from is None else BURST_FROM[x.burst_from]}
    if x.batch_stats:
        found["effective_sample_size_share"] = (None if x.ess_share is None
                                                else round(x.ess_share, 3))
    return found | {"fix_samples_per_insert": x.fix_samples_per_insert,
                    "fix_max_size": x.fix_max_size}


def summary(x: Wasted) -> str:
    w = x.waste
    head = (f"Table '{x.table}' evicted {w.never_sampled:,} of the {w.inserts:,} items "
            f"inserted over {w.until - w.since:.0f} s ({w.share:.0%}) without ever sampling "
            f"them, at {w.spi:.2f} samples per insert.")
    if x.cause is Cause.RATIO:
        return (f"{head} That is what a uniform table wastes at this ratio (e^-{w.spi:.2f} = "
                f"{w.uniform:.0%}, whatever its max_size): too few samples per insert.")
    if x.cause is Cause.BURSTS:
        return f"{head} A uniform table wastes {w.uniform:.0%} at this ratio; here {_bursts(x)}."
    return (f"{head} A uniform table wastes {w.uniform:.0%} at this ratio; the rest is either "
            f"bursts ({_bursts(x)}) or the priorities drawing from a few items. "
            f"{_telling_apart(x)}.")


def fix(x: Wasted) -> str:
    if x.cause is Cause.RATIO:
        return f"{_capital(_more_samples(x))}. A larger max_size changes nothing."
    then = f"; then {_more_samples(x)}" if x.ratio_too else ""
    if x.cause is Cause.BURSTS:
        return f"{_capital(_size(x))}{then}."
    return (f"If bursts: {_size(x)}{then}. If the priorities: bound them (clip the TD error) "
            "or lower priority_exponent.")


def _bursts(x: Wasted) -> str:
    assert x.burst is not None and x.burst_from is not None
    return (f"inserts arrive about {x.burst:,.0f} at a time between the learner's samples "
            f"({BURST_FROM[x.burst_from]}), more than max_size {x.waste.max_size:,}: the first "
            "of each burst are evicted before any sample")


def _telling_apart(x: Wasted) -> str:
    """What tells bursts from priorities, or what the batches already say."""
    if x.ess_share is None:
        return ("A trainer probe with batch_stats=True tells them apart (an effective sample "
                "size near the table's size clears the priorities)")
    return (f"The batches' effective sample size is {x.ess_share:.0%} of the table, so the "
            "priorities may explain it; the loop's inserts between next() calls (a "
            "probe-wrapped writer) would settle bursts")


def _more_samples(x: Wasted) -> str:
    spi = x.spi_fix
    return (f"sample at least {spi:g} per insert (a uniform table then evicts "
            f"{math.exp(-spi):.0%} unsampled): `rate_limiter=reverb.rate_limiters."
            f"SampleToInsertRatio(samples_per_insert={spi:g}, ...)`, the actors then wait for "
            "the learner, or insert less (fewer actors, fewer collect steps per train step)")


def _size(x: Wasted) -> str:
    shorter = (f"insert at most {x.waste.max_size:,} items between the learner's samples "
               "(fewer collect steps per train step, a learner that does not pause while the "
               "actors insert)")
    if x.size_fits:
        return f"raise max_size to {x.size_fix:,} (a burst then fits), or {shorter}"
    return (f"{shorter}: a max_size of {x.size_fix:,} that would hold a burst does not fit in "
            f"memory (it fits {x.fits_max_size:,} items)")


def _capital(text: str) -> str:
    return f"{text[0].upper()}{text[1:]}"
