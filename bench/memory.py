"""make bench-memory: the replay's memory against a real cgroup limit, and what reading it costs.

Each run starts harness/memory_hog.py in a cgroup v1 memory group made here (as root:
where none can be made this fails in one line): a Reverb server filled with incompressible
63,504-byte frames at RATE items a second by a real writer. The limit is set HEADROOM above
what the group uses once the server is up. The sidecar's own poller watches it (--reverb-pid).

  does_not_fit   max_size 40,000 (about 3 GiB): when memory_exhaustion opens, how full the
                 table is, its seconds_left against the real time to the kernel's kill (the
                 first, and the most it said over the time there was at any poll), and
                 whether target_down then carries the OOM kill
  actor_apart    the same table as a real job runs it: the server alone in a 2 GiB cgroup
                 (limited before it starts), its frames written at APART_RATE items/s by an
                 actor in a process of its own, started beside the sidecar, so the table
                 stands empty while the actor loads (a rate averaged over that said twice
                 the time there was)
  fits           max_size 4,000 (about 300 MB under 512 MiB): any memory finding from the
                 start to FITS_WATCH_S after the table is full is a false alarm (memory_leak
                 included: a full table in steady state, its evictions released late)
  leaks          max_size 500 at LEAK_RATE items/s, the writer made with num_keep_alive_refs
                 1,000,000 and never ending its episode, through an ActorProbe the sidecar
                 reads: when memory_leak opens after the table is full, the growth it saw
                 and the cause it names (LEAK_HEADROOM above the group's use: no kill)

Then the cost: MemoryWatch.read on a live process, per call (the poll adds one).

    python -m bench.memory [--results bench/RESULTS.md]
    python -m bench.memory --run actor_apart --trace tests/fixtures/memory_actor_apart.json

`--run`: that run alone, its row printed (no file written). `--trace`: each poll's readings
(the table's size, the process's counted memory, the sidecar's clock from the first poll)
and the kill, as JSON: tests/test_rules_memory.py judges the fixture poll by poll.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness.cgroups import remove_group
from harness.procs import PYTHON, Proc
from replaywatch.config import PollConfig, ProbeTarget, WatchConfig
from replaywatch.sources.memory import MemoryWatch
from replaywatch.state import Published
from replaywatch.wiring import build_sidecar

V1 = Path("/sys/fs/cgroup/memory")
HEADROOM = 512 << 20
RATE = 90.0
FITS_WATCH_S = 300.0
LEAK_RATE = 20.0
LEAK_HEADROOM = 4 << 30
LEAK_WITHIN_S = 600.0
APART_LIMIT = 2 << 30
APART_RATE = 100.0
HEADING = "## Replay memory against a real cgroup limit"
KINDS = ("memory_exhaustion", "memory_leak", "target_down")


def run(name: str, max_size: int, tmp: Path, watch_full_s: float, rate: float = RATE,
        headroom: int = HEADROOM, leak: bool = False, limit: int | None = None,
        apart: bool = False) -> dict[str, Any]:
    """One server watched until it is killed or full for `watch_full_s`: its limit
    `headroom` above the group's use once it is up, or `limit` from its start; `apart`: its
    writer a process of its own, outside the group, started beside the sidecar."""
    group = V1 / f"replaywatch-bench-{os.getpid()}-{name}"
    group.mkdir()
    if limit is not None:
        (group / "memory.limit_in_bytes").write_text(str(limit))
    flags = ["--keep-episode", "--actor-probe"] if leak else []
    writes = ["--serve-only"] if apart else ["--rate", str(rate)]
    hog = Proc([PYTHON, "harness/memory_hog.py", "--cgroup", str(group), "--max-size",
                str(max_size), *writes, *flags], stdout_path=tmp / f"{name}.log")
    writer = None
    try:
        start = hog.announce(timeout_s=120)
        if limit is None:
            limit = int((group / "memory.usage_in_bytes").read_text()) + headroom
            (group / "memory.limit_in_bytes").write_text(str(limit))
        if apart:
            writer = Proc([PYTHON, "harness/memory_hog.py", "--write-to", start["reverb"],
                           "--rate", str(rate)], stdout_path=tmp / f"{name}-writer.log")
        probes = (ProbeTarget(start["actor_probe"], start["reverb"]),) if leak else ()
        config = WatchConfig(targets=(start["reverb"],), probes=probes,
                             reverb_pids=((start["reverb"], start["pid"]),),
                             poll=PollConfig(interval_s=1.0, history_s=900.0))
        out: dict[str, Any] = {"run": name, "max_size": max_size, "limit_bytes": limit,
                               "findings": [], "lefts": [], "polls": []}
        began = time.monotonic()
        full_at = killed_at = None
        began_at: float | None = None
        with build_sidecar(config, incidents_path=str(tmp / f"{name}.db")) as sidecar:
            while time.monotonic() - began < (LEAK_WITHIN_S + 120 if leak else 600):
                t0 = time.monotonic()
                state = sidecar.poller.tick()
                now = time.monotonic() - began
                if killed_at is None and hog.returncode is not None:
                    killed_at = now
                table = next(iter(state.tables.values()), None)
                began_at = state.at if began_at is None else began_at
                _trace(out, state, began_at, killed_at is not None)
                if table is not None and full_at is None and table.current_size >= max_size:
                    full_at = now
                for f in state.findings:
                    if f.kind in KINDS and not any(
                            x["kind"] == f.kind for x in out["findings"]):
                        out["findings"].append({"kind": f.kind, "at_s": round(now, 1),
                                                "evidence": f.evidence})
                    if f.kind == "memory_exhaustion" and f.evidence["seconds_left"] is not None:
                        out["lefts"].append((now, f.evidence["seconds_left"]))
                if any(x["kind"] in ("target_down", "memory_leak") for x in out["findings"]):
                    break
                if full_at is not None and now - full_at >= watch_full_s:
                    break
                time.sleep(max(0.0, 1.0 - (time.monotonic() - t0)))
        out.update(killed_at_s=killed_at, full_at_s=full_at)
        return out
    finally:
        hog.kill()
        if writer is not None:
            writer.kill()
        remove_group(group)


def _trace(out: dict[str, Any], state: Published, origin: float, killed: bool) -> None:
    """The poll's readings, on the sidecar's clock from the first poll: alive, the table's
    snapshot and the memory read beside it; the first poll that finds the process gone, its
    time as the kill's."""
    table = next(iter(state.tables.values()), None)
    m = next(iter(state.memory.values()), None)
    if killed:
        out.setdefault("killed_at_clock_s", round(state.at - origin, 3))
    elif table is not None and m is not None and m.counted_bytes is not None:
        out["polls"].append([round(table.observed_at - origin, 3), table.current_size,
                             round(m.observed_at - origin, 3), m.counted_bytes])


