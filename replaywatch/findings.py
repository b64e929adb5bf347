"""The findings keeper: runs the pure diagnosis on each target's recent history,
keeps findings' lifecycle, writes every transition to the incident log and, when
a critical finding opens, captures the trainer's thread stacks as evidence.

It runs on the poller's thread (the one writer). Capturing stacks is I/O that
can take seconds (py-spy), so it runs on a short-lived worker thread and
never delays the poll cadence.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

from replaywatch.diagnosis.engine import diagnose
from replaywatch.diagnosis.kinds import worst_first
from replaywatch.diagnosis.lifecycle import Reconciled, Transition, reconcile
from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.errors import SourceError
from replaywatch.history import History
from replaywatch.incidents import IncidentLog
from replaywatch.model import Finding, Severity
from replaywatch.poller import CycleFindings
from replaywatch.sources.probe_http import get_json
from replaywatch.state import SourceStatus

log = logging.getLogger("replaywatch.findings")

# Snapshots around a transition stored with it as context.
CONTEXT_POINTS = 5


def view_window_s(th: Thresholds, interval_s: float) -> float:
    """History the rules look at: enough for the SPI window and three stall windows."""
    return max(th.spi_window_s, 3 * th.stall_window_s) + 3 * interval_s


def fetch_stacks(probe_urls: Sequence[str], trainer_pid: int | None,
                 timeout_s: float = 5.0) -> dict[str, Any] | None:
    """The trainer's stacks: from each probe's /stacks, else `py-spy dump`."""
    taken: dict[str, Any] = {}
    for url in probe_urls:
        try:
            taken[url] = get_json(f"{url}/stacks", timeout_s)
        except SourceError as e:
            taken[url] = {"error": str(e)}
    if trainer_pid is not None:
        taken[f"py-spy:{trainer_pid}"] = py_spy_dump(trainer_pid, timeout_s)
    return taken or None


def py_spy_dump(pid: int, timeout_s: float) -> dict[str, Any]:
    """`py-spy dump --json` of a trainer without the probe (needs ptrace rights)."""
    exe = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    try:
        done = subprocess.run([exe, "dump", "--pid", str(pid), "--json"], capture_output=True,
                              text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"error": f"py-spy dump failed: {e}"}
    if done.returncode != 0:
        return {"error": f"py-spy dump exited {done.returncode}: {done.stderr.strip()[:300]}"}
    try:
        return {"threads": json.loads(done.stdout)}
    except ValueError:
        return {"text": done.stdout[:200_000]}


StackFetcher = Callable[[Sequence[str], int | None], dict[str, Any] | None]


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
        trainer_pid: int | None = None,
        stack_fetcher: StackFetcher = fetch_stacks,
    ):
        self._targets = targets
        self._th = thresholds
        self._window_s = view_window_s(thresholds, interval_s)
        self._incidents = incidents
        self._trainer_pid = trainer_pid
        self._fetch_stacks = stack_fetcher
        self._active: dict[tuple[str, str, str], Finding] = {}
        self._resumed = False
        self._held: set[tuple[str, str, str]] = set()
        self._hold_until = 0.0
        # A restarted sidecar knows nothing for a while: a target_down needs
        # several failed polls, a stall a whole window. Until then an incident
        # resumed from the log is held open, not resolved and then re-opened.
        self._hold_s = thresholds.stall_window_s + (thresholds.down_polls + 2) * interval_s

    def _resume(self, now: float) -> None:
        """Open incidents from before a restart continue, not duplicated."""
        self._resumed = True
        self._hold_until = now + self._hold_s
        if self._incidents is None:
            return
        self._incidents.open()
        for f in self._incidents.open_findings():
            self._active[f.key] = f
            self._held.add(f.key)
        if self._active:
            log.info("resumed %d open incident(s) from the log", len(self._active))

    def diagnose_cycle(self, history: History, sources: dict[str, SourceStatus], now: float
                       ) -> CycleFindings:
        if not self._resumed:
            self._resume(now)
        found: list[Finding] = []
        insufficient: list[str] = []
        targets = self._targets()
        for target, probes in targets.items():
            view = history.view(target, probes, start=now - self._window_s)
            diagnosis = diagnose(view, self._th, now)
            found.extend(diagnosis.findings)
            insufficient.extend(f"{target} {name}" for name in diagnosis.insufficient)
        found_keys = {f.key for f in found}
        self._held -= found_keys  # seen again: an ordinary finding from now on
        if now < self._hold_until:
            found += [self._active[k] for k in self._held if k in self._active]
        else:
            self._held.clear()
        result: Reconciled = reconcile(self._active, found, set(targets), now)
        # Findings of targets no longer watched (a reloaded targets file) resolve too.
        gone = [f for f in result.active.values() if f.target not in targets]
        transitions = list(result.transitions) + [
            Transition("resolved", dataclasses.replace(f, resolved_at=now)) for f in gone]
        self._active = {k: f for k, f in result.active.items() if f.target in targets}
        self._record(transitions, history, targets, now)
        ids: dict[str, int] = {}
        log_error, dropped = None, 0
        if self._incidents is not None:
            ids = self._incidents.open_incident_ids()
            log_error = self._incidents.last_error
            dropped = self._incidents.dropped
        return CycleFindings(
            findings=worst_first(self._active.values()),
            insufficient=tuple(insufficient),
            incident_ids=ids,
            incident_log_error=log_error,
            incident_log_dropped=dropped,
        )

    def _record(self, transitions: list[Transition], history: History,
                targets: dict[str, list[str]], now: float) -> None:
        for t in transitions:
            f = t.finding
            level = logging.WARNING if f.severity >= Severity.WARNING else logging.INFO
            log.log(level, "%s %s %s %s: %s", t.kind, f.kind, f.target, f.table, f.summary)
        if self._incidents is None:
            return
        if not transitions and self._incidents.last_error is None:
            return
        # With no new transitions this retries what a failed write left queued.
        self._incidents.apply(transitions, self._context(transitions, history, targets))
        for t in transitions:
            if t.kind == "opened" and t.finding.severity == Severity.CRITICAL:
                self._capture_stacks(t.finding, targets.get(t.finding.target, []))

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
                probes[url] = [dataclasses.asdict(p) for p in history.probe(url)[-CONTEXT_POINTS:]]
        return {"tables": tables, "probes": probes}

    def _capture_stacks(self, finding: Finding, probe_urls: list[str]) -> None:
        if not probe_urls and self._trainer_pid is None:
            return
        incidents = self._incidents
        assert incidents is not None

        def capture() -> None:
            stacks = self._fetch_stacks(probe_urls, self._trainer_pid)
            if stacks is not None and not incidents.attach_stacks(finding.finding_id, stacks):
                log.warning("could not store stacks for %s", finding.finding_id)

        # Nobody joins it: it ends when the fetch does (every fetch has a timeout),
        # and a daemon thread never holds up the sidecar's exit.
        threading.Thread(target=capture, name="replaywatch-stacks", daemon=True).start()

