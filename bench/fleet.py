"""`make bench-fleet`: one sidecar over a fleet, then the same fleet split over two shards.

32 real Reverb servers (harness/reverb_workload.py, one process) and 512 trainer probes (16
processes of 32, harness/probe_farm.py, each probe its own HTTP server taking a batch a
second), 16 probes to a server, listed in one targets file (Prometheus file_sd, the probes as
`__probe_url__`). One `replaywatch watch --targets-file` at 1 Hz, measured over `--seconds`:
its CPU per cycle, its cycles' duration (p50, p99, max, from
replaywatch_poll_cycle_duration_seconds at each scrape), cycles that ran late, polls skipped as
late, and /metrics' latency (a scrape about every cycle, drifting through its phases). Then
two sidecars with --shard 0/2 and 1/2 on the same file: the targets each polls (its
replaywatch_target_up series), whether every target is polled by exactly one, and their
replaywatch_targets counts.

    python -m bench.fleet [--seconds 60] [--results bench/RESULTS.md]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.results_md import replace_sections
from bench.scale import _metric, _scrape, cpu_seconds
from bench.stats import percentile
from harness.procs import PYTHON, Proc, free_port, get_json, wait_until

HEADING = "## A fleet: 32 servers and 512 probes, one sidecar, then two shards"
SERVERS, FARMS, PER_FARM = 32, 16, 32


def fleet(tmp: Path) -> tuple[list[Proc], Path, list[str]]:
    """The servers, the probe farms, and the targets file listing them."""
    procs = [Proc([PYTHON, "harness/reverb_workload.py", "--servers", str(SERVERS),
                   "--insert-hz", "10"], stdout_path=tmp / "reverb.log")]
    farms = [Proc([PYTHON, "harness/probe_farm.py", "--probes", str(PER_FARM), "--name",
                   f"farm{i}"], stdout_path=tmp / f"farm{i}.log") for i in range(FARMS)]
    procs += farms
    servers = procs[0].announce(timeout_s=300)["all"]
    urls = [u for farm in farms for u in farm.announce(timeout_s=300)["probes"]]
    per = len(urls) // len(servers)
    groups = [{"targets": [s], "labels": {"__probe_url__": ",".join(urls[i * per:(i + 1) * per])}}
              for i, s in enumerate(servers)]
    listed = tmp / "targets.json"
    listed.write_text(json.dumps(groups))
    return procs, listed, servers


def sidecar(tmp: Path, listed: Path, name: str, *flags: str) -> tuple[Proc, str]:
    port = free_port()
    proc = Proc([PYTHON, "-m", "replaywatch", "watch", "--targets-file", str(listed), "--listen",
                 f"127.0.0.1:{port}", "--db", str(tmp / f"{name}.db"), "--log-level", "warning",
                 *flags], stdout_path=tmp / f"{name}.log")
    base = f"http://127.0.0.1:{port}"
    wait_until(lambda: get_json(f"{base}/readyz", 5)[1].get("cycle", 0) >= 5, 300)
    return proc, base


def measure(base: str, pid: int, seconds: float) -> dict[str, Any]:
    cycle0 = get_json(f"{base}/readyz")[1]["cycle"]
    cpu0 = cpu_seconds(pid)
    body = _scrape(base)
    late0 = _metric(body, "replaywatch_late_poll_cycles_total")
    skipped0 = _summed(body, "replaywatch_late_polls_total")
    latencies, cycle_s = [], []
    began = time.monotonic()
    while time.monotonic() - began < seconds:
        time.sleep(1.05)  # drifts 50 ms a cycle: scrapes land at every phase of a cycle
        t0 = time.perf_counter()
        body = _scrape(base)
        latencies.append(time.perf_counter() - t0)
        cycle_s.append(_metric(body, "replaywatch_poll_cycle_duration_seconds"))
    cycles = get_json(f"{base}/readyz")[1]["cycle"] - cycle0
    return {"cycles": cycles, "cpu_s_per_cycle": (cpu_seconds(pid) - cpu0) / max(1, cycles),
            "late_cycles": _metric(body, "replaywatch_late_poll_cycles_total") - late0,
            "skipped_polls": _summed(body, "replaywatch_late_polls_total") - skipped0,
            "polls_per_cycle": len(re.findall(rb"^replaywatch_polls_total\{", body, re.M)),
            "cycle_p50_ms": 1000 * statistics.median(cycle_s),
            "cycle_p99_ms": 1000 * percentile(cycle_s, 0.99), "cycle_max_ms": 1000 * max(cycle_s),
            "metrics_p50_ms": 1000 * statistics.median(latencies),
            "metrics_p99_ms": 1000 * percentile(latencies, 0.99), "scrapes": len(latencies),
            "metrics_bytes": len(body)}


def _summed(body: bytes, name: str) -> float:
    return sum(float(line.split()[-1]) for line in body.decode().splitlines()
               if line.startswith(name + "{"))


def polled_targets(base: str) -> set[str]:
    body = _scrape(base).decode()
    return set(re.findall(r'^replaywatch_target_up\{[^}]*target="([^"]+)"', body, re.M))


def shards(tmp: Path, listed: Path, servers: list[str]) -> dict[str, Any]:
    cars = [sidecar(tmp, listed, f"shard{i}", "--shard", f"{i}/2") for i in (0, 1)]
    try:
        time.sleep(3.0)
        owned = [polled_targets(base) for _, base in cars]
        counts = [(_metric(_scrape(base), 'replaywatch_targets{state="owned"}'),
                   _metric(_scrape(base), 'replaywatch_targets{state="others"}'))
                  for _, base in cars]
    finally:
        for proc, _ in cars:
            proc.kill()
    every = set(servers)
    return {"owned": [len(o) for o in owned], "counts": counts,
            "union_is_all": owned[0] | owned[1] == every, "overlap": len(owned[0] & owned[1])}


def render(one: dict[str, Any], split: dict[str, Any], minutes: float, seconds: float) -> str:
    return "\n".join([
        HEADING, "",
        f"`make bench-fleet` ({minutes:.1f} min, this 2-core machine): {SERVERS} real Reverb "
        f"servers (one process) and {FARMS * PER_FARM} trainer probes ({FARMS} processes of "
        f"{PER_FARM}, each probe its own HTTP server), 16 probes to a server, in one targets "
        f"file; one sidecar at 1 Hz over {seconds:.0f} s, then two with --shard 0/2 and 1/2.",
        "",
        "| sources polled a cycle | CPU s per cycle (= cores at 1 Hz) | cycle p50 / p99 / max ms "
        "| late cycles | skipped polls | /metrics p50 / p99 ms | /metrics bytes |",
        "| ---: | ---: | --- | ---: | ---: | --- | ---: |",
        f"| {one['polls_per_cycle']} | {one['cpu_s_per_cycle']:.3f} | "
        f"{one['cycle_p50_ms']:.0f} / {one['cycle_p99_ms']:.0f} / {one['cycle_max_ms']:.0f} | "
        f"{one['late_cycles']:.0f} of {one['cycles']} | {one['skipped_polls']:.0f} | "
        f"{one['metrics_p50_ms']:.1f} / {one['metrics_p99_ms']:.1f} ({one['scrapes']} scrapes) "
        f"| {one['metrics_bytes']:,} |",
        "",
        f"Two shards: they poll {split['owned'][0]} and {split['owned'][1]} of the "
        f"{SERVERS} servers; every server by exactly one: "
        f"{'yes' if split['union_is_all'] and not split['overlap'] else 'NO'} (overlap "
        f"{split['overlap']}); replaywatch_targets owned/others: "
        f"{', '.join(f'{o:.0f}/{x:.0f}' for o, x in split['counts'])}.", ""])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=120.0)
    p.add_argument("--results", type=Path, default=None)
    args = p.parse_args()
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="rwfleet-") as tmp_name:
        tmp = Path(tmp_name)
        procs, listed, servers = fleet(tmp)
        try:
            car, base = sidecar(tmp, listed, "one")
            try:
                one = measure(base, car.pid, args.seconds)
            finally:
                car.kill()
            print(json.dumps(one))
            split = shards(tmp, listed, servers)
            print(json.dumps(split))
        finally:
            for proc in procs:
                proc.kill()
    text = render(one, split, (time.monotonic() - began) / 60, args.seconds)
    print(text)
    if args.results:
        args.results.write_text(replace_sections(args.results.read_text(), [text]))
    ok = (one["late_cycles"] == 0 and one["metrics_p99_ms"] < 50 and split["union_is_all"]
          and not split["overlap"])
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