def cost(calls: int = 2000) -> dict[str, float]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        watch = MemoryWatch(f"127.0.0.1:{port}", port)
        t0 = time.perf_counter()
        watch.read(0.0)  # finds the process: once
        first = time.perf_counter() - t0
        times = []
        for _ in range(calls):
            t0 = time.perf_counter()
            watch.read(0.0)
            times.append(time.perf_counter() - t0)
    times.sort()
    return {"discovery_ms": first * 1e3, "p50_ms": statistics.median(times) * 1e3,
            "p99_ms": times[int(0.99 * len(times))] * 1e3}


def render(rows: list[dict[str, Any]], c: dict[str, float] | None) -> str:
    lines = [f"{HEADING} ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})", "",
             f"`make bench-memory` (bench/memory.py): a Reverb server in a cgroup v1 memory "
             f"group, its limit {HEADROOM >> 20} MiB above the group's use once the server is "
             f"up, filled at {RATE:g} items/s with incompressible 63,504-byte frames by a real "
             "writer, watched by the sidecar once a second.", "",
             f"actor_apart: the server alone in a {APART_LIMIT >> 30} GiB group (limited "
             f"before it starts), its frames written at {APART_RATE:g} items/s by an actor in "
             "a process of its own started beside the sidecar, the table empty while the "
             "actor loads. seconds_left is the soonest the readings allow (its range beside "
             "it); \"most over\": the most it said over the real time left at any poll.", "",
             "| run | max_size | memory_exhaustion opened | table full then | bytes/item "
             "(measured) | seconds_left then | real time to the kill | most over, any poll "
             "| target_down says OOM kill | memory findings after full |",
             "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | --- | --- |"]
    for r in (r for r in rows if r["run"] != "leaks"):
        ex = next((f for f in r["findings"] if f["kind"] == "memory_exhaustion"), None)
        down = next((f for f in r["findings"] if f["kind"] == "target_down"), None)
        to_kill = (None if ex is None or r["killed_at_s"] is None
                   else round(r["killed_at_s"] - ex["at_s"]))
        after_full = [f["kind"] for f in r["findings"] if r["full_at_s"] is not None
                      and f["at_s"] >= r["full_at_s"]]
        full = "-" if ex is None else format(ex["evidence"]["current_size"] / r["max_size"], ".0%")
        lines.append(
            f"| {r['run']} | {r['max_size']:,} | "
            f"{'no' if ex is None else str(ex['at_s']) + ' s'} | "
            f"{full} | {'-' if ex is None else format(ex['evidence']['bytes_per_item'], ',')} | "
            f"{'-' if ex is None else _left(ex['evidence'])} | "
            f"{'-' if to_kill is None else to_kill} | {most_over(r)} | "
            f"{'-' if down is None else bool(down['evidence'].get('killed_at_memory_limit'))} | "
            f"{', '.join(after_full) or 'none'} |")
    leaks = [r for r in rows if r["run"] == "leaks"]
    if leaks:
        lines += ["", f"A writer that keeps its episode alive (num_keep_alive_refs 1,000,000, no "
                  f"end_episode, {LEAK_RATE:g} frames/s) beside a table of 500 that is full "
                  "after 25 s:", "",
                  "| run | memory_leak opened, after the table was full | growth seen | over | "
                  "rate | cause named |", "| --- | ---: | ---: | ---: | ---: | --- |"]
        for r in leaks:
            lk = next((f for f in r["findings"] if f["kind"] == "memory_leak"), None)
            if lk is None or r["full_at_s"] is None:
                lines.append(f"| {r['run']} | no | - | - | - | - |")
                continue
            ev = lk["evidence"]
            lines.append(f"| {r['run']} | {lk['at_s'] - r['full_at_s']:.0f} s | "
                         f"{ev['growth_bytes'] / 2**20:,.0f} MiB | {ev['over_s']} s | "
                         f"{ev['bytes_per_s'] / 2**20:.2f} MiB/s | {ev['cause']} |")
    if c is not None:
        lines += ["", f"Reading the memory (MemoryWatch.read, a live process): discovery by "
                  f"port {c['discovery_ms']:.1f} ms once, then {c['p50_ms']:.3f} ms a poll (p99 "
                  f"{c['p99_ms']:.3f} ms)."]
    return "\n".join(lines)


