"""Start-up and restarts: can the job start, is it starting, was its server restarted.

    warmup_impossible   max_size < min_size_to_sample: one snapshot proves it never starts
    learner_starting    no learner has finished its first step: blocked is start-up, for a while
    (as_first_step)     Reverb alone, a synchronous loop's first step: sample_blocked as info
    server_restarted    the server was replaced or restored from a checkpoint
    reconnecting        the server came back and its clients are reconnecting: stalls wait

Reverb's table worker accounts for all of its time in one of its states, so the sum of
`table_worker_time` is the server's uptime (measured on Reverb 0.14: 2036 ms after 2.03 s).
That says, from `TableInfo` alone, when the table's counters started and whether a poll
reached a new server even when its counters did not go back (a restored checkpoint).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from replaywatch.diagnosis import kinds, rules_config
from replaywatch.diagnosis import ratelimiter as lim
from replaywatch.diagnosis import window as win
from replaywatch.diagnosis.case import Probe, TableCase, limiter_evidence
from replaywatch.diagnosis.registry import Rule, Shape
from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.diagnosis.window import TargetView, inserts_of, samples_of
from replaywatch.model import Finding, ProbeSnapshot, Severity, TableSnapshot

# A fresh server's counters start at zero, so at its first poll it has inserted at most what
# the actors insert per second times its uptime; a restore shows counters far beyond
# (reverb#118: 100073 inserts on a server one poll old). The actors' rate is the old server's
# fastest between two polls (its lifetime average hides a job that idled: a restore 0.9 s
# after the stop of a server 8 s old was taken for a replacement), with this much margin for
# a restarted job that inserts faster than before. Clients reconnect seconds after a
# restart, so a fresh server polled in its first second has inserted almost nothing.
RESTORE_FACTOR = 3.0
RATE_INTERVAL_S = 0.5  # shorter poll intervals make a rate of noise


def uptime_s(t: TableSnapshot) -> float:
    """Seconds since the server started, from the table worker's time in all its states."""
    return win.worker_ms(t) / 1000.0


# -- warmup_impossible -------------------------------------------------------------------------

def is_warmup_impossible(case: TableCase, th: Thresholds) -> Finding | None:
    """The table can never hold `min_size_to_sample` items: the learner waits forever.

    Inserts past `max_size` evict the oldest items, so `current_size` stops at
    `max_size`; with `max_size < min_size_to_sample` Reverb's `CanSample` is never
    true and this looks like warm-up that never ends (alf PR#1737, dreamerv3#117).
    """
    t = case.latest
    if t.max_size >= t.rate_limiter.min_size_to_sample:
        return None
    rl = t.rate_limiter
    summary = (f"Table '{t.name}' holds at most {t.max_size} items but sampling waits for "
               f"{rl.min_size_to_sample} (min_size_to_sample): the learner can never sample.")
    fix = (f"Raise max_size of '{t.name}' to at least {rl.min_size_to_sample}, or lower "
           f"min_size_to_sample (Acme: min_replay_size) to at most {t.max_size}.")
    evidence = {**limiter_evidence(t), "max_size": t.max_size,
                "items_short": rl.min_size_to_sample - t.max_size}
    return case.finding(kinds.WARMUP_IMPOSSIBLE, summary, evidence, fix,
                        since=case.history[0].observed_at)


# -- learner_starting --------------------------------------------------------------------------

def _past_first_step(s: ProbeSnapshot) -> bool:
    """A learner stepped once, or came back for a second batch (so its first step ended).

    Either signal is enough: a trainer that never marks steps still asks for batches.
    """
    return s.learner_steps >= 1 or s.batches_retrieved >= 2


def has_finished_first_step(p: Probe) -> bool:
    return _past_first_step(p[-1])


def first_step_seen_at(case: TableCase) -> float | None:
    """The poll that first showed a learner through its first step, if the view holds it.

    The newest such change of any probe (a restarted trainer starts over); None when every
    probe was already past it at the start of the view, or is not yet.
    """
    seen = [cur.observed_at for p in case.probes for prev, cur in zip(p, p[1:])
            if _past_first_step(cur) and not _past_first_step(prev)]
    return max(seen, default=None)


