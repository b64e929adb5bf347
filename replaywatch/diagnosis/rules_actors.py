"""Stalls whose cause only the loop or the actor side proves: worker_starvation, writer_stalled.

worker_starvation is named only on a proven circular wait, because its fix
(`num_parallel_calls=1`) is wrong for dead actors, and from Reverb and the learner alone dead
actors and live actors that wait for the learner look the same:

    synchronous layout    insert blocking disabled: the loop that inserts is the learner
                          blocked in next(), so nothing will insert (trainer probe, or two
                          py-spy dumps of the loop inside next(): "from stacks")
    asynchronous layout   every actor probe on the table shows a live actor waiting on the
                          learner (`probe.waiting("learner")`) for the stall window

and the learner is blocked in next() with at least a batch drawn and never delivered.
Anything else is sample_blocked (rules_stalls). writer_stalled is an actor stuck inside a
Reverb writer call while the limiter would let its items in, or the server is gone.
"""

from __future__ import annotations

import dataclasses

from replaywatch.diagnosis import actors as act
from replaywatch.diagnosis import budget_fixes, kinds, rules_config
from replaywatch.diagnosis import ratelimiter as lim
from replaywatch.diagnosis import window as win
from replaywatch.diagnosis.case import Probe, TableCase, limiter_evidence, worker_waited
from replaywatch.diagnosis.ratelimiter import (
    Stranded,
    can_insert,
    can_sample,
    sample_headroom,
)
from replaywatch.diagnosis.registry import Rule, Shape
from replaywatch.diagnosis.rules_liveness import failing_since, paused_since
from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.diagnosis.window import TargetView, inserts_of, samples_of
from replaywatch.model import ActorSnapshot, Finding


def is_worker_starvation(case: TableCase, th: Thresholds) -> Finding | None:
    """Parallel batching workers each hold part of a batch in a circular wait; next() blocks.

    Holds when the table has drawn no sample for the stall window, the limiter
    allows no more (`sample_headroom < 1`, or the table worker keeps waiting for
    inserts), a learner has been blocked in next() for the window with at least
    one batch stranded (drawn - delivered - prefetched: any number), and nothing
    will insert: the layout is synchronous, or every actor waits on the learner.
    Without a trainer probe, a synchronous loop seen inside next() in two stack
    dumps (`case.stacks`) proves it too.
    """
    t = case.latest
    idle = win.idle_for(case.history, samples_of)
    if idle < th.stall_window_s:
        return None
    if sample_headroom(t) >= 1 and not worker_waited(case, "waiting_for_inserts", th):
        return None
    synchronous = rules_config.loop_is_synchronous(case)
    for probe in case.probes:
        p = probe[-1]
        if (len(probe) < 2 or win.span(probe) < th.min_history_s or not p.blocked_in_next
                or p.blocked_for_s < th.stall_window_s):
            continue
        stranded = lim.stranded_samples(case.history, [h[-1] for h in case.probes])
        batch = p.pipeline.batch_size
        if stranded is None or batch is None or stranded.samples < batch:
            continue
        if synchronous or act.all_waiting(case.actors, th, case.now):
            return _worker_starvation(case, probe, stranded, idle, th)
    if not case.probes and synchronous and _loop_seen_in_next(case, th):
        return _starvation_from_stacks(case)
    return None


def _worker_starvation(case: TableCase, probe: Probe, stranded: Stranded, idle: float,
                       th: Thresholds) -> Finding:
    t, p = case.latest, probe[-1]
    workers, batch = p.pipeline.num_parallel_calls, p.pipeline.batch_size
    synchronous = rules_config.loop_is_synchronous(case)
    evidence = {**limiter_evidence(t), **stranded.evidence(), "workers": workers,
                "batch_size": batch, "sample_headroom": sample_headroom(t),
                "blocked_for_s": p.blocked_for_s, "probe": p.probe,
                **_layout_evidence(case, synchronous),
                "circular_wait": "the loop inserts only after a step" if synchronous
                else "every actor waits on the learner"}
    if not synchronous:
        evidence.update(act.evidence(case.actors, th, case.now))
    iterators = (f"{workers} requested, up to ~{stranded.sampling_iterators_up_to} sampling "
                 "iterators behind Acme's interleave" if workers else "several workers")
    who = "the loop inserts only after a learner step" if synchronous else (
        "every actor waits on the learner")
    summary = (f"The learner '{p.name}' is blocked in next() while batching workers ({iterators}) "
               f"hold samples from '{t.name}' that no batch of {batch} completes, and {who}: "
               "parallel batching workers starve one another.")
    ds = rules_config.dataset_of(p, t)
    if ds is not None and ds.after_interleave:
        # TF-Agents' shape has no batching workers: the samplers no thread reads hold them.
        summary = (f"The learner '{p.name}' is blocked in next() while {ds.samplers} Reverb "
                   f"datasets read by {ds.workers} interleave thread(s) hold samples from "
                   f"'{t.name}' that no batch of {batch} completes, and {who}: the datasets "
                   "no thread is in keep what they drew.")
    fix, proven = _starvation_fix(case, probe, synchronous)
    evidence["fixes"] = proven
    return case.finding(kinds.WORKER_STARVATION, summary, evidence, fix,
                        since=t.observed_at - idle)


