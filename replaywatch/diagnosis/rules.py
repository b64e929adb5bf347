"""One small named rule per finding kind, in Reverb's and Acme's words.

Each rule answers for one table (and, where it needs one, one trainer probe)
and returns a Finding or None. Stalls are judged by progress (insert, sample,
batch and step counters that did not move for the whole stall window, proven
by snapshots at both ends); `table_worker_time` only says which side waits,
because a healthy synchronous loop waits for inserts ~98% of the time too.
Summaries hold only stable facts, so an open finding is not rewritten every
poll; the moving numbers are in the evidence.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from replaywatch.diagnosis import arithmetic as ar
from replaywatch.diagnosis import progress as pg
from replaywatch.diagnosis.ratelimiter import (
    can_insert,
    can_sample,
    cursor,
    insert_headroom,
    is_insert_blocking_disabled,
    is_warming_up,
    limiter_slack,
    sample_headroom,
)
from replaywatch.diagnosis.rates import PollRecord, TargetView, inserts_of, samples_of
from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.model import Finding, ProbeSnapshot, Severity, TableSnapshot

CRITICAL, WARNING, INFO = Severity.CRITICAL, Severity.WARNING, Severity.INFO


@dataclasses.dataclass(frozen=True)
class TableCase:
    """One table's snapshots since its last counter reset, and the probes reading it."""

    target: str
    history: tuple[TableSnapshot, ...]  # non-empty, time-ordered
    probes: tuple[tuple[ProbeSnapshot, ...], ...]  # each since its trainer's last restart
    now: float

    @property
    def latest(self) -> TableSnapshot:
        return self.history[-1]

    @property
    def name(self) -> str:
        return self.latest.name

    def finding(self, kind: str, severity: Severity, summary: str, evidence: dict[str, Any],
                fix: str, since: float) -> Finding:
        return Finding(kind, severity, self.target, self.name, summary, evidence, fix,
                       since=since, last_seen=self.now)


def _waits(case: TableCase, state: str, th: Thresholds) -> bool:
    """The table worker spent time in `state` during the stall window."""
    points = pg.window(case.history, case.latest.observed_at - th.stall_window_s)
    return pg.increase(points, lambda s: s.worker_time.ms(state)) > 0


def _limiter(t: TableSnapshot) -> dict[str, Any]:
    rl = t.rate_limiter
    return {"cursor": cursor(t), "min_diff": rl.min_diff, "max_diff": rl.max_diff,
            "samples_per_insert": rl.samples_per_insert, "current_size": t.current_size,
            "min_size_to_sample": rl.min_size_to_sample}


# -- stalls seen from Reverb alone --------------------------------------------------------------

def is_sample_blocked(case: TableCase, th: Thresholds) -> Finding | None:
    """The learner wants samples, the limiter refuses, and no actor inserts: training stopped.

    Blocked means `not can_sample(table, 1)`: below `min_size_to_sample`, or
    `cursor - 1 < min_diff`. Someone wants samples when the table worker kept
    `waiting_for_inserts`, or a probe reading the table is blocked in next().
    Inserts must have *stopped*: a table that never had an insert is a job whose
    actors are still starting (distributed actors take 10-30 s to import and
    connect), and calling that a stall was our one false alarm on healthy runs.
    """
    t = case.latest
    if t.rate_limiter.inserts == 0:
        return None
    idle = pg.idle_for(case.history, inserts_of, samples_of)
    wanted = _waits(case, "waiting_for_inserts", th) or any(p[-1].blocked_in_next
                                                           for p in case.probes)
    if idle < th.stall_window_s or can_sample(t, 1) or not wanted:
        return None
    needed = ar.inserts_to_sample(t)
    summary = (f"Sampling from table '{t.name}' is blocked by the rate limiter and inserts have "
               "stopped: the actors are dead, stuck or too slow.")
    if not case.probes:
        summary += (" From Reverb alone this is also how worker starvation looks; attach the "
                    "trainer probe to tell them apart.")
    fix = (f"Check that the actors are alive and inserting into '{t.name}' (an adder stuck in "
           f"flush, a crashed actor); {needed} more insert(s) would let the next sample through. "
           "If actors and learner share one loop, attach replaywatch's TrainerProbe to the "
           "learner's iterator: parallel batching workers can strand the samples it needs.")
    evidence = {**_limiter(t), "sample_headroom": sample_headroom(t), "inserts_needed": needed,
                "seconds_without_progress": idle}
    return case.finding("sample_blocked", CRITICAL, summary, evidence, fix,
                        since=t.observed_at - idle)


