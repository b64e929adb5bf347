"""The job's rhythm, learned: how long its progress normally rests, and the stall window that
follows from it.

A fixed stall window is right for a loop whose steps take milliseconds and wrong for a
learner whose step takes 12 s (a big network on a small host, an evaluation or a checkpoint
inside the loop): it pages a healthy job all run. So each progress series (a table's
samples and inserts, a trainer probe's batches and steps, an actor's steps) keeps the gaps
between the polls that saw it move, and a stall is judged over

    window = max(stall_window_s, k x the longest normal gap)        (k: window_factor, 3)

NVIDIA's nvidia-resiliency-ext derives its hang timeouts the same way (the heartbeat
intervals it observed times a safety factor, 5 by default); k = 3 is what the healthy runs
of bench/healthy.py and tests/test_windows.py measured safe, and it names a hung 12 s
learner in 37 s.

**Normal, or a pause.** A gap is normal when it is at most PAUSE_RATIO times the median gap,
or when gaps that long recur (NORMAL_SHARE of the gaps, at least twice): a job whose inserts
come in bursts every 12 s has many short gaps and one long one a cycle, and the long one is
its rhythm. A long gap seen once (a first jit compile) or seldom (an evaluation every few
minutes) is a pause: kept apart with when it began, it does not widen the window.

**Pauses at their rhythm.** A pause that ended normally is learned: when the series rests
again at the phase a pause is due (pauses every T seconds, T from two of them, or from one
and the series' first progress; within a quarter period or the normal window), the window
is pause_slack x the longest pause seen. A rest at any other moment is judged by the normal
window, and a pause far longer than any seen is a stall all the same.

**Sections.** A loop that marks a section (`with probe.section("evaluate"):`) says it rests
on purpose: while inside, the window reaches the section's own timeout_s, else its learned
length (pause_slack x its longest), else, never seen to end, `startup_grace_s`.

**A learner fed by its pipeline.** Where inserts wait at max_diff, the table moves only when
the learner's pipeline draws, and a pipeline that holds many batches (a deep prefetch, several
batching workers) draws nothing for as long as the learner lives on what it holds: a 12 s
learner's table rested 60 s once in a rhythm of 12. So the table waits, with its trainer
probe, until the learner itself rests its own window (it took batches since the table last
moved); from Reverb alone, for as long as the most samples ever drawn between two polls (the
pipeline's first fill: what it can hold) last at the series' rate beside that burst,
pause_slack times, at most `startup_grace_s`, and until a rate is seen, `startup_grace_s`.
Reverb alone cannot tell a learner living on its buffer from one that hangs with it full.

**Pinned.** `--stall-window-s` (or `stall_window_s` in the config file) pins the window:
nothing is learned over it.

Pure: time comes from the snapshots; the rhythms are the keeper's memory, handed in with the
view (TargetView.rhythms) and kept across a restart in the incident log.
"""

from __future__ import annotations

import bisect
import dataclasses
import enum
import statistics
from collections.abc import Iterable, Sequence

from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.model import Section, SectionStat

GAPS_KEPT = 128  # the newest gaps a series keeps
PAUSES_KEPT = 16  # pauses kept apart (a pause every few minutes outlives 128 short gaps)
PAUSE_RATIO = 4.0  # a gap this many times the median is long ...
NORMAL_SHARE = 0.1  # ... and normal all the same when this share of the gaps are as long
RECUR_BAND = 1.5  # "as long": within this factor
MIN_GAPS = 4  # fewer gaps cannot tell a pause from the rhythm: the longest is normal
PHASE_SHARE = 0.25  # a pause is due within this share of its period
# A burst is what it drew over this many polls: a first fill may land across two or three
# (a 12 s learner's 448 samples came as 228 and 220), while a job that moves at every poll
# draws a few polls' worth, which lasts it a few polls.
BURST_POLLS = 3


@dataclasses.dataclass(frozen=True)
class Rhythm:
    """One progress series: its newest value and the gaps between the polls that saw it move.

    Times are the sidecar's clock (the snapshots' `observed_at`).
    """

    value: float  # the counter's newest value
    seen_at: float  # the newest snapshot folded in
    last_event_at: float | None = None  # the first poll that saw `value` (None: not known)
    first_event_at: float | None = None  # the first progress seen (a period from one pause)
    gaps: tuple[float, ...] = ()  # newest last, at most GAPS_KEPT
    pauses: tuple[tuple[float, float], ...] = ()  # (began at, seconds), at most PAUSES_KEPT
    burst: float = 0.0  # the most it moved over BURST_POLLS polls (a pipeline's fill)
    tail: tuple[float, ...] = ()  # its values at the newest polls, at most BURST_POLLS
    moved: float = 0.0  # how much it moved since first sight, restarts summed
    moved_at: float | None = None  # when it last moved (kept across restarts, unlike last_event_at)
    # (its value, the server's age) at first sight of a young server's samples: a pipeline's
    # first fill may have come before the sidecar did
    drawn_before: tuple[float, float] | None = None

    def resumed(self) -> Rhythm:
        """After the sidecar's own restart: what was learned stays; the time between the last
        progress it saw and the first it sees now is no gap of the job's."""
        return dataclasses.replace(self, last_event_at=None, seen_at=0.0, tail=())


