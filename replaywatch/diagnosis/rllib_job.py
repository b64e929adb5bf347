"""One RLlib job as its rules read it: its snapshots, its progress series, whether it is
starting or warming up, and how a finding about it is made.

What real Ray 2.60 jobs showed (docs/research/rllib-observables.md §6) shapes it: a DQN job
samples and trains in one synchronous loop, so a hung env or learner stops every counter; an
APPO job samples asynchronously, so a hung runner or learner stops only its own counter;
a learner inside the driver (`num_learners=0`) leaves no call to age.

Start-up, in the spirit of rules_startup.py: before a series has moved often enough to
learn its rhythm, it is judged by `stall_window_s` (a counter's floor at least), and while
the job has not finished its first update (a first compile may take minutes) the hangs
found then do not page in its first `startup_grace_s`: they are said as info with when they
would page. The job's start comes from its result rows (`timestamp - time_total_s`), else
the oldest snapshot held. A hang is start-up by when it began: one that began before the
job's first update (a runner's first sample call, the learner's first compile) stays start-up
after other parts of the job have trained; one that began after it is judged as any other,
even when it outlasted the look-back so that no rhythm is left in view, as learner_starting
ends at the first step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from replaywatch.diagnosis import rllib_progress as rp
from replaywatch.diagnosis.kinds import Kind
from replaywatch.diagnosis.rllib_progress import Progress
from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.model import Finding, Severity
from replaywatch.ray_model import ActorRole, RaySnapshot, ResultRow

# The algorithms measured: DQN waits for every EnvRunner's sample in its training step,
# APPO (IMPALA's loop) samples asynchronously and goes on without a runner.
SYNCHRONOUS = frozenset({"DQN"})
ASYNCHRONOUS = frozenset({"APPO", "IMPALA"})


@dataclasses.dataclass(frozen=True)
class RllibJob:
    """One job's snapshots (oldest first, this job's only), read once for every rule."""

    target: str
    job_id: str
    history: tuple[RaySnapshot, ...]
    now: float
    th: Thresholds
    sampled: Progress | None  # env steps sampled, every EnvRunner's summed
    trained: Progress | None  # env steps trained, every learner's
    iterations: Progress | None
    training_steps: Progress | None
    rows: Progress | None  # result rows' arrival

    @property
    def latest(self) -> RaySnapshot:
        return self.history[-1]

    @property
    def table(self) -> str:
        return f"job:{self.job_id}"

    def finding(self, kind: Kind, summary: str, evidence: dict[str, Any], fix: str,
                since: float) -> Finding:
        return kind.finding(self.target, self.table, summary, evidence, fix, since=since,
                            last_seen=self.now)

    def row(self) -> ResultRow | None:
        """The newest result row read."""
        return next((s.results[-1] for s in reversed(self.history) if s.results), None)

    def algorithm(self) -> str | None:
        """The algorithm's own tag on its driver's series (DQN, APPO), where exported: the
        joined driver's, else the one tag every such series has (a dead job's driver stays
        exported beside the live one's while the join is incomplete)."""
        tags = [(c.joined, c.rllib) for c in self.latest.counters
                if c.iterations is not None or c.training_steps is not None]
        joined = {t for j, t in tags if j}
        every = {t for _, t in tags}
        one = joined if joined else every
        return next(iter(one)) if len(one) == 1 else None

    def series(self) -> tuple[Progress, ...]:
        return tuple(p for p in (self.sampled, self.trained, self.iterations,
                                 self.training_steps, self.rows) if p is not None)


def read_job(target: str, history: Sequence[RaySnapshot], th: Thresholds,
             now: float) -> RllibJob | None:
    """The newest snapshot's job and its snapshots; None where no job is found."""
    if not history or history[-1].job_id is None:
        return None
    job_id = history[-1].job_id
    mine = tuple(s for s in history if s.job_id == job_id)
    floor = rp.counter_floor(th)

    def counter(field: str, what: str, role: ActorRole | None = None) -> Progress | None:
        return rp.progress(mine, rp.counter_reader(field, role), what, th, floor)

    return RllibJob(target, job_id, mine, now, th,
                    counter("env_steps_sampled", "env steps sampled", ActorRole.ENV_RUNNER),
                    counter("env_steps_trained", "env steps trained"),
                    counter("iterations", "iterations"),
                    counter("training_steps", "training steps"),
                    rp.progress(mine, rp.rows_reader, "result rows", th))


# -- start-up and warm-up ------------------------------------------------------------------

