"""The fleet: the sidecar's targets grouped into jobs, each job's health at a glance, the
worst first (`GET /api/v1/fleet`, the page's "Jobs" and its drill-down `/?job=NAME`).

A target's job is its `job` label (a targets file's group labels, as Prometheus' file_sd
gives them: the Reverb servers a job shards its experience over, listed under one label, are
one row); a Ray job found by `--ray-job all` is a job of its own (`... job 02000000`), as is
any other target. A probe belongs to its target's job. Pure: a `Published` in, rows out.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable
from typing import Any

from replaywatch.diagnosis.kinds import worst_first
from replaywatch.model import Finding, Severity
from replaywatch.state import Published, SourceStatus

JOB_LABEL = "job"


@dataclasses.dataclass(frozen=True)
class FleetJob:
    """One job: its targets, the sources of it that are down, its findings by severity and
    the worst of them."""

    name: str
    targets: tuple[str, ...]
    sources: int
    down: tuple[str, ...]
    findings: dict[str, int]
    worst: Finding | None

    @property
    def severity(self) -> Severity | None:
        return self.worst.severity if self.worst is not None else None

    def document(self) -> dict[str, Any]:
        w = self.worst
        paged = w is not None and w.severity >= Severity.WARNING
        health = (w.severity.label if paged and w is not None else "down" if self.down
                  else "info" if w is not None else "ok")
        return {"job": self.name, "targets": list(self.targets), "sources": self.sources,
                "down": list(self.down), "findings": dict(self.findings), "health": health,
                "worst": None if w is None else {
                    "kind": str(w.kind), "severity": w.severity.label, "target": w.target,
                    "table": w.table, "summary": w.summary, "since": w.since}}


def job_of_targets(state: Published) -> dict[str, str]:
    """Each target's job: the `job` label its sources carry, else the target itself."""
    return jobs_of(state.sources.values())


def jobs_of(sources: Iterable[SourceStatus]) -> dict[str, str]:
    """Each target's job, from its sources' `job` labels (else the target itself)."""
    jobs: dict[str, str] = {}
    for s in sources:
        label = dict(s.labels).get(JOB_LABEL)
        if label:
            jobs[s.target] = label
        else:
            jobs.setdefault(s.target, s.target)
    return jobs


def fleet(state: Published) -> tuple[FleetJob, ...]:
    """Every job of the picture, the worst first (critical, warning, down, info, ok), then
    by name."""
    jobs = job_of_targets(state)
    targets: dict[str, set[str]] = {}
    sources: Counter[str] = Counter()
    down: dict[str, list[str]] = {}
    for s in state.sources.values():
        job = jobs[s.target]
        targets.setdefault(job, set()).add(s.target)
        sources[job] += 1
        if not s.up:
            down.setdefault(job, []).append(s.name)
    found: dict[str, list[Finding]] = {}
    for f in state.findings:
        job = jobs.get(f.target, f.target)
        targets.setdefault(job, set()).add(f.target)
        found.setdefault(job, []).append(f)
    rows = []
    for job in targets:
        mine = worst_first(found.get(job, ()))
        rows.append(FleetJob(job, tuple(sorted(targets[job])), sources[job],
                             tuple(sorted(down.get(job, ()))),
                             dict(Counter(f.severity.label for f in mine)),
                             mine[0] if mine else None))
    return tuple(sorted(rows, key=lambda r: (-_rank(r), r.name)))


def _rank(job: FleetJob) -> float:
    if job.severity is not None and job.severity >= Severity.WARNING:
        return float(job.severity)
    if job.down:
        return 1.5  # unreadable: worse than an info finding, better than a warning
    return float(job.severity or 0)
