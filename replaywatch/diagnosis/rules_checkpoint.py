"""Checkpoints and restores: restoring, checkpoint_failed, checkpoint_unrestorable,
restore_config_override.

    restoring                the server loads a checkpoint: its port does not serve yet, and
                             how far the load is, at what rate, and about when it ends
    checkpoint_failed        the newest checkpoint call raised, a write an earlier process
                             began never finished, or no new complete checkpoint came within
                             the interval plus twice the last write
    checkpoint_unrestorable  checkpoints go to Reverb's default, a fresh temporary directory
                             per process start: no restart ever finds one
    restore_config_override  the server serves a table other than the code wrote: a restore
                             loads the checkpoint's sampler, remover, max_size and rate
                             limiter with its counters over the code's (reverb#137)

Reverb tells none of this to a client: ServerInfo has no checkpointer, a checkpoint is one
blocking `client.checkpoint()` and a restore runs inside `reverb.Server(...)` before its port
serves. All four read what the replay process's own probe says of its server
(ReplayProbe.server and .checkpoint, model.ReplayCode), the newest reading, on the probe's
clock for durations. Without that probe none is named, and a restore reads as target_down.
"""

from __future__ import annotations

import math
from typing import Any

from replaywatch.diagnosis import kinds
from replaywatch.diagnosis import ratelimiter as lim
from replaywatch.diagnosis.memory import MIB
from replaywatch.diagnosis.registry import Rule, Shape
from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.diagnosis.window import TargetView
from replaywatch.model import (
    CheckpointCall,
    DeclaredTable,
    Finding,
    MemorySnapshot,
    ReplayCode,
    TableSnapshot,
)

# What checkpoint_unrestorable prints, and `replaywatch predict` before the job starts
UNRESTORABLE_FIX = ("Give the server a checkpointer whose directory outlives the process: "
                    "reverb.Server(tables, port, checkpointer=reverb.checkpointers."
                    "DefaultCheckpointer(path='/persistent/replay')) (on a volume that survives "
                    "the pod or host); a restart then loads the newest checkpoint in it.")
# A restore's rate is read over the load so far once this much of it passed: the first
# reads are the files' headers, not the load's pace.
RATE_AFTER_S = 2.0


def is_restoring(view: TargetView, th: Thresholds, now: float) -> Finding | None:
    """The replay process lives and its probe answers while `reverb.Server(...)` still loads
    a checkpoint: the port serves once it is loaded, so the server is not down."""
    read = view.replay_code(now, th.stall_window_s)
    if read is None:
        return None
    m, code = read
    r = code.restore
    if r is None or r.path is None:
        return None
    if r.ended_at is not None:
        return _loaded(view, th, now, m, code)
    for_s = code.probe_now - r.started_at
    done = r.read_bytes
    rate = done / for_s if done is not None and for_s >= RATE_AFTER_S else None
    left = max(0, r.bytes - done) if done is not None else None
    eta = left / rate if rate and left is not None else None
    evidence: dict[str, Any] = {
        "checkpoint": r.path, "checkpoint_bytes": r.bytes, "read_bytes": done,
        "restoring_for_s": round(for_s, 1),
        "read_rate_bytes_per_s": round(rate) if rate else None,
        "eta_s": round(eta, 1) if eta is not None else None,
        "server_answers": bool(view.polls and view.polls[-1].ok)}
    if eta is not None and rate and done is not None and r.bytes:
        how = (f"{min(1.0, done / r.bytes):.0%} of its {r.bytes / MIB:,.0f} MiB read at "
               f"{rate / MIB:,.1f} MiB/s, about {eta:,.0f} s left")
    else:
        how = f"{r.bytes / MIB:,.0f} MiB to read, no rate yet"
    summary = (f"The Reverb server '{view.target}' is restoring checkpoint '{r.path}' for "
               f"{for_s:,.0f} s ({how}): its port serves once the load ends.")
    fix = ("Wait: its clients connect once it serves. If read_bytes stops growing the load "
           "hangs (reverb#147): take the replay process's stacks (its probe's /stacks).")
    return kinds.RESTORING.finding(view.target, "", summary, evidence, fix,
                                   since=code.on_sidecar_clock(r.started_at, m.observed_at),
                                   last_seen=now)


def _loaded(view: TargetView, th: Thresholds, now: float, m: MemorySnapshot,
            code: ReplayCode) -> Finding | None:
    """A load that ended while the server's port is not answered yet: the sidecar's channel,
    refused through the load, waits out gRPC's reconnect back-off (half a second to seconds),
    for at most `reconnect_grace_s`."""
    r = code.restore
    assert r is not None and r.ended_at is not None
    ended = code.on_sidecar_clock(r.ended_at, m.observed_at)
    if (not view.polls or view.polls[-1].ok or now - ended > th.reconnect_grace_s
            or any(p.ok for p in view.polls if p.at >= ended)):
        return None
    evidence = {"checkpoint": r.path, "checkpoint_bytes": r.bytes, "read_bytes": r.read_bytes,
                "restored_in_s": round(r.ended_at - r.started_at, 1),
                "loaded_at": ended, "server_answers": False}
    summary = (f"The Reverb server '{view.target}' loaded checkpoint '{r.path}' in "
               f"{r.ended_at - r.started_at:,.1f} s and serves; the sidecar reconnects.")
    return kinds.RESTORING.finding(
        view.target, "", summary, evidence, f"Nothing: if it is not answered "
        f"{th.reconnect_grace_s:g} s after the load, this becomes target_down.",
        since=code.on_sidecar_clock(r.started_at, m.observed_at), last_seen=now)


