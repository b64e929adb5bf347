"""Benchmark: one sidecar polling many Reverb targets while many clients read it.

Starts real Reverb servers (one process hosting N servers x T tables), one
`replaywatch watch` at 1 Hz, and C concurrent HTTP clients hitting /metrics,
/api/v1/tables and /api/v1/findings for D seconds. Reports error responses,
late polls, the sidecar's memory over time, and p50/p99 latencies.

Memory is sampled every RSS_EVERY_S from the moment the history window is full.
The load's start costs a step (100 keep-alive connections, the server's worker
threads, their malloc arenas), then RSS settles as the allocator's free lists
fill. "Flat" is judged on the last third of the run: its growth and least-squares
slope, which a leak (a per-request or per-poll allocation never freed) would keep
at the same rate however long the run.

    python -m bench.load --duration 600     # the soak that RESULTS.md quotes

    python -m bench.load [--targets 20] [--tables 5] [--clients 100] [--duration 60]
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path

from bench.stats import percentile
from harness.procs import PYTHON, Proc, free_port, get_json, wait_until

PATHS = ("/metrics", "/api/v1/tables", "/api/v1/findings")
RSS_EVERY_S = 2.0


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def client_loop(port: int, stop: threading.Event, out: dict[str, list[float]],
                errors: list[str], index: int) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    n = index
    while not stop.is_set():
        path = PATHS[n % len(PATHS)]
        n += 1
        t0 = time.perf_counter()
        try:
            conn.request("GET", path)
            response = conn.getresponse()
            response.read()
            if response.status != 200:
                errors.append(f"{path}: HTTP {response.status}")
        except (OSError, http.client.HTTPException) as e:
            errors.append(f"{path}: {type(e).__name__}")
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            continue
        out[path].append(time.perf_counter() - t0)
    conn.close()


def slope_mb_per_min(samples: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, MB) samples, in MB per minute."""
    if len(samples) < 2:
        return float("nan")
    mean_t = statistics.fmean(t for t, _ in samples)
    mean_m = statistics.fmean(m for _, m in samples)
    var = sum((t - mean_t) ** 2 for t, _ in samples)
    cov = sum((t - mean_t) * (m - mean_m) for t, m in samples)
    return 60.0 * cov / var if var else float("nan")


def memory_summary(samples: list[tuple[float, float]], duration: float) -> dict[str, float]:
    """RSS when the load starts, a third in, two thirds in and at the end; growth and
    slope over the last third."""
    nan = float("nan")

    def at(fraction: float) -> float:
        later = [m for t, m in samples if t >= fraction * duration]
        return later[0] if later else nan

    last_third = [(t, m) for t, m in samples if t >= 2 * duration / 3]
    end = samples[-1][1] if samples else nan
    return {
        "rss_load_start_mb": samples[0][1] if samples else nan,
        "rss_third_mb": at(1 / 3), "rss_two_thirds_mb": at(2 / 3), "rss_end_mb": end,
        "rss_peak_mb": max((m for _, m in samples), default=nan),
        "last_third_growth_mb": end - at(2 / 3),
        "last_third_slope_mb_per_min": slope_mb_per_min(last_third),
    }


