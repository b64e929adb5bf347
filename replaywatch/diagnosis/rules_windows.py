"""What the learned windows hold back: in_section.

    in_section   a learner (or every actor) is inside a section its code marks, longer than
                 the stall window: the stall rules wait for the section (diagnosis/rhythm.py)

Said as info, so a person looking at a quiet learner sees why nothing is paged yet and until
when; past the section's timeout or learned length the usual stall is named.
"""

from __future__ import annotations

from replaywatch.diagnosis import kinds
from replaywatch.diagnosis import rhythm as rh
from replaywatch.diagnosis.case import TableCase, limiter_evidence
from replaywatch.diagnosis.registry import Rule, Shape
from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.model import Finding, Section, SectionStat


def is_in_section(case: TableCase, th: Thresholds) -> Finding | None:
    """A section of the table's learner (or of all its actors) has outlasted the configured
    stall window: the stall rules are waiting for it."""
    w = case.window
    if w is None or w.basis != "section":
        return None
    inside: list[tuple[str, Section, float, tuple[SectionStat, ...]]] = [
        (f"learner '{p[-1].name}'", p[-1].section, p[-1].observed_at, p[-1].sections)
        for p in case.probes if p[-1].section is not None]
    inside += [(f"actor '{a.name}'", a.history[-1].section, a.history[-1].observed_at,
                a.history[-1].sections)
               for a in case.actors if a.history and a.history[-1].section is not None]
    longest = max(inside, key=lambda x: x[1].for_s, default=None)
    if longest is None or longest[1].for_s < th.stall_window_s:
        return None
    who, s, seen_at, past = longest
    allowance, how = rh.section_allowance(s, past, th)
    evidence = {**limiter_evidence(case.latest), **w.evidence(), "who": who,
                "section": s.name, "section_for_s": round(s.for_s, 1),
                "timeout_s": s.timeout_s, "section_allowance_s": round(allowance, 1),
                "in_section": sorted(x[0] for x in inside)}
    summary = (f"The {who} on table '{case.name}' is in section '{s.name}' for "
               f"{s.for_s:.0f} s: the stall rules wait for it ({how}).")
    fix = (f"Nothing while it lasts; if '{s.name}' runs past {allowance:.0f} s the usual stall "
           "is named. Give the section a timeout_s to bound the wait.")
    return case.finding(kinds.IN_SECTION, summary, evidence, fix,
                        since=seen_at - s.for_s)


RULES = (
    Rule(kinds.IN_SECTION, is_in_section, Shape.TABLE_SETTINGS),
)