def _complete(code: ReplayCode) -> list[CheckpointCall]:
    return [c for c in code.checkpoints if c.ended_at is not None and c.error is None]


def is_checkpoint_failed(view: TargetView, th: Thresholds, now: float) -> Finding | None:
    """The replay's checkpoints do not reach its directory: the newest call raised, a write an
    earlier process began was never finished (DONE missing), or none completed within the
    interval the code said plus twice the last write (at least the stall window)."""
    read = view.replay_code(now, th.stall_window_s)
    if read is None:
        return None
    m, code = read
    done = _complete(code)
    ended = [c for c in code.checkpoints if c.ended_at is not None]
    last = done[-1] if done else None
    evidence: dict[str, Any] = {
        "checkpointer_path": code.checkpointer_path, "every_s": code.every_s,
        "last_complete": last.path if last else None,
        "last_complete_at": (code.on_sidecar_clock(last.ended_at, m.observed_at)
                             if last and last.ended_at is not None else None)}
    if ended and ended[-1].error is not None:
        failed = ended[-1]
        evidence.update(error=failed.error, failed_calls=sum(
            1 for c in code.checkpoints if c.error is not None))
        summary = (f"The last checkpoint of '{view.target}' failed: {failed.error}.")
        since = failed.started_at
    elif code.incomplete:
        evidence.update(incomplete=list(code.incomplete))
        summary = (f"{len(code.incomplete)} checkpoint(s) of '{view.target}' in "
                   f"'{code.checkpointer_path}' were begun and never finished (no DONE): the "
                   "process that wrote them stopped during the write.")
        since = code.restore.started_at if code.restore else code.probe_now
    else:
        overdue = _overdue(code, last, th.stall_window_s)
        if overdue is None:
            return None
        since, allowed = overdue
        evidence.update(allowed_s=round(allowed, 1),
                        seconds_since_last_complete=round(code.probe_now - since, 1),
                        in_progress=any(c.ended_at is None for c in code.checkpoints))
        summary = (f"No checkpoint of '{view.target}' completed for "
                   f"{code.probe_now - since:,.0f} s: every {code.every_s:g} s was said, and "
                   f"{allowed - (code.every_s or 0.0):,.0f} s more were allowed (twice the last "
                   "write, at least the stall window).")
    fix = ("Make the checkpoint directory writable with room for a checkpoint of the table's "
           "size (the last complete one's bytes), and check the replay process's log for the "
           "write's error; until one completes, a restart loses what was inserted since "
           f"{'the last one' if last else 'the start'}.")
    return kinds.CHECKPOINT_FAILED.finding(view.target, "", summary, evidence, fix,
                                           since=code.on_sidecar_clock(since, m.observed_at),
                                           last_seen=now)


def _overdue(code: ReplayCode, last: CheckpointCall | None, window_s: float
             ) -> tuple[float, float] | None:
    """(since when, seconds allowed) when no checkpoint completed within the interval plus
    twice the last write, or plus the stall window where that is longer; counted from the
    server's start before the first. The interval is the loop's intent, not a clock: the loop
    that calls the checkpoint runs late by its own step (a restored replay under make test's
    load took its first 1 s checkpoint 1.4 s after the restore, a quick write allowed none
    of it), and a rest shorter than the stall window is paged for no other series either.
    The first write, while it runs, has no length to go by: `checkpointing` says how long it
    has run (a quiet 600 MiB write took 11 s where the code said every 6 s)."""
    if code.every_s is None:
        return None
    if last is not None and last.ended_at is not None:
        since, took = last.ended_at, last.ended_at - last.started_at
    elif any(c.ended_at is None for c in code.checkpoints):
        return None
    elif code.restore is not None and code.restore.ended_at is not None:
        since, took = code.restore.ended_at, 0.0
    else:
        return None
    allowed = code.every_s + max(2 * took, window_s)
    return (since, allowed) if code.probe_now - since > allowed else None


