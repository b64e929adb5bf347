"""make bench-long: what `make bench` is too short to show, at the default thresholds.

1. **Healthy runs of LONG_S (600 s)**, three side by side at a time as in make bench:
   sync, async, distributed; then queue (an on-policy `Table.queue`), eval_checkpoint (a sync
   loop evaluating and checkpointing about once a minute) and first_step_600s
   (a 10-minute first compile, watched a minute past it); then slow_step_12s (a learner
   whose every update takes 12 s, the actors held at max_diff through each step: the
   learned stall windows) beside prioritized and prioritized_sync (prioritized replay, the
   learner sending each batch's |TD error| back: the replay-health findings). A throughput
   baseline takes 3 minutes and a drop 5 more, so only runs this long can show
   throughput_drop's false alarms. Any warning or critical finding on any of the three
   sidecars is a false alarm.
2. **throughput_drop's detection times**: distributed runs (a 20 ms environment step) whose
   actor loops are paced 2x, 5x and 10x slower than their own minute before (DROPS), at once,
   BASELINE_S (240 s) after each actor's environment is made, side by side. Measured per
   sidecar: from the slow-down (the earliest actor probe's `started_at` plus BASELINE_S; the
   environment is made a moment after the probe starts) to the first throughput_drop; not
   named within DROP_WATCH_S is "not named".

    python -m bench.long --results bench/RESULTS.md     # make bench-long (about 60 min)
    python -m bench.long --seconds 120 --baseline-s 60  # a quick look (no drop is named)
    python -m bench.long --no-drops --runs eval_checkpoint,first_step_600s   # two runs again
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import healthy, watched
from bench.results_md import write_sections
from harness.procs import get_json

LONG_S = 600.0
BASELINE_S = 240.0
DROP_WATCH_S = 660.0  # past the slow-down: the 300 s bound for half, twice, and a minute
STEP_S = 0.02
# Each actor loop is paced FACTOR times slower than its own minute before the slow-down
# (`--slow-down FACTORx@SECONDS`). Multiplying only the environment step's sleep took the
# rates down by however much of the loop that sleep was on a machine this busy: x3.2 and x9.5
# left 0.5 and 0.21 of the rate in one run, x4 and x11 left 0.31 and 0.11 in the next.
DROPS = (("2x", 2.0), ("5x", 5.0), ("10x", 10.0))
HEALTHY_GROUPS = (("sync", "async", "distributed"),
                  ("queue", "eval_checkpoint", "first_step_600s"),
                  ("slow_step_12s", "prioritized", "prioritized_sync"))
HEADING_HEALTHY = "## Long healthy runs"
HEADING_DROPS = "## throughput_drop detection"


def drop_runs(baseline_s: float) -> list[healthy.HealthyRun]:
    return [healthy.HealthyRun(
        f"drop_{name}", [*watched.DISTRIBUTED, "--env-step-delay-s", f"{STEP_S:g}",
                         "--slow-down", f"{f:g}x@{baseline_s:g}"]) for name, f in DROPS]


def detect_drops(tmp: Path, baseline_s: float, watch_s: float) -> list[dict[str, Any]]:
    """Each drop run side by side; when throughput_drop first showed on each sidecar."""
    runs = [healthy._Watched(r, tmp) for r in drop_runs(baseline_s)]
    started = time.monotonic()
    try:
        while any(r.start is None for r in runs):
            for r in runs:
                if r.start is None:
                    r.attach(baseline_s + watch_s)
            if time.monotonic() - started > 300:
                raise TimeoutError("a drop run printed no start line in 300 s")
            time.sleep(1.0)
        slowed = {r.run.name: _slow_down_at(r, baseline_s) for r in runs}
        while any(not r.done() for r in runs):
            for r in runs:
                r.poll()
            if all("throughput_drop" in r.seen[side] for r in runs for side in r.bases):
                break
            time.sleep(1.0)
        out = []
        for r in runs:
            at = slowed[r.run.name]
            row: dict[str, Any] = {"run": r.run.name, "slow_down_at": at}
            for side in r.bases:
                seen = r.seen[side].get("throughput_drop")
                row[side] = (None if seen is None or at is None
                             else round((r.attached_at or 0) + seen - at, 1))
                row[f"{side}:alarms"] = sorted(k for k in r.alarms[side]
                                               if k != "throughput_drop")
            row["finding"] = _drop_evidence(r)
            row["measured_ratio"] = _measured_ratio(r, at)
            out.append(row)
        return out
    finally:
        for r in runs:
            r.close()


def _slow_down_at(run: Any, baseline_s: float) -> float | None:
    starts = []
    for url in (run.start or {}).get("actor_probes", []):
        try:
            starts.append(float(get_json(f"{url}/probe", 2)[1]["started_at"]))
        except (OSError, KeyError, ValueError, TypeError):
            continue
    return min(starts) + baseline_s if starts else None


def _drop_evidence(run: Any) -> dict[str, Any] | None:
    for base in run.bases.values():
        try:
            found = get_json(f"{base}/api/v1/findings", 2)[1]["findings"]
        except (OSError, KeyError, ValueError):
            continue
        for f in found:
            if f["kind"] == "throughput_drop":
                ev = f["evidence"]
                return {"worst_series": ev.get("worst_series"),
                        "worst_ratio": round(ev.get("worst_ratio", 0.0), 3),
                        "attribution": ev.get("attribution")}
    return None


def _measured_ratio(run: Any, slowed_at: float | None, span_s: float = 180.0
                    ) -> float | None:
    """The table's insert rate over the last `span_s` against its rate over the `span_s`
    before the slow-down, from the sidecar's history, named or not: how deep the drop went,
    whatever baseline the rule was judging by by then."""
    if slowed_at is None:
        return None
    for base in run.bases.values():
        try:
            table = get_json(f"{base}/api/v1/tables", 2)[1]["tables"][0]
            points = get_json(f"{base}/api/v1/tables/{table['target']}/{table['name']}"
                              "/history?seconds=3600", 5)[1]["points"]
        except (OSError, KeyError, IndexError, ValueError):
            continue
        before = _rate([p for p in points if slowed_at - span_s <= p["observed_at"] <= slowed_at])
        after = _rate([p for p in points if p["observed_at"] >= points[-1]["observed_at"] - span_s])
        if before and after is not None:
            return round(after / before, 3)
    return None


def _rate(points: list[dict[str, Any]]) -> float | None:
    if len(points) < 2 or points[-1]["observed_at"] <= points[0]["observed_at"]:
        return None
    inserts = points[-1]["rate_limiter"]["inserts"] - points[0]["rate_limiter"]["inserts"]
    return inserts / (points[-1]["observed_at"] - points[0]["observed_at"])


def render_drops(rows: list[dict[str, Any]], baseline_s: float) -> str:
    lines = [f"{HEADING_DROPS} ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})", "",
             f"`make bench-long` (bench/long.py), default thresholds. Distributed, 4 actors "
             f"stepping a {STEP_S * 1000:g} ms environment, each loop paced the factor shown "
             f"slower than its minute before, at once, after {baseline_s:g} s; seconds from "
             "the slow-down to the first throughput_drop on each sidecar (bounds: 60 s plus "
             "a 10 s bucket below a fifth, 300 s plus a bucket below half). Ratio: the worst "
             "series' rate over its baseline, from the finding still open at the end; "
             "inserts after/before: the table's insert rate over the last 180 s against its "
             "rate over the 180 s before the slow-down, named or not.", "",
             "| drop | loop factor | probe+actors sidecar s | Reverb-only sidecar s "
             "| worst series | ratio | inserts after/before | attribution | other alarms |",
             "| --- | ---: | ---: | ---: | --- | ---: | ---: | --- | --- |"]
    factors = dict(DROPS)
    for r in rows:
        f = r["finding"] or {}
        other = sorted(set(r.get("probe:alarms", [])) | set(r.get("reverb:alarms", [])))
        name = r['run'].removeprefix('drop_')
        lines.append(f"| {name} | {factors.get(name, 0):g} | {_s(r.get('probe'))} | "
                     f"{_s(r.get('reverb'))} | {f.get('worst_series', '-')} | "
                     f"{f.get('worst_ratio', '-')} | {r.get('measured_ratio') or '-'} | "
                     f"{f.get('attribution', '-')} | "
                     f"{', '.join(other) or 'none'} |")
    return "\n".join(lines) + "\n"


def _s(value: float | None) -> str:
    return "not named" if value is None else f"{value:g}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=LONG_S, help="each healthy run")
    p.add_argument("--baseline-s", type=float, default=BASELINE_S)
    p.add_argument("--drop-watch-s", type=float, default=DROP_WATCH_S)
    p.add_argument("--no-healthy", action="store_true")
    p.add_argument("--no-drops", action="store_true")
    p.add_argument("--runs", default=None, metavar="NAME,...",
                   help="only these healthy runs, side by side (bench/healthy.py's RUNS)")
    p.add_argument("--results", type=Path, default=None, help="replace the sections here")
    args = p.parse_args(argv)
    sections = []
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        if not args.no_healthy:
            results = []
            groups = HEALTHY_GROUPS if args.runs is None else (tuple(args.runs.split(",")),)
            unknown = sorted(set(groups[0]) - set(healthy.RUNS)) if args.runs else []
            if unknown:
                p.error(f"unknown run {unknown[0]!r} (known: {', '.join(healthy.RUNS)})")
            for group in groups:
                results += healthy.healthy(args.seconds, Path(tmp), group,
                                           first_step_s=args.seconds)
            took = (time.monotonic() - t0) / 60
            sections.append(
                f"{HEADING_HEALTHY} ({args.seconds:g} s each, {took:.1f} min, "
                f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})\n\n"
                f"`make bench-long`: runs of {args.seconds:g} s, up to three side by side, "
                "three sidecars each (probes and actors; Reverb alone; the learner's probe "
                "alone), default thresholds (windows learned). Any warning or critical "
                "finding is a false alarm.\n\n"
                + healthy.render(results) + "\n")
            print(sections[-1], flush=True)
        if not args.no_drops:
            rows = detect_drops(Path(tmp), args.baseline_s, args.drop_watch_s)
            sections.append(render_drops(rows, args.baseline_s))
            print(sections[-1], flush=True)
    if args.results and sections:
        write_sections(args.results, sections)
    return 0


if __name__ == "__main__":
    sys.exit(main())