def _left(ev: dict[str, Any]) -> str:
    span = ev.get("seconds_left_range")
    return f"{ev['seconds_left']}" + (f" ({span[0]}-{span[1] or 'no end'})" if span else "")


def most_over(r: dict[str, Any]) -> str:
    """The most seconds_left said over the real time left, at any poll, as a share of it
    (the last 5 s left out: a second's rounding there is a share of nothing)."""
    if r["killed_at_s"] is None or not r["lefts"]:
        return "-"
    over = [((left - (r["killed_at_s"] - at)) / (r["killed_at_s"] - at), left,
             r["killed_at_s"] - at) for at, left in r["lefts"] if r["killed_at_s"] - at >= 5]
    if not over:
        return "-"
    share, said, real = max(over)
    return f"{share:+.0%} ({said} s said, {real:.0f} s left)"


RUNS = {
    "does_not_fit": lambda tmp: run("does_not_fit", 40_000, tmp, 0.0),
    "actor_apart": lambda tmp: run("actor_apart", 40_000, tmp, 0.0, rate=APART_RATE,
                                   limit=APART_LIMIT, apart=True),
    "fits": lambda tmp: run("fits", 4_000, tmp, FITS_WATCH_S),
    "leaks": lambda tmp: run("leaks", 500, tmp, LEAK_WITHIN_S, rate=LEAK_RATE,
                             headroom=LEAK_HEADROOM, leak=True),
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", type=Path, default=None)
    p.add_argument("--run", action="append", choices=sorted(RUNS), default=None,
                   help="only this run (repeatable): its rows printed, no file written")
    p.add_argument("--trace", type=Path, default=None,
                   help="each run's polls and kill, as JSON (tests/fixtures/memory_*.json)")
    args = p.parse_args(argv)
    if args.run and args.results:
        p.error("--run prints its rows only: the section is written by every run")
    try:
        probe = V1 / f"replaywatch-bench-{os.getpid()}-probe"
        probe.mkdir()
        probe.rmdir()
    except OSError as e:
        print(f"bench.memory: error: no memory cgroup can be made under {V1} ({e})",
              file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        rows = [RUNS[name](Path(tmp)) for name in args.run or RUNS]
    if args.trace:
        args.trace.write_text(json.dumps(
            {r["run"]: {"recorded": "python -m bench.memory --run " + r["run"] + " --trace",
                        "limit_bytes": r["limit_bytes"], "max_size": r["max_size"],
                        "killed_at_clock_s": r.get("killed_at_clock_s"),
                        "polls": r["polls"]} for r in rows}, separators=(",", ":")) + "\n")
    text = render(rows, None if args.run else cost())
    print(text, flush=True)
    if args.results:
        from bench.results_md import write_sections

        write_sections(args.results, [text + "\n"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
