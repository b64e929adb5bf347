"""Stall windows learned from the job's rhythm, judged poll by poll by the pure diagnosis.

Each test drives the keeper's cycle by hand: a job's counters at every 1 s poll, the view the
keeper would build, the rhythms folded in (stall_window.learn_view), `diagnose`. The jobs
are the ones a fixed window paged: an asynchronous learner whose step takes 12 s (actors
held at max_diff through each step), and a learner that evaluates for 60 s every 4
minutes. Real processes run the same in tests/test_windows.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from replaywatch.diagnosis import rhythm as rh
from replaywatch.diagnosis import rules_throughput, rules_windows
from replaywatch.diagnosis import stall_window as sw
from replaywatch.diagnosis.engine import diagnose
from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.model import Finding, Section, SectionStat, Severity
from tests.builders import PROBE, polls, probe_snapshot, table_snapshot
from tests.builders import target_view as make_view

TH = Thresholds()
# Many minutes of a job, poll by poll, through the whole diagnosis: 2.5 s and more each. Make test
# runs them; make test-fast (under a minute) leaves them to it.
SIMULATED_RUNS = pytest.mark.slow
PINNED = dataclasses.replace(TH, learned_windows=False)
REACH_S = 63.0  # the keeper's view: max(spi window, 3 stall windows) + 3 polls
B = 16  # a batch; spi 1, so a step frees 16 inserts


@dataclasses.dataclass
class State:
    """The job at one poll: the table's counters and the learner's."""

    inserts: int
    samples: int
    batches: int
    steps: int
    section: Section | None = None
    sections: tuple[SectionStat, ...] = ()


Job = Callable[[float], State]


def slow_learner(step_s: float = 12.0, hang_at: float | None = None) -> Job:
    """Actors at max_diff (100 ahead) insert as soon as a step draws a batch."""
    def at(t: float) -> State:
        k = int((min(t, hang_at) if hang_at is not None else t) // step_s)
        return State(inserts=100 + B * (k + 1), samples=B * (k + 1), batches=k + 1, steps=k)
    return at


def evaluating_learner(every_s: float = 240.0, pause_s: float = 60.0, sections: bool = False,
                       hang_at: float | None = None) -> Job:
    """A step a second, but for `pause_s` every `every_s` (from `every_s` on) it evaluates."""
    def at(t: float) -> State:
        live = min(t, hang_at) if hang_at is not None else t
        done = int(live // every_s)  # evaluations begun
        phase = live - done * every_s
        inside = done > 0 and phase < pause_s
        paused = max(0, done - 1) * pause_s + (min(phase, pause_s) if done else 0.0)
        # Out of an evaluation it takes its next batch at once.
        k = int(live - paused) + (0 if inside else 1)
        inside = inside and (hang_at is None or t < hang_at)
        ended = done - 1 if inside else done
        past = (SectionStat("evaluate", ended, pause_s, pause_s),) if ended > 0 else ()
        return State(inserts=100 + B * (k + 1), samples=B * (k + 1), batches=k + 1, steps=k,
                     section=Section("evaluate", phase, None) if sections and inside else None,
                     sections=past if sections else ())
    return at


def buffered_learner(step_s: float = 12.0, fill: int = 448, rest: tuple[float, float] = (97, 157),
                     hang_at: float | None = None, split: bool = False) -> Job:
    """The pipeline draws `fill` samples at its first poll (a deep prefetch, four batching
    workers), then a batch a step, but draws nothing from `rest[0]` to `rest[1]` (then what
    it missed at once), while the learner takes a batch every step from what it holds: the
    table of a real 12 s learner behind prefetch(8) and four workers."""
    def at(t: float) -> State:
        live = min(t, hang_at) if hang_at is not None else t
        k = int(live // step_s)
        drawn_at = min(live, rest[0]) if rest[0] <= live < rest[1] else live
        drawn = 0 if t < 1 else fill + B * int(drawn_at // step_s)
        if split and 1 <= t < 2:  # the fill across two polls, as 228 and 220 came
            drawn = fill // 2
        return State(inserts=100 + drawn, samples=drawn, batches=k + 1, steps=k)
    return at


def run(job: Job, seconds: int, th: Thresholds = TH, probe: bool = True,
        rhythms: dict[str, rh.Rhythm] | None = None, start: float = 1000.0,
        age_s: float = 0.0, reach_cap_s: float | None = None, coarse: bool = False
        ) -> tuple[list[tuple[float, Finding]], dict[str, rh.Rhythm]]:
    """Every warning or critical finding at each poll, and the rhythms learned (`age_s`: the
    server's age at the first poll)."""
    tables: list[Any] = []
    probes: list[Any] = []
    learned = dict(rhythms or {})
    paged: list[tuple[float, Finding]] = []
    answered = polls([start + i for i in range(seconds + 1)])  # every poll answered, made once
    for i in range(seconds + 1):
        t = start + i
        s = job(float(i))
        tables.append(table_snapshot(t, s.inserts, s.samples,
                                     waiting_for_sampling_ms=int(1000 * (age_s + i))))
        probes.append(dataclasses.replace(
            probe_snapshot(t, s.batches, steps=s.steps, batch_size=B, started_at=start - 5),
            section=s.section, sections=s.sections))
        reach = max(REACH_S, 3 * sw.longest_learned_s(learned, th) + 3)
        reach = reach if reach_cap_s is None else min(reach, reach_cap_s)
        recent = [x for x in tables if x.observed_at >= t - reach]
        view = make_view([tuple(recent)],
                         [tuple(p for p in probes if p.observed_at >= t - reach)] if probe
                         else [],
                         target_polls=answered[len(tables) - len(recent):len(tables)])
        if not probe:
            view = dataclasses.replace(view, probe_polls={})
        if coarse:  # the keeper's copy for the throughput rule: a snapshot per 10 s
            view = dataclasses.replace(view, coarse_tables={"replay": tuple(
                x for x in tables[::10] if x.observed_at >= t - th.throughput_lookback_s)})
        learned = sw.learn_view(view, learned)
        view = dataclasses.replace(view, rhythms=learned)
        paged += [(float(i), f) for f in diagnose(view, th, t).findings
                  if f.severity >= Severity.WARNING]
    return paged, learned


def test_a_learner_whose_step_takes_12_s_is_never_paged_with_or_without_its_probe() -> None:
    for probe in (False, True):
        paged, learned = run(slow_learner(), 600, probe=probe)
        assert paged == [], (probe, [(t, f.kind) for t, f in paged[:3]])
    # The learned rhythm: a step every 12 s, none longer.
    assert rh.longest_normal(learned["samples replay"].gaps) == 12.0
    assert rh.longest_normal(learned[f"probe {PROBE}"].gaps) == 12.0
    # The same job under a pinned 10 s window is paged all run: the test can fail.
    paged, _ = run(slow_learner(), 120, th=PINNED)
    assert {f.kind for _, f in paged} >= {"learner_stalled"}
    assert any(f.severity is Severity.CRITICAL for _, f in paged)


def test_a_hung_12_s_learner_is_named_within_3_gaps_and_says_its_window() -> None:
    paged, _ = run(slow_learner(hang_at=300.5), 420)
    first = next((t, f) for t, f in paged if f.severity is Severity.CRITICAL)
    # Its last step began at 300 (k = 25): progress last seen at 300; 3 x 12 = 36 s.
    assert 300 + 36 <= first[0] <= 300 + 36 + 2, first[0]
    assert first[1].kind == "learner_stalled"
    ev = first[1].evidence
    assert (ev["window_basis"], ev["window_s"]) == ("learned", 36.0)
    assert ev["window_why"].startswith("learned: ") and "longest 12.0 s" in ev["window_why"]


@SIMULATED_RUNS
def test_a_periodic_evaluation_is_paged_at_most_at_its_first_pause() -> None:
    paged, learned = run(evaluating_learner(), 1000)
    assert paged, "the first 60 s evaluation outlasts the 10 s window: nothing learned yet"
    assert all(240 <= t <= 300 + 2 for t, _ in paged), sorted({t for t, _ in paged})
    r = learned["samples replay"]
    # Seen from the last step before each (a second before it began) to the first after.
    assert [round(length) for _, length in r.pauses][:3] == [61, 61, 61]


def last_poll(job: Job, seconds: int, probe: bool = True) -> tuple[Finding, ...]:
    """Every finding at the job's last poll, the rhythms learned all along."""
    tables: list[Any] = []
    probes: list[Any] = []
    learned: dict[str, rh.Rhythm] = {}
    found: tuple[Finding, ...] = ()
    for i in range(seconds + 1):
        t, s = 1000.0 + i, job(float(i))
        tables.append(table_snapshot(t, s.inserts, s.samples, waiting_for_sampling_ms=500 * i))
        probes.append(dataclasses.replace(
            probe_snapshot(t, s.batches, steps=s.steps, batch_size=B, started_at=995.0),
            section=s.section, sections=s.sections))
        view = make_view([tuple(tables[-90:])], [tuple(probes[-90:])] if probe else [])
        if not probe:
            view = dataclasses.replace(view, probe_polls={})
        learned = sw.learn_view(view, learned)
        found = diagnose(dataclasses.replace(view, rhythms=learned), TH, t).findings
    return found


# (what, the evaluating learner's poll, the kind it shows: in_section or nothing)
WINDOW_CASES: list[tuple[str, Job, int, bool, str | None]] = [
    ("40 s into its first marked evaluation", evaluating_learner(sections=True), 280, True,
     "in_section"),
    ("5 s in: shorter than the stall window, nothing to say",
     evaluating_learner(sections=True), 245, True, None),
    ("not marked: nothing said of sections", evaluating_learner(), 280, True, None),
    ("the pipeline drew nothing for 40 s, its learner took 3 batches meanwhile",
     buffered_learner(), 137, True, "pipeline_draining"),
    ("the same from Reverb alone: its first fill lasts it minutes", buffered_learner(), 137,
     False, "pipeline_draining"),
    ("within the table's own rhythm: nothing to say", buffered_learner(), 105, True, None),
    ("inserts not held at max_diff: no pipeline to wait for", slow_learner(), 130, False, None),
]


def test_each_window_case_shows_its_kind() -> None:
    held = {rule.kind.name for rule in rules_windows.RULES}
    assert held == {"in_section", "pipeline_draining"}
    for what, job, at, probe, kind in WINDOW_CASES:
        shown = [f.kind for f in last_poll(job, at, probe) if f.kind in held]
        assert shown == ([kind] if kind else []), what


@SIMULATED_RUNS
def test_a_learner_fed_by_its_pipeline_is_never_paged_with_or_without_its_probe() -> None:
    for probe in (False, True):
        paged, _ = run(buffered_learner(), 600, probe=probe)
        assert paged == [], (probe, [(t, f.kind, f.evidence.get("window_why")) for t, f in
                                     paged[:3]])
    # Judged by the table's own rhythm (3 x 12 s), the 60 s rest pages: the test can fail.
    paged, _ = run(buffered_learner(), 200, th=dataclasses.replace(TH, pause_slack=1.0,
                                                                     startup_grace_s=30.0),
                   probe=False)
    assert any(f.kind == "insert_blocked" for _, f in paged)


def test_a_sidecar_that_came_after_the_pipelines_fill_counts_it_from_the_servers_age() -> None:
    # First seen 10 s into the job, the fill long drawn: what the server had drawn then, less
    # what its rate since would have drawn in its 10 s, is the fill.
    later = buffered_learner()
    paged, learned = run(lambda t: later(t + 10), 300, probe=False, age_s=10.0)
    assert paged == [], [(t, f.kind, f.evidence.get("window_why")) for t, f in paged[:3]]
    burst, lasts = rh.drain_s(learned["samples replay"]) or (0, None)
    assert 430 <= burst <= 448 and lasts is not None
    # Seen first on a server an hour old, its counters say nothing of a fill: judged by the
    # table's own rhythm, the rest pages (the test can fail).
    paged, _ = run(lambda t: later(t + 10), 300, probe=False, age_s=3600.0)
    assert any(f.kind == "insert_blocked" for _, f in paged)


# Four runs of 1,100 polls each judged cycle by cycle: make test's, not the edit-test loop's,
# and handed out first there (a minute of one core).
@pytest.mark.slow
@pytest.mark.long
def test_a_60_s_learner_living_on_its_pipeline_for_5_steps_is_no_throughput_drop(
        monkeypatch: Any) -> None:
    job = buffered_learner(step_s=60.0, rest=(480, 780))
    paged, _ = run(job, 1100, probe=False, coarse=True)
    assert paged == [], [(t, f.kind) for t, f in paged[:3]]
    # At 12 s its fill (448 samples, 336 s of its sampling) would swell any baseline of spans
    # that long: a table whose pipeline holds longer than a drop is judged over is not judged.
    for split in (False, True):
        paged, _ = run(buffered_learner(split=split), 1100, probe=False, coarse=True)
        assert paged == [], (split, [(t, f.kind) for t, f in paged[:3]])
    # Its rates judged over its own rhythm alone, the 300 s rest is a drop (it can fail).
    monkeypatch.setattr(rules_throughput, "pipeline_hold_s", lambda *_: 0.0)
    paged, _ = run(job, 1100, probe=False, coarse=True)
    assert {f.kind for _, f in paged} == {"throughput_drop"}


def test_a_hung_learner_fed_by_its_pipeline_is_named_by_its_own_window_or_its_fill() -> None:
    # With its probe: 3 x its 12 s step after its last batch (at 300).
    paged, _ = run(buffered_learner(hang_at=300.5), 360)
    first = next((t, f) for t, f in paged if f.severity is Severity.CRITICAL)
    assert 300 + 36 <= first[0] <= 300 + 36 + 2, first[0]
    assert first[1].kind == "learner_stalled"
    # It says the window it was judged by: its own (3 x 12 s), not the table's.
    assert first[1].evidence["window_s"] == 36.0, first[1].evidence["window_why"]
    # From Reverb alone: the 448 samples its pipeline drew at once last it 336 s at the
    # 16 samples per 12 s it draws beside them; 1.5 x that after the table last moved (300).
    paged, _ = run(buffered_learner(hang_at=300.5), 300 + 510, probe=False)
    first = next((t, f) for t, f in paged if f.severity is Severity.CRITICAL)
    assert first[1].kind == "insert_blocked"
    ev = first[1].evidence
    assert ev["window_basis"] == "drain" and "drew 448 samples" in ev["window_why"]
    assert 300 + ev["window_s"] <= first[0] <= 300 + ev["window_s"] + 2, (first[0], ev)
    assert 480 <= ev["window_s"] <= 530, ev["window_s"]
    # A history shorter than that window (the sidecar's --history) still proves it: the
    # table's rhythms know when it last moved (a server past its start-up grace: a view this
    # short no longer shows the learner trained).
    short, _ = run(buffered_learner(hang_at=300.5), 300 + 510, probe=False, reach_cap_s=200.0,
                   age_s=1000.0)
    assert next(t for t, f in short if f.kind == "insert_blocked") == first[0]


@SIMULATED_RUNS
def test_a_marked_evaluation_is_never_paged_and_says_so() -> None:
    paged, _ = run(evaluating_learner(sections=True), 1000)
    assert paged == []
    # Its first section: no timeout_s, never ended before, so it waits up to the start-up
    # grace and says so in an info finding.
    (info,) = [f for f in last_poll(evaluating_learner(sections=True), 280)
               if f.kind == "in_section"]
    assert info.severity is Severity.INFO
    assert info.evidence["section"] == "evaluate" and info.evidence["section_for_s"] == 40
    assert "never seen to end" in info.evidence["window_why"]
    # Its second: its learned length, 1.5 x 60 s.
    (info,) = [f for f in last_poll(evaluating_learner(sections=True), 520)
               if f.kind == "in_section"]
    assert info.evidence["section_allowance_s"] == 90.0


@SIMULATED_RUNS
def test_an_evaluating_learner_hung_for_good_is_named_within_its_window() -> None:
    # Hung at 650 s, between evaluations (480 and 720): named by the normal window.
    paged, _ = run(evaluating_learner(sections=True, hang_at=650.5), 720)
    first = next(t for t, f in paged if f.severity is Severity.CRITICAL)
    assert 650 + TH.stall_window_s <= first <= 650 + TH.stall_window_s + 2, first
    # Hung inside an evaluation: named once the section outlasts 1.5 x its longest (90 s).
    paged, _ = run(evaluating_learner(sections=True, hang_at=500.5), 640)
    first = next(t for t, f in paged if f.severity is Severity.CRITICAL)
    assert 480 + 90 <= first <= 480 + 90 + 2, first


def test_the_rhythm_survives_the_sidecars_restart() -> None:
    # 300 s learned, then a new sidecar: its view starts empty, its rhythms are resumed.
    _, learned = run(slow_learner(), 300)
    resumed = {k: r.resumed() for k, r in learned.items()}
    paged, _ = run(lambda t: slow_learner()(t + 301), 60, rhythms=resumed, start=1301.0)
    assert paged == []
    # Without them the first 60 s page the healthy job.
    paged, _ = run(lambda t: slow_learner()(t + 301), 60, start=1301.0)
    assert paged


def test_a_pause_learned_is_not_a_licence_at_any_other_time() -> None:
    r = rh.Rhythm(0.0, 0.0)
    r = rh.learn(r, [(float(t), float(t)) for t in range(0, 240)])
    r = rh.learn(r, [(300.0, 300.0)] + [(float(t), float(t)) for t in range(301, 400)])
    assert r is not None and [(round(a), round(b)) for a, b in r.pauses] == [(239, 61)]
    mid = dataclasses.replace(r, last_event_at=400.0)  # 160 s after it: not due
    assert rh.series_window(mid, TH, "samples").basis == "stall_window_s"
    due = dataclasses.replace(r, last_event_at=478.0)  # 239 + 239: due
    w = rh.series_window(due, TH, "samples")
    assert w.basis == "pause" and round(w.seconds) == round(1.5 * 61)


def test_a_pinned_window_learns_nothing() -> None:
    r = rh.learn(None, [(float(t), float(t // 12)) for t in range(0, 200)])
    assert rh.series_window(r, PINNED, "samples").seconds == 10.0
    assert rh.series_window(r, PINNED, "samples").basis == "pinned"
    assert rh.series_window(r, TH, "samples").seconds == 36.0


def test_gaps_that_recur_are_the_rhythm_and_one_long_gap_is_not() -> None:
    bursts = [1.0] * 5 + [14.0]
    assert rh.longest_normal(bursts * 4) == 14.0  # inserts in bursts every 20 s
    assert rh.longest_normal([600.0] + [12.0] * 8) == 12.0  # a first compile, once
    assert rh.longest_normal([12.0] * 20 + [60.0]) == 12.0  # an evaluation among steps
    assert rh.longest_normal([600.0, 12.0]) == 600.0  # too few to tell: the longest holds


def test_polls_for_the_view_reach_back_over_the_longest_window() -> None:
    r = rh.learn(None, [(float(t), float(t // 40)) for t in range(0, 400)])
    assert sw.longest_learned_s({"samples replay": r}, TH) == 120.0
    assert polls([1.0])[0].ok


def test_reverb_alone_names_a_hung_12_s_learner_too() -> None:
    # No probe: sampling seen paced by the learner over the view tells it trained, so the
    # hang is not taken for start-up; the learned window times it.
    paged, _ = run(slow_learner(hang_at=300.5), 420, probe=False)
    first = next((t, f) for t, f in paged if f.severity is Severity.CRITICAL)
    assert 300 + 36 <= first[0] <= 300 + 36 + 2, first
    assert first[1].evidence["window_basis"] == "learned"