def is_insert_blocked(case: TableCase, th: Thresholds) -> Finding | None:
    """Actors wait at max_diff and the learner draws nothing: the learner stopped consuming.

    Blocked means `not can_insert(table, 1)`: `cursor + samples_per_insert >
    max_diff` with the table past `min_size_to_sample`; the table worker kept
    `waiting_for_sampling`, so inserts are queued behind it.
    """
    t = case.latest
    idle = pg.idle_for(case.history, inserts_of, samples_of)
    if idle < th.stall_window_s or can_insert(t, 1) or not _waits(case, "waiting_for_sampling",
                                                                   th):
        return None
    needed = ar.samples_to_insert(t)
    summary = (f"Inserts into table '{t.name}' are blocked at max_diff and sampling has stopped: "
               "the learner is not consuming.")
    fix = (f"Check the learner: {needed} sample(s) would let the next insert through. Attach "
           "the trainer probe and read GET /stacks to see whether it waits in next() or hangs "
           "in its update step.")
    evidence = {**_limiter(t), "insert_headroom": insert_headroom(t), "samples_needed": needed,
                "seconds_without_progress": idle}
    return case.finding("insert_blocked", CRITICAL, summary, evidence, fix,
                        since=t.observed_at - idle)


def is_warmup(case: TableCase, th: Thresholds) -> Finding | None:
    """Below min_size_to_sample while actors insert: the learner waits by design, not a stall."""
    t = case.latest
    points = pg.window(case.history, t.observed_at - th.stall_window_s)
    if not is_warming_up(t) or pg.increase(points, inserts_of) <= 0:
        return None
    rl = t.rate_limiter
    inserted, secs = pg.increase(points, inserts_of), pg.span(points)
    rate = inserted / secs if secs > 0 else None
    missing = rl.min_size_to_sample - t.current_size
    evidence = {**_limiter(t), "insert_rate_per_s": rate, "items_missing": missing,
                "eta_s": missing / rate if rate else None}
    summary = (f"Table '{t.name}' is filling up to min_size_to_sample "
               f"({rl.min_size_to_sample} items); sampling waits by design.")
    warm = [s for s in case.history if is_warming_up(s)]
    return case.finding("warmup", INFO, summary, evidence, "Nothing to fix: wait.",
                        since=warm[0].observed_at)


def is_spi_drift(case: TableCase, th: Thresholds) -> Finding | None:
    """Samples per insert stayed off the configured ratio: learner and actors out of balance.

    With tolerance `error_buffer / (spi * min_size)` (Acme's
    `samples_per_insert_tolerance_rate`), it holds when over the whole window
    `|observed / spi - 1| > tolerance` and `|spi * inserts - samples|` exceeds
    the error_buffer, so post-warm-up catch-up (at most one buffer) is not drift.
    A blocking limiter keeps this bounded by its slack; it drifts when inserts
    never block (synchronous layout) and the learner falls behind.
    """
    t, start = case.latest, case.latest.observed_at - th.spi_window_s
    rl, tol = t.rate_limiter, ar.spi_tolerance(t)
    if tol is None or not ar.is_sample_limited(t) or not pg.covers(case.history, start):
        return None
    points = pg.window(case.history, start)
    inserted, sampled = pg.increase(points, inserts_of), pg.increase(points, samples_of)
    if any(is_warming_up(s) for s in points) or inserted < th.spi_min_inserts:
        return None
    observed, gap = sampled / inserted, rl.samples_per_insert * inserted - sampled
    if abs(observed / rl.samples_per_insert - 1) <= tol or abs(gap) <= ar.error_buffer(t):
        return None
    side = "the learner samples less" if gap > 0 else "the learner samples more"
    evidence = {**_limiter(t), "observed_samples_per_insert": observed, "tolerance_rate": tol,
                "window_s": pg.span(points), "inserts": inserted, "samples": sampled,
                "sample_deficit": gap}
    summary = (f"Table '{t.name}' is sampled off its configured {rl.samples_per_insert:g} "
               f"samples per insert by more than {tol:.0%}: {side} than configured.")
    fix = ("Balance the loop: speed up the learner (or slow the actors) until samples per "
           "insert returns to the configured ratio, or lower samples_per_insert.")
    return case.finding("spi_drift", WARNING, summary, evidence, fix, since=points[0].observed_at)


# -- stalls that need the trainer probe ---------------------------------------------------------

