"""Replay health as the learner sees it: priorities_ignored.

    priorities_ignored  the learner sends priority updates (its trainer probe counts the
                        wrapped client's mutate_priorities) to a table whose sampler and
                        remover read no priority (Uniform, Fifo, Lifo): Reverb keeps every
                        value and no sample changes (a "priority table" built with a
                        Uniform selector)

    repeated_batches    the learner took a batch whose keys are exactly those of one of its
                        recent batches: a cache or a prefetch that yields a batch again,
                        named on the first poll that sees a repeat
    priority_collapse   on a prioritized table, the sampler draws from under 1% of the table
                        (the effective sample size of the batches' probabilities) for
                        COLLAPSE_FOR_S, or a batch carried an infinite priority within the
                        stall window
    priority_updates_rejected
                        Reverb refused the learner's priority updates over the stall window
                        (NaN or negative priorities: the rest of each call goes with them);
                        critical when every call was refused (REFUSED_CALLS at least)
    wasted_experience   more than half of the items a full table evicted while it stayed full
                        (two turnovers and spi_window_s at least) were never sampled: too
                        few samples per insert (e^-s of them, whatever max_size is), or
                        inserts in bursts longer than the table (diagnosis/waste.py has the
                        arithmetic and the fixes' reasons)

Read from the table's sampler and remover options in ServerInfo and the probe's counts
(priority updates by table; the batches' SampleInfo, probe/batch_stats.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from replaywatch.diagnosis import kinds
from replaywatch.diagnosis import waste as ws
from replaywatch.diagnosis import waste_words as words
from replaywatch.diagnosis import window as win
from replaywatch.diagnosis.case import Probe, TableCase
from replaywatch.diagnosis.registry import Rule, Shape
from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.diagnosis.window import TargetView
from replaywatch.model import BatchStats, Finding, ProbeSnapshot, Severity

# The selectors that read an item's priority: as the sampler or as the remover.
READ_PRIORITIES = frozenset({"prioritized", "heap"})
# A collapse: the sampler draws from fewer than COLLAPSE_SHARE of the table's items, on every
# poll over COLLAPSE_FOR_S (three polls at least): not one odd batch.
COLLAPSE_SHARE = 0.01
COLLAPSE_FOR_S = 10.0
COLLAPSE_POLLS = 3
# Every update refused is critical once this many calls were refused in a row over the window:
# one refused call of a learner that updates rarely is a warning until more say the same.
REFUSED_CALLS = 3


def is_priorities_ignored(case: TableCase, probe: Probe, th: Thresholds) -> Finding | None:
    """Priority updates sent to a table that samples and removes by no priority."""
    t = case.latest
    if not probe or t.sampler.kind in READ_PRIORITIES or t.remover.kind in READ_PRIORITIES:
        return None
    sent = probe[-1].priorities_to(t.name)
    if sent is None or sent.keys == 0:
        return None
    first = next(p for p in probe if (u := p.priorities_to(t.name)) and u.keys > 0)
    evidence = {"sampler": t.sampler.kind, "remover": t.remover.kind, "probe": probe[-1].probe,
                "update_calls": sent.calls, "keys_updated": sent.keys,
                "update_seconds_total": round(sent.seconds_total, 3)}
    summary = (f"The learner '{probe[-1].name}' sent {sent.calls:,} priority updates "
               f"({sent.keys:,} keys, {sent.seconds_total:.2f} s of its time) to table "
               f"'{t.name}', whose sampler is {t.sampler.kind} and remover {t.remover.kind}: "
               "neither reads a priority, so Reverb keeps the values and no sample changes.")
    fix = (f"Build table '{t.name}' with reverb.selectors.Prioritized(priority_exponent) as "
           "its sampler (the exponent your learner's importance weights assume), or stop "
           "computing and sending priorities: they change nothing here.")
    return case.finding(kinds.PRIORITIES_IGNORED, summary, evidence, fix,
                        since=first.observed_at)


def is_priority_updates_rejected(case: TableCase, probe: Probe, th: Thresholds
                                 ) -> Finding | None:
    """Priority updates to this table that Reverb refused over the stall window."""
    t = case.latest
    sent = [(p.observed_at, u) for p in probe if (u := p.priorities_to(t.name)) is not None]
    if not sent:
        return None
    start = case.now - th.stall_window_s
    newest = sent[-1][1]
    base = next((u for at, u in reversed(sent) if at <= start), None)
    calls = newest.calls - (base.calls if base else 0)
    refused = newest.errors - (base.errors if base else 0)
    if refused <= 0:
        return None
    since = next(at for at, u in sent if u.errors > (base.errors if base else 0))
    every = refused == calls and refused >= REFUSED_CALLS
    evidence = {"calls_in_window": calls, "refused_in_window": refused,
                "refused_calls": newest.errors, "calls": newest.calls,
                "rejected_keys": newest.rejected_keys, "infinite_keys": newest.infinite_keys,
                "last_error": newest.last_error, "probe": probe[-1].probe,
                "sampler": t.sampler.kind}
    why = (f"{newest.rejected_keys:,} keys had a NaN or negative priority"
           if newest.rejected_keys else f"Reverb said: {newest.last_error}")
    summary = (f"Reverb refused {refused:,} of the {calls:,} priority updates the learner "
               f"'{probe[-1].name}' sent to table '{t.name}' in the last "
               f"{th.stall_window_s:g} s ({why}); a refused call drops the rest of its keys"
               + (", so no priority lands: the table samples by stale ones." if every
                  else "."))
    fix = ("Send finite priorities >= 0: find where the TD error turns NaN (a diverged loss, "
           "a division by zero) and send its absolute value, clipped; check them before "
           "`mutate_priorities`." if newest.rejected_keys else
           f"Reverb refuses the calls ({newest.last_error}): fix what it names.")
    found = case.finding(kinds.PRIORITY_UPDATES_REJECTED, summary, evidence, fix, since=since)
    return found if every else dataclasses.replace(found, severity=Severity.WARNING)


Stats = list[tuple[float, BatchStats]]


def _stats(probe: Probe) -> Stats:
    return [(p.observed_at, p.batch_stats) for p in probe if p.batch_stats is not None]


def _rose(stats: Stats, count: Callable[[BatchStats], int], start: float
          ) -> tuple[int, float] | None:
    """How much a cumulative count rose since `start` (since the probe started, when its
    history is younger), and when it first did; None when it did not: a repeat or an
    infinite priority seen once resolves a window later."""
    if not stats:
        return None
    base = next((count(b) for t, b in reversed(stats) if t <= start), 0)
    if count(stats[-1][1]) <= base:
        return None
    return count(stats[-1][1]) - base, next(t for t, b in stats if count(b) > base)


def is_repeated_batches(case: TableCase, probe: Probe, th: Thresholds) -> Finding | None:
    """Batches repeated over the newest stall window."""
    stats = _stats(probe)
    rose = _rose(stats, lambda b: b.batches_repeated, case.now - th.stall_window_s)
    if rose is None:
        return None
    (in_window, since), newest = rose, stats[-1][1]
    evidence = {"batches_repeated": newest.batches_repeated,
                "repeated_in_window": in_window, "batches": newest.batches,
                "keys_repeated_in_batch": newest.keys_repeated_in_batch,
                "probe": probe[-1].probe}
    summary = (f"The learner '{probe[-1].name}' took {newest.batches_repeated:,} of its "
               f"{newest.batches:,} batches twice: their keys are exactly those of a batch it "
               "took shortly before, so it trains on the same samples again (a cache or a "
               "prefetch that yields a batch again).")
    fix = ("Take each batch from the Reverb dataset once: no `.cache()` or `.repeat()` after "
           "the Reverb dataset, and no iterator that keeps a batch and yields it again.")
    return case.finding(kinds.REPEATED_BATCHES, summary, evidence, fix, since=since)


def is_priority_collapse(case: TableCase, probe: Probe, th: Thresholds) -> Finding | None:
    """A prioritized table whose sampler draws from a handful of items."""
    t = case.latest
    if t.sampler.kind != "prioritized":
        return None
    stats = _stats(probe)
    if not stats:
        return None
    newest = stats[-1][1]
    infinite = _rose(stats, lambda b: b.infinite_priorities, case.now - th.stall_window_s)
    recent = [(at, b) for at, b in stats if at >= case.now - COLLAPSE_FOR_S]
    shares = [b.effective_sample_size / b.table_size for _, b in recent
              if b.effective_sample_size is not None and b.table_size]
    covered = stats[0][0] <= case.now - COLLAPSE_FOR_S  # watched for the whole stretch
    collapsed = (covered and len(shares) >= COLLAPSE_POLLS and len(shares) == len(recent)
                 and max(shares) < COLLAPSE_SHARE)
    if not collapsed and infinite is None:
        return None
    ess = newest.effective_sample_size
    evidence = {"effective_sample_size": None if ess is None else round(ess, 1),
                "table_size": newest.table_size,
                "share_of_table": None if not (ess and newest.table_size)
                else round(ess / newest.table_size, 6),
                "max_importance_weight": newest.max_importance_weight,
                "infinite_priorities": newest.infinite_priorities,
                "priority_exponent": t.sampler.priority_exponent, "probe": probe[-1].probe}
    why = (f"{newest.infinite_priorities:,} samples carried an infinite priority (Reverb "
           "accepts +inf, and it takes over sampling)" if infinite is not None else
           f"its batches' probabilities give an effective sample size of {ess:,.1f} items of "
           f"{newest.table_size:,} ({COLLAPSE_SHARE:.0%} or less for {COLLAPSE_FOR_S:g} s)")
    summary = (f"Table '{t.name}' samples from a handful of its items: {why}. The learner "
               "trains on the same few items over and over.")
    fix = ("Bound the priorities the learner sends (clip the TD error, or cap priorities at a "
           "maximum, and never send +inf or NaN), or lower the table's priority_exponent.")
    since = recent[0][0] if collapsed or infinite is None else infinite[1]
    return case.finding(kinds.PRIORITY_COLLAPSE, summary, evidence, fix, since=since)


# The samplers and removers whose waste the arithmetic knows: drawn by weight (uniform is
# the weights' equal case), evicted oldest first, kept however often sampled.
WASTE_SAMPLERS = frozenset({"uniform", "prioritized"})


def _learner_on(view: TargetView, name: str) -> ProbeSnapshot | None:
    """The newest reading of a trainer probe on table `name`, if one reads it."""
    newest = [h[-1] for h in view.probes.values()
              if h and view.table_named(h[-1].table) == name]
    return max(newest, key=lambda p: p.observed_at, default=None)


def _wasted(view: TargetView, name: str, th: Thresholds, now: float) -> Finding | None:
    points = win.since_last_reset(win.reach(view, name))
    t = points[-1] if points else None
    if (t is None or t.remover.kind != "fifo" or t.sampler.kind not in WASTE_SAMPLERS
            or t.max_times_sampled > 0 or (w := ws.waste(points, th.spi_window_s)) is None
            or w.share <= ws.WASTED_SHARE or w.samples == 0):
        # Nothing sampled at all is no ratio to fix: a learner not started yet (a long first
        # compile) or a table only written to; the stall and start-up rules speak of those.
        return None
    learner = _learner_on(view, name)
    strides = learner.next_strides if learner else None
    fits = view.table_memories.get(name)
    x = ws.wasted(name, w, t.sampler.kind, strides.most if strides else None,
                  learner.batch_stats if learner else None,
                  fits.fits_max_size if fits else None)
    return kinds.WASTED_EXPERIENCE.finding(view.target, name, words.summary(x),
                                           words.evidence(x), words.fix(x), since=w.since,
                                           last_seen=now)


def is_wasted_experience(view: TargetView, th: Thresholds, now: float) -> Finding | None:
    """The table that wastes the largest share of its evictions, where one wastes over half."""
    found = [f for name in sorted(view.tables) if (f := _wasted(view, name, th, now)) is not None]
    return max(found, key=lambda f: f.evidence["never_sampled_share"], default=None)


RULES = (
    Rule(kinds.PRIORITIES_IGNORED, is_priorities_ignored, Shape.PROBE_SETTINGS),
    Rule(kinds.REPEATED_BATCHES, is_repeated_batches, Shape.PROBE_SETTINGS),
    Rule(kinds.PRIORITY_COLLAPSE, is_priority_collapse, Shape.PROBE_SETTINGS),
    Rule(kinds.WASTED_EXPERIENCE, is_wasted_experience, Shape.VIEW),
    Rule(kinds.PRIORITY_UPDATES_REJECTED, is_priority_updates_rejected, Shape.PROBE_SETTINGS),
)