def is_checkpoint_unrestorable(view: TargetView, th: Thresholds, now: float
                               ) -> Finding | None:
    """The server checkpoints into Reverb's default checkpointer's directory, a fresh
    temporary one per process start: a restarted replay process looks in a new, empty one
    and starts empty. Named before the first restart, once the code says it checkpoints
    (an interval, or a checkpoint written)."""
    read = view.replay_code(now, th.stall_window_s)
    if read is None:
        return None
    m, code = read
    written = _complete(code)
    if not code.temporary or (code.every_s is None and not written):
        return None
    evidence = {"checkpointer_path": code.checkpointer_path, "every_s": code.every_s,
                "checkpoints_written": len(written),
                "last_checkpoint_bytes": written[-1].bytes if written else None}
    summary = (f"The server '{view.target}' checkpoints into '{code.checkpointer_path}', the "
               "temporary directory Reverb's default checkpointer made for this process: a "
               "restarted replay process makes a new one and starts empty, so no checkpoint "
               "written here is ever restored.")
    return kinds.CHECKPOINT_UNRESTORABLE.finding(
        view.target, "", summary, evidence, UNRESTORABLE_FIX,
        since=code.on_sidecar_clock(code.restore.started_at if code.restore else
                                    code.probe_now, m.observed_at), last_seen=now)


def _limiter(t: DeclaredTable | TableSnapshot) -> dict[str, float]:
    rl = t.rate_limiter if isinstance(t, TableSnapshot) else t
    return {"samples_per_insert": rl.samples_per_insert,
            "min_size_to_sample": rl.min_size_to_sample, "min_diff": rl.min_diff,
            "max_diff": rl.max_diff}


def settings_of(t: DeclaredTable | TableSnapshot) -> dict[str, Any]:
    """What a restore replaces, by the name Reverb's Table takes it under."""
    if isinstance(t, TableSnapshot):
        exponent = t.sampler.priority_exponent
        sampler, remover = t.sampler.kind, t.remover.kind
    else:
        exponent, sampler, remover = t.priority_exponent, t.sampler, t.remover
    return {"max_size": t.max_size, "max_times_sampled": t.max_times_sampled,
            "sampler": sampler, "priority_exponent": exponent if sampler == "prioritized"
            else None, "remover": remover, **_limiter(t)}


def same_setting(a: Any, b: Any) -> bool:
    """Two settings are the same (floats to a millionth: read back through protobuf)."""
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)
    return bool(a == b)


def is_restore_config_override(view: TargetView, th: Thresholds, now: float
                               ) -> Finding | None:
    """A table serves settings other than its code wrote: a restore loaded the checkpoint's
    over them (or the probe was handed another server's tables). The first table that
    differs, every setting named with both values."""
    read = view.replay_code(now, th.stall_window_s)
    if read is None or not view.polls or not view.polls[-1].ok:
        return None
    m, code = read
    for declared in code.tables:
        points = view.tables.get(declared.name)
        if not points:
            continue
        served = points[-1]
        wrote, serves = settings_of(declared), settings_of(served)
        changed = sorted(k for k in wrote if not same_setting(wrote[k], serves[k]))
        if changed:
            return _override(view, code, m, declared, served, changed, now)
    return None


def _override(view: TargetView, code: ReplayCode, m: MemorySnapshot, declared: DeclaredTable,
              served: TableSnapshot, changed: list[str], now: float) -> Finding:
    wrote, serves = settings_of(declared), settings_of(served)
    restored = code.restore.path if code.restore is not None else None
    evidence: dict[str, Any] = {
        "changed": changed, "code": {k: wrote[k] for k in changed},
        "served": {k: serves[k] for k in changed}, "restored_from": restored,
        "inserts": served.rate_limiter.inserts, "samples": served.rate_limiter.samples}
    words = ", ".join(f"{k} {wrote[k]} in the code, {serves[k]} served" for k in changed)
    effect = ""
    rl = served.rate_limiter
    if not lim.can_sample(served, 1) and served.current_size >= rl.min_size_to_sample:
        need = lim.inserts_to_sample(served, 1)
        evidence["inserts_to_sample"] = need
        effect = (f" Its restored limiter, with the counters it restored ({rl.inserts:,} "
                  f"inserts, {rl.samples:,} samples), blocks sampling for {need:,} more "
                  "inserts.")
    source = (f"restored from '{restored}'" if restored else
              "not restored by the code's server (is the probe beside this server?)")
    summary = (f"Table '{declared.name}' on '{view.target}' serves settings its code did not "
               f"write ({source}): {words}.{effect}")
    fix = ("Reverb loads a checkpoint's table settings over the code's. To run the code's, "
           "start the server on a checkpoint directory without this checkpoint (its items are "
           "not kept); to keep the items, write the served settings into the code so that "
           "both agree.")
    return kinds.RESTORE_CONFIG_OVERRIDE.finding(
        view.target, declared.name, summary, evidence, fix,
        since=code.on_sidecar_clock(code.restore.ended_at or code.probe_now, m.observed_at)
        if code.restore else m.observed_at, last_seen=now)


RULES = (
    Rule(kinds.RESTORING, is_restoring, Shape.VIEW),
    Rule(kinds.CHECKPOINT_FAILED, is_checkpoint_failed, Shape.VIEW),
    Rule(kinds.CHECKPOINT_UNRESTORABLE, is_checkpoint_unrestorable, Shape.VIEW),
    Rule(kinds.RESTORE_CONFIG_OVERRIDE, is_restore_config_override, Shape.VIEW),
)