def started_at(job: RllibJob) -> float | None:
    """When the job began training, from a result row (the driver's clock)."""
    starts = [r.timestamp - r.time_total_s for s in job.history for r in s.results
              if r.timestamp is not None and r.time_total_s is not None]
    return min(starts, default=None)


def has_trained(job: RllibJob) -> bool:
    """The job's learner finished an update: its trained counter rose in the history, a
    live learner's stands above 0, or a row counts trained steps (a dead worker's series,
    kept unjoined, says nothing of this job)."""
    return ((job.trained is not None and job.trained.gained > 0)
            or any(c.joined and (c.env_steps_trained or 0) > 0
                   for s in job.history for c in s.counters)
            or any((r.env_steps_trained_lifetime or 0) > 0
                   for s in job.history for r in s.results))


def untrained_at(job: RllibJob) -> float | None:
    """The newest time the job is known not to have trained yet: the end of the last
    iteration whose row counts no trained step, where a later row in view counts some (so
    the rows do carry the key, and its absence before was no update yet). None where the
    rows show no such turn (the first update before the look-back, or rows that never
    count trained steps)."""
    rows = sorted({r.iteration: r for s in job.history for r in s.results
                   if r.iteration is not None and r.timestamp is not None}.items())
    before: float | None = None
    for _, r in rows:
        if (r.env_steps_trained_lifetime or 0) > 0:
            return before
        before = r.timestamp
    return None


def grace(job: RllibJob, learned: bool, began: float) -> tuple[float, str] | None:
    """(began at, how known) while a hang judged by an unlearned window must not page: it
    began before the job's first update (a first compile, a runner's first sample call may
    take minutes on a loaded host) and the job is younger than `startup_grace_s`. `began`:
    when the hang began, the latest of its parts' (a hang that began after the first update
    pages, even beside one that began before). Past its first update a stall is judged as any
    other, even when it outlasted the look-back so that no rhythm is left in view."""
    if learned:
        return None
    if has_trained(job):
        untrained = untrained_at(job)
        if untrained is None or began >= untrained:
            return None
    start, basis = started_at(job), "result rows (timestamp - time_total_s)"
    if start is None:
        start, basis = job.history[0].observed_at, "the oldest snapshot held (no result row)"
    if job.now - start >= job.th.startup_grace_s:
        return None
    return start, basis


def held(f: Finding, began: tuple[float, str] | None, th: Thresholds, now: float) -> Finding:
    """A hang said as info during start-up, with when it would page."""
    if began is None:
        return f
    start, basis = began
    evidence = {**f.evidence, "grace_started_at": start, "grace_basis": basis,
                "grace_left_s": round(th.startup_grace_s - (now - start), 1),
                "startup_grace_s": th.startup_grace_s, "would_be": f.severity.label}
    return dataclasses.replace(
        f, severity=Severity.INFO, evidence=evidence,
        summary=f"Start-up (nothing learned yet, {now - start:.0f} s in): {f.summary}",
        fix=f"Wait: it pages if it lasts {th.startup_grace_s:g} s past the start. {f.fix}")


def rows_warm_up(job: RllibJob) -> tuple[float, float] | None:
    """(sampled so far, needed) from the newest row that says both; None where none does."""
    for s in reversed(job.history):
        for r in reversed(s.results):
            if (r.num_steps_sampled_before_learning_starts is not None
                    and r.env_steps_sampled_lifetime is not None):
                return r.env_steps_sampled_lifetime, r.num_steps_sampled_before_learning_starts
    return None


def warming_up(job: RllibJob) -> dict[str, Any] | None:
    """Learning has not started yet: evidence, or None.

    From a row: fewer steps sampled than `num_steps_sampled_before_learning_starts` (DQN
    counts sampled steps, not stored ones). Without one: a Learner actor alive whose trained
    counter never rose (RLlib exports it from the first update) while sampling moves; a
    learner in the driver may export none, so then nothing is said."""
    said = rows_warm_up(job)
    if said is not None:
        sampled, needed = said
        if sampled >= needed:
            return None
        return {"env_steps_sampled_lifetime": sampled,
                "num_steps_sampled_before_learning_starts": needed,
                "env_steps_to_go": needed - sampled, "told_by": "result row"}
    if has_trained(job):
        return None
    learners = [a for a in job.latest.actors if a.role is ActorRole.LEARNER and a.alive]
    if not learners or job.sampled is None or not job.sampled.moving(job.now):
        return None
    return {"env_steps_trained": None if job.trained is None else job.trained.value,
            "env_steps_sampled": job.sampled.value, "learner_pids": [a.pid for a in learners],
            "told_by": "the trained counter never rose while sampling moves"}
