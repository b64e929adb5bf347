"""The findings keeper: runs the pure diagnosis on each target's recent history,
keeps findings' lifecycle, writes every transition to the incident log and, when
a critical finding opens, captures the trainer's thread stacks as evidence.

It runs on the poller's thread (the one writer). Capturing stacks is I/O that
can take seconds (py-spy), so it runs on a short-lived worker thread and
never delays the poll cadence.

Without any probe, a `sample_blocked` opening on a synchronous layout with
`--trainer-pid` given makes it take two py-spy dumps a second apart (one dump can
catch a healthy loop inside next() for a moment). Their verdict (is the loop thread
inside an iterator's next() in both?)
is kept per table and handed to the pure diagnosis as data with its time, so
the next cycle can name `worker_starvation` "from stacks", and keeps doing so
while the stall lasts. Nothing is dumped while the job is healthy.
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
import time
from collections.abc import Callable, Sequence
from typing import Any

from replaywatch.diagnosis import kinds
from replaywatch.diagnosis.engine import diagnose
from replaywatch.diagnosis.kinds import worst_first
from replaywatch.diagnosis.lifecycle import Reconciled, Transition, reconcile
from replaywatch.diagnosis.stacks import StackVerdict, stack_verdict
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
# pid -> one `py-spy dump --json` document ({"threads": [...]} or {"error": ...}).
StackDumper = Callable[[int], dict[str, Any]]
# Two dumps this far apart both inside next() are a loop that stays there, not a passing call.
DUMP_GAP_S = 1.0


def dump_trainer(pid: int) -> dict[str, Any]:
    """One py-spy dump of the trainer, with the usual timeout."""
    return py_spy_dump(pid, 5.0)


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
        stack_dumper: StackDumper = dump_trainer,
        dump_gap_s: float = DUMP_GAP_S,
        layout: str | None = None,
    ):
        self._targets = targets
        self._th = thresholds
        self._layout = layout  # the job's declared layout (--layout), for the budget model
        self._window_s = view_window_s(thresholds, interval_s)
        self._incidents = incidents
        self._trainer_pid = trainer_pid
        self._fetch_stacks = stack_fetcher
        self._dump = stack_dumper
        self._dump_gap_s = dump_gap_s
        # (target, table) -> the two-dump verdict and its dumps; written by the dump thread.
        self._verdicts: dict[tuple[str, str], tuple[StackVerdict, dict[str, Any]]] = {}
        self._verdicts_lock = threading.Lock()
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
            diagnosis = diagnose(view, self._th, now, stacks=self._stack_verdicts(target),
                                 layout=self._layout)
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
            if t.kind != "opened" or t.finding.severity != Severity.CRITICAL:
                continue
            if self._wants_loop_dumps(t.finding):
                continue  # its two dumps are attached when taken
            if t.finding.evidence.get("from_stacks"):
                self._attach_loop_dumps(t.finding)
            else:
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
                # A URL is a trainer's or an actor's: only one of the two holds snapshots.
                seen: list[Any] = (history.probe(url)[-CONTEXT_POINTS:]
                                   or history.actor(url)[-CONTEXT_POINTS:])
                probes[url] = [dataclasses.asdict(p) for p in seen]
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

    # -- item 8: two dumps of a synchronous loop, without any probe ------------------------------

    def _stack_verdicts(self, target: str) -> dict[str, StackVerdict]:
        with self._verdicts_lock:
            return {table: v for (tgt, table), (v, _) in self._verdicts.items() if tgt == target}

    def _forget_verdicts(self) -> None:
        """A verdict lasts while its stall does: a sample_blocked or the starvation it became."""
        stalled = {(f.target, f.table) for f in self._active.values()
                   if f.kind in (kinds.SAMPLE_BLOCKED.name, kinds.WORKER_STARVATION.name)}
        with self._verdicts_lock:
            for key in [k for k in self._verdicts if k not in stalled]:
                del self._verdicts[key]

    def _wants_loop_dumps(self, finding: Finding) -> bool:
        """A sample_blocked on a synchronous layout that no trainer probe reads, and a pid."""
        return (self._trainer_pid is not None and finding.kind == kinds.SAMPLE_BLOCKED.name
                and str(finding.evidence.get("layout", "")).startswith("sync")
                and not finding.evidence.get("trainer_probes"))

    def _dump_loop_stacks(self, transitions: list[Transition]) -> None:
        for t in transitions:
            if t.kind == "opened" and self._wants_loop_dumps(t.finding):
                self._start_loop_dumps(t.finding)

    def _start_loop_dumps(self, finding: Finding) -> None:
        pid, incidents = self._trainer_pid, self._incidents
        assert pid is not None
        requested_at = finding.last_seen  # the diagnosis time that asked, on the view's clock

        def dump_twice() -> None:
            first = self._dump(pid)
            time.sleep(self._dump_gap_s)
            second = self._dump(pid)
            verdict = stack_verdict(first, second, requested_at)
            dumps = {f"py-spy:{pid}": first, f"py-spy:{pid} +{self._dump_gap_s:g}s": second}
            with self._verdicts_lock:
                self._verdicts[(finding.target, finding.table)] = (verdict, dumps)
            log.info("%s %s: loop %s in two dumps", finding.target, finding.table,
                     "inside next()" if verdict.in_next else "not inside next()")
            if incidents is not None and not incidents.attach_stacks(finding.finding_id, dumps):
                log.warning("could not store stacks for %s", finding.finding_id)

        # Off the poller's thread, as _capture_stacks; each dump has a timeout.
        threading.Thread(target=dump_twice, name="replaywatch-loop-stacks", daemon=True).start()

    def _attach_loop_dumps(self, finding: Finding) -> None:
        """A starvation named from stacks keeps the dumps that named it; no third dump."""
        with self._verdicts_lock:
            kept = self._verdicts.get((finding.target, finding.table))
        if kept is not None and self._incidents is not None:
            self._incidents.attach_stacks(finding.finding_id, kept[1])
