"""`replaywatch check`: poll for a while, then print each table and the findings."""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from typing import Any, TextIO

from replaywatch.config import WatchConfig
from replaywatch.diagnosis.kinds import worst_first
from replaywatch.diagnosis.ratelimiter import TableDerived
from replaywatch.model import ActorSnapshot, Severity, SourceKind
from replaywatch.ray_model import RaySnapshot
from replaywatch.state import Published
from replaywatch.wiring import build_sidecar


def _num(value: float | None, digits: int = 1) -> str:
    if value is None:
        return "-"
    if abs(value) >= 1e300:
        return "inf" if value > 0 else "-inf"
    if abs(value) >= 1e6:
        return f"{value:.3g}"
    return f"{value:,.{digits}f}"


def to_document(state: Published) -> dict[str, Any]:
    """The `--json` document: targets, probes, tables (with derived), findings, actors, and
    each RLlib job watched (`ray`, by its cluster's dashboard).

    `probes` keeps its shape (a trainer's snapshot, else null) and lists actor
    probes too; `actors` holds each actor probe's latest snapshot by URL.
    """
    return {
        "at": state.at,
        "targets": [dataclasses.asdict(s) for s in state.sources.values()
                    if s.kind == SourceKind.REVERB],
        "probes": [
            {**dataclasses.asdict(s), "snapshot": dataclasses.asdict(state.probes[s.name])
             if s.name in state.probes else None}
            for s in state.sources.values() if s.kind == SourceKind.PROBE
        ],
        "tables": [
            {**dataclasses.asdict(snap),
             "derived": dataclasses.asdict(d) if (d := _derived(state, key)) else None}
            for key, snap in sorted(state.tables.items())
        ],
        "findings": [f.to_document() for f in worst_first(state.findings)],
        "insufficient_data": list(state.insufficient),
        "actors": {url: dataclasses.asdict(a) for url, a in sorted(state.actors.items())},
        "rule_errors": list(state.rule_errors),
        # Each Ray target's newest read, with whether its last poll read anything.
        "ray": {t: {**snap.document(), "up": state.sources[t].up if t in state.sources else None}
                for t, snap in sorted(state.ray.items())},
    }



def _derived(state: Published, key: tuple[str, str]) -> TableDerived | None:
    """The table's limiter figures (diagnosis/figures.py), once a diagnosis made them."""
    figures = state.figures.get(key)
    return figures.derived if figures is not None else None


def render_text(state: Published, out: TextIO) -> None:
    for s in sorted(state.sources.values(), key=lambda s: (s.kind != SourceKind.REVERB, s.name)):
        status = "up" if s.up else f"DOWN ({s.last_error})"
        print(f"{s.kind:6} {s.name}: {status}", file=out)
    header = ("target", "table", "size/max", "inserts", "samples", "spi cfg/obs", "cursor",
              "headroom s/i", "ins/s", "smp/s", "can_sample")
    rows = [header]
    for (target, name), snap in sorted(state.tables.items()):
        if (d := _derived(state, (target, name))) is None:
            continue  # a table no diagnosis saw (its target no longer watched)
        rl = snap.rate_limiter
        rows.append((
            target, name, f"{snap.current_size}/{snap.max_size}", str(rl.inserts), str(rl.samples),
            f"{_num(rl.samples_per_insert, 2)}/{_num(d.observed_samples_per_insert, 2)}",
            _num(d.cursor), f"{_num(d.sample_headroom)}/{_num(d.insert_headroom)}",
            _num(d.insert_rate), _num(d.sample_rate), "yes" if d.can_sample else "no",
        ))
    if len(rows) > 1:
        widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
        print(file=out)
        for row in rows:
            print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip(), file=out)
    for url, p in sorted(state.probes.items()):
        blocked = f"blocked in next() for {p.blocked_for_s:.1f}s" if p.blocked_in_next else \
            "not blocked"
        print(f"\nprobe {url} ({p.name}, pid {p.pid}): {p.batches_retrieved} batches, "
              f"{p.learner_steps} steps, {blocked}, ready={p.ready}, threads={p.thread_count}",
              file=out)
    for url, a in sorted(state.actors.items()):
        print(f"\n{_actor_line(url, a)}", file=out)
    for target, job in sorted(state.ray.items()):
        print(f"\n{_ray_lines(target, job)}", file=out)
    print(file=out)
    if not state.findings:
        # Not "none" while a rule could not judge: what it would have found is unknown.
        print("findings: none" if not state.rule_errors else
              "findings: none from the rules that judged", file=out)
    for f in worst_first(state.findings):
        print(f"[{f.severity.label.upper()}] {f.kind} {f.target} {f.table}".rstrip(), file=out)
        print(f"  {f.summary}", file=out)
        for k, v in f.evidence.items():
            print(f"    {k}: {v}", file=out)
        print(f"  fix: {f.fix}", file=out)
    for name in state.insufficient:
        print(f"insufficient data: {name}", file=out)
    for error in state.rule_errors:
        print(f"rule error, its finding is missing (a replaywatch bug): {error}", file=out)


