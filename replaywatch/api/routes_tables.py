"""Targets, tables, their history and the probes (trainers and actors)."""

from __future__ import annotations

import bisect
import dataclasses
from typing import Annotated

from fastapi import APIRouter, Query, Response

from replaywatch.api.deps import ApiError, CacheDep, HistoryDep, PublishedDep
from replaywatch.api.schemas import (
    HistoryOut,
    MemoryOut,
    ProbeOut,
    ProbesOut,
    TableOut,
    TablesOut,
    TargetOut,
    TargetsOut,
)
from replaywatch.config import MAX_HISTORY_S, RATE_WINDOW_S
from replaywatch.diagnosis import window as win
from replaywatch.diagnosis.figures import TableFigures
from replaywatch.diagnosis.ratelimiter import derive
from replaywatch.metrics_probes import replay_probe
from replaywatch.model import SourceKind

router = APIRouter(prefix="/api/v1")


@router.get("/targets", response_model=TargetsOut)
def targets(state: PublishedDep) -> TargetsOut:
    statuses = sorted(state.sources.values(), key=lambda s: s.name)
    return TargetsOut(
        targets=[TargetOut.of(s) for s in statuses if s.kind == SourceKind.REVERB],
        probes=[TargetOut.of(s) for s in statuses if s.kind == SourceKind.PROBE],
        ray=[TargetOut.of(s) for s in statuses if s.kind == SourceKind.RAY],
        config_errors=list(state.config_errors),
    )


@router.get("/memory", response_model=MemoryOut)
def memory(state: PublishedDep) -> MemoryOut:
    """Each Reverb target's process memory and its limit, where its host could be read (the
    sidecar on the server's host, or --reverb-pid), and what each table costs it: an item's
    bytes (measured as the table fills, else the signature's) and the process at max_size."""
    return MemoryOut(
        memory=[dataclasses.asdict(m) | {"counted_bytes": m.counted_bytes}
                for _, m in sorted(state.memory.items())],
        tables=[{"target": t, "table": n} | dataclasses.asdict(f.memory)
                for (t, n), f in sorted(state.figures.items()) if f.memory is not None])


@router.get("/tables", response_model=TablesOut)
def tables(
    state: PublishedDep,
    cache: CacheDep,
    target: Annotated[str | None, Query(max_length=300)] = None,
) -> Response:
    if target is not None and target not in state.sources:
        raise ApiError(404, f"unknown target {target!r}")

    def render() -> bytes:
        out = TablesOut(tables=[
            TableOut.of(snap, state.figures.get(key))
            for key, snap in sorted(state.tables.items())
            if target is None or key[0] == target
        ])
        return out.model_dump_json().encode()

    body = cache.get(f"/tables?target={target}", state.cycle, render)
    return Response(body, media_type="application/json")


@router.get("/tables/{target}/{table}/history", response_model=HistoryOut)
def table_history(
    target: str,
    table: str,
    state: PublishedDep,
    history: HistoryDep,
    seconds: Annotated[float, Query(gt=0, le=MAX_HISTORY_S, description=(
        "window in seconds; a window longer than the history kept (--history) returns "
        "all that is kept"))] = 60,
) -> HistoryOut:
    if (target, table) not in state.tables:
        if target not in state.sources:
            raise ApiError(404, f"unknown target {target!r}")
        raise ApiError(404, f"unknown table {table!r} on target {target!r}")
    points = history.table(target, table, start=state.at - seconds)
    # Each point carries the limiter's figures over the rate window ending at it.
    times = [p.observed_at for p in points]
    out = [
        TableOut.of(p, TableFigures(target, table, derive(
            points[bisect.bisect_left(times, p.observed_at - RATE_WINDOW_S) : i + 1])))
        for i, p in enumerate(points)
    ]
    return HistoryOut(target=target, table=table, seconds=seconds, points=out)


@router.get("/probes", response_model=ProbesOut)
def probes(state: PublishedDep, history: HistoryDep) -> ProbesOut:
    """Trainer, actor and replay probes alike; `role` says which, from the probe's own
    document (a replay probe's is its target's memory, `GET /api/v1/memory`)."""
    statuses = sorted((s for s in state.sources.values() if s.kind == SourceKind.PROBE),
                      key=lambda s: s.name)
    out = []
    for s in statuses:
        actor = state.actors.get(s.name)
        if actor is None:
            probe = ProbeOut.of(s, state.probes.get(s.name))
            if probe.role == "unknown" and replay_probe(state, s.name) is not None:
                probe.role = "replay"
            out.append(probe)
            continue
        window = win.actor_since_last_restart(history.actor(s.name, state.at - RATE_WINDOW_S))
        steps = win.rate([(a.observed_at, float(a.steps_total)) for a in window])
        out.append(ProbeOut.of(s, actor, steps))
    return ProbesOut(probes=out)