# Poll intervals of learner-paced sampling that make a learner that steps. A first fill of
# the pipeline, drawn while the limiter has credit to spare, lands within one poll, or two when
# large items take a while to travel (84x84x9 frames: 1 MiB responses); several more are a
# learner coming back for batch after batch.
PACED_POLLS = 4


def learner_paced_polls(points: Sequence[TableSnapshot]) -> int:
    """Poll intervals in which samples were drawn and the limiter could still sample at the
    end: draws the learner asked for, not draws waiting on the limiter's credit."""
    return sum(1 for a, b in zip(points, points[1:])
               if samples_of(b) > samples_of(a) and lim.can_sample(b))


def sampling_has_flowed(case: TableCase, th: Thresholds) -> bool:
    """Reverb alone: the learner has trained, not only filled its pipeline once.

    Asynchronous layout: a tf.data pipeline draws its first batches (`num_parallel_calls`
    workers and the prefetch buffer: 768 samples in our agent) before the learner's first
    step ends, then draws nothing while that step compiles and the actors run ahead to
    max_diff. That fill is one burst: with credit to spare the workers take it within a poll;
    with none, it is drawn as the actors' inserts release it, every draw waiting on the
    limiter. So sampling is a learner that steps once it was drawn with credit to spare in
    `PACED_POLLS` poll intervals (a learner that trains for 5 s and hangs is judged as a
    hang), or seen moving for a whole stall window: a learner faster than its actors draws
    every sample as it is released, which from Reverb alone looks like a slow first fill
    until then (a trainer probe tells at once). Synchronous layout: any sample counts. There
    a loop that drew samples and stopped inserting is, from Reverb alone, the seed's
    stranded workers or a first compile; the one that pages is the one that must
    (sample_blocked says both).
    """
    t = case.latest
    if t.rate_limiter.samples == 0:
        return False
    if lim.is_insert_blocking_disabled(t):
        return True
    return (learner_paced_polls(case.history) >= PACED_POLLS
            or win.progressing_s(case.history, samples_of) >= th.stall_window_s)


def startup_began(case: TableCase, th: Thresholds) -> tuple[float, str] | None:
    """When the grace started and why; None once a learner has finished its first step.

    With probes: the newest trainer's `started_at` (its process's own clock: a sidecar
    started late, or restarted, does not hand a hung learner a fresh grace). Reverb alone:
    sampling not yet seen flowing (at most a first fill of the pipeline) since the counters
    started, which began `uptime_s` before the poll.
    """
    if case.probes:
        if any(has_finished_first_step(p) for p in case.probes):
            return None
        return max(p[-1].started_at for p in case.probes), "probe started_at"
    t = case.latest
    if sampling_has_flowed(case, th):
        return None
    if uptime_s(t) > 0:
        return t.observed_at - uptime_s(t), "server uptime (table worker time)"
    return case.history[0].observed_at, "first sight of the table"


def is_learner_starting(case: TableCase, th: Thresholds,
                        stalls: Sequence[Finding]) -> Finding | None:
    """No learner finished its first step yet: blocked inserts or an idle learner are start-up.

    A JAX learner's first jit compile takes from seconds to many minutes (acme#212: 20)
    while actors run ahead to max_diff. It holds for `startup_grace_s`; a learner still
    not through its first step then is hung, and the usual critical finding opens.
    `stalls` are this table's stall findings; the ones start-up explains it stands down.
    """
    began = startup_began(case, th)
    if began is None:
        return _first_step_just_ended(case, th, stalls)
    if case.now - began[0] >= th.startup_grace_s:
        return None
    held = _held(case, stalls)
    return _learner_starting(case, began, held, th) if held else None


def _held(case: TableCase, stalls: Sequence[Finding]) -> list[str]:
    """The stall findings start-up explains on this table now: blocked inserts, a learner
    stalled in next(), and sample_blocked when a probe shows the learner busy outside
    next() (a synchronous loop compiling its first step stops inserting). A learner waiting
    in next() for data, or what Reverb alone sees, waits on the actors: sample_blocked
    stands."""
    explained = {kinds.Name.INSERT_BLOCKED, kinds.Name.LEARNER_STALLED}
    if any(not p[-1].blocked_in_next for p in case.probes):
        explained.add(kinds.Name.SAMPLE_BLOCKED)
    return sorted({f.kind for f in stalls if f.kind in explained})


