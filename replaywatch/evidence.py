"""The evidence a cycle's transitions call for: written to the incident log with the snapshots
around them, and, when a critical finding opens, the trainer's thread stacks (an RLlib job's:
the stacks of the processes it names, by its dashboard) and a bundle.

The findings keeper hands each cycle's verdict here. The stacks are the `StackTaker`'s
business (replaywatch/stack_taker.py: the I/O, off the poller's thread): this module decides
when to ask. Nothing is dumped while the job is healthy.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

from replaywatch.bundle import Inputs
from replaywatch.bundle_store import BundleStore
from replaywatch.diagnosis.cycle import Verdict
from replaywatch.diagnosis.lifecycle import Transition
from replaywatch.history import History
from replaywatch.incidents import IncidentLog
from replaywatch.model import Finding, Name, Severity
from replaywatch.stack_taker import StackTaker

log = logging.getLogger("replaywatch.findings")

# Snapshots around a transition stored with it as context.
CONTEXT_POINTS = 5

Last = Mapping[str, tuple[Inputs, tuple[Finding, ...]]]


class Evidence:
    """Records transitions and takes what a critical one needs; runs on the poller's thread."""

    def __init__(self, incidents: IncidentLog | None, stacks: StackTaker,
                 bundles: BundleStore | None):
        self._incidents = incidents
        self.stacks = stacks
        self._bundles = bundles

    def after_cycle(self, verdict: Verdict, history: History,
                    targets: Mapping[str, list[str]], last: Last) -> None:
        transitions = list(verdict.transitions)
        # A loop-dump verdict lasts while its stall does: a sample_blocked or its starvation.
        self.stacks.keep_only({(f.target, f.table) for f in verdict.active.values()
                               if f.kind in (Name.SAMPLE_BLOCKED, Name.WORKER_STARVATION)})
        attach = self._attach if self._incidents is not None else None
        for t in transitions:
            if t.kind == "opened" and self._wants_loop_dumps(t.finding):
                f = t.finding  # requested at the diagnosis time that asked, the view's clock
                self.stacks.dump_loop(f.target, f.table, f.finding_id, f.last_seen, attach)
        self._record(transitions, history, targets, last)

    def _record(self, transitions: list[Transition], history: History,
                targets: Mapping[str, list[str]], last: Last) -> None:
        for t in transitions:
            f = t.finding
            level = logging.WARNING if f.severity >= Severity.WARNING else logging.INFO
            log.log(level, "%s %s %s %s: %s", t.kind, f.kind, f.target, f.table, f.summary)
        openings = [t.finding for t in transitions
                    if t.kind == "opened" and t.finding.severity == Severity.CRITICAL]
        if self._incidents is None:
            for f in openings:
                self._bundle(f, last, expect_stacks=False)
            return
        if not transitions and self._incidents.last_error is None:
            return
        # With no new transitions this retries what a failed write left queued.
        self._incidents.apply(transitions, _context(transitions, history, targets))
        for f in openings:
            if (workers := _ray_workers(f, last)) is not None:
                self._bundle(f, last, expect_stacks=self.stacks.will_capture_ray(workers))
                self.stacks.capture_ray(f.finding_id, f.target, workers, self._attach)
            elif self._wants_loop_dumps(f):
                self._bundle(f, last, expect_stacks=True)  # its two dumps attach when taken
            elif f.evidence.get("from_stacks"):
                self._bundle(f, last, expect_stacks=True)
                kept = self.stacks.dumps(f.target, f.table)  # the dumps that named it
                if kept is not None:
                    self._attach(f.finding_id, kept)
            else:
                urls = targets.get(f.target, [])
                self._bundle(f, last, expect_stacks=self.stacks.will_capture(urls))
                self.stacks.capture(f.finding_id, urls, self._attach)

    def _bundle(self, finding: Finding, last: Last, expect_stacks: bool) -> None:
        """This cycle's bundle for a critical that opened, written once its stacks are in."""
        cycle = last.get(finding.target)
        if self._bundles is not None and cycle is not None:
            self._bundles.on_critical(finding, cycle[0], cycle[1], expect_stacks)

    def _attach(self, finding_id: str, stacks: dict[str, Any]) -> bool:
        """Stacks to the incident log, and to the bundle waiting for them."""
        if self._bundles is not None:
            self._bundles.stacks_taken(finding_id, stacks)
        return self._incidents is not None and self._incidents.attach_stacks(finding_id, stacks)

    def _wants_loop_dumps(self, finding: Finding) -> bool:
        """A sample_blocked on a synchronous layout that no trainer probe reads, and a pid."""
        return (self.stacks.can_dump_loop() and finding.kind == Name.SAMPLE_BLOCKED
                and str(finding.evidence.get("layout", "")).startswith("sync")
                and not finding.evidence.get("trainer_probes"))


def _ray_workers(finding: Finding, last: Last) -> list[tuple[int, str | None]] | None:
    """The processes an RLlib finding names (its hung calls', its learners', runners' and
    driver's pids), each with its node where an actor of the job's newest snapshot runs
    there; None for a Reverb target's finding."""
    cycle = last.get(finding.target)
    if cycle is None or not cycle[0].ray:
        return None
    ev = finding.evidence
    named = [*(c.get("pid") for c in ev.get("calls") or () if isinstance(c, dict)),
             *(ev.get("learner_pids") or ()), *(ev.get("runner_pids") or ()),
             ev.get("driver_pid")]
    nodes = {a.pid: a.node_id for a in cycle[0].ray[-1].actors if a.pid}
    pids = list(dict.fromkeys(p for p in named if isinstance(p, int) and p > 0))
    return [(p, nodes.get(p)) for p in pids]


def _context(transitions: list[Transition], history: History,
             targets: Mapping[str, list[str]]) -> dict[str, Any]:
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
