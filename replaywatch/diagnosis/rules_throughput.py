"""Throughput that falls without blocking: throughput_drop.

    throughput_drop   a table's insert or sample rate, or an actor's steps per second, below
                      its own baseline for long enough (baseline.judge), nothing blocked

Two actors whose environment step grew from 20 ms to 200 ms over 90 s took inserts from
96/s to 10/s and batches from 24/s to 2.7/s, and nothing ever blocked: no stall rule can see
it, and a job ten times slower for a night is as lost as a hung one (reverb#99: inserts slow
after ~20 h; Mava#366: adders take 30 % of step time).

Read from the view's coarse snapshots (one per ~10 s over `throughput_lookback_s`), each
series from its server's or actor's last restart on: a restart starts its baseline afresh,
and start-up has no baseline yet. Attribution, where the data can tell:

    the server      the table worker's `inserting` time per insert grew (TableWorkerTime):
                    each insert costs the server more, whatever the clients do
    the clients     the server's time per insert did not grow: the actors (their steps per
                    second, from ActorProbe) or their writers (the share of their time inside
                    writer calls) are slower
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from replaywatch.diagnosis import baseline as bl
from replaywatch.diagnosis import kinds
from replaywatch.diagnosis import ratelimiter as lim
from replaywatch.diagnosis import rhythm as rh
from replaywatch.diagnosis import window as win
from replaywatch.diagnosis.registry import Rule, Shape
from replaywatch.diagnosis.rhythm import Rhythm, longest_normal
from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.diagnosis.window import TargetView, inserts_of, samples_of
from replaywatch.model import ActorSnapshot, Finding, TableSnapshot

SLOW_SERVER = 2.0  # server time per insert this many times its baseline's: the server
# ... and a measurable share of the span spent inserting: Reverb counts whole milliseconds,
# and a server busy 0.2 % of the time is not what holds the actors back.
SERVER_BUSY_SHARE = 0.01


def _observed(s: Any) -> float:
    return float(s.observed_at)


def is_throughput_drop(view: TargetView, th: Thresholds, now: float) -> Finding | None:
    """The worst table whose own rate, or whose actors' step rate, fell below its baseline.

    One finding per target: the table with the deepest drop, every dropped series named.
    """
    found = [f for name in sorted(view.coarse_tables)
             if (f := _table_drop(view, name, th, now)) is not None]
    return min(found, key=lambda f: f.evidence["worst_ratio"], default=None)


def _judge(points: Sequence[Any], value: Any, th: Thresholds, now: float,
           held: bl.Baseline | None, rhythm: Rhythm | None = None, hold_s: float = 0.0
           ) -> bl.Drop | None:
    return bl.judge(_buckets(points, value, th, rhythm, hold_s), now, th.throughput_drop_for_s,
                    th.throughput_baseline_s, th.throughput_min_baseline_s, held)


def _buckets(points: Sequence[Any], value: Any, th: Thresholds, rhythm: Rhythm | None,
             hold_s: float = 0.0) -> list[bl.Bucket]:
    """The series' coarse rates, each over at least two of its longest normal gaps where
    its rhythm is slower than the coarse buckets (bursts are not drops), and over what the
    learner's pipeline holds (`hold_s`, pipeline_hold_s)."""
    out = bl.buckets(points, _observed, value)
    normal = None if rhythm is None or not th.learned_windows else longest_normal(rhythm.gaps)
    span = max(2 * normal if normal else 0.0, hold_s)
    return bl.merged(out, span) if span else out


def pipeline_hold_s(view: TargetView, name: str, points: Sequence[TableSnapshot],
                    th: Thresholds) -> float:
    """How long the table may rest while its learner lives on what its pipeline drew, where
    inserts waited at max_diff over the span judged (stall_window.py): a slow learner behind a
    deep pipeline draws nothing for minutes, then all it missed, which is no drop. Infinite
    while not known: no rate can be judged over a shorter span. At a stall window or more,
    the table is not judged at all (_table_drop)."""
    recent = [p for p in points if p.observed_at >= points[-1].observed_at
              - th.throughput_drop_for_s] if points else []
    if not th.learned_windows or all(lim.can_insert(p, 1) for p in recent):
        return 0.0
    drained = rh.drain_s(view.rhythms.get(f"samples {name}"))
    if drained is None:
        return 0.0
    return math.inf if drained[1] is None else drained[1]