def _first_step_just_ended(case: TableCase, th: Thresholds,
                           stalls: Sequence[Finding]) -> Finding | None:
    """Start-up's hand-off: stalls are timed from the end of the first step, not before it.

    The stall rules time a stall from the last insert or sample, and nothing moves while a
    first step runs (the pipeline's first fill waits in its buffer, actors rest at max_diff).
    So the poll that first shows the step done finds every counter resting as long as
    start-up lasted, while the learner is only now taking the batches it buffered: the
    bench's healthy 60 s first step paged insert_blocked for that one poll. For one stall
    window after the first step the same findings stay start-up; a learner that then still
    moves nothing has had its full window.
    """
    ended = first_step_seen_at(case)
    if ended is None or case.now - ended >= th.stall_window_s:
        return None
    held = _held(case, stalls)
    if not held:
        return None
    t = case.latest
    start = max(p[-1].started_at for p in case.probes)
    evidence = {**limiter_evidence(t), "grace_started_at": start, "grace_basis": "probe started_at",
                "first_step_seen_at": ended,
                "stall_clock_starts_in_s": th.stall_window_s - (case.now - ended),
                "would_be": held, "samples": t.rate_limiter.samples,
                "learner_steps": [p[-1].learner_steps for p in case.probes],
                "batches_retrieved": [p[-1].batches_retrieved for p in case.probes]}
    summary = (f"The learner on table '{t.name}' has just finished its first step (seen "
               f"{case.now - ended:.0f} s ago): the counters rested through start-up, so a "
               "stall is timed from the first step, not before it.")
    fix = (f"Wait: if nothing moves for {th.stall_window_s:g} s after the first step, this "
           f"becomes {' / '.join(held)}.")
    return case.finding(kinds.LEARNER_STARTING, summary, evidence, fix, since=start)


def _learner_starting(case: TableCase, began: tuple[float, str], held: list[str],
                      th: Thresholds) -> Finding:
    t, (start, basis) = case.latest, began
    evidence = {**limiter_evidence(t), "grace_started_at": start, "grace_basis": basis,
                "sampling_seen_flowing_s": win.progressing_s(case.history, samples_of),
                "learner_paced_polls": learner_paced_polls(case.history),
                "grace_left_s": th.startup_grace_s - (case.now - start),
                "startup_grace_s": th.startup_grace_s, "would_be": held,
                "samples": t.rate_limiter.samples,
                "learner_steps": [p[-1].learner_steps for p in case.probes],
                "batches_retrieved": [p[-1].batches_retrieved for p in case.probes]}
    summary = (f"No learner on table '{t.name}' has finished its first step yet: the stall "
               "is start-up (a first compile), not a hang, until the grace ends.")
    fix = (f"Wait: if the learner has not finished a step {th.startup_grace_s:g} s after it "
           f"started, this becomes {' / '.join(held)}.")
    return case.finding(kinds.LEARNER_STARTING, summary, evidence, fix, since=start)


def first_draw_at(case: TableCase) -> float | None:
    """When the sidecar saw the table's first samples drawn; None when it did not (it came
    after them, or none were drawn)."""
    if samples_of(case.history[0]) > 0:
        return None
    return next((t.observed_at for t in case.history if samples_of(t) > 0), None)


def as_first_step(found: list[Finding], case: TableCase, th: Thresholds) -> list[Finding]:
    """Reverb alone, a synchronous loop that drew its first batch and has inserted nothing
    since: sample_blocked is said, as info, until `startup_grace_s` after that draw.

    From the server a loop taking its first (compiling) step and a loop hung in its first
    next() with the samples stranded in its batching workers (the seed's hang) are the same
    counters: samples drawn once, inserts stopped, samplers waiting. Paging the first would
    page every healthy job whose first step outlasts the stall window; saying nothing would
    hide the second. So the finding is named at once with both readings and what settles
    them, and pages once the grace is spent; a loop seen inserting after its first draw has
    finished a step and is judged by its rhythm, and a trainer probe tells the two apart
    from its first poll.
    """
    if case.probes or not rules_config.loop_is_synchronous(case):
        return found
    drawn = first_draw_at(case)
    if drawn is None or case.now - drawn >= th.startup_grace_s:
        return found
    after = [t for t in case.history if t.observed_at >= drawn]
    if inserts_of(after[-1]) > inserts_of(after[0]):
        return found
    left = th.startup_grace_s - (case.now - drawn)
    extra = {"first_step_or_hang": True, "first_draw_at": drawn,
             "pages_in_s": round(left, 1), "startup_grace_s": th.startup_grace_s}
    note = (f" Nothing was inserted since the loop drew its first samples "
            f"{case.now - drawn:.0f} s ago: from Reverb alone its first step (a compile) and "
            "a hang in its first next() look the same, so this pages only if nothing moves "
            f"for startup_grace_s ({th.startup_grace_s:g} s) after that draw.")
    return [dataclasses.replace(f, severity=Severity.INFO, summary=f.summary + note,
                                evidence={**f.evidence, **extra})
            if f.kind == kinds.Name.SAMPLE_BLOCKED else f for f in found]