def _actor_line(url: str, a: ActorSnapshot) -> str:
    call = f"in {a.in_call}() for {a.blocked_for_s:.1f}s" if a.in_call else "in no writer call"
    wait = f"waiting on {a.waiting_on} for {a.waiting_for_s:.1f}s" if a.waiting_on else \
        "not waiting"
    since = "no step yet" if a.seconds_since_last_step is None else \
        f"last {a.seconds_since_last_step:.1f}s ago"
    return (f"actor {url} ({a.name}, pid {a.pid}): {a.steps_total} steps ({since}), {call}, "
            f"{wait}, {a.items_created_total} items created, {a.pending_items} pending, "
            f"threads={a.thread_count}/{a.os_threads if a.os_threads is not None else '-'} OS")


def run_check(config: WatchConfig, duration_s: float, as_json: bool,
              out: TextIO = sys.stdout) -> int:
    """Polls for `duration_s`; exit 1 if a critical finding is active at the end."""
    # A one-shot look keeps its incidents in memory: it must not touch the log
    # of a `watch` that may be running beside it.
    with build_sidecar(config, incidents_path=":memory:") as sidecar:
        deadline = time.monotonic() + duration_s
        state = sidecar.poller.tick()
        while (left := deadline - time.monotonic()) > 0:
            time.sleep(min(config.poll.interval_s, left))
            state = sidecar.poller.tick()
    if as_json:
        json.dump(to_document(state), out, indent=2, default=str)
        print(file=out)
    else:
        render_text(state, out)
    return 1 if any(f.severity == Severity.CRITICAL for f in state.findings) else 0


def _ray_lines(target: str, snap: RaySnapshot) -> str:
    row = snap.results[-1] if snap.results else None
    head = (f"ray {target}: job {snap.job_id or 'none found'}"
            + (f", iteration {row.iteration}" if row is not None else "")
            + (f", driver pid {snap.driver_pid}" if snap.driver_pid else ""))
    calls = {t.worker_pid: t for t in snap.tasks}
    lines = [head]
    for a in snap.actors:
        call = calls.get(a.pid)
        in_call = f", in {call.name} for {call.running_for_s:.1f}s" \
            if call is not None and call.running_for_s is not None else ""
        lines.append(f"  {a.role} {a.class_name.rsplit('.', 1)[-1]} pid {a.pid}: {a.state}, "
                     f"{a.num_restarts} restarts{in_call}"
                     + (f" ({a.death_cause})" if a.death_cause else ""))
    live = snap.live
    if live is not None and live.env_steps_stored is not None:
        lines.append(f"  replay buffer ({live.buffer_kind}): {live.env_steps_stored} of "
                     f"{live.capacity} env steps stored, {live.env_steps_added} added, "
                     f"{live.env_steps_sampled} sampled (RLlibProbe)")
    if live is not None and live.learner_thread_alive is not None:
        state = ("dead" if not live.learner_thread_alive
                 else "waiting for a batch" if live.learner_waiting else "in an update")
        lines.append(f"  learner thread: {state}, {live.queue_depth} batch(es) queued"
                     + (f", waited {live.learner_waited_s:.0f} of {live.learner_watched_s:.0f} s"
                        if live.learner_waited_s is not None and live.learner_watched_s
                        else "") + " (RLlibProbe)")
    lines += [f"  unread: {e}" for e in snap.errors]
    return "\n".join(lines)
