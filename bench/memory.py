"""make bench-memory: the replay's memory against a real cgroup limit, and what reading it costs.

Each run starts harness/memory_hog.py in a cgroup v1 memory group made here (as root:
where none can be made this fails in one line): a Reverb server filled with incompressible
63,504-byte frames at RATE items a second by a real writer. The limit is set HEADROOM above
what the group uses once the server is up. The sidecar's own poller watches it (--reverb-pid).

  does_not_fit   max_size 40,000 (about 3 GiB): when memory_exhaustion opens, how full the
                 table is, its seconds_left against the real time to the kernel's kill, and
                 whether target_down then carries the OOM kill
  fits           max_size 4,000 (about 300 MB under 512 MiB): any memory finding from the
                 start to FITS_WATCH_S after the table is full is a false alarm (memory_leak
                 included: a full table in steady state, its evictions released late)
  leaks          max_size 500 at LEAK_RATE items/s, the writer made with num_keep_alive_refs
                 1,000,000 and never ending its episode, through an ActorProbe the sidecar
                 reads: when memory_leak opens after the table is full, the growth it saw
                 and the cause it names (LEAK_HEADROOM above the group's use: no kill)

Then the cost: MemoryWatch.read on a live process, per call (the poll adds one).

    python -m bench.memory [--results bench/RESULTS.md]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness.procs import PYTHON, Proc
from replaywatch.config import PollConfig, ProbeTarget, WatchConfig
from replaywatch.sources.memory import MemoryWatch
from replaywatch.wiring import build_sidecar

V1 = Path("/sys/fs/cgroup/memory")
HEADROOM = 512 << 20
RATE = 90.0
FITS_WATCH_S = 300.0
LEAK_RATE = 20.0
LEAK_HEADROOM = 4 << 30
LEAK_WITHIN_S = 600.0
HEADING = "## Replay memory against a real cgroup limit"
KINDS = ("memory_exhaustion", "memory_leak", "target_down")


def run(name: str, max_size: int, tmp: Path, watch_full_s: float, rate: float = RATE,
        headroom: int = HEADROOM, leak: bool = False) -> dict[str, Any]:
    group = V1 / f"replaywatch-bench-{os.getpid()}-{name}"
    group.mkdir()
    flags = ["--keep-episode", "--actor-probe"] if leak else []
    hog = Proc([PYTHON, "harness/memory_hog.py", "--cgroup", str(group), "--max-size",
                str(max_size), "--rate", str(rate), *flags], stdout_path=tmp / f"{name}.log")
    try:
        start = hog.announce(timeout_s=120)
        used = int((group / "memory.usage_in_bytes").read_text())
        (group / "memory.limit_in_bytes").write_text(str(used + headroom))
        probes = (ProbeTarget(start["actor_probe"], start["reverb"]),) if leak else ()
        config = WatchConfig(targets=(start["reverb"],), probes=probes,
                             reverb_pids=((start["reverb"], start["pid"]),),
                             poll=PollConfig(interval_s=1.0, history_s=900.0))
        out: dict[str, Any] = {"run": name, "max_size": max_size, "limit_bytes": used + headroom,
                               "findings": []}
        began = time.monotonic()
        full_at = killed_at = None
        with build_sidecar(config, incidents_path=str(tmp / f"{name}.db")) as sidecar:
            while time.monotonic() - began < (LEAK_WITHIN_S + 120 if leak else 600):
                t0 = time.monotonic()
                state = sidecar.poller.tick()
                now = time.monotonic() - began
                if killed_at is None and hog.returncode is not None:
                    killed_at = now
                table = next(iter(state.tables.values()), None)
                if table is not None and full_at is None and table.current_size >= max_size:
                    full_at = now
                for f in state.findings:
                    if f.kind in KINDS and not any(
                            x["kind"] == f.kind for x in out["findings"]):
                        out["findings"].append({"kind": f.kind, "at_s": round(now, 1),
                                                "evidence": f.evidence})
                if any(x["kind"] in ("target_down", "memory_leak") for x in out["findings"]):
                    break
                if full_at is not None and now - full_at >= watch_full_s:
                    break
                time.sleep(max(0.0, 1.0 - (time.monotonic() - t0)))
        out.update(killed_at_s=killed_at, full_at_s=full_at)
        return out
    finally:
        hog.kill()
        for _ in range(50):
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)


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


def render(rows: list[dict[str, Any]], c: dict[str, float]) -> str:
    lines = [f"{HEADING} ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})", "",
             f"`make bench-memory` (bench/memory.py): a Reverb server in a cgroup v1 memory "
             f"group, its limit {HEADROOM >> 20} MiB above the group's use once the server is "
             f"up, filled at {RATE:g} items/s with incompressible 63,504-byte frames by a real "
             "writer, watched by the sidecar once a second.", "",
             "| run | max_size | memory_exhaustion opened | table full then | bytes/item "
             "(measured) | seconds_left then | real time to the kill | target_down says "
             "OOM kill | memory findings after full |",
             "| --- | ---: | --- | ---: | ---: | ---: | ---: | --- | --- |"]
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
            f"{'-' if ex is None else ex['evidence']['seconds_left']} | "
            f"{'-' if to_kill is None else to_kill} | "
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
    lines += ["", f"Reading the memory (MemoryWatch.read, a live process): discovery by port "
              f"{c['discovery_ms']:.1f} ms once, then {c['p50_ms']:.3f} ms a poll (p99 "
              f"{c['p99_ms']:.3f} ms)."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", type=Path, default=None)
    args = p.parse_args(argv)
    try:
        probe = V1 / f"replaywatch-bench-{os.getpid()}-probe"
        probe.mkdir()
        probe.rmdir()
    except OSError as e:
        print(f"bench.memory: error: no memory cgroup can be made under {V1} ({e})",
              file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        rows = [run("does_not_fit", 40_000, Path(tmp), 0.0),
                run("fits", 4_000, Path(tmp), FITS_WATCH_S),
                run("leaks", 500, Path(tmp), LEAK_WITHIN_S, rate=LEAK_RATE,
                    headroom=LEAK_HEADROOM, leak=True)]
    text = render(rows, cost())
    print(text, flush=True)
    if args.results:
        from bench.results_md import replace_sections

        args.results.write_text(replace_sections(args.results.read_text(), [text + "\n"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
