"""What the learned windows hold back: in_section, pipeline_draining.

    in_section          a learner (or every actor) is inside a section its code marks, longer
                        than the stall window: the stall rules wait for the section
    pipeline_draining   inserts wait at max_diff and the table rested past its own rhythm
                        while the learner lives on what its pipeline drew before: the stall
                        rules wait for the learner (diagnosis/rhythm.py says how long)

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
    if w is None or w.basis is not rh.Basis.SECTION:
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


def is_pipeline_draining(case: TableCase, th: Thresholds) -> Finding | None:
    """The table rested past the window its own rhythm gives while the learner's pipeline
    feeds it: the stall rules wait for the learner."""
    w = case.window
    if w is None or w.basis not in rh.HELD_BY_PIPELINE or w.normal_s is None:
        return None
    idle = case.resting_s()
    if idle < w.normal_s:
        return None
    t = case.latest
    evidence = {**limiter_evidence(t), **w.evidence(), "seconds_without_progress": idle,
                "judged_in_s": round(max(0.0, w.seconds - idle), 1),
                "trainer_probes": [p[-1].probe for p in case.probes] or None}
    how = ("its trainer probe shows it taking batches" if w.basis is rh.Basis.LEARNER
           else "from Reverb alone, what its pipeline drew at once can last it that long")
    summary = (f"Inserts into table '{t.name}' wait at max_diff and nothing was drawn past "
               f"the table's own rhythm, while the learner lives on samples its pipeline "
               f"drew before ({how}): the stall rules wait for it.")
    fix = ("Nothing while the learner trains. If it has stopped, insert_blocked or "
           "learner_stalled is named once the window ends (evidence: judged_in_s)"
           + ("." if case.probes else "; attach the trainer probe to judge by its own batches, "
              "much sooner."))
    return case.finding(kinds.PIPELINE_DRAINING, summary, evidence, fix,
                        since=t.observed_at - idle)


RULES = (
    Rule(kinds.IN_SECTION, is_in_section, Shape.TABLE_SETTINGS),
    Rule(kinds.PIPELINE_DRAINING, is_pipeline_draining, Shape.TABLE_SETTINGS),
)
