"""Reachability and the trainer's health: target_down, probe_down, too_many_threads.

These judge a whole target (its polls and its probes), not one table, so their findings
carry table "". Each rule is a predicate on the poll records or the thread count, then its
explanation (summary, evidence, fix).
"""

from __future__ import annotations

from replaywatch.diagnosis import kinds
from replaywatch.diagnosis.case import Probe
from replaywatch.diagnosis.checkpoint_write import (
    checkpoint_running,
    kept_alive,
    previous_writes_s,
)
from replaywatch.diagnosis.memory import GIB, MIB, killed_at_limit
from replaywatch.diagnosis.registry import Rule, Shape
from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.diagnosis.window import PollRecord, TargetView, failed_polls_at_end
from replaywatch.model import NO_ANSWER, CheckpointCall, Finding, ProbeSnapshot, ReplayCode


def failing_since(polls: tuple[PollRecord, ...], th: Thresholds) -> PollRecord | None:
    """The first poll of a run of more than `down_polls` failures ending now."""
    run = failed_polls_at_end(polls)
    return polls[-run] if run > th.down_polls else None


def is_target_down(view: TargetView, th: Thresholds, now: float) -> Finding | None:
    """The Reverb server has not answered for more than `down_polls` polls."""
    first = failing_since(view.polls, th)
    return None if first is None else _target_down(view, first, now)


def _target_down(view: TargetView, first: PollRecord, now: float) -> Finding:
    ok = [r.at for r in view.polls if r.ok]
    evidence: dict[str, object] = {
        "failed_polls": sum(1 for r in view.polls if r.at >= first.at),
        "last_error": view.polls[-1].error, "last_ok_at": ok[-1] if ok else None}
    summary = f"The Reverb server '{view.target}' does not answer."
    fix = f"Check that the replay process runs and is reachable at {view.target}."
    killed = killed_at_limit(view.memory)
    if killed is not None:
        alive = [m for m in view.memory if m.rss_bytes is not None]
        last = alive[-1].rss_bytes if alive else None
        evidence.update(killed_at_memory_limit=True, oom_kills=killed.oom_kills,
                        limit_bytes=killed.limit_bytes, limit_from=killed.limit_from,
                        last_memory_bytes=last)
        summary = (f"The Reverb server '{view.target}' does not answer: killed at its memory "
                   f"limit ({killed.limit_bytes / GIB:.2f} GiB, {killed.limit_from}: "
                   "its OOM kill count rose).")
        fix = ("Restart it with a max_size that fits under its memory limit (memory_exhaustion "
               "gives the value) or a larger limit; the incident's bundle has its memory "
               "series.")
    return kinds.TARGET_DOWN.finding(view.target, "", summary, evidence, fix,
                                     since=first.at, last_seen=now)


def is_probe_down(view: TargetView, th: Thresholds, now: float) -> Finding | None:
    """A trainer or actor probe has not answered for more than `down_polls` polls, and the
    server's pause does not explain it (`held_by_pause`)."""
    down = {url: first for url, polls in sorted(view.probe_polls.items())
            if (first := failing_since(polls, th)) is not None
            and not held_by_pause(view, polls, first, th, now)}
    return _probe_down(view, down, now) if down else None


def held_by_pause(view: TargetView, polls: tuple[PollRecord, ...], first: PollRecord,
                  th: Thresholds, now: float) -> bool:
    """A probe that went unanswered (never refused) when its server paused is held by the
    same pause, for as long as the pause is `checkpointing` and `down_polls` polls after it
    ends: the process that checkpoints sits in the client's call (a sync loop's probe shares
    it), or the host is busy. Seen on a healthy sync loop checkpointing every 2 minutes: its
    ActorProbe went 3 polls unanswered with the server, and probe_down paged for 3 s.

    "When its server paused" is within one poll before the server's first unanswered one:
    the pause may land between the two polls of one cycle, so the probe fails a cycle first,
    and the cycles' timing jitters by a fraction of one (hence 1.5 polls, not 1)."""
    pause = _last_pause(view.polls)
    if pause is None:
        return False
    unanswered, answered_after = pause
    if (now - unanswered[0].at >= th.checkpoint_grace_s
            or len(answered_after) > th.down_polls
            or first.at < unanswered[0].at - 1.5 * _spacing(view.polls)
            or not all(r.error and NO_ANSWER in r.error for r in unanswered)):
        return False
    return all(r.error and NO_ANSWER in r.error for r in polls if r.at >= first.at)


