"""Which progress series a target has, their rhythms learned from its view, and the stall
window each table's and actor's rules judge by (diagnosis/rhythm.py says how).

    rhythms = learn_view(view, previous)          # the keeper, each cycle
    window = table_window(view, case, th)         # the engine, each table
    window = actors_window(view, th)              # the engine, the actor rules

Series, by key: "samples NAME" and "inserts NAME" (a table's counters), "probe URL" (a
trainer's batches and steps), "actor URL" (an actor's steps and items).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from replaywatch.diagnosis import ratelimiter as lim
from replaywatch.diagnosis import rhythm as rh
from replaywatch.diagnosis import window as win
from replaywatch.diagnosis.case import TableCase
from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.diagnosis.window import TargetView
from replaywatch.model import ActorSnapshot, ProbeSnapshot


def probe_progress(p: ProbeSnapshot) -> float:
    return float(p.batches_retrieved + p.learner_steps)


def actor_progress(a: ActorSnapshot) -> float:
    return float(a.steps_total + a.items_created_total)


def _points(snapshots: Sequence[Any], value: Callable[[Any], float]
            ) -> list[tuple[float, float]]:
    return [(s.observed_at, value(s)) for s in snapshots]


def series_of(view: TargetView) -> dict[str, list[tuple[float, float]]]:
    """Every progress series of the view, as (observed_at, value) points."""
    out: dict[str, list[tuple[float, float]]] = {}
    for name, snaps in view.tables.items():
        out[f"samples {name}"] = _points(snaps, win.samples_of)
        out[f"inserts {name}"] = _points(snaps, win.inserts_of)
    for url, probe in view.probes.items():
        out[f"probe {url}"] = _points(probe, probe_progress)
    for url, actor in view.actors.items():
        out[f"actor {url}"] = _points(actor, actor_progress)
    return out


def learn_view(view: TargetView, previous: Mapping[str, rh.Rhythm]) -> dict[str, rh.Rhythm]:
    """The target's rhythms with the view's newer points folded in (series the view no longer
    has are kept as they were: a probe down for a while comes back with its rhythm)."""
    out = dict(previous)
    for key, points in series_of(view).items():
        learned = rh.learn(previous.get(key), points,
                           None if key in previous else _young_server_age(view, key))
        if learned is not None:
            out[key] = learned
    return out


# A samples series first seen on a server younger than this counts what was drawn before as
# a possible fill (rhythm.drain_s); an older server's counters say too little of one.
FILL_SEEN_WITHIN_S = 900.0


def _young_server_age(view: TargetView, key: str) -> float | None:
    """The server's age at the first snapshot of a table's samples series, if it is young."""
    side, _, name = key.partition(" ")
    snaps = view.tables.get(name) if side == "samples" else None
    if not snaps:
        return None
    age = win.worker_ms(snaps[0]) / 1000.0
    return age if 0 < age <= FILL_SEEN_WITHIN_S else None


def table_window(view: TargetView, case: TableCase, th: Thresholds) -> rh.Window:
    """The longest window of the table's series and of its learners, stretched by a section
    any of its learners is inside (or every one of its actors)."""
    name = case.name
    rhythms = view.rhythms
    keyed = [(f"samples {name}", "samples"), (f"inserts {name}", "inserts")]
    keyed += [(f"probe {p[-1].probe}", f"learner '{p[-1].name}' progress") for p in case.probes]
    normal = rh.longest((rh.series_window(rhythms.get(k), th, what) for k, what in keyed), th)
    if not th.learned_windows:
        return normal
    normal = _fed_by_pipeline(normal, view, case, th)
    onsets = [r.last_event_at for k, _ in keyed if (r := rhythms.get(k)) is not None
              and r.last_event_at is not None]
    inside: list[tuple[str, Any]] = [(f"learner '{p[-1].name}'", p[-1]) for p in case.probes
                                     if p[-1].section is not None]
    actors = [a.history[-1] for a in case.actors if a.history]
    if actors and all(a.section is not None for a in actors):
        inside += [(f"actor '{a.name}'", a) for a in actors]
    return _in_sections(normal, inside, onsets, th)


def rested_since(view: TargetView, table: str) -> float | None:
    """When the table's inserts and samples last moved, from their rhythms (None: either not
    known)."""
    rested = [r.last_event_at for side in ("samples", "inserts")
              if (r := view.rhythms.get(f"{side} {table}")) is not None]
    return None if not rested or None in rested else max(x for x in rested if x is not None)


def _fed_by_pipeline(normal: rh.Window, view: TargetView, case: TableCase, th: Thresholds
                     ) -> rh.Window:
    """Inserts wait at max_diff: the table moves when the learner's pipeline draws, which it
    does not while the learner lives on what it holds (rhythm.py). The longer of: each
    learner's own window from its last batch, where it took one since the table last moved;
    and, from Reverb alone, how long the pipeline's first fill lasts."""
    if lim.can_insert(case.latest, 1):
        return normal
    rhythms = view.rhythms
    onset = rested_since(view, case.name)
    if onset is None:
        return normal
    held: list[rh.Window] = []
    for p in case.probes:
        r = rhythms.get(f"probe {p[-1].probe}")
        # After the table last moved: the table was polled again, resting, before the batch
        # was seen (a probe is polled just after its table, in the same cycle).
        if r is None or r.last_event_at is None or not any(
                onset < s.observed_at <= r.last_event_at for s in case.history):
            continue
        own = probe_window(view, case, p, th)
        after = r.last_event_at - onset
        held.append(rh.Window(
            after + own.seconds, rh.Basis.LEARNER,
            f"learner '{p[-1].name}' took a batch {after:.0f} s after table '{case.name}' "
            f"last moved: its pipeline feeds it while inserts wait at max_diff; the table "
            f"is judged once the learner rests its own window ({own.seconds:.0f} s)",
            normal.seconds))
    if not case.probes:
        held += _drain(rhythms.get(f"samples {case.name}"), normal, case.name, th)
    best = max(held, key=lambda w: w.seconds, default=None)
    return best if best is not None and best.seconds > normal.seconds else normal