def learn(prev: Rhythm | None, points: Iterable[tuple[float, float]],
          age_s: float | None = None) -> Rhythm | None:
    """`prev` with the (observed_at, value) points newer than it folded in. `age_s`: how old
    the server was at the first point, for a samples series first seen here."""
    r = prev
    for at, value in points:
        if r is None:
            # First sight: progress happened by now, so the first gap is timed from here (at
            # most the true one: the window it sets errs short, as a fixed one does).
            before = (value, age_s) if age_s is not None and value > 0 else None
            r = Rhythm(value, at, at if value > 0 else None, at if value > 0 else None,
                       tail=(value,), drawn_before=before)
            continue
        if at <= r.seen_at:
            continue
        elif value < r.value:  # a restart: its counters start over, no gap spans it
            r = dataclasses.replace(r, value=value, seen_at=at, last_event_at=None, tail=())
        elif value > r.value:
            r = _moved(r, at, value)
        else:
            r = dataclasses.replace(r, seen_at=at)
        r = dataclasses.replace(r, tail=(*r.tail, value)[-BURST_POLLS:])
    return r


def _moved(r: Rhythm, at: float, value: float) -> Rhythm:
    first = r.first_event_at if r.first_event_at is not None else at
    step = value - r.value
    # A sidecar resumed after its own restart sees in one step all the job did meanwhile:
    # no burst of the job's.
    drawn = value - (r.tail[0] if r.tail else r.value)
    burst = r.burst if r.seen_at == 0.0 else max(r.burst, drawn)
    r = dataclasses.replace(r, burst=burst, moved=r.moved + step, moved_at=at)
    if r.last_event_at is None:
        return dataclasses.replace(r, value=value, seen_at=at, last_event_at=at,
                                   first_event_at=first)
    gap = at - r.last_event_at
    pauses = r.pauses
    if len(r.gaps) >= MIN_GAPS and gap > PAUSE_RATIO * statistics.median(r.gaps):
        pauses = (*pauses, (r.last_event_at, gap))[-PAUSES_KEPT:]
    return dataclasses.replace(r, value=value, seen_at=at, last_event_at=at,
                               first_event_at=first, gaps=(*r.gaps, gap)[-GAPS_KEPT:],
                               pauses=pauses)


def longest_normal(gaps: Sequence[float]) -> float | None:
    """The longest gap that is the job's rhythm, not a pause (module docstring)."""
    if not gaps:
        return None
    if len(gaps) < MIN_GAPS:
        return max(gaps)
    ordered = sorted(gaps)
    short = PAUSE_RATIO * statistics.median(ordered)
    need = max(2.0, NORMAL_SHARE * len(ordered))
    for g in reversed(ordered):
        as_long = len(ordered) - bisect.bisect_left(ordered, g / RECUR_BAND)
        if g <= short or as_long >= need:
            return g
    return ordered[0]


# -- the window ------------------------------------------------------------------------------

class Basis(enum.StrEnum):
    """What set a window's length."""

    STALL_WINDOW = "stall_window_s"  # the configured window: nothing learned is longer
    PINNED = "pinned"  # learning is off
    LEARNED = "learned"  # k x the longest normal gap
    PAUSE = "pause"  # a pause seen before is due
    SECTION = "section"  # a learner or the actors are inside a marked section
    # Inserts wait at max_diff while the learner lives on samples drawn before:
    LEARNER = "learner"  # its probe shows it taking batches since the table last moved
    DRAIN = "drain"  # from Reverb alone: what its pipeline drew at once lasts this long


# The bases that hold back a stall the table's own rhythm would have named (rules_windows).
HELD_BY_PIPELINE = (Basis.LEARNER, Basis.DRAIN)


@dataclasses.dataclass(frozen=True)
class Window:
    """The stall window a rule judges by, and why it is that long (`normal_s`: the window the
    series' own rhythm gave, where a learner's pipeline stretched it)."""

    seconds: float
    basis: Basis
    why: str
    normal_s: float | None = None

    def evidence(self) -> dict[str, object]:
        doc: dict[str, object] = {"window_s": round(self.seconds, 1),
                                  "window_basis": str(self.basis), "window_why": self.why}
        if self.normal_s is not None:
            doc["window_normal_s"] = round(self.normal_s, 1)
        return doc


def fixed(th: Thresholds, why: str) -> Window:
    return Window(th.stall_window_s, Basis.PINNED if not th.learned_windows
                  else Basis.STALL_WINDOW, why)