def _last_pause(polls: tuple[PollRecord, ...]
                ) -> tuple[tuple[PollRecord, ...], tuple[PollRecord, ...]] | None:
    """The server's last run of failed polls and the answers since (a probe polled beside it
    may still fail the cycle its server answers again)."""
    end = len(polls)
    while end and polls[end - 1].ok:
        end -= 1
    start = end
    while start and not polls[start - 1].ok:
        start -= 1
    return (polls[start:end], polls[end:]) if end else None


def _spacing(polls: tuple[PollRecord, ...]) -> float:
    """One poll interval, as the server's last two polls were spaced."""
    return polls[-1].at - polls[-2].at if len(polls) >= 2 else 0.0


def _role(view: TargetView, url: str) -> str:
    """What the URL last answered as; a probe that never answered is just a probe."""
    if url in view.actors:
        return "actor"
    return "trainer" if url in view.probes else "probe"


def _probe_down(view: TargetView, down: dict[str, PollRecord], now: float) -> Finding:
    roles = {u: _role(view, u) for u in sorted(down)}
    evidence = {"probes": sorted(down), "roles": roles,
                "last_errors": {u: view.probe_polls[u][-1].error for u in sorted(down)}}
    named = sorted(set(roles.values()))
    what = " and ".join(named) if named != ["probe"] else "trainer or actor"
    return kinds.PROBE_DOWN.finding(
        view.target, "", f"{len(down)} {what} probe(s) of '{view.target}' do not answer.",
        evidence, "Check that the process runs and serves its probe (TrainerProbe.start() or "
        "ActorProbe.start()) at that address; an actor probe that stopped answering is often "
        "a dead actor.", since=min(r.at for r in down.values()), last_seen=now)


def threads_of(snapshot: ProbeSnapshot) -> int:
    """The trainer's threads as the OS counts them (`/proc/self/task`), else Python's.

    The seed's ">500 threads" were OS threads: tf.data's, Reverb's samplers', gRPC's. Python's
    `threading` sees only its own (8 in a hung Acme process that ran 156).
    """
    return snapshot.os_threads if snapshot.os_threads is not None else snapshot.thread_count


def is_too_many_threads(view: TargetView, th: Thresholds, now: float) -> Finding | None:
    """The trainer runs more threads than the threshold (the seed's hung job had over 500)."""
    over = {url: h for url, h in sorted(view.probes.items())
            if h and now - h[-1].observed_at <= th.stall_window_s
            and threads_of(h[-1]) > th.too_many_threads}
    return _too_many_threads(view, over, th, now) if over else None


def _too_many_threads(view: TargetView, over: dict[str, Probe], th: Thresholds,
                      now: float) -> Finding:
    since = []
    for h in over.values():  # the first snapshot of the run above the threshold
        start = len(h) - 1
        while start > 0 and threads_of(h[start - 1]) > th.too_many_threads:
            start -= 1
        since.append(h[start].observed_at)
    evidence = {"threads": {u: threads_of(h[-1]) for u, h in over.items()},
                "os_threads": {u: h[-1].os_threads for u, h in over.items()},
                "python_threads": {u: h[-1].thread_count for u, h in over.items()},
                "threshold": th.too_many_threads}
    return kinds.TOO_MANY_THREADS.finding(
        view.target, "", f"A trainer of '{view.target}' runs more than {th.too_many_threads} "
        "threads.", evidence, "Cap the thread pools (tf.data num_parallel_calls, "
        "TF inter/intra op threads, XLA) so workers are scheduled.",
        since=min(since), last_seen=now)


def paused_since(view: TargetView, th: Thresholds, now: float) -> PollRecord | None:
    """The first unanswered poll of a server that is paused, not gone: more than `down_polls`
    polls unanswered within their deadline (none refused), for less than
    `checkpoint_grace_s`. Writers and samplers held meanwhile are held by the pause."""
    first = failing_since(view.polls, th)
    if first is None:
        return None
    running = checkpoint_running(view, th, now)
    # A checkpoint its replay probe saw begin before the pause holds it for as long as it
    # writes: Acme's replay checkpoints can take ten minutes.
    held = running is not None and running[1] <= first.at
    if now - first.at >= th.checkpoint_grace_s and not held:
        return None
    failing = [r for r in view.polls if r.at >= first.at]
    return first if all(r.error and NO_ANSWER in r.error for r in failing) else None


