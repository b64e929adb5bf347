"""Replay health as the learner sees it: priorities_ignored.

    priorities_ignored  the learner sends priority updates (its trainer probe counts the
                        wrapped client's mutate_priorities) to a table whose sampler and
                        remover read no priority (Uniform, Fifo, Lifo): Reverb keeps every
                        value and no sample changes (acme#69: a "priority table" built with a
                        Uniform selector)

Read from the table's sampler and remover options in ServerInfo and the probe's counts; named
on the first poll that sees both.
"""

from __future__ import annotations

from replaywatch.diagnosis import kinds
from replaywatch.diagnosis.case import Probe, TableCase
from replaywatch.diagnosis.registry import Rule, Shape
from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.model import Finding

# The selectors that read an item's priority: as the sampler or as the remover.
READ_PRIORITIES = frozenset({"prioritized", "heap"})


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


RULES = (
    Rule(kinds.PRIORITIES_IGNORED, is_priorities_ignored, Shape.PROBE_SETTINGS),
)
