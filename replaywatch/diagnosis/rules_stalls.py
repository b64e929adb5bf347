"""Stalls seen from Reverb: sample_blocked, insert_blocked, spi_drift, warmup, stale_data.

Stalls are judged by progress (insert and sample counters that did not move for the whole
stall window, proven by snapshots at both ends); `table_worker_time` only says which side
waits, because a healthy synchronous loop waits for inserts ~98% of the time too. Each rule is
a predicate in Reverb's words, then its explanation: the summary (stable facts only, so an open
finding is not rewritten every poll), the evidence (the moving numbers) and the fix.
"""

from __future__ import annotations

from typing import Any

from replaywatch.diagnosis import actors as act
from replaywatch.diagnosis import kinds, rules_config
from replaywatch.diagnosis import ratelimiter as lim
from replaywatch.diagnosis import window as win
from replaywatch.diagnosis.case import TableCase, limiter_evidence, worker_waited
from replaywatch.diagnosis.consumption import consumed_since
from replaywatch.diagnosis.ratelimiter import (
    can_insert,
    can_sample,
    insert_headroom,
    is_insert_blocking_disabled,
    is_warming_up,
    sample_headroom,
)
from replaywatch.diagnosis.registry import Rule, Shape
from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.diagnosis.window import inserts_of, samples_of
from replaywatch.model import FLOAT_MAX, Finding, TableSnapshot


def is_sample_blocked(case: TableCase, th: Thresholds) -> Finding | None:
    """The learner wants samples, the limiter refuses, and nothing inserts: training stopped.

    Blocked means `not can_sample(table, 1)`: below `min_size_to_sample`, or
    `cursor - 1 < min_diff`. Someone wants samples when the table worker kept
    `waiting_for_inserts`, or a probe reading the table is blocked in next().
    Inserts must have *stopped*: a table that never had an insert is a job whose
    actors are still starting (distributed actors take 10-30 s to import and
    connect), and calling that a stall was our one false alarm on healthy runs.
    Which of the inserting side's failures it is (dead actors, actors waiting on
    the learner, a synchronous loop blocked in next()) is worker_starvation's or
    writer_stalled's to prove; when neither can, this finding names the
    possibilities the known layout leaves (layout.resolve), as equals when the
    layout is unknown, and what would settle them.
    """
    t = case.latest
    if t.rate_limiter.inserts == 0:
        return None
    idle = win.idle_for(case.history, inserts_of, samples_of)
    if idle < th.stall_window_s or can_sample(t, 1) or not samples_wanted(case, th):
        return None
    return _sample_blocked(case, idle, th)


def samples_wanted(case: TableCase, th: Thresholds) -> bool:
    """The table worker kept waiting for inserts, or a learner waits in next()."""
    return (worker_waited(case, "waiting_for_inserts", th)
            or any(p[-1].blocked_in_next for p in case.probes))


def _sample_blocked(case: TableCase, idle: float, th: Thresholds) -> Finding:
    t = case.latest
    needed = lim.inserts_to_sample(t)
    known = rules_config.known_layout(case)
    synchronous = rules_config.loop_is_synchronous(case)
    evidence: dict[str, Any] = {
        **limiter_evidence(t), "sample_headroom": sample_headroom(t), "inserts_needed": needed,
        "seconds_without_progress": idle, **known.evidence(),
        "trainer_probes": [h[-1].probe for h in case.probes] or None}
    if not known.known:
        evidence["layout"] = "synchronous (max_diff at float max)" if synchronous else "unknown"
    stranded = lim.stranded_samples(case.history, [h[-1] for h in case.probes])
    if stranded is not None:
        evidence.update(stranded.evidence())
    if lim.is_queue(t):
        # Each item is sampled once: what the learner's client drew and has not delivered
        # as batches is the queue's too, though the table's size no longer counts it.
        evidence["queue"] = True
        evidence["items_in_learner_client"] = (
            None if stranded is None else stranded.drawn - stranded.delivered)
    if case.actors and not synchronous:  # a synchronous loop's own probe is not an actor's
        evidence.update(act.evidence(case.actors, th, case.now))
    if synchronous:
        summary, fix = _loop_text(case, needed)
    elif known.known:
        summary, fix = _actors_text(case, needed, stranded)
    else:
        summary, fix = _unknown_layout_text(case, needed, stranded)
    return case.finding(kinds.SAMPLE_BLOCKED, summary, evidence, fix, since=t.observed_at - idle)