def is_checkpointing(view: TargetView, th: Thresholds, now: float) -> Finding | None:
    """target_down's polls all timed out on a server that refused nothing: it is busy, for
    up to `checkpoint_grace_s`.

    A refused connection is a server gone; a call (or a connection) not answered within its
    deadline is a server whose table lock is held, its threads all waiting on it. Reverb's
    `Table::Checkpoint` holds it while it copies every item (measured on 0.14: 0.8 s at
    300,000 items; a sync loop checkpointing every 2 minutes under load went 3 polls of
    0.8 s unanswered, and a new channel's connection during one timed out the same way), and
    so does a hung server or a host that is gone; which, only the time tells, so the grace
    ends and target_down opens.
    """
    first = paused_since(view, th, now)
    running = checkpoint_running(view, th, now)
    if first is None:
        return None if running is None else _writing(view, th, running, now)
    failing = [r for r in view.polls if r.at >= first.at]
    held = sorted(url for url, polls in view.probe_polls.items()
                  if (down := failing_since(polls, th)) is not None
                  and held_by_pause(view, polls, down, th, now))
    evidence: dict[str, object] = {
                "failed_polls": len(failing), "last_error": failing[-1].error,
                "seconds_since": now - first.at,
                "grace_left_s": th.checkpoint_grace_s - (now - first.at),
                "probes_held": held}
    if running is not None:
        evidence.update(_write_evidence(*running))
    return kinds.CHECKPOINTING.finding(
        view.target, "", f"The Reverb server '{view.target}' answers no call in time and "
        "refuses none: its table lock is held, by a checkpoint copying its items or by a hung "
        "server.",
        evidence, f"Wait: if it still does not answer {th.checkpoint_grace_s:g} s after its "
        "first unanswered poll, this becomes target_down.", since=first.at, last_seen=now)


def _write_evidence(call: CheckpointCall, began: float, code: ReplayCode) -> dict[str, object]:
    took = previous_writes_s(code)
    return {"checkpoint_for_s": round(code.probe_now - call.started_at, 1),
            "checkpoint_began_at": began, "previous_checkpoints_s": took[-5:],
            "checkpointer_path": code.checkpointer_path}


def _writing(view: TargetView, th: Thresholds,
             running: tuple[CheckpointCall, float, ReplayCode], now: float) -> Finding:
    """A checkpoint the replay probe reports in progress on a server that answers: Reverb
    copies the items under its table lock, then writes them while it serves, keeping every
    item removed meanwhile alive (checkpoint_write.py): memory_exhaustion says it when that
    takes the process past its limit."""
    call, began, code = running
    evidence = {**_write_evidence(*running), "server_answers": True}
    took = evidence["previous_checkpoints_s"]
    before = (f"; the last took {took[-1]:g} s" if isinstance(took, list) and took
              else "; the first one")
    summary = (f"The replay process of '{view.target}' has been writing a checkpoint for "
               f"{evidence['checkpoint_for_s']:g} s{before}. The server answers meanwhile.")
    kept = kept_alive(view, th, now)
    if kept is not None:
        evidence.update(kept.evidence())
        summary += (f" The write keeps the {kept.items:,} items removed since it began alive: "
                    f"{kept.bytes / MIB:,.0f} MiB so far, {kept.bytes_per_s / MIB:,.1f} MiB/s.")
    return kinds.CHECKPOINTING.finding(
        view.target, "", summary, evidence, "Nothing while it writes: checkpoint_failed is "
        "named if none completes within the interval the code said plus twice the last write.",
        since=began, last_seen=now)


RULES = (
    Rule(kinds.TARGET_DOWN, is_target_down, Shape.VIEW),
    Rule(kinds.CHECKPOINTING, is_checkpointing, Shape.VIEW),
    Rule(kinds.PROBE_DOWN, is_probe_down, Shape.VIEW),
    Rule(kinds.TOO_MANY_THREADS, is_too_many_threads, Shape.VIEW),
)
