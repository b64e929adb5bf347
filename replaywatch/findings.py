"""The findings keeper: the memory and the I/O around each cycle's pure verdict.

It gathers each target's inputs (its view, learned rhythms, stack verdicts, findings open
before), has `judge_cycle` (diagnosis/cycle.py) judge them, and keeps what outlives a cycle:
the open findings, incidents resumed after a restart (held open a while), the last cycle's
inputs for bundles. Transitions go to `Evidence` (evidence.py). On the poller's thread.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable

from replaywatch.bundle_store import BundleStore
from replaywatch.config import RATE_WINDOW_S
from replaywatch.diagnosis.cycle import Inputs, Key, judge_cycle, with_job_peers
from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.evidence import Evidence
from replaywatch.fleet import jobs_of
from replaywatch.history import History
from replaywatch.incidents import IncidentLog
from replaywatch.model import Finding
from replaywatch.poller import CycleFindings
from replaywatch.rhythm_book import RhythmBook
from replaywatch.stack_taker import StackTaker
from replaywatch.state import SourceStatus

log = logging.getLogger("replaywatch.findings")


def view_window_s(th: Thresholds, interval_s: float) -> float:
    """History the rules look at: enough for the SPI window and three stall windows."""
    return max(th.spi_window_s, 3 * th.stall_window_s) + 3 * interval_s


class FindingsKeeper:
    """The poller's `Diagnoser`: one verdict per cycle, and the memory between them."""

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
        self._interval_s = interval_s
        self._incidents = incidents
        self._evidence = Evidence(incidents, stacks or StackTaker(), bundles)
        self.rhythms = RhythmBook(incidents)
        self._bundles = bundles
        self._active: dict[Key, Finding] = {}
        self._resumed = False
        # Rules that raised, each logged once: a rule's bug must not fill the log each poll.
        self._rule_errors_logged: set[str] = set()
        # A restarted sidecar knows nothing for a while (a target_down needs several failed
        # polls, a stall a whole window): until then a resumed incident is held open.
        self._held: set[Key] = set()
        self._hold_until = 0.0
        self._hold_s = thresholds.stall_window_s + (thresholds.down_polls + 2) * interval_s
        # target -> the last cycle's inputs and the findings they gave (a bundle's content)
        self._last: dict[str, tuple[Inputs, tuple[Finding, ...]]] = {}

    def _resume(self, now: float) -> None:
        """Open incidents from before a restart continue, not duplicated; rhythms too."""
        self._resumed = True
        self._hold_until = now + self._hold_s
        if self._incidents is None:
            return
        self._incidents.connect()
        self.rhythms.resume()
        for f in self._incidents.open_findings():
            self._active[f.key] = f
            self._held.add(f.key)
        if self._active:
            log.info("resumed %d open incident(s) from the log", len(self._active))

    def last_cycle(self, target: str) -> tuple[Inputs, tuple[Finding, ...]] | None:
        """The last cycle's diagnosis inputs for `target` and the findings it had after it."""
        return self._last.get(target)

    def _inputs(self, history: History, target: str, probes: list[str], now: float,
                open_here: tuple[Finding, ...]) -> Inputs:
        # Back far enough for the longest window the job's rhythm sets to be proven.
        reach = max(self._window_s, self.rhythms.reach_s(target, self._th)
                    + 3 * self._interval_s)
        view = history.view(target, probes, start=now - reach,
                            coarse_start=now - self._th.throughput_lookback_s)
        held = tuple(f for f in open_here if f.key in self._held and now < self._hold_until)
        if ray := history.ray(target, now - reach):  # an RLlib job: its rules learn its rhythm
            return Inputs(view, now, self._th, active_before=open_here, held=held, ray=ray)
        view = dataclasses.replace(view, rhythms=self.rhythms.learn(target, view))
        return Inputs(view, now, self._th, self._layout, self._evidence.stacks.verdicts(target),
                      open_here, held, history.rate_windows(target, now - RATE_WINDOW_S))

    def diagnose_cycle(self, history: History, sources: dict[str, SourceStatus], now: float
                       ) -> CycleFindings:
        if not self._resumed:
            self._resume(now)
        targets = self._targets()
        open_by_target = _by_target(self._active.values())
        inputs = with_job_peers({t: self._inputs(history, t, probes, now, open_by_target.get(
            t, ())) for t, probes in targets.items()}, jobs_of(sources.values()))
        self.rhythms.save(now)
        verdict = judge_cycle(inputs, self._active, now)
        self._held = set() if now >= self._hold_until else self._held - verdict.diagnosed
        for error in verdict.rule_errors:
            if error not in self._rule_errors_logged:
                self._rule_errors_logged.add(error)
                log.error("a rule raised and was skipped (the others judged): %s", error)
        self._active = dict(verdict.active)
        # Replaced whole, never changed in place: an API thread reads it for a bundle.
        self._last = {t: (i, verdict.of(t)) for t, i in inputs.items()}
        self._evidence.after_cycle(verdict, history, targets, self._last)
        log_error, dropped, ids = None, 0, {}
        if (book := self._incidents) is not None:
            ids, log_error, dropped = book.open_incident_ids(), book.last_error, book.dropped
        return CycleFindings(
            findings=verdict.findings, insufficient=verdict.insufficient, incident_ids=ids,
            incident_log_error=log_error, incident_log_dropped=dropped,
            bundles_written=self._bundles.written if self._bundles else 0,
            bundle_failures=self._bundles.failed if self._bundles else 0,
            rule_errors=verdict.rule_errors, figures=verdict.figures)


def _by_target(findings: Iterable[Finding]) -> dict[str, tuple[Finding, ...]]:
    """Findings grouped by target, each group in the order given."""
    out: dict[str, list[Finding]] = {}
    for f in findings:
        out.setdefault(f.target, []).append(f)
    return {t: tuple(fs) for t, fs in out.items()}