def is_worker_starvation(case: TableCase, probe: tuple[ProbeSnapshot, ...],
                         th: Thresholds) -> Finding | None:
    """Parallel batching workers each hold part of a batch; none completes, next() blocks.

    Holds when next() has blocked for the stall window, the table has drawn no
    sample for as long, the limiter allows no more (`sample_headroom < 1`, or
    the table worker keeps waiting for inserts), and the stranded samples
    (drawn - batches * batch_size - prefetched) reach one batch.
    """
    t, p = case.latest, probe[-1]
    idle = pg.idle_for(case.history, samples_of)
    if not p.blocked_in_next or p.blocked_for_s < th.stall_window_s or idle < th.stall_window_s:
        return None
    if sample_headroom(t) >= 1 and not _waits(case, "waiting_for_inserts", th):
        return None
    stranded = ar.stranded_samples(case.history, [h[-1] for h in case.probes])
    if stranded is None or p.batch_size is None or stranded.samples < p.batch_size:
        return None
    workers, batch, spi = p.num_parallel_calls, p.batch_size, t.rate_limiter.samples_per_insert
    evidence = {**_limiter(t), "stranded_samples": stranded.samples, "drawn": stranded.drawn,
                "delivered": stranded.delivered, "prefetched": stranded.held,
                "stranded_basis": stranded.basis, "workers": workers, "batch_size": batch,
                "sample_headroom": sample_headroom(t), "blocked_for_s": p.blocked_for_s,
                "probe": p.probe}
    summary = (f"The learner '{p.name}' is blocked in next() while {workers or 'several'} "
               f"batching workers hold samples from '{t.name}' that no batch of {batch} "
               "completes: parallel batching workers starve one another.")
    if is_insert_blocking_disabled(t) or workers is None:
        fix = (f"Set num_parallel_calls=1 in make_reverb_dataset (now {workers}): in a "
               "synchronous loop the table only gains sample credit after a learner step.")
    else:
        need = ar.required_slack(workers, batch, spi)
        fix = (f"Give the limiter at least {need:g} slack (max_diff - min_diff, now "
               f"{limiter_slack(t):g}; error_buffer >= {ar.error_buffer_for(need)}), or set "
               f"num_parallel_calls={ar.workers_within(limiter_slack(t), batch, spi)}.")
    return case.finding("worker_starvation", CRITICAL, summary, evidence, fix,
                        since=t.observed_at - idle)


def is_learner_stalled(case: TableCase, probe: tuple[ProbeSnapshot, ...],
                       th: Thresholds) -> Finding | None:
    """The iterator has data but the learner takes no batch and no step: its update hangs.

    Has data: the iterator says `ready()`, or the table `can_sample` a batch.
    The learner is not in next(), so it is stuck elsewhere (a pmap deadlock).
    """
    t, p = case.latest, probe[-1]
    idle = pg.idle_for(probe, lambda s: s.batches_retrieved, lambda s: s.learner_steps)
    has_data = p.ready is True or can_sample(t, p.batch_size or 1)
    if p.blocked_in_next or idle < th.stall_window_s or not has_data:
        return None
    evidence = {"seconds_without_batch_or_step": idle, "batches_retrieved": p.batches_retrieved,
                "learner_steps": p.learner_steps, "ready": p.ready,
                "table_can_sample_batch": can_sample(t, p.batch_size or 1),
                "batch_size": p.batch_size, "sample_headroom": sample_headroom(t),
                "probe": p.probe}
    summary = (f"The learner '{p.name}' has taken no batch and no step while its iterator on "
               f"'{t.name}' has data: its update step is hung.")
    fix = (f"Read the learner's stacks (GET {p.probe}/stacks, kept with this incident) to see "
           "where it waits: a pmap or collective deadlock, a stuck device transfer, a lock.")
    return case.finding("learner_stalled", CRITICAL, summary, evidence, fix,
                        since=p.observed_at - idle)


# -- configuration that will hang -----------------------------------------------------------------

def is_batch_exceeds_headroom(case: TableCase, probe: tuple[ProbeSnapshot, ...],
                              th: Thresholds) -> Finding | None:
    """The limiter's slack cannot hold one batch: once warm-up credit is spent, batches stall.

    Inserts stop once `cursor + spi > max_diff`, so the cursor may rest up to
    `spi` below max_diff and only `slack - spi` samples are sure to be drawable
    before an insert is needed: a batch needs `slack >= batch_size + spi`.
    """
    t, p = case.latest, probe[-1]
    if p.batch_size is None or is_insert_blocking_disabled(t) or not ar.is_sample_limited(t):
        return None
    spi, slack = t.rate_limiter.samples_per_insert, limiter_slack(t)
    need = p.batch_size + spi
    if slack >= need:
        return None
    evidence = {**_limiter(t), "slack": slack, "batch_size": p.batch_size,
                "required_slack": need, "probe": p.probe}
    summary = (f"The rate limiter of '{t.name}' allows {slack:g} samples of slack, less than "
               f"a batch of {p.batch_size} plus {spi:g} samples per insert.")
    fix = (f"Raise the slack (max_diff - min_diff) to at least {need:g}: error_buffer >= "
           f"{ar.error_buffer_for(need)} for SampleToInsertRatio, or lower batch_size.")
    return case.finding("batch_exceeds_headroom", CRITICAL, summary, evidence, fix,
                        since=max(case.history[0].observed_at, probe[0].observed_at))


