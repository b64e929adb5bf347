"""diagnose(view, thresholds, now): the ordered rules applied to one target's history.

    diagnosis = diagnose(history.view(target, probes, start), thresholds, now)
    for finding in diagnosis.findings: ...        # worst first
    diagnosis.insufficient                         # ("table:replay", ...) too young to judge
    diagnosis.rule_errors                          # rules that raised: bugs, for the edge to log
    diagnose(view, thresholds, now, stacks={"replay": verdict})  # the keeper's stack dumps
    diagnosis.figures["replay"]                    # the table's TableFigures (figures.py)

Pure: the time is an argument and every number comes from the view. Each shape's rules are
read from their registrations (`rules.of_shape`); the order they run in decides nothing, as
precedence is the kinds' declaration order (`kinds.ALL`). A rule that raises costs its own
finding only: the others still judge, and the error is handed back (a sidecar watching a
week-long job must not go blind on one rule's bug).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from replaywatch.diagnosis import figures as fig
from replaywatch.diagnosis import rules, rules_startup
from replaywatch.diagnosis import stall_window as sw
from replaywatch.diagnosis import window as win
from replaywatch.diagnosis.actors import Actor
from replaywatch.diagnosis.case import Probe, TableCase
from replaywatch.diagnosis.kinds import superseded_by, worst_first
from replaywatch.diagnosis.registry import Shape
from replaywatch.diagnosis.rhythm import Window
from replaywatch.diagnosis.stacks import StackVerdict
from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.diagnosis.window import TargetView
from replaywatch.model import Finding, Name, TableSnapshot


@dataclasses.dataclass(frozen=True)
class Diagnosis:
    """Findings worst first, the tables/probes too young to judge ("table:NAME") and each
    table's figures (figures.py: its limiter, throughput baselines, memory, consumption)."""

    findings: tuple[Finding, ...]
    insufficient: tuple[str, ...]
    rule_errors: tuple[str, ...] = ()
    figures: dict[str, fig.TableFigures] = dataclasses.field(default_factory=dict)


def _judged(rule: Callable[..., Any], errors: list[str], *args: Any) -> Finding | None:
    """One rule's answer; a rule that raises answers None and its error is kept."""
    try:
        result: Finding | None = rule(*args)
    except Exception as e:  # a bug in one rule: the others must still judge
        errors.append(f"{getattr(rule, '__qualname__', rule)}: {type(e).__name__}: {e}")
        return None
    return result


def is_fresh(observed_at: float, th: Thresholds, now: float) -> bool:
    """Seen within the stall window; older data is the down rules' business."""
    return now - observed_at <= th.stall_window_s


def has_enough_history(points: tuple, th: Thresholds) -> bool:
    """Two snapshots at least `min_history_s` apart; less is insufficient data."""
    return len(points) >= 2 and win.span(points) >= th.min_history_s


def probes_by_table(view: TargetView, th: Thresholds, now: float) -> dict[str, list[Probe]]:
    """Fresh probe histories by the table their iterator reads.

    A probe naming no table reads the target's only table, if it has one.
    """
    out: dict[str, list[Probe]] = {}
    for url in sorted(view.probes):
        history = win.since_last_restart(view.probes[url])
        if not history or not is_fresh(history[-1].observed_at, th, now):
            continue
        table = view.table_named(history[-1].table)
        if table in view.tables:
            out.setdefault(table, []).append(history)
    return out


def actors_by_table(view: TargetView) -> dict[str, list[Actor]]:
    """Actor probes by the table they write to, down ones included (a dead actor is news).

    An actor naming no table, or whose snapshots all left the window, writes to the
    target's only table, if it has one.
    """
    out: dict[str, list[Actor]] = {}
    for url in sorted(view.actors):
        history = win.actor_since_last_restart(view.actors[url])
        table = view.table_named(history[-1].table if history else None)
        if table in view.tables:
            out.setdefault(table, []).append(
                Actor(url, history, view.probe_polls.get(url, ())))
    return out


