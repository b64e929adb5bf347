"""`make bench-poll-deadline`: one Reverb server that answers nothing must not slow the polls
of the others.

Four real Reverb servers, each its own process with its own insert and sample loops
(harness/reverb_workload.py), watched by one sidecar polling every second (the default
deadline: 0.8 x the interval). After a baseline, one server is stopped (SIGSTOP) for
`--blocked-s`: from outside it looks as a server whose table lock a checkpoint holds (the
connection is taken, ServerInfo never answers), then it is continued. For the three others,
per phase: the poll's duration (p50, p99, max), how many cycles polled each of them, and
polls skipped as late; for the cycle, its duration. What the blocked one was named while it
was blocked is listed too.
"""

from __future__ import annotations

import argparse
import signal
import statistics
import tempfile
import time
from pathlib import Path

from bench.results_md import write_sections
from bench.stats import percentile
from harness.procs import PYTHON, Proc
from replaywatch.config import PollConfig, WatchConfig
from replaywatch.wiring import build_sidecar

HEADING = "## One blocked server and the others' polls"
SERVERS = 4


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--baseline-s", type=float, default=30.0)
    p.add_argument("--blocked-s", type=float, default=60.0)
    p.add_argument("--results", type=Path, default=None)
    args = p.parse_args()
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="rwpd-") as tmp:
        procs = [Proc([PYTHON, "harness/reverb_workload.py", "--port", "0"],
                      stdout_path=Path(tmp) / f"reverb-{i}.log") for i in range(SERVERS)]
        try:
            addresses = [proc.announce(timeout_s=120)["reverb"] for proc in procs]
            blocked, others = addresses[0], addresses[1:]
            config = WatchConfig(targets=tuple(addresses), poll=PollConfig(interval_s=1.0))
            phases: dict[str, dict[str, list[float]]] = {}
            named: set[str] = set()
            with build_sidecar(config, incidents_path=str(Path(tmp) / "i.db")) as car:
                state = car.poller.tick()
                for phase, seconds in (("warm-up", 10.0), ("baseline", args.baseline_s),
                                       ("one blocked", args.blocked_s)):
                    if phase == "one blocked":
                        procs[0].signal(signal.SIGSTOP)
                    record = phases.setdefault(phase, {"poll_s": [], "cycle_s": [],
                                                       "polled": [], "late": []})
                    start = time.monotonic()
                    while time.monotonic() - start < seconds:
                        t0 = time.monotonic()
                        before = {n: s.polls_total for n, s in state.sources.items()}
                        state = car.poller.tick()
                        record["cycle_s"].append(time.monotonic() - t0)
                        for name in others:
                            s = state.sources[name]
                            record["polled"].append(float(s.polls_total - before.get(name, 0)))
                            record["late"].append(float(s.late_polls_total))
                            if s.last_duration_s is not None:
                                record["poll_s"].append(s.last_duration_s)
                        if phase == "one blocked":
                            named |= {f"{f.kind}" for f in state.findings if f.target == blocked}
                        time.sleep(max(0.0, 1.0 - (time.monotonic() - t0)))
        finally:
            procs[0].signal(signal.SIGCONT)
            for proc in procs:
                proc.kill()
    rows = {phase: summary(r) for phase, r in phases.items() if phase != "warm-up"}
    text = render(rows, named, args, (time.monotonic() - began) / 60)
    print(text)
    if args.results:
        write_sections(args.results, [text])
    base, held = rows["baseline"], rows["one blocked"]
    return 0 if held["missed"] == 0 and held["late"] == 0 and held["p99_ms"] <= max(
        2 * base["p99_ms"], base["p99_ms"] + 20) else 1


def summary(r: dict[str, list[float]]) -> dict[str, float]:
    polls_ms = [1000 * d for d in r["poll_s"]]
    return {"cycles": len(r["cycle_s"]), "p50_ms": statistics.median(polls_ms),
            "p99_ms": percentile(polls_ms, 0.99), "max_ms": max(polls_ms),
            "missed": sum(1 for n in r["polled"] if n < 1),
            "late": max(r["late"]) - min(r["late"]),
            "cycle_p50_ms": 1000 * statistics.median(r["cycle_s"]),
            "cycle_max_ms": 1000 * max(r["cycle_s"])}


def render(rows: dict[str, dict[str, float]], named: set[str], args: argparse.Namespace,
           minutes: float) -> str:
    lines = [f"{HEADING} ({args.baseline_s:g} s baseline, {args.blocked_s:g} s blocked, "
             f"{minutes:.1f} min, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})", "",
             f"`make bench-poll-deadline` (bench/poll_deadline.py): {SERVERS} real Reverb "
             "servers with their own insert and sample loops, one sidecar polling each every "
             "second (deadline 0.8 s); one server then stopped with SIGSTOP (it takes the "
             "connection and never answers, as a server whose table lock a checkpoint holds "
             "does from outside). Figures for the three others; a cycle that did not poll one "
             "of them is `missed`.", "",
             "| phase | cycles | poll p50 ms | poll p99 ms | poll max ms | missed | late "
             "| cycle p50 ms | cycle max ms |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for phase, r in rows.items():
        lines.append(f"| {phase} | {r['cycles']} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | "
                     f"{r['max_ms']:.1f} | {r['missed']} | {r['late']:.0f} | "
                     f"{r['cycle_p50_ms']:.0f} | {r['cycle_max_ms']:.0f} |")
    lines += ["", "The blocked server was named " + (", ".join(sorted(named)) or "nothing")
              + " while it was blocked. A cycle waits for its slowest poll up to the "
              "deadline, so its duration rises to about the deadline while one server is "
              "blocked; the others' polls do not.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