def _layout_evidence(case: TableCase, synchronous: bool) -> dict[str, object]:
    """The layout as known; unknown, what proved the circular wait instead."""
    known = rules_config.known_layout(case)
    if known.known:
        return known.evidence()
    return {**known.evidence(), "layout": "synchronous (max_diff at float max)" if synchronous
            else "asynchronous (every actor waits on the learner)"}


def _starvation_fix(case: TableCase, probe: Probe, synchronous: bool
                    ) -> tuple[str, list[dict[str, object]]]:
    """The fixes the budget model proves for this configuration (never the current values);
    the plain advice only when the probe does not declare the dataset."""
    ds = rules_config.dataset_of(probe[-1], case.latest)
    known = rules_config.known_layout(case)
    model = known.model() or (rules_config.synchronous_model(case) if synchronous else None)
    if model is None:
        return ("Loosen the actors' policy-lag bound, widen the limiter (error_buffer) or "
                "use fewer sampling workers; declare the bound (ActorProbe(max_policy_lag=...))"
                " for the numbers the budget model proves."), []
    if ds is None:
        return ("Set num_parallel_calls=1 in make_reverb_dataset, or give the limiter more "
                "slack (declare batch_size and num_parallel_calls to the trainer probe for "
                "the numbers)."), []
    limiter = rules_config.limiter_of(case.latest)
    # Searched as deadlock_risk's are: a stride nobody said or proved feeds no fix.
    model = known.fix_model(limiter) or model.for_fixes(limiter)
    found, note = budget_fixes.fixes(limiter, ds, model), ""
    if not found and ds.iterators_per_worker < lim.ITERATORS_PER_WORKER_UP_TO:
        # It starved although the declared dataset cannot strand this much: more sampling
        # iterators read the table than declared, as Acme's repeat-interleave makes.
        ds = dataclasses.replace(ds, iterators_per_worker=lim.ITERATORS_PER_WORKER_UP_TO)
        found = budget_fixes.fixes(limiter, ds, model)
        note = (f" (judged with {ds.iterators_per_worker} sampling iterators per worker, as "
                "Acme's make_reverb_dataset before acme dea9307 runs: the declared dataset "
                "could not have starved)")
    if not found:
        return (f"The budget model calls this configuration safe for a {model.kind} loop, yet "
                "the learner starved: its loop waits in next() where that layout would not "
                "(declare the layout with --layout or TrainerProbe(layout=...) for proven "
                "fixes). One sampling worker (num_parallel_calls=1) cannot split a batch "
                "across workers; read the stored stacks."), []
    return (f"Any one of (each proven by the budget model{note}): "
            + "; ".join(f.text() for f in found) + "."), [f.document() for f in found]



def _loop_seen_in_next(case: TableCase, th: Thresholds) -> bool:
    """Sampling blocked, inserts stopped, and both dumps, taken since, show next()."""
    t, verdict = case.latest, case.stacks
    if verdict is None or not verdict.in_next or t.rate_limiter.inserts == 0 or can_sample(t, 1):
        return False
    onset = win.idle_since(case.history, inserts_of, samples_of)
    return t.observed_at - onset >= th.stall_window_s and verdict.requested_at >= onset