def _table_drop(view: TargetView, name: str, th: Thresholds, now: float) -> Finding | None:
    points = win.since_last_reset(view.coarse_tables[name])
    if not points or now - points[-1].observed_at > th.stall_window_s + _coarse_spacing(points):
        return None  # a table not seen lately is the down rules' business
    held = view.held_baselines.get(name, {})
    drops: dict[str, bl.Drop] = {}
    hold = pipeline_hold_s(view, name, points, th)
    if hold >= th.stall_window_s:
        # The learner lives on what its pipeline drew, longer than a stall window: the
        # table's and its actors' rates (held at max_diff with it) are the pipeline's draws,
        # its first fill swells any baseline, and how much of it a poll saw varies (a 12 s
        # learner's 448 came over one to four polls). Its trainer probe judges its steps.
        return None
    for series, value in (("inserts", inserts_of), ("samples", samples_of)):
        if (d := _judge(points, value, th, now, held.get(series),
                        view.rhythms.get(f"{series} {name}"), hold)) is not None:
            drops[series] = d
    actors = {url: h for url, h in sorted(view.coarse_actors.items())
              if view.table_named(h[-1].table if h else None) == name}
    for url, history in actors.items():
        mine = win.actor_since_last_restart(history)
        series = f"actor {mine[-1].name} steps"
        if (d := _judge(mine, lambda a: float(a.steps_total), th, now,
                        held.get(series), view.rhythms.get(f"actor {url}"))) is not None:
            drops[series] = d
    if not drops:
        return None
    return _finding(view, name, points, actors, drops, th, now)


def table_baselines(view: TargetView, th: Thresholds, now: float
                    ) -> dict[str, dict[str, bl.Baseline]]:
    """Each table's insert and sample baselines now (those established, or held by an open
    drop), for the metrics."""
    return {name: found for name in sorted(view.coarse_tables)
            if (found := baselines_of(view, name, th, now))}


def baselines_of(view: TargetView, name: str, th: Thresholds, now: float
                 ) -> dict[str, bl.Baseline]:
    """One table's insert and sample baselines now, by series (none without a coarse copy)."""
    if name not in view.coarse_tables:
        return {}
    points = win.since_last_reset(view.coarse_tables[name])
    held = view.held_baselines.get(name, {})
    return {series: b for series, value in (("inserts", inserts_of), ("samples", samples_of))
            if (b := held.get(series) or bl.current(
                _buckets(points, value, th, view.rhythms.get(f"{series} {name}"),
                         pipeline_hold_s(view, name, points, th)), now,
                th.throughput_drop_for_s,
                th.throughput_baseline_s, th.throughput_min_baseline_s)) is not None}


def held_baselines(evidence: dict[str, Any]) -> dict[str, bl.Baseline]:
    """The baselines an open throughput_drop's evidence records, by series: what the drop is
    judged against until it resolves (kept in the finding, so a restarted sidecar has them)."""
    out = {}
    for series, d in (evidence.get("series") or {}).items():
        try:
            out[series] = bl.Baseline(float(d["baseline_per_s"]), float(d["baseline_mad"]),
                                      float(d["baseline_seconds"]), float(d["band_low_per_s"]))
        except (KeyError, TypeError, ValueError):
            continue  # an older sidecar's evidence: judged against the look-back again
    return out


def _coarse_spacing(points: Sequence[TableSnapshot]) -> float:
    """The coarse spacing seen (a table polled less often than the bucket has wider ones)."""
    gaps = [b.observed_at - a.observed_at for a, b in zip(points, points[1:])]
    return max(gaps, default=0.0)