# -- server_restarted ---------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Restart:
    """The last snapshot of the old server and the first of the new one."""

    before: TableSnapshot
    after: TableSnapshot
    latest: TableSnapshot
    restored: bool | None  # None: the old server's insert rate is unknown


def last_restart(points: Sequence[TableSnapshot]) -> Restart | None:
    """The newest server change in a table's history (counters or uptime went back), and
    whether it was a restore."""
    i = win.last_reset_index(points)
    if i == 0:
        return None
    before, after = points[i - 1], points[i]
    rate = old_insert_rate(points[win.last_reset_index(points[:i]):i])
    restored = None
    if rate is not None:
        # Floored at 0.1 s: a server polled in its first milliseconds has no time to count.
        fresh_most = RESTORE_FACTOR * rate * max(uptime_s(after), 0.1)
        restored = inserts_of(after) > fresh_most
    return Restart(before, after, points[-1], restored)


def old_insert_rate(old: Sequence[TableSnapshot]) -> float | None:
    """The old server's fastest inserts per second: between two of its polls, or over its
    lifetime; None when neither is known (one snapshot of a server with no uptime)."""
    rates = [(inserts_of(b) - inserts_of(a)) / (b.observed_at - a.observed_at)
             for a, b in zip(old, old[1:]) if b.observed_at - a.observed_at >= RATE_INTERVAL_S]
    if old and uptime_s(old[-1]) > 0:
        rates.append(inserts_of(old[-1]) / uptime_s(old[-1]))
    return max(rates) if rates else None


def is_server_restarted(view: TargetView, th: Thresholds, now: float) -> Finding | None:
    """The server behind the address was replaced or restored within the startup grace.

    The rules judge each table from the restart on (its rates never go negative); this
    says that it happened, with the counters before and after.
    """
    seen = {name: r for name, h in sorted(view.tables.items())
            if (r := last_restart(h)) is not None
            and now - r.after.observed_at < th.startup_grace_s}
    return _server_restarted(view, seen, now) if seen else None


def restart_evidence(r: Restart) -> dict[str, Any]:
    """Before/after counters; after a restore, the inserts the limiter needs to sample again."""
    counters = lambda t: {"inserts": t.rate_limiter.inserts,  # noqa: E731
                          "samples": t.rate_limiter.samples, "current_size": t.current_size,
                          "cursor": lim.cursor(t), "observed_at": t.observed_at}
    out: dict[str, Any] = {"before": counters(r.before), "after": counters(r.after),
                           "restored_from_checkpoint": r.restored}
    if r.restored:
        out["inserts_to_unblock"] = lim.inserts_to_sample(r.latest)
    return out


def _server_restarted(view: TargetView, seen: dict[str, Restart], now: float) -> Finding:
    restored = any(r.restored for r in seen.values())
    how = "restored from a checkpoint" if restored else "replaced (counters start again)"
    summary = (f"The Reverb server at '{view.target}' restarted: {how}. Its tables are "
               "judged from the restart on.")
    fix = "Nothing, if the restart was intended."
    unblock = {n: e["inserts_to_unblock"] for n, r in seen.items()
               if (e := restart_evidence(r)).get("inserts_to_unblock")}
    if unblock:
        fix += " Sampling waits until " + ", ".join(
            f"{n} gets {k} more insert(s)" for n, k in unblock.items()) + "."
    evidence = {"tables": {n: restart_evidence(r) for n, r in seen.items()}}
    return kinds.SERVER_RESTARTED.finding(
        view.target, "", summary, evidence, fix,
        since=min(r.after.observed_at for r in seen.values()), last_seen=now)