def _starvation_from_stacks(case: TableCase) -> Finding:
    t, verdict = case.latest, case.stacks
    assert verdict is not None and verdict.second is not None
    onset = win.idle_since(case.history, inserts_of, samples_of)
    evidence = {**limiter_evidence(t), **verdict.evidence(), "layout": "synchronous",
                "sample_headroom": sample_headroom(t),
                "seconds_without_progress": t.observed_at - onset}
    summary = (f"From stacks: the training loop is inside the iterator's next() "
               f"({verdict.second.where}) in two dumps a second apart, while sampling from "
               f"'{t.name}' is blocked and the loop, which inserts, cannot: parallel batching "
               "workers hold the samples it waits for.")
    fix = ("Set num_parallel_calls=1 in make_reverb_dataset: in a synchronous loop the table "
           "only gains sample credit after a learner step. Attach replaywatch's TrainerProbe "
           "to the learner's iterator to count the stranded samples.")
    return case.finding(kinds.WORKER_STARVATION, summary, evidence, fix, since=onset)


def is_writer_stalled(view: TargetView, th: Thresholds, now: float) -> Finding | None:
    """An actor sits inside a Reverb writer call for the stall window, not throttled.

    Not throttled: the Reverb server does not answer (a writer whose server went
    away blocks forever, reverb#4), or the limiter of the actor's table would
    have accepted an insert at every poll since the call began (`can_insert`).
    An actor held at max_diff by the limiter waits by design: insert_blocked. A server
    paused (checkpointing: unanswered, not refusing, within its grace) holds writers by
    design too; and a call that began while the limiter held inserts is the limiter's,
    whatever the server does after (a 10-minute first compile, then a server too busy to
    answer a poll, must not turn the actors it held into writer_stalled).
    """
    if paused_since(view, th, now) is not None:
        return None
    server_down = failing_since(view.polls, th) is not None
    stalled: list[tuple[ActorSnapshot, str]] = []
    for url in sorted(view.actors):
        history = win.actor_since_last_restart(view.actors[url])
        if not history or now - history[-1].observed_at > th.stall_window_s:
            continue  # a silent probe says nothing about its writer now
        a = history[-1]
        if a.in_call is None or a.blocked_for_s < th.stall_window_s:
            continue
        table = a.table if a.table is not None or len(view.tables) != 1 else next(
            iter(view.tables))
        entered = a.observed_at - a.blocked_for_s
        if _limiter_let_in(view, table, entered) or (
                server_down and not _limiter_held(view, table, entered)):
            stalled.append((a, table or ""))
    return _writer_stalled(view, stalled, server_down, now) if stalled else None


def _limiter_held(view: TargetView, table: str | None, since: float) -> bool:
    """Some answered snapshot of the table since `since` would have refused an insert."""
    points = win.window(view.tables.get(table or "", ()), since)
    return any(not can_insert(s, 1) for s in points)


def _limiter_let_in(view: TargetView, table: str | None, since: float) -> bool:
    """Every snapshot of the table since `since` (and the one before) would accept an insert."""
    points = win.window(view.tables.get(table or "", ()), since)
    return bool(points) and all(can_insert(s, 1) for s in points)


def _writer_stalled(view: TargetView, stalled: list[tuple[ActorSnapshot, str]],
                    server_down: bool, now: float) -> Finding:
    worst, table = max(stalled, key=lambda s: s[0].blocked_for_s)
    evidence = {
        "actors": [{"name": a.name, "probe": a.probe, "call": a.in_call,
                    "blocked_for_s": a.blocked_for_s, "pending_items": a.pending_items,
                    "table": t} for a, t in stalled],
        "call": worst.in_call, "blocked_for_s": worst.blocked_for_s,
        "pending_items": worst.pending_items, "server_down": server_down}
    why = (f"the Reverb server '{view.target}' does not answer" if server_down else
           f"the rate limiter of '{table}' would accept inserts")
    summary = (f"Actor '{worst.name}' is stuck inside the writer's {worst.in_call}() while {why}"
               f"{f' ({len(stalled)} actors)' if len(stalled) > 1 else ''}: its writer, not the "
               "limiter, holds it.")
    fix = (f"Check the Reverb server at {view.target} and the actor's connection to it: a "
           "writer whose server went away blocks in create_item/flush forever (reverb#4) and "
           "end_episode() can hang (reverb#144). Restart the actor's client (and the server if "
           "it is gone); pass timeout_ms to flush()/end_episode() so a lost server raises.")
    return kinds.WRITER_STALLED.finding(view.target, table, summary, evidence, fix,
                                        since=worst.observed_at - worst.blocked_for_s,
                                        last_seen=now)


RULES = (
    Rule(kinds.WORKER_STARVATION, is_worker_starvation, Shape.TABLE_STALL),
    Rule(kinds.WRITER_STALLED, is_writer_stalled, Shape.VIEW),
)