def _drain(r: rh.Rhythm | None, normal: rh.Window, table: str, th: Thresholds
           ) -> list[rh.Window]:
    """From Reverb alone: the most the learner's pipeline drew at once, and how long that
    lasts it at the rate it samples."""
    drained = rh.drain_s(r)
    if drained is None:
        return []
    burst, lasts = drained
    if lasts is None:
        return [rh.Window(th.startup_grace_s, rh.Basis.DRAIN,
                          f"the learner's pipeline drew {burst:.0f} samples of '{table}' at "
                          "once and has taken none since: how long they last it is not "
                          f"known yet; waits up to startup_grace_s {th.startup_grace_s:g} s",
                          normal.seconds)]
    seconds = min(th.pause_slack * lasts, th.startup_grace_s)
    return [rh.Window(seconds, rh.Basis.DRAIN,
                      f"the learner's pipeline drew {burst:.0f} samples of '{table}' at once, "
                      f"{lasts:.0f} s of its sampling: it may live on them that long "
                      f"with nothing drawn; window {seconds:.0f} s ({th.pause_slack:g} x, at "
                      f"most startup_grace_s); a trainer probe would judge by its batches",
                      normal.seconds)]


def probe_window(view: TargetView, case: TableCase, probe: Any, th: Thresholds) -> rh.Window:
    """A learner's own window: its batches and steps, stretched by its own section."""
    p = probe[-1]
    r = view.rhythms.get(f"probe {p.probe}")
    w = rh.series_window(r, th, f"learner '{p.name}' progress")
    if th.learned_windows and p.section is not None:
        onsets = [r.last_event_at] if r is not None and r.last_event_at is not None else []
        w = _in_sections(w, [(f"learner '{p.name}'", p)], onsets, th)
    return w


def actors_window(view: TargetView, th: Thresholds) -> rh.Window:
    """The window of the actor rules: the longest of the actors' own, each stretched by its
    own section."""
    windows = []
    for url, history in sorted(view.actors.items()):
        if not history:
            continue
        r = view.rhythms.get(f"actor {url}")
        a = history[-1]
        w = rh.series_window(r, th, f"actor '{a.name}' steps")
        if th.learned_windows and a.section is not None:
            onsets = [r.last_event_at] if r is not None and r.last_event_at is not None else []
            w = _in_sections(w, [(f"actor '{a.name}'", a)], onsets, th)
        windows.append(w)
    return rh.longest(windows, th)


def _in_sections(normal: rh.Window, inside: Iterable[tuple[str, Any]], onsets: list[float],
                 th: Thresholds) -> rh.Window:
    """`normal`, or the longest section window of those inside one. The rest is timed from
    the earliest last progress, so no series' stall is named while a section runs."""
    best = normal
    onset = min(onsets, default=None)
    for who, snap in inside:
        began = snap.observed_at - snap.section.for_s
        rested = 0.0 if onset is None else max(0.0, began - onset)
        w = rh.section_window(normal, snap.section, snap.sections, rested, th, who)
        if w.seconds > best.seconds or best is normal:
            best = w
    return best


def longest_learned_s(rhythms: Mapping[str, rh.Rhythm], th: Thresholds) -> float:
    """The longest window any series would get now, a pause due included and, for a table's
    samples, what its pipeline's first fill lasts (the keeper's view must reach back that far
    for a rule to prove a stall that long)."""
    most = th.stall_window_s
    if not th.learned_windows:
        return most
    for key, r in rhythms.items():
        if key.startswith("samples ") and (drained := rh.drain_s(r)) is not None:
            lasts = drained[1]
            most = max(most, th.startup_grace_s if lasts is None
                       else min(th.pause_slack * lasts, th.startup_grace_s))
        normal = rh.longest_normal(r.gaps)
        if normal is not None:
            most = max(most, th.window_factor * normal)
        if r.pauses:
            most = max(most, th.pause_slack * max(s for _, s in r.pauses))
    return most