def server_ms_per_insert(points: Sequence[TableSnapshot]) -> float | None:
    """The table worker's `inserting` milliseconds per insert over `points`."""
    inserted = win.increase(points, inserts_of)
    spent = win.increase(points, lambda s: s.worker_time.ms("inserting"))
    return spent / inserted if inserted > 0 else None


def writer_share(points: Sequence[ActorSnapshot]) -> float | None:
    """The share of an actor's time spent inside writer calls over `points`."""
    if len(points) < 2:
        return None
    first, last = points[0], points[-1]
    inside = (sum(c.seconds_total for c in last.calls)
              - sum(c.seconds_total for c in first.calls))
    span = last.observed_at - first.observed_at
    return max(0.0, min(1.0, inside / span)) if span > 0 else None


def _finding(view: TargetView, name: str, points: Sequence[TableSnapshot],
             actors: dict[str, tuple[ActorSnapshot, ...]], drops: dict[str, bl.Drop],
             th: Thresholds, now: float) -> Finding:
    worst_series, worst = min(drops.items(), key=lambda kv: kv[1].ratio)
    span_start = now - worst.span_s
    recent = win.window(points, span_start)
    before = [s for s in points if s.observed_at <= span_start]
    server_now, server_before = server_ms_per_insert(recent), server_ms_per_insert(before)
    busy = win.increase(recent, lambda s: s.worker_time.ms("inserting")) / (
        1000.0 * max(win.span(recent), 1e-9))
    slow_server = (server_now is not None and server_before is not None and server_before > 0
                   and server_now >= SLOW_SERVER * server_before and busy >= SERVER_BUSY_SHARE)
    shares = {}
    for url, history in actors.items():
        mine = win.actor_since_last_restart(history)
        shares[mine[-1].name if mine else url] = {
            "writer_share_now": writer_share([a for a in mine if a.observed_at >= span_start]),
            "writer_share_before": writer_share([a for a in mine
                                                 if a.observed_at <= span_start])}
    evidence: dict[str, Any] = {
        "series": {k: {"rate_per_s": d.rate, "baseline_per_s": d.baseline.median,
                       "baseline_mad": d.baseline.mad, "band_low_per_s": d.baseline.low,
                       "line_per_s": d.line, "ratio": d.ratio, "span_s": d.span_s,
                       "below_a_fifth": d.severe, "baseline_seconds": d.baseline.seconds}
                   for k, d in drops.items()},
        "worst_series": worst_series, "worst_ratio": worst.ratio,
        "server_ms_per_insert_now": server_now, "server_ms_per_insert_before": server_before,
        "server_inserting_share_now": busy,
        "attribution": ("server" if slow_server else "clients" if server_now is not None
                        else "unknown"),
        "actors": shares or None,
        "baseline_lookback_s": th.throughput_baseline_s,
    }
    how = "a fifth" if worst.severe else "half"
    summary = (f"Throughput on '{name}' fell below {how} of its own baseline "
               f"({', '.join(sorted(drops))}), and nothing is blocked: the job runs slower, "
               "it is not stuck.")
    if slow_server:
        fix = (f"The Reverb server is slower: each insert costs its table worker "
               f"{server_now:.3g} ms against {server_before:.3g} ms before. Check the replay "
               "host (CPU, memory, swap; a table grown past its memory; checkpoints).")
    elif server_now is not None:
        fix = (f"Not the server (its time per insert is {server_now:.3g} ms, "
               f"{server_before if server_before is not None else 0:.3g} ms before): the "
               "clients are slower. Check the actors' environment step time and, with "
               "ActorProbe, the share of their time inside writer calls (evidence "
               "`actors`); a slower learner lowers the sample rate.")
    else:
        fix = ("Check the actors' environment step time and the learner's step time; with "
               "ActorProbe attached the finding says which actor slowed.")
    since = span_start
    return kinds.THROUGHPUT_DROP.finding(view.target, name, summary, evidence, fix,
                                         since=since, last_seen=now)


RULES = (
    Rule(kinds.THROUGHPUT_DROP, is_throughput_drop, Shape.VIEW),
)