def with_restore_evidence(found: list[Finding], points: Sequence[TableSnapshot]) -> list[Finding]:
    """After a restore, sample_blocked says how many inserts unblock the restored limiter."""
    r = last_restart(points)
    if r is None or not r.restored:
        return found
    extra = {"restored_from_checkpoint": True,
             "inserts_to_unblock": lim.inserts_to_sample(r.latest)}
    return [dataclasses.replace(f, evidence={**f.evidence, **extra})
            if f.kind == kinds.Name.SAMPLE_BLOCKED else f for f in found]


# -- reconnecting -------------------------------------------------------------------------------

# What a server coming back explains while its clients reconnect: a writer still inside the
# call it made to the old server, and every stall that follows from clients not yet talking
# to the new one. Configuration findings and the down rules are not among them.
RECONNECT_EXPLAINS = frozenset(kinds.RECONNECTING.supersedes)


def is_reconnecting(case: TableCase, th: Thresholds,
                    stalls: Sequence[Finding]) -> Finding | None:
    """The server came back less than its grace ago: its stalls are the coming back.

    A new server (a restart or a restore) gets `reconnect_grace_s`. Measured on Reverb 0.14
    with a checkpoint restore on the same port: clients reconnect about 12 s after the stop
    whatever the dark time (2-6 s dark, 5 runs), and an actor's writer stays inside its call
    until then, so writer_stalled opened on every restore. The same server answering again
    after an outage gets one stall window: its clients' channels never broke (after a
    SIGSTOP of 3, 8 and 20 s their inserts and samples went on within 0.1 s), but a window
    that still spans the dark time shows no progress that the clients could have made.
    """
    if case.came_back_at is None:
        return None
    grace = _grace_s(case, th)
    if case.now - case.came_back_at >= grace:
        return None
    held = sorted({f.kind for f in stalls if f.kind in RECONNECT_EXPLAINS})
    if not held:
        return None
    t, ago = case.latest, case.now - case.came_back_at
    evidence = {**limiter_evidence(t), "came_back_at": case.came_back_at,
                "came_back_how": case.came_back_how, "seconds_since": ago,
                "grace_s": grace, "grace_left_s": grace - ago,
                "reconnect_grace_s": th.reconnect_grace_s, "would_be": held,
                "inserts": t.rate_limiter.inserts, "samples": t.rate_limiter.samples}
    if case.came_back_how == "outage":
        summary = (f"The Reverb server at '{case.target}' answered again after an outage "
                   f"{ago:.0f} s ago; its clients go on at once, but the stall window still "
                   f"spans the dark time, which is why {' / '.join(held)} would be raised.")
    else:
        how = "restarted (see server_restarted)" if case.came_back_how == "restart" else \
            "came back"
        summary = (f"The Reverb server at '{case.target}' {how} {ago:.0f} s ago; clients of "
                   f"'{t.name}' are still reconnecting, which is why {' / '.join(held)} "
                   "would be raised.")
    fix = (f"Wait: if it still holds {grace:g} s after the server came back, this becomes "
           f"{' / '.join(held)}.")
    return case.finding(kinds.RECONNECTING, summary, evidence, fix, since=case.came_back_at)


def _grace_s(case: TableCase, th: Thresholds) -> float:
    """How long after coming back stalls are held: a new server's clients reconnect, the
    same server's need only a stall window of answers after the dark time."""
    if case.came_back_how == "outage":
        return min(th.stall_window_s, th.reconnect_grace_s)
    return th.reconnect_grace_s


RULES = (
    Rule(kinds.WARMUP_IMPOSSIBLE, is_warmup_impossible, Shape.TABLE_SETTINGS),
    Rule(kinds.LEARNER_STARTING, is_learner_starting, Shape.AFTER_STALLS),
    Rule(kinds.SERVER_RESTARTED, is_server_restarted, Shape.VIEW),
    Rule(kinds.RECONNECTING, is_reconnecting, Shape.AFTER_STALLS),
)