def _loop_text(case: TableCase, needed: int) -> tuple[str, str]:
    """Synchronous layout: one loop inserts and samples, so speak of the loop, not actors."""
    t = case.latest
    blocked = [h[-1] for h in case.probes if h[-1].blocked_in_next]
    summary = (f"Sampling from table '{t.name}' is blocked by the rate limiter and inserts have "
               "stopped. The layout is synchronous: the loop that inserts is the loop that "
               "samples, so it is not inserting.")
    if blocked:
        summary += (f" The loop is blocked in next() ('{blocked[0].name}') with less than a "
                    "batch stranded by its batching workers.")
        fix = (f"Read the loop's stacks (GET {blocked[0].probe}/stacks, kept with this "
               "incident): a batching pipeline that waits on something other than Reverb (a "
               "filter, another table), or an iterator created before the table could sample. "
               f"{needed} more insert(s) would let the next sample through.")
        return summary, fix
    if not case.probes:
        summary += (" From Reverb alone this is also how worker starvation looks; attach the "
                    "trainer probe (or give --trainer-pid) to tell them apart.")
    fix = ("Either the loop is blocked in the iterator's next() while parallel batching "
           "workers hold the samples it needs (worker starvation: fewer num_parallel_calls or "
           "a wider limiter), or the loop crashed or hangs elsewhere (its logs)"
           + ("" if case.probes else ", or, in a job that started minutes ago, its first "
              "learner step is still compiling")
           + f". {needed} more insert(s) would let the next sample through. To settle it: ")
    fix += ("read the loop's stacks (kept with this incident)." if case.probes else
            "attach replaywatch's TrainerProbe to the learner's iterator, or run the sidecar "
            "with --trainer-pid: two stack dumps of the loop inside next() name it.")
    return summary, fix


def _actors_text(case: TableCase, needed: int, stranded: lim.Stranded | None
                 ) -> tuple[str, str]:
    """Asynchronous layout (known from actor probes or declared): the actors insert."""
    # The summary holds stable facts only (an open finding is not rewritten every poll): each
    # actor's state and the stranded count are in the evidence.
    t = case.latest
    summary = (f"Sampling from table '{t.name}' is blocked by the rate limiter and inserts have "
               "stopped: the actors are dead, stuck or too slow.")
    if stranded is not None and stranded.samples > 0:
        summary += (" Samples were drawn and never delivered to the learner (evidence: "
                    "stranded_samples).")
    fix = (f"Restart or unblock the actors and check their logs ({needed} more insert(s) "
           "would let the next sample through); if live actors wait on the learner (a "
           "policy-lag bound, a parameter hand-off), parallel batching workers strand the "
           "samples it needs (worker starvation). ")
    if not case.actors:
        fix += ("To settle it, attach replaywatch's ActorProbe to the actors (mark the wait with "
                "probe.waiting(\"learner\")): live actors waiting on the learner mean worker "
                "starvation, dead or silent ones mean restart them.")
    else:
        fix += ("The actor probes show who is down or silent; an actor that waits on the "
                "learner without probe.waiting(...) looks silent: read its stacks (GET /stacks).")
    return summary, fix


def _unknown_layout_text(case: TableCase, needed: int, stranded: lim.Stranded | None
                         ) -> tuple[str, str]:
    """Layout unknown, max_diff finite: a synchronous loop and dead actors look the same."""
    t = case.latest
    summary = (f"Sampling from table '{t.name}' is blocked by the rate limiter and inserts have "
               "stopped. Two readings fit these numbers equally: a synchronous loop (it "
               "inserts and samples, and waits in next()), or actors that died, hang or wait "
               "on the learner.")
    if stranded is not None and stranded.samples > 0:
        summary += " Samples were drawn and never delivered (evidence: stranded_samples)."
    fix = (f"{needed} more insert(s) would let the next sample through. If it is a "
           "synchronous loop: parallel batching workers hold the samples it waits for "
           "(replaywatch predict gives the fix); if actors insert: restart or unblock them. "
           "To settle it: wrap the loop's writer with the trainer probe "
           "(probe.wrap_writer / wrap_client / wrap_builder) or give --layout; attach "
           "ActorProbe to the actors; or give --trainer-pid (its stacks show whether the "
           "thread in next() is the one that inserts).")
    return summary, fix


def is_insert_blocked(case: TableCase, th: Thresholds) -> Finding | None:
    """Actors wait at max_diff and the learner draws nothing: the learner stopped consuming.

    Blocked means `not can_insert(table, 1)`: `cursor + samples_per_insert >
    max_diff` with the table past `min_size_to_sample`; the table worker kept
    `waiting_for_sampling`, so inserts are queued behind it.
    """
    t = case.latest
    idle = case.resting_s()
    if (idle < th.stall_window_s or can_insert(t, 1)
            or not worker_waited(case, "waiting_for_sampling", th)):
        return None
    return _insert_blocked(case, idle)