def series_window(r: Rhythm | None, th: Thresholds, what: str) -> Window:
    """The window for one series, its rest beginning at its last progress."""
    if not th.learned_windows:
        return fixed(th, f"pinned: stall_window_s {th.stall_window_s:g} s (nothing learned)")
    normal = None if r is None else longest_normal(r.gaps)
    if r is None or normal is None:
        return fixed(th, f"stall_window_s {th.stall_window_s:g} s: no rhythm of {what} learned "
                         "yet")
    k = th.window_factor
    typical = statistics.median(r.gaps)
    seen = f"{what} every {typical:.1f} s, longest {normal:.1f} s"
    learned = k * normal
    window = (Window(learned, Basis.LEARNED, f"learned: {seen}; window {learned:.0f} s "
                     f"({k:g} x {normal:.1f} s)") if learned > th.stall_window_s
              else fixed(th, f"stall_window_s {th.stall_window_s:g} s: learned {seen} "
                             f"({k:g} x {normal:.1f} s is shorter)"))
    due = pause_due(r, th, normal)
    if due is None:
        return window
    period, longest, how = due
    pause = th.pause_slack * longest
    if pause <= window.seconds:
        return window
    return Window(pause, Basis.PAUSE, f"learned pause: {what} rested {longest:.0f} s every "
                  f"{period:.0f} s ({how}), and one is due now; window {pause:.0f} s "
                  f"({th.pause_slack:g} x the longest seen); {seen}")


def pause_due(r: Rhythm, th: Thresholds, normal: float) -> tuple[float, float, str] | None:
    """(period, longest pause, how the period is known) when the series' current rest began
    when a pause is due; None otherwise (module docstring)."""
    if not r.pauses or r.last_event_at is None:
        return None
    starts = [s for s, _ in r.pauses]
    if len(starts) >= 2:
        period = statistics.median(b - a for a, b in zip(starts, starts[1:]))
        how = f"from {len(starts)} pauses"
    elif r.first_event_at is not None and r.first_event_at < starts[0]:
        period, how = starts[0] - r.first_event_at, "from one pause"
    else:
        return None
    tolerance = max(PHASE_SHARE * period, th.window_factor * normal)
    if period < 2 * tolerance or r.last_event_at <= starts[-1]:
        return None
    phase = (r.last_event_at - starts[-1]) % period
    if tolerance < phase < period - tolerance:
        return None
    return period, max(s for _, s in r.pauses), how


def section_window(normal: Window, section: Section, past: Sequence[SectionStat],
                   rested_before_s: float, th: Thresholds, who: str) -> Window:
    """Inside a section: the stall waits for its timeout, or learned length, from when it
    began (`rested_before_s`: how long the series had rested when it began)."""
    allowance, how = section_allowance(section, past, th)
    seconds = max(normal.seconds, rested_before_s + allowance)
    return Window(seconds, Basis.SECTION, f"{who} is in section '{section.name}' for "
                  f"{section.for_s:.0f} s: {how}")


def section_allowance(section: Section, past: Sequence[SectionStat], th: Thresholds
                      ) -> tuple[float, str]:
    """How long a section may last, and why."""
    if section.timeout_s is not None:
        return section.timeout_s, f"waits for its timeout_s {section.timeout_s:g} s"
    seen = next((s for s in past if s.name == section.name and s.count > 0), None)
    if seen is not None:
        allowance = th.pause_slack * seen.longest_s
        return allowance, (f"waits {allowance:.0f} s ({th.pause_slack:g} x its longest, "
                           f"{seen.longest_s:.0f} s, of {seen.count} seen)")
    return th.startup_grace_s, ("no timeout_s given and never seen to end: waits up to "
                                f"startup_grace_s {th.startup_grace_s:g} s")


def drain_s(r: Rhythm | None) -> tuple[float, float | None] | None:
    """(burst, seconds it lasts) for a samples series: the most it drew between two polls,
    and how long that lasts at its rate beside the burst (None: nothing consumed since, so
    not known yet). None when the series never moved.

    Seen first on a young server, what it had drawn then less what its rate since would have
    drawn over the server's life counts as a burst too: a fill that came before the sidecar
    (never more than was drawn: a job whose rate fell errs long, bounded by the caller)."""
    if r is None or r.first_event_at is None:
        return None
    # The rate while it moved: a learner that hangs must not stretch its own window.
    span = (r.moved_at if r.moved_at is not None else r.first_event_at) - r.first_event_at
    rate = (r.moved - r.burst) / span if span > 0 else 0.0
    burst = r.burst
    if r.drawn_before is not None:
        value, age = r.drawn_before
        burst = max(burst, value - rate * age if rate > 0 else value)
    if burst <= 0:
        return None
    return burst, (burst / rate if rate > 0 else None)


def longest(windows: Iterable[Window], th: Thresholds) -> Window:
    """The longest of the windows (a table's: its series', its learners'), never below the
    stall window."""
    best = None
    for w in windows:
        if best is None or w.seconds > best.seconds:
            best = w
    return best if best is not None else fixed(th, f"stall_window_s {th.stall_window_s:g} s")