def is_deadlock_risk(case: TableCase, probe: tuple[ProbeSnapshot, ...],
                     th: Thresholds) -> Finding | None:
    """This layout can strand a batch across parallel workers and hang (predicted, not seen).

    Synchronous (insert blocking disabled): the table gains sample credit only
    after a learner step, and Acme calls next() once one batch is sampleable;
    two or more workers can split that batch so none completes: risk when
    `workers > 1`. Blocking: risk when `slack < workers * (batch_size - 1) + spi`
    (see arithmetic.required_slack).
    """
    t, p = case.latest, probe[-1]
    w, b, spi = p.num_parallel_calls, p.batch_size, t.rate_limiter.samples_per_insert
    if w is None or b is None or not ar.is_sample_limited(t):
        return None
    evidence = {**_limiter(t), "workers": w, "batch_size": b, "strandable_samples": w * (b - 1),
                "probe": p.probe}
    if is_insert_blocking_disabled(t):
        if w <= 1:
            return None
        summary = (f"'{t.name}' uses a synchronous layout (inserts never block) and {w} parallel "
                   "batching workers: they can split the samples of one batch and hang next().")
        fix = f"Set num_parallel_calls=1 in make_reverb_dataset (now {w})."
    else:
        need, slack = ar.required_slack(w, b, spi), limiter_slack(t)
        if slack >= need:
            return None
        evidence.update(slack=slack, required_slack=need)
        summary = (f"The slack of '{t.name}' ({slack:g}) is less than {w} workers x "
                   f"({b} - 1) + {spi:g}: parallel batching workers can strand a batch.")
        fix = (f"Raise error_buffer to at least {ar.error_buffer_for(need)} (slack {need:g}) "
               f"or set num_parallel_calls={ar.workers_within(slack, b, spi)}.")
    return case.finding("deadlock_risk", WARNING, summary, evidence, fix,
                        since=max(case.history[0].observed_at, probe[0].observed_at))


# -- reachability and the trainer's health --------------------------------------------------------

def _failing_since(polls: tuple[PollRecord, ...], th: Thresholds) -> PollRecord | None:
    """The first poll of a run of more than `down_polls` failures ending now."""
    run = 0
    for record in reversed(polls):
        if record.ok:
            break
        run += 1
    return polls[-run] if run > th.down_polls else None


def is_target_down(view: TargetView, th: Thresholds, now: float) -> Finding | None:
    """The Reverb server has not answered for more than `down_polls` polls."""
    first = _failing_since(view.polls, th)
    if first is None:
        return None
    ok = [r.at for r in view.polls if r.ok]
    evidence = {"failed_polls": sum(1 for r in view.polls if r.at >= first.at),
                "last_error": view.polls[-1].error, "last_ok_at": ok[-1] if ok else None}
    return Finding("target_down", WARNING, view.target, "",
                   f"The Reverb server '{view.target}' does not answer.", evidence,
                   f"Check that the replay process runs and is reachable at {view.target}.",
                   since=first.at, last_seen=now)


def is_probe_down(view: TargetView, th: Thresholds, now: float) -> Finding | None:
    """A trainer probe has not answered for more than `down_polls` polls."""
    down = {url: first for url, polls in sorted(view.probe_polls.items())
            if (first := _failing_since(polls, th)) is not None}
    if not down:
        return None
    evidence = {"probes": sorted(down),
                "last_errors": {u: view.probe_polls[u][-1].error for u in sorted(down)}}
    return Finding("probe_down", WARNING, view.target, "",
                   f"{len(down)} trainer probe(s) of '{view.target}' do not answer.", evidence,
                   "Check that the trainer runs and serves its probe (TrainerProbe.start()).",
                   since=min(r.at for r in down.values()), last_seen=now)


def is_too_many_threads(view: TargetView, th: Thresholds, now: float) -> Finding | None:
    """The trainer runs more threads than the threshold (the seed's hung job had over 500)."""
    over = {url: h for url, h in sorted(view.probes.items())
            if h and now - h[-1].observed_at <= th.stall_window_s
            and h[-1].thread_count > th.too_many_threads}
    if not over:
        return None
    since = []
    for h in over.values():  # the first snapshot of the run above the threshold
        start = len(h) - 1
        while start > 0 and h[start - 1].thread_count > th.too_many_threads:
            start -= 1
        since.append(h[start].observed_at)
    evidence = {"threads": {u: h[-1].thread_count for u, h in over.items()},
                "threshold": th.too_many_threads}
    return Finding("too_many_threads", WARNING, view.target, "",
                   f"A trainer of '{view.target}' runs more than {th.too_many_threads} threads.",
                   evidence, "Cap the thread pools (tf.data num_parallel_calls, "
                   "TF inter/intra op threads, XLA) so workers are scheduled.",
                   since=min(since), last_seen=now)