def _insert_blocked(case: TableCase, idle: float) -> Finding:
    t = case.latest
    needed = lim.samples_to_insert(t)
    summary = (f"Inserts into table '{t.name}' are blocked at max_diff and sampling has stopped: "
               "the learner is not consuming.")
    fix = (f"Check the learner: {needed} sample(s) would let the next insert through. Attach "
           "the trainer probe and read GET /stacks to see whether it waits in next() or hangs "
           "in its update step.")
    evidence = {**limiter_evidence(t), "insert_headroom": insert_headroom(t),
                "samples_needed": needed, "seconds_without_progress": idle}
    return case.finding(kinds.INSERT_BLOCKED, summary, evidence, fix, since=t.observed_at - idle)


def is_warmup(case: TableCase, th: Thresholds) -> Finding | None:
    """Below min_size_to_sample while actors insert: the learner waits by design, not a stall."""
    t = case.latest
    points = win.window(case.history, t.observed_at - th.stall_window_s)
    if not is_warming_up(t) or win.increase(points, inserts_of) <= 0:
        return None
    return _warmup(case, points)


def _warmup(case: TableCase, points: tuple) -> Finding:
    t, rl = case.latest, case.latest.rate_limiter
    inserted, secs = win.increase(points, inserts_of), win.span(points)
    rate = inserted / secs if secs > 0 else None
    missing = rl.min_size_to_sample - t.current_size
    evidence = {**limiter_evidence(t), "insert_rate_per_s": rate, "items_missing": missing,
                "eta_s": missing / rate if rate else None}
    summary = (f"Table '{t.name}' is filling up to min_size_to_sample "
               f"({rl.min_size_to_sample} items); sampling waits by design.")
    warm = [s for s in case.history if is_warming_up(s)]
    return case.finding(kinds.WARMUP, summary, evidence, "Nothing to fix: wait.",
                        since=warm[0].observed_at)


def is_spi_drift(case: TableCase, th: Thresholds) -> Finding | None:
    """Samples per insert stayed off the configured ratio: learner and actors out of balance.

    With tolerance `error_buffer / (spi * min_size)` (Acme's
    `samples_per_insert_tolerance_rate`), it holds when over the whole window
    `|observed / spi - 1| > tolerance` and `|spi * inserts - samples|` exceeds
    the error_buffer, so post-warm-up catch-up (at most one buffer) is not drift.
    A blocking limiter keeps this bounded by its slack; it drifts when inserts
    never block (synchronous layout) and the learner falls behind. Where trainer probes
    cover the window, the samples are the ones the learner took (consumption.py): the
    server's count includes what its prefetch drew ahead; their difference over the window
    (the pipeline's buffers filling or draining) is allowed on top.
    """
    t, start = case.latest, case.latest.observed_at - th.spi_window_s
    rl, tol = t.rate_limiter, lim.spi_tolerance(t)
    if tol is None or not lim.is_sample_limited(t) or not win.covers(case.history, start):
        return None
    points = win.window(case.history, start)
    inserted = win.increase(points, inserts_of)
    if any(is_warming_up(s) for s in points) or inserted < th.spi_min_inserts:
        return None
    server = win.increase(points, samples_of)
    taken = consumed_since(list(case.probes), points[0].observed_at)
    sampled = server if taken is None else taken
    # What the learner's pipeline took in or gave out over the window, where the samples are
    # the learner's: its buffers (prefetch, sampler queues, interleave) fill and drain by
    # thousands of samples in a healthy job (make bench-long's async run: 2,336 over 10 s
    # against a slack of 2,048), and they are bounded: the learner's count leads or lags the
    # server's by them, and only drift beyond them is the learner's own.
    swing = abs(server - sampled)
    observed, gap = sampled / inserted, rl.samples_per_insert * inserted - sampled
    if (abs(observed / rl.samples_per_insert - 1) <= tol
            or abs(gap) <= drift_allowed(t) + swing):
        return None
    return _spi_drift(case, points, tol, inserted, server, taken)


def drift_allowed(t: TableSnapshot) -> float:
    """How far `spi * inserts - samples` may move over a window without being drift.

    A blocking limiter lets the cursor roam its whole slack (`max_diff - min_diff`, twice
    the error_buffer for SampleToInsertRatio) and no further: within it the limiter is
    doing its job. Where inserts never block, the error_buffer is the configured tolerance.
    """
    return lim.error_buffer(t) if is_insert_blocking_disabled(t) else lim.limiter_slack(t)


