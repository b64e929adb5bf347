"""Benchmark: the sidecar's own cost as targets and tables grow.

For each shape (targets x tables per target) it starts real Reverb servers and
one `replaywatch watch` at 1 Hz, then measures
  - CPU seconds the sidecar spends per poll cycle (from /proc, no HTTP load),
  - /metrics latency over HTTP, p50 and p99, one scrape about every cycle,
    drifting through the cycle's phases (the body is rendered once per cycle on
    the poller's thread; a scrape that lands while the poller runs waits for the GIL),
  - the poll cycle's own duration and the cycles that ran late meanwhile,
and, in-process, the memory a full default history window (900 s at 1 Hz)
takes for 50 targets x 5 tables, built from a real snapshot.

    python -m bench.scale [--quick] [--shape 50x5 ...]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import tempfile
import time
import tracemalloc
import urllib.request
from pathlib import Path

from bench.stats import percentile
from harness.procs import PYTHON, Proc, free_port, get_json, wait_until

SHAPES = [(1, 1), (1, 10), (1, 100), (10, 5), (50, 5)]
# The goal is /metrics p99 < 20 ms at this shape (README): it gets enough scrapes for a
# p99 to mean something (100: the second slowest; --quick, make bench's, 70: the slowest),
# the others a quick look.
GOAL_SHAPE, GOAL_SCRAPES, QUICK_GOAL_SCRAPES = (50, 5), 100, 70


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure_shape(targets: int, tables: int, idle_s: float, scrapes: int) -> dict[str, float]:
    tmp = Path(tempfile.mkdtemp(prefix="rw-scale-"))
    servers = Proc([PYTHON, "harness/reverb_workload.py", "--servers", str(targets),
                    "--tables", str(tables), "--insert-hz", "10"], stdout_path=tmp / "r.log")
    sidecar = None
    try:
        addresses = servers.announce(timeout_s=180)["all"]
        port = free_port()
        flags = [f for a in addresses for f in ("--reverb", a)]
        sidecar = Proc([PYTHON, "-m", "replaywatch", "watch", *flags, "--listen",
                        f"127.0.0.1:{port}", "--db", str(tmp / "i.db"), "--log-level",
                        "warning"], stdout_path=tmp / "s.log")
        base = f"http://127.0.0.1:{port}"
        wait_until(lambda: len(get_json(f"{base}/api/v1/tables", 10)[1]["tables"])
                   == targets * tables, 120)
        time.sleep(2.0)
        cycle0 = get_json(f"{base}/readyz")[1]["cycle"]
        cpu0 = cpu_seconds(sidecar.pid)
        time.sleep(idle_s)
        cpu1 = cpu_seconds(sidecar.pid)
        cycles = get_json(f"{base}/readyz")[1]["cycle"] - cycle0
        latencies, cycle_s = [], []
        late0 = _metric(_scrape(base), "replaywatch_late_poll_cycles_total")
        for _ in range(scrapes):
            time.sleep(1.05)  # drifts 50 ms a cycle: scrapes land at every phase of a cycle
            t0 = time.perf_counter()
            body = _scrape(base)
            latencies.append(time.perf_counter() - t0)
            cycle_s.append(_metric(body, "replaywatch_poll_cycle_duration_seconds"))
        late = _metric(_scrape(base), "replaywatch_late_poll_cycles_total") - late0
    finally:
        if sidecar is not None:
            sidecar.kill()
        servers.kill()
    cpu_per_cycle = (cpu1 - cpu0) / max(1, cycles)
    return {"targets": targets, "tables": tables, "cycles": cycles,
            "cpu_s_per_cycle": cpu_per_cycle, "core_share_at_1hz": cpu_per_cycle,
            "metrics_p50_ms": 1000 * statistics.median(latencies),
            "metrics_p99_ms": 1000 * percentile(latencies, 0.99),
            "cycle_p50_ms": 1000 * statistics.median(cycle_s),
            "cycle_max_ms": 1000 * max(cycle_s), "late_cycles": late, "scrapes": scrapes}


def _scrape(base: str) -> bytes:
    with urllib.request.urlopen(f"{base}/metrics", timeout=10) as r:
        return r.read()


def _metric(body: bytes, name: str) -> float:
    """An unlabelled sample's value in a text exposition."""
    for line in body.decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise ValueError(f"{name} not in /metrics")


