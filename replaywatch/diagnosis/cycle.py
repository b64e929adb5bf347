"""judge_cycle: one poll cycle's verdict from its inputs, the one function the live sidecar
and `replaywatch analyze` both call, so a bundle's replay is the live verdict by
construction.

    inputs = {target: Inputs(view, now, thresholds, layout, stacks, active_before, held)}
    verdict = judge_cycle(inputs, active, now)
    verdict.active, verdict.transitions       # the keeper's memory and its incident log
    verdict.findings                          # worst first
    verdict.rule_errors, verdict.figures      # for the page, /readyz and /metrics

Diagnose each target (its open throughput drops' baselines handed back to the rule), add the
incidents held open after a restart, reconcile against what was open, close as gone what
belongs to targets no longer watched or to an RLlib job that ended, worst first. Pure: time
is an argument.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from replaywatch.diagnosis.engine import diagnose
from replaywatch.diagnosis.figures import TableFigures
from replaywatch.diagnosis.kinds import worst_first
from replaywatch.diagnosis.lifecycle import Transition, reconcile
from replaywatch.diagnosis.peers import with_peers
from replaywatch.diagnosis.rllib_actors import job_ended
from replaywatch.diagnosis.rules_rllib import judge_rllib
from replaywatch.diagnosis.rules_throughput import held_baselines
from replaywatch.diagnosis.stacks import StackVerdict
from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.diagnosis.window import TargetView
from replaywatch.model import NO_ANSWER, Finding, Name, TableSnapshot
from replaywatch.ray_model import RaySnapshot

Key = tuple[str, str, str]


@dataclasses.dataclass(frozen=True)
class Inputs:
    """One target's diagnosis at one cycle: everything its verdict was made from."""

    view: TargetView
    now: float
    thresholds: Thresholds
    layout: str | None = None  # the job's declared layout (--layout)
    stacks: dict[str, StackVerdict] = dataclasses.field(default_factory=dict)  # by table
    active_before: tuple[Finding, ...] = ()  # this target's findings open before the cycle
    held: tuple[Finding, ...] = ()  # incidents resumed from the log and held open this cycle
    # By table: its snapshots over the rate window, for its limiter's figures (not in bundles:
    # no rule reads them)
    rates: dict[str, tuple[TableSnapshot, ...]] = dataclasses.field(default_factory=dict)
    # A Ray target's snapshots over the look-back, oldest first: judged by RLlib's rules,
    # and by the view's liveness (its polls) alone; None for a Reverb target
    ray: tuple[RaySnapshot, ...] | None = None


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What a cycle concluded, for every target judged."""

    active: dict[Key, Finding]  # open after the cycle
    transitions: tuple[Transition, ...]  # opened, updated, resolved
    findings: tuple[Finding, ...]  # the active ones, worst first
    rule_errors: tuple[str, ...] = ()  # "target: rule: error", once each
    insufficient: tuple[str, ...] = ()  # "target table:NAME": too young to judge
    diagnosed: frozenset[Key] = frozenset()  # what the diagnosis named (held ones aside)
    # (target, table) -> its figures (diagnosis/figures.py)
    figures: dict[tuple[str, str], TableFigures] = dataclasses.field(default_factory=dict)

    def of(self, target: str) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.target == target)


def unanswered_carry(inputs: Inputs, found: tuple[Finding, ...]) -> tuple[Finding, ...]:
    """A table's open findings, carried where the cycle cannot judge its tables.

    Over a poll that timed out on a server that refused nothing: an unanswered ServerInfo
    (a table lock held by a checkpoint, a host too loaded to answer in time) says nothing
    about the tables. And for the window after such an outage, while `reconnecting` holds
    back the stalls it would raise: a stall that was open before the outage and would be
    raised again is the same stall. What was open neither resolves nor changes until the
    tables can be judged again or target_down takes over."""
    if any(f.kind == Name.TARGET_DOWN for f in found):
        return ()
    polls = inputs.view.polls
    if polls and not polls[-1].ok and NO_ANSWER in (polls[-1].error or ""):
        return tuple(f for f in inputs.active_before if f.table)
    held_back = {(r.table, kind) for r in found if r.kind == Name.RECONNECTING
                 and r.evidence.get("came_back_how") == "outage"
                 for kind in r.evidence.get("would_be", ())}
    return tuple(f for f in inputs.active_before if (f.table, f.kind) in held_back)


def _without_explained(found: list[Finding], carried: tuple[Finding, ...]) -> list[Finding]:
    """`reconnecting` drops out where every stall it holds back is carried open."""
    open_kinds = {(f.table, f.kind) for f in carried}
    return [f for f in found if f.kind != Name.RECONNECTING or not all(
        (f.table, k) in open_kinds for k in f.evidence.get("would_be", ()))]


def with_held_baselines(inputs: Inputs) -> TargetView:
    """The view, with the baselines its open throughput drops were judged against: a drop
    that outlasts half the look-back would otherwise become its own baseline."""
    held = {f.table: held_baselines(f.evidence) for f in inputs.active_before
            if f.kind == Name.THROUGHPUT_DROP and f.table}
    return dataclasses.replace(inputs.view, held_baselines=held) if held else inputs.view


def with_job_peers(inputs: Mapping[str, Inputs], jobs: Mapping[str, str]) -> dict[str, Inputs]:
    """Each Reverb target of a job sharded over several servers, its view given the others'
    tables (peers.with_peers): before the cycle is judged, so that a bundle of one target
    carries what its verdict was made from."""
    views = with_peers({t: i.view for t, i in inputs.items() if i.ray is None}, jobs)
    return {t: i if i.ray is not None or views[t] is i.view
            else dataclasses.replace(i, view=views[t]) for t, i in inputs.items()}


def judge_cycle(inputs: Mapping[str, Inputs], active: Mapping[Key, Finding], now: float,
                thresholds: Thresholds | None = None) -> Verdict:
    """The cycle's verdict (module docstring); `thresholds` re-judges under others."""
    found: list[Finding] = []
    errors: list[str] = []
    insufficient: list[str] = []
    figures: dict[tuple[str, str], TableFigures] = {}
    diagnosed: set[Key] = set()
    for target, i in sorted(inputs.items()):
        th = thresholds or i.thresholds
        if i.ray is not None:
            d = diagnose(i.view, th, now)  # its polls' liveness: no table is in the view
            d = dataclasses.replace(d, findings=(*d.findings, *_rllib(target, i.ray, th, now,
                                                                       errors)))
        else:
            d = diagnose(with_held_baselines(i), th, now, stacks=i.stacks or None,
                         layout=i.layout, rates=i.rates)
        seen = {f.key for f in d.findings}
        diagnosed |= seen
        # A held incident the diagnosis names again is an ordinary finding from now on.
        carried = tuple(f for f in unanswered_carry(i, d.findings) if f.key not in seen)
        found += [*_without_explained(list(d.findings), carried), *carried,
                  *(f for f in i.held if f.key not in seen | {c.key for c in carried})]
        errors += [f"{target}: {e}" for e in dict.fromkeys(d.rule_errors)]
        insufficient += [f"{target} {name}" for name in d.insufficient]
        figures.update({f.key: f for f in d.figures.values()})
    result = reconcile(dict(active), found, set(inputs), now)
    # Findings of targets no longer watched (a reloaded targets file) close as gone: nothing
    # showed them fixed, and a user reading the log must not take them for resolved. So do
    # the findings an RLlib job stops raising once it has ended (its driver killed, or
    # algo.stop()): a runner that hung until its job was killed was never seen to recover.
    gone = [f for f in result.active.values() if f.target not in inputs]
    ended = {t for t, i in inputs.items() if i.ray and job_ended(i.ray[-1])}
    transitions = (*(Transition("gone", t.finding) if t.kind == "resolved"
                     and t.finding.target in ended else t for t in result.transitions),
                   *(Transition("gone", dataclasses.replace(f, resolved_at=now))
                     for f in gone))
    kept = {k: f for k, f in result.active.items() if f.target in inputs}
    return Verdict(kept, transitions, worst_first(kept.values()), tuple(errors),
                   tuple(insufficient), frozenset(diagnosed), figures)


def _rllib(target: str, history: tuple[RaySnapshot, ...], th: Thresholds, now: float,
           errors: list[str]) -> tuple[Finding, ...]:
    """RLlib's rules on a Ray target; raising costs their findings, not the cycle."""
    try:
        return judge_rllib(target, history, th, now)
    except Exception as e:  # a bug in a rule: the other targets must still be judged
        errors.append(f"{target}: judge_rllib: {type(e).__name__}: {e}")
        return ()