def diagnose(view: TargetView, thresholds: Thresholds, now: float,
             stacks: Mapping[str, StackVerdict] | None = None,
             layout: str | None = None,
             rates: Mapping[str, Sequence[TableSnapshot]] | None = None) -> Diagnosis:
    """Every rule on every table and probe of one target; worst first.

    `stacks`: by table, the verdict of two stack dumps of the trainer's loop that the
    findings keeper took when a sample_blocked opened (data with its time, like the view).
    `layout`: the job's layout as its configuration declares it (`--layout`), if it does.
    `rates`: by table, its snapshots over the rate window, for its limiter's figures.
    """
    th = thresholds
    errors: list[str] = []
    actors = actors_by_table(view)
    # The actor rules judge by the actors' learned window; the table rules by their table's.
    actor_window = sw.actors_window(view, th)
    found = [_windowed(f, actor_window) if f.kind == Name.WRITER_STALLED else f
             for rule in rules.of_shape(Shape.VIEW)
             if (f := _judged(rule, errors, view, _judging(th, actor_window), now))
             is not None]
    insufficient = [] if view.polls or view.tables else [f"target:{view.target}"]
    by_table = probes_by_table(view, th, now)
    answered_again = win.answered_again_at(view.polls, th.down_polls)
    for name in sorted(view.tables):
        history = win.since_last_reset(view.tables[name])
        if not history or not is_fresh(history[-1].observed_at, th, now):
            continue
        probes = by_table.get(name, [])
        came_back = came_back_at(view.tables[name], answered_again)
        case = TableCase(view.target, history, tuple(probes), now,
                         actors=tuple(actors.get(name, ())), stacks=(stacks or {}).get(name),
                         declared_layout=layout, came_back_at=came_back and came_back[0],
                         came_back_how=came_back and came_back[1], job=view.job,
                         peers=tuple(p for p in view.peers if p.name == name))
        window = sw.table_window(view, case, th)
        case = dataclasses.replace(case, window=window,
                                   rested_since=sw.rested_since(view, name))
        judging = _judging(th, window)
        stalls = []
        if has_enough_history(history, th):
            stalls = stall_findings(case, judging, errors,
                                    {p[-1].probe: sw.probe_window(view, case, p, th)
                                     for p in probes})
        else:
            insufficient.append(f"table:{name}")
        # After-stalls rules also see the target-wide findings placed on this table (an
        # actor's writer_stalled), even in a history too young for the stall rules: a
        # writer stuck in its call to the server before a restart is seen at once.
        on_table = tuple(stalls) + tuple(f for f in found if f.table == name)
        stalls += [f for rule in rules.of_shape(Shape.AFTER_STALLS)
                   if (f := _judged(rule, errors, case, judging, on_table)) is not None]
        # A learner's own stall keeps the window it was judged by (its own, not the table's).
        stalls = [f if "window_s" in f.evidence else _windowed(f, window) for f in stalls]
        stalls = rules_startup.as_first_step(stalls, case, th)
        found += rules_startup.with_restore_evidence(stalls, view.tables[name])
        found += [f for rule in rules.of_shape(Shape.TABLE_SETTINGS)
                  if (f := _judged(rule, errors, case, th)) is not None]
        found += [f for probe in probes for rule in rules.of_shape(Shape.PROBE_SETTINGS)
                  if (f := _judged(rule, errors, case, probe, th)) is not None]
    insufficient += [f"probe:{url}" for url, h in sorted(view.probes.items())
                     if h and not has_enough_history(win.since_last_restart(h), th)]
    return Diagnosis(worst_first(_supersede(_first_per_key(found))), tuple(insufficient),
                     tuple(errors), fig.table_figures(view, th, now, by_table, rates or {}))


def _judging(th: Thresholds, window: Window) -> Thresholds:
    """The thresholds a rule judges by: the stall window the rhythm sets in place of the
    configured one (never shorter: rhythm.py)."""
    if window.seconds == th.stall_window_s:
        return th
    return dataclasses.replace(th, stall_window_s=window.seconds)


def _windowed(f: Finding, window: Window) -> Finding:
    """A stall finding says which window it was judged over, and why that long."""
    return dataclasses.replace(f, evidence={**f.evidence, **window.evidence()})


def came_back_at(table: tuple[TableSnapshot, ...], answered_again: float | None
                 ) -> tuple[float, str] | None:
    """When the server behind a table last came back, and how: a new server in the table's
    history ("restart"), or its first answer after an outage target_down named ("outage")."""
    seen = [(at, how) for at, how in ((win.restarted_at(table), "restart"),
                                      (answered_again, "outage")) if at is not None]
    return max(seen, default=None)


def stall_findings(case: TableCase, th: Thresholds, errors: list[str],
                   probe_windows: Mapping[str, Window] | None = None) -> list[Finding]:
    """The stall rules on one table whose history covers the window: each trainer probe's
    with enough history of its own (judged by its own learned window: the learner's steps,
    not the table's sampling, which a prefetching pipeline makes burstier), then the
    table's."""
    windows = probe_windows or {}
    found = [_windowed(f, windows[probe[-1].probe]) if probe[-1].probe in windows else f
             for probe in case.probes if has_enough_history(probe, th)
             for rule in rules.of_shape(Shape.PROBE_STALL)
             if (f := _judged(rule, errors, case, probe,
                              _judging(th, windows[probe[-1].probe])
                              if probe[-1].probe in windows else th)) is not None]
    return found + [f for rule in rules.of_shape(Shape.TABLE_STALL)
                    if (f := _judged(rule, errors, case, th)) is not None]


def _first_per_key(found: list[Finding]) -> list[Finding]:
    """Two learners on one table may both trip a rule; one finding per key (kind, place)."""
    seen: dict[tuple[str, str, str], Finding] = {}
    for f in found:
        seen.setdefault(f.key, f)
    return list(seen.values())


def _supersede(found: list[Finding]) -> list[Finding]:
    """The more specific cause wins on the same table (see `Kind.supersedes`)."""
    present = {f.key for f in found}
    return [f for f in found
            if not any((winner, f.target, f.table) in present for winner in superseded_by(f.kind))]