def run(targets: int, tables: int, clients: int, duration: float, interval: float = 1.0,
        history: float = 30.0
        ) -> dict[str, object]:
    tmp = Path(tempfile.mkdtemp(prefix="rw-load-"))
    servers = Proc([PYTHON, "harness/reverb_workload.py", "--servers", str(targets),
                    "--tables", str(tables), "--insert-hz", "20"], stdout_path=tmp / "r.log")
    port = free_port()
    sidecar = None
    try:
        addresses = servers.announce(timeout_s=120)["all"]
        flags = [f for a in addresses for f in ("--reverb", a)]
        sidecar = Proc([PYTHON, "-m", "replaywatch", "watch", *flags, "--listen",
                        f"127.0.0.1:{port}", "--interval", str(interval), "--db",
                        str(tmp / "i.db"), "--log-level", "warning", "--history", str(history)],
                       stdout_path=tmp / "s.log")
        base = f"http://127.0.0.1:{port}"
        wait_until(lambda: len(get_json(f"{base}/api/v1/tables", 5)[1]["tables"])
                   == targets * tables, 60)
        # Let the history window fill first: from then on memory must stay flat.
        time.sleep(history + 3 * interval)
        before = get_json(f"{base}/api/v1/targets")[1]["targets"]
        rss_before = rss_mb(sidecar.pid)
        stop = threading.Event()
        latencies: dict[str, list[float]] = {p: [] for p in PATHS}
        errors: list[str] = []
        threads = [threading.Thread(target=client_loop, args=(port, stop, latencies, errors, i),
                                    daemon=True) for i in range(clients)]
        started = time.monotonic()
        for t in threads:
            t.start()
        rss: list[tuple[float, float]] = [(0.0, rss_before)]
        while (elapsed := time.monotonic() - started) < duration:
            time.sleep(min(RSS_EVERY_S, duration - elapsed))
            rss.append((time.monotonic() - started, rss_mb(sidecar.pid)))
        stop.set()
        for t in threads:
            t.join(timeout=15)
        elapsed = time.monotonic() - started
        after = get_json(f"{base}/api/v1/targets")[1]["targets"]
        rss_after = rss_mb(sidecar.pid)
    finally:
        if sidecar is not None:
            sidecar.kill()
        servers.kill()
    polls = sum(a["polls_total"] - b["polls_total"] for a, b in zip(after, before, strict=True))
    late = sum(a["late_polls_total"] - b["late_polls_total"]
               for a, b in zip(after, before, strict=True))
    expected = targets * elapsed / interval
    return {
        "targets": targets, "tables": tables, "clients": clients, "duration_s": elapsed,
        "requests": sum(len(v) for v in latencies.values()), "errors": len(errors),
        "error_samples": errors[:5], "polls": polls, "expected_polls": expected,
        "late_polls": late, "late_pct": 100.0 * late / max(1, polls + late),
        "missed_pct": 100.0 * max(0.0, expected - polls) / expected,
        "rss_before_mb": rss_before, "rss_after_mb": rss_after,
        "rss_samples": rss, **memory_summary(rss, duration),
        "latency_ms": {p: {"p50": 1000 * statistics.median(v) if v else float("nan"),
                           "p99": 1000 * percentile(v, 0.99), "n": len(v)}
                       for p, v in latencies.items()},
    }


def render(r: dict) -> str:
    lines = [
        f"{r['targets']} targets x {r['tables']} tables at 1 Hz, {r['clients']} clients, "
        f"{r['duration_s']:.0f} s: {r['requests']} requests, {r['errors']} errors",
        f"polls {r['polls']} of {r['expected_polls']:.0f} expected "
        f"({r['missed_pct']:.1f}% missed), late {r['late_polls']} ({r['late_pct']:.1f}%)",
        f"sidecar RSS (history full) {r['rss_load_start_mb']:.0f} MB when the load starts, "
        f"{r['rss_third_mb']:.0f} / {r['rss_two_thirds_mb']:.0f} / {r['rss_end_mb']:.0f} MB "
        f"a third in / two thirds in / at the end (peak {r['rss_peak_mb']:.0f}); last third "
        f"{r['last_third_growth_mb']:+.1f} MB, {r['last_third_slope_mb_per_min']:+.2f} MB/min",
        "| endpoint | p50 ms | p99 ms | requests |", "| --- | ---: | ---: | ---: |",
    ]
    for path, v in r["latency_ms"].items():
        lines.append(f"| {path} | {v['p50']:.1f} | {v['p99']:.1f} | {v['n']} |")
    return "\n".join(lines)


def main() -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--targets", type=int, default=20)
    p.add_argument("--tables", type=int, default=5)
    p.add_argument("--clients", type=int, default=100)
    p.add_argument("--duration", type=float, default=60.0)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    result = run(args.targets, args.tables, args.clients, args.duration)
    print(json.dumps(result, indent=2) if args.json else render(result))
    return result


if __name__ == "__main__":
    main()