def full_window_memory_mb(targets: int = 50, tables: int = 5, points: int = 900) -> float:
    """Bytes a full history takes, built from one real snapshot with moving counters."""
    from replaywatch.history import History
    from replaywatch.model import PollOutcome, RateLimiterInfo, TableSnapshot
    from replaywatch.sources.reverb import ReverbSource

    servers = Proc([PYTHON, "harness/reverb_workload.py", "--tables", "1"],
                   stdout_path=Path(tempfile.mkdtemp()) / "r.log")
    try:
        address = servers.announce(timeout_s=120)["reverb"]
        template: TableSnapshot = wait_until(
            lambda: ReverbSource(address, 2.0).poll().tables[0], 30)
    finally:
        servers.kill()
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    history = History(max_age_s=points, max_points=points + 2)
    for t in range(points):
        for target in range(targets):
            snaps = tuple(dataclasses.replace(
                template, target=f"10.0.0.{target}:8000", name=f"table_{k}", observed_at=t,
                rate_limiter=dataclasses.replace(template.rate_limiter, inserts=t * 10 + k,
                                                 samples=t * 9 + k))
                for k in range(tables))
            history.record(PollOutcome(f"10.0.0.{target}:8000", "reverb", float(t), 0.001,
                                       tables=snaps))
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    assert isinstance(history.table("10.0.0.0:8000", "table_0")[0].rate_limiter,
                      RateLimiterInfo)
    grown = sum(s.size_diff for s in after.compare_to(before, "filename"))
    return grown / 1e6


def _shape(text: str) -> tuple[int, int]:
    targets, _, tables = text.partition("x")
    if not (targets.isdigit() and tables.isdigit()):
        raise argparse.ArgumentTypeError(f"shape {text!r} is not TARGETSxTABLES, e.g. 50x5")
    return int(targets), int(tables)


def _shapes_text() -> str:
    return " ".join(f"{t}x{n}" for t, n in SHAPES)


def main(argv: list[str] | None = None) -> dict[str, object]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer samples per shape")
    p.add_argument("--scrapes", type=int, help="scrapes a shape (default 20, --quick 8)")
    p.add_argument("--shape", action="append", type=_shape, metavar="TARGETSxTABLES",
                   help=f"only these shapes (repeatable; default all: {_shapes_text()})")
    args = p.parse_args(argv)
    idle_s, scrapes = (6.0, 8) if args.quick else (15.0, 20)
    scrapes = args.scrapes or scrapes
    rows = [measure_shape(t, n, idle_s,
                          max(scrapes, QUICK_GOAL_SCRAPES if args.quick else GOAL_SCRAPES)
                          if (t, n) == GOAL_SHAPE else scrapes)
            for t, n in args.shape or SHAPES]
    print("| targets | tables/target | CPU s per poll cycle (= cores at 1 Hz) | "
          "/metrics p50 ms | /metrics p99 ms | poll cycle p50 ms | max ms | late cycles |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['targets']} | {r['tables']} | {r['cpu_s_per_cycle']:.4f} | "
              f"{r['metrics_p50_ms']:.1f} | {r['metrics_p99_ms']:.1f} | "
              f"{r['cycle_p50_ms']:.0f} | {r['cycle_max_ms']:.0f} | {r['late_cycles']:.0f} |")
    counts = ", ".join(f"{r['targets']}x{r['tables']}: {r['scrapes']}" for r in rows)
    print(f"\n/metrics: scrapes a shape ({counts}), one every 1.05 s, p99 by nearest rank; "
          "poll cycle: replaywatch_poll_cycle_duration_seconds at each scrape; late cycles: "
          "over the scrapes.")
    if args.shape:  # a chosen few shapes: the edit-measure loop, without the memory run
        return {"rows": rows}
    memory = full_window_memory_mb()
    print(f"full history window (900 s at 1 Hz), 50 targets x 5 tables: {memory:.0f} MB")
    return {"rows": rows, "full_window_mb": memory}


if __name__ == "__main__":
    main()