def _spi_drift(case: TableCase, points: tuple, tol: float, inserted: float, server: float,
               taken: float | None) -> Finding:
    t, rl = case.latest, case.latest.rate_limiter
    sampled = server if taken is None else taken
    observed, gap = sampled / inserted, rl.samples_per_insert * inserted - sampled
    side = "the learner samples less" if gap > 0 else "the learner samples more"
    evidence = {**limiter_evidence(t), "observed_samples_per_insert": observed,
                "tolerance_rate": tol, "window_s": win.span(points), "inserts": inserted,
                "samples": sampled, "sample_deficit": gap, "drift_allowed": drift_allowed(t),
                "pipeline_swing": None if taken is None else abs(server - taken),
                "samples_counted_by": "the server (its prefetch included)" if taken is None
                else "the learner's batches (trainer probe)",
                "server_samples": server}
    summary = (f"Table '{t.name}' is sampled off its configured {rl.samples_per_insert:g} "
               f"samples per insert by more than {tol * 100:.3g}%: {side} than configured.")
    fix = ("Balance the loop: speed up the learner (or slow the actors) until samples per "
           "insert returns to the configured ratio, or lower samples_per_insert.")
    return case.finding(kinds.SPI_DRIFT, summary, evidence, fix, since=points[0].observed_at)


def limiter_kind(t: TableSnapshot) -> str:
    """MinSize never holds samples back (min_diff -float max, max_diff float max)."""
    rl = t.rate_limiter
    if rl.min_diff <= -FLOAT_MAX * 0.5 and rl.max_diff >= FLOAT_MAX * 0.5:
        return "MinSize"
    return "SampleToInsertRatio"


def is_stale_data(case: TableCase, th: Thresholds) -> Finding | None:
    """No insert for the stall window while the learner keeps sampling: it trains on old data.

    A limiter that never blocks sampling (MinSize, or a SampleToInsertRatio window wide
    enough) hides dead actors: nothing hangs, the same items are sampled over and over
    (instadeepai/Mava#801). Not before the first insert, not in warm-up, and not once the
    limiter refuses samples: a ratio limiter whose credit ran out is sample_blocked's
    business, a window later, and warning about it first would be noise.
    """
    t = case.latest
    if t.rate_limiter.inserts == 0 or lim.is_warming_up(t) or not lim.can_sample(t, 1):
        return None
    idle = win.idle_for(case.history, inserts_of)
    if idle < th.stall_window_s or win.idle_for(case.history, samples_of) >= th.stall_window_s:
        return None
    if sampling_since(case, idle) < th.stall_window_s:
        return None
    return _stale_data(case, idle)


def sampling_since(case: TableCase, idle: float) -> float:
    """Seconds since sampling went on after the last insert.

    Both counters resting is not stale data: a synchronous loop whose first step took a
    minute inserted nothing meanwhile, then samples its credit before it inserts again.
    """
    t = case.latest
    after = [s for s in case.history if s.observed_at >= t.observed_at - idle]
    moved = next((a for a, b in zip(after, after[1:]) if samples_of(b) > samples_of(a)), None)
    return 0.0 if moved is None else t.observed_at - moved.observed_at


def _stale_data(case: TableCase, idle: float) -> Finding:
    t = case.latest
    onset = t.observed_at - idle
    at_onset = next(s for s in case.history if s.observed_at >= onset)
    drawn = samples_of(t) - samples_of(at_onset)
    evidence = {**limiter_evidence(t), "seconds_since_last_insert": idle,
                "samples_since_last_insert": drawn,
                "times_each_item_sampled_since": drawn / t.current_size if t.current_size else None,
                "limiter": limiter_kind(t)}
    summary = (f"No actor has inserted into table '{t.name}' while the learner keeps sampling "
               f"it ({limiter_kind(t)} limiter): it trains on a frozen table.")
    fix = (f"Restart the actors feeding '{t.name}' (dead or stuck: check their logs); the "
           "learner keeps training on the same items until they insert again.")
    return case.finding(kinds.STALE_DATA, summary, evidence, fix, since=onset)


RULES = (
    Rule(kinds.SAMPLE_BLOCKED, is_sample_blocked, Shape.TABLE_STALL),
    Rule(kinds.INSERT_BLOCKED, is_insert_blocked, Shape.TABLE_STALL),
    Rule(kinds.SPI_DRIFT, is_spi_drift, Shape.TABLE_STALL),
    Rule(kinds.WARMUP, is_warmup, Shape.TABLE_STALL),
    Rule(kinds.STALE_DATA, is_stale_data, Shape.TABLE_STALL),
)
