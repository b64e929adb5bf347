"""The findings keeper: runs the pure diagnosis on each target's recent history,
keeps findings' lifecycle (reconcile, and holding resumed incidents open after a
restart), writes every transition to the incident log and, when a critical finding
opens, has the trainer's thread stacks taken as evidence.

It runs on the poller's thread (the one writer). The stacks are the `StackTaker`'s
business (replaywatch/stack_taker.py: the I/O, off this thread): this module decides
when to ask, and hands the taker's loop-dump verdicts to the diagnosis. Nothing is
dumped while the job is healthy.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable
from typing import Any

from replaywatch.bundle import Inputs
from replaywatch.bundle_store import BundleStore
from replaywatch.diagnosis import kinds
from replaywatch.diagnosis.baseline import Baseline
from replaywatch.diagnosis.engine import diagnose
from replaywatch.diagnosis.kinds import worst_first
from replaywatch.diagnosis.lifecycle import Reconciled, Transition, reconcile
from replaywatch.diagnosis.rules_throughput import held_baselines, table_baselines
from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.history import History
from replaywatch.incidents import IncidentLog
from replaywatch.model import Finding, Severity
from replaywatch.poller import CycleFindings
from replaywatch.rhythm_book import RhythmBook
from replaywatch.stack_taker import StackTaker
from replaywatch.state import SourceStatus

log = logging.getLogger("replaywatch.findings")

# Snapshots around a transition stored with it as context.
CONTEXT_POINTS = 5


def view_window_s(th: Thresholds, interval_s: float) -> float:
    """History the rules look at: enough for the SPI window and three stall windows."""
    return max(th.spi_window_s, 3 * th.stall_window_s) + 3 * interval_s


class FindingsKeeper:
    """Diagnoses every target each cycle; the only caller of reconcile().

    The poller's `Diagnoser`: it keeps the active findings between cycles,
    resumes open incidents after a restart and holds them open for a while.
    """

    def __init__(
        self,
        targets: Callable[[], dict[str, list[str]]],  # target -> its probe URLs
        thresholds: Thresholds,
        interval_s: float,
        incidents: IncidentLog | None,
        stacks: StackTaker | None = None,
        layout: str | None = None,
        bundles: BundleStore | None = None,
    ):
        """`stacks`: who takes the trainer's stacks (None: a taker with probes' /stacks only)."""
        self._targets = targets
        self._th = thresholds
        self._layout = layout  # the job's declared layout (--layout), for the budget model
        self._window_s = view_window_s(thresholds, interval_s)
        self._incidents = incidents
        self._stacks = stacks or StackTaker()
        self._active: dict[tuple[str, str, str], Finding] = {}
        self._resumed = False
        # Rules that raised, each logged once: a bug in one rule costs its finding, not the
        # cycle, and must not fill the log at every poll.
        self._rule_errors_logged: set[str] = set()
        self._held: set[tuple[str, str, str]] = set()
        self._hold_until = 0.0
        # A restarted sidecar knows nothing for a while: a target_down needs
        # several failed polls, a stall a whole window. Until then an incident
        # resumed from the log is held open, not resolved and then re-opened.
        self._hold_s = thresholds.stall_window_s + (thresholds.down_polls + 2) * interval_s
        self._bundles = bundles
        # target -> the last cycle's inputs and the findings they gave (a bundle's content)
        self._last: dict[str, tuple[Inputs, tuple[Finding, ...]]] = {}
        self._interval_s = interval_s
        self._rhythms = RhythmBook(incidents)

    def _resume(self, now: float) -> None:
        """Open incidents from before a restart continue, not duplicated."""
        self._resumed = True
        self._hold_until = now + self._hold_s
        if self._incidents is None:
            return
        self._incidents.connect()
        self._rhythms.resume()
        for f in self._incidents.open_findings():
            self._active[f.key] = f
            self._held.add(f.key)
        if self._active:
            log.info("resumed %d open incident(s) from the log", len(self._active))

    def last_cycle(self, target: str) -> tuple[Inputs, tuple[Finding, ...]] | None:
        """The last cycle's diagnosis inputs for `target` and the findings it had after it."""
        return self._last.get(target)

    @staticmethod
    def _held_baselines(open_here: tuple[Finding, ...]) -> dict[str, dict[str, Baseline]]:
        """The baselines of a target's open throughput drops, by table."""
        return {f.table: held_baselines(f.evidence) for f in open_here
                if f.kind == kinds.THROUGHPUT_DROP.name and f.table}

    def diagnose_cycle(self, history: History, sources: dict[str, SourceStatus], now: float
                       ) -> CycleFindings:
        if not self._resumed:
            self._resume(now)
        found: list[Finding] = []
        insufficient: list[str] = []
        baselines: dict[tuple[str, str], dict[str, Baseline]] = {}
        targets = self._targets()
        open_by_target = _by_target(self._active.values())
        inputs: dict[str, Inputs] = {}
        rule_errors: list[str] = []
        for target, probes in targets.items():
            open_here = open_by_target.get(target, ())
            # Back far enough for the longest window the job's rhythm sets to be proven.
            reach = max(self._window_s,
                        self._rhythms.reach_s(target, self._th) + 3 * self._interval_s)
            view = history.view(target, probes, start=now - reach,
                                coarse_start=now - self._th.throughput_lookback_s)
            view = dataclasses.replace(view, held_baselines=self._held_baselines(open_here),
                                       rhythms=self._rhythms.learn(target, view))
            verdicts = self._stacks.verdicts(target)
            diagnosis = diagnose(view, self._th, now, stacks=verdicts, layout=self._layout)
            # One line per rule and error, not per table it raised on.
            for error in dict.fromkeys(diagnosis.rule_errors):
                rule_errors.append(f"{target}: {error}")
                if error not in self._rule_errors_logged:
                    self._rule_errors_logged.add(error)
                    log.error("a rule raised on %s and was skipped (the others judged): %s",
                              target, error)
            inputs[target] = Inputs(view, now, self._th, self._layout, verdicts, open_here)
            found.extend(diagnosis.findings)
            insufficient.extend(f"{target} {name}" for name in diagnosis.insufficient)
            for name, series in table_baselines(view, self._th, now).items():
                baselines[(target, name)] = series
        self._rhythms.save(now)
        found_keys = {f.key for f in found}
        self._held -= found_keys  # seen again: an ordinary finding from now on
        if now < self._hold_until:
            held = [self._active[k] for k in self._held if k in self._active]
            found += held
            for f in held:
                if f.target in inputs:
                    inputs[f.target] = dataclasses.replace(
                        inputs[f.target], held=(*inputs[f.target].held, f))
        else:
            self._held.clear()
        result: Reconciled = reconcile(self._active, found, set(targets), now)
        # Findings of targets no longer watched (a reloaded targets file) resolve too.
        gone = [f for f in result.active.values() if f.target not in targets]
        transitions = list(result.transitions) + [
            Transition("resolved", dataclasses.replace(f, resolved_at=now)) for f in gone]
        self._active = {k: f for k, f in result.active.items() if f.target in targets}
        ordered = worst_first(self._active.values())
        after = _by_target(ordered)
        # Replaced whole, never changed in place: an API thread reads it for a bundle.
        self._last = {t: (i, after.get(t, ())) for t, i in inputs.items()}
        self._forget_verdicts()
        self._dump_loop_stacks(transitions)
        self._record(transitions, history, targets, now)
        ids: dict[str, int] = {}
        log_error, dropped = None, 0
        if self._incidents is not None:
            ids = self._incidents.open_incident_ids()
            log_error = self._incidents.last_error
            dropped = self._incidents.dropped
        return CycleFindings(
            findings=ordered,
            insufficient=tuple(insufficient),
            incident_ids=ids,
            incident_log_error=log_error,
            incident_log_dropped=dropped,
            bundles_written=self._bundles.written if self._bundles else 0,
            bundle_failures=self._bundles.failed if self._bundles else 0,
            rule_errors=tuple(rule_errors),
            baselines=baselines,
        )

    def _record(self, transitions: list[Transition], history: History,
                targets: dict[str, list[str]], now: float) -> None:
        for t in transitions:
            f = t.finding
            level = logging.WARNING if f.severity >= Severity.WARNING else logging.INFO
            log.log(level, "%s %s %s %s: %s", t.kind, f.kind, f.target, f.table, f.summary)
        if self._incidents is None:
            for t in self._critical_openings(transitions):
                self._bundle(t.finding, expect_stacks=False)
            return
        if not transitions and self._incidents.last_error is None:
            return
        # With no new transitions this retries what a failed write left queued.
        self._incidents.apply(transitions, self._context(transitions, history, targets))
        for t in self._critical_openings(transitions):
            if self._wants_loop_dumps(t.finding):
                # its two dumps are attached when taken
                self._bundle(t.finding, expect_stacks=True)
            elif t.finding.evidence.get("from_stacks"):
                self._bundle(t.finding, expect_stacks=True)
                self._attach_loop_dumps(t.finding)
            else:
                urls = targets.get(t.finding.target, [])
                self._bundle(t.finding, expect_stacks=self._stacks.will_capture(urls))
                self._capture_stacks(t.finding, urls)

    @staticmethod
    def _critical_openings(transitions: list[Transition]) -> list[Transition]:
        return [t for t in transitions
                if t.kind == "opened" and t.finding.severity == Severity.CRITICAL]

    def _bundle(self, finding: Finding, expect_stacks: bool) -> None:
        """This cycle's bundle for a critical that opened, written once its stacks are in."""
        last = self._last.get(finding.target)
        if self._bundles is not None and last is not None:
            self._bundles.on_critical(finding, last[0], last[1], expect_stacks)

    def _attach(self, finding_id: str, stacks: dict[str, Any]) -> bool:
        """Stacks to the incident log, and to the bundle waiting for them."""
        if self._bundles is not None:
            self._bundles.stacks_taken(finding_id, stacks)
        return self._incidents is not None and self._incidents.attach_stacks(finding_id, stacks)

    def _context(self, transitions: list[Transition], history: History,
                 targets: dict[str, list[str]]) -> dict[str, Any]:
        """The snapshots surrounding the transitions, stored with them."""
        tables: dict[str, Any] = {}
        probes: dict[str, Any] = {}
        for t in transitions:
            f = t.finding
            if f.table:
                points = history.table(f.target, f.table)[-CONTEXT_POINTS:]
                tables[f"{f.target}/{f.table}"] = [dataclasses.asdict(p) for p in points]
            for url in targets.get(f.target, []):
                # A URL is a trainer's or an actor's: only one of the two holds snapshots.
                seen: list[Any] = (history.probe(url)[-CONTEXT_POINTS:]
                                   or history.actor(url)[-CONTEXT_POINTS:])
                probes[url] = [dataclasses.asdict(p) for p in seen]
        return {"tables": tables, "probes": probes}

    def _capture_stacks(self, finding: Finding, probe_urls: list[str]) -> None:
        if self._incidents is not None:
            self._stacks.capture(finding.finding_id, probe_urls, self._attach)

    # -- two dumps of a synchronous loop, without any probe ----------------------------------

    def _forget_verdicts(self) -> None:
        """A verdict lasts while its stall does: a sample_blocked or the starvation it became."""
        self._stacks.keep_only({(f.target, f.table) for f in self._active.values()
                                if f.kind in (kinds.Name.SAMPLE_BLOCKED,
                                              kinds.Name.WORKER_STARVATION)})

    def _wants_loop_dumps(self, finding: Finding) -> bool:
        """A sample_blocked on a synchronous layout that no trainer probe reads, and a pid."""
        return (self._stacks.can_dump_loop() and finding.kind == kinds.Name.SAMPLE_BLOCKED
                and str(finding.evidence.get("layout", "")).startswith("sync")
                and not finding.evidence.get("trainer_probes"))

    def _dump_loop_stacks(self, transitions: list[Transition]) -> None:
        attach = self._attach if self._incidents is not None else None
        for t in transitions:
            if t.kind == "opened" and self._wants_loop_dumps(t.finding):
                f = t.finding
                # requested at the diagnosis time that asked, on the view's clock
                self._stacks.dump_loop(f.target, f.table, f.finding_id, f.last_seen, attach)

    def _attach_loop_dumps(self, finding: Finding) -> None:
        """A starvation named from stacks keeps the dumps that named it; no third dump."""
        kept = self._stacks.dumps(finding.target, finding.table)
        if kept is not None and self._incidents is not None:
            self._attach(finding.finding_id, kept)


def _by_target(findings: Iterable[Finding]) -> dict[str, tuple[Finding, ...]]:
    """Findings grouped by target, each group in the order given."""
    out: dict[str, list[Finding]] = {}
    for f in findings:
        out.setdefault(f.target, []).append(f)
    return {t: tuple(fs) for t, fs in out.items()}
