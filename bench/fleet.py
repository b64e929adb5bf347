"""`make bench-fleet`: one sidecar over a fleet, then the same fleet split over two shards.

32 real Reverb servers (harness/reverb_workload.py, one process) and 512 trainer probes (16
processes of 32, harness/probe_farm.py, each probe its own HTTP server taking a batch a
second), 16 probes to a server, listed in one targets file (Prometheus file_sd, the probes as
`__probe_url__`). One `replaywatch watch --targets-file` at 1 Hz, measured over `--seconds`:
its CPU per cycle (its /metrics process's included), its cycles' duration (p50, p99, max, from
replaywatch_poll_cycle_duration_seconds at each scrape), cycles that ran late, polls skipped as
late, and /metrics' latency (a scrape about every cycle, drifting through its phases) on its
own port (--metrics-listen) and on the API's. Then two sidecars with --shard 0/2 and 1/2 on
the same file: the targets each polls (its replaywatch_target_up series), whether every
target is polled by exactly one, and their replaywatch_targets counts. A 33rd server runs
in a process of its own, listed like the others; after the first measure it is stopped
(SIGSTOP) for `--blocked-s` (60 s: what a server whose table lock a checkpoint holds is from
outside) and the fleet measured again: late cycles, the other targets' skipped polls and
their poll durations (each scrape's replaywatch_poll_duration_seconds), against the same
figures before.

Measured after `--warm-s` (120 s) of polling, once the history holds what the views read.

    python -m bench.fleet [--warm-s 120] [--seconds 120] [--blocked-s 60] [--results ...]
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.results_md import write_sections
from bench.scale import _metric, _scrape, cpu_seconds
from bench.stats import percentile
from harness.procs import PYTHON, Proc, descendants, free_port, get_json, wait_until

HEADING = "## A fleet: 32 servers and 512 probes, one sidecar, then two shards"
SERVERS, FARMS, PER_FARM = 32, 16, 32


def fleet(tmp: Path) -> tuple[list[Proc], Path, list[str], Proc, str]:
    """The servers, the probe farms, and the targets file listing them; and the server in a
    process of its own, to be blocked, with its address."""
    alone = Proc([PYTHON, "harness/reverb_workload.py", "--port", "0"],
                 stdout_path=tmp / "alone.log")
    procs = [Proc([PYTHON, "harness/reverb_workload.py", "--servers", str(SERVERS),
                   "--insert-hz", "10"], stdout_path=tmp / "reverb.log"), alone]
    farms = [Proc([PYTHON, "harness/probe_farm.py", "--probes", str(PER_FARM), "--name",
                   f"farm{i}"], stdout_path=tmp / f"farm{i}.log") for i in range(FARMS)]
    procs += farms
    servers = procs[0].announce(timeout_s=300)["all"]
    urls = [u for farm in farms for u in farm.announce(timeout_s=300)["probes"]]
    per = len(urls) // len(servers)
    groups = [{"targets": [s], "labels": {"__probe_url__": ",".join(urls[i * per:(i + 1) * per])}}
              for i, s in enumerate(servers)]
    blocked = alone.announce(timeout_s=300)["reverb"].replace("localhost", "127.0.0.1")
    groups.append({"targets": [blocked]})
    listed = tmp / "targets.json"
    listed.write_text(json.dumps(groups))
    return procs, listed, [*servers, blocked], alone, blocked


def sidecar(tmp: Path, listed: Path, name: str, *flags: str) -> tuple[Proc, str, str]:
    """The sidecar, its API's base URL and its /metrics port's (--metrics-listen)."""
    port, mport = free_port(), free_port()
    proc = Proc([PYTHON, "-m", "replaywatch", "watch", "--targets-file", str(listed), "--listen",
                 f"127.0.0.1:{port}", "--metrics-listen", f"127.0.0.1:{mport}", "--db",
                 str(tmp / f"{name}.db"), "--log-level", "warning", *flags],
                stdout_path=tmp / f"{name}.log")
    base = f"http://127.0.0.1:{port}"
    wait_until(lambda: get_json(f"{base}/readyz", 5)[1].get("cycle", 0) >= 5, 300)
    return proc, base, f"http://127.0.0.1:{mport}"


def measure(base: str, own: str, pid: int, seconds: float, blocked: str) -> dict[str, Any]:
    """The sidecar over `seconds`; skipped polls and poll durations are the targets' other
    than `blocked` (and their probes'). Each round scrapes /metrics on its own port (`own`) and
    on the API's, in turn first."""
    cycle0 = get_json(f"{base}/readyz")[1]["cycle"]
    cpu0 = _cpu(pid)
    body = _scrape(base)
    late0 = _metric(body, "replaywatch_late_poll_cycles_total")
    skipped0 = _summed(body, "replaywatch_late_polls_total", blocked)
    latencies: list[float] = []
    api_latencies: list[float] = []
    cycle_s: list[float] = []
    polls_s: list[float] = []
    began = time.monotonic()
    while time.monotonic() - began < seconds:
        time.sleep(1.05)  # drifts 50 ms a cycle: scrapes land at every phase of a cycle
        rounds = [(own, latencies), (base, api_latencies)]
        for where, into in rounds if len(cycle_s) % 2 else rounds[::-1]:
            t0 = time.perf_counter()
            got = _scrape(where)
            into.append(time.perf_counter() - t0)
            if where == own:
                body = got
        cycle_s.append(_metric(body, "replaywatch_poll_cycle_duration_seconds"))
        polls_s += _values(body, "replaywatch_poll_duration_seconds", blocked)
    cycles = get_json(f"{base}/readyz")[1]["cycle"] - cycle0
    return {"cycles": cycles, "cpu_s_per_cycle": (_cpu(pid) - cpu0) / max(1, cycles),
            "late_cycles": _metric(body, "replaywatch_late_poll_cycles_total") - late0,
            "skipped_polls": _summed(body, "replaywatch_late_polls_total", blocked) - skipped0,
            "others_poll_p50_ms": 1000 * statistics.median(polls_s),
            "others_poll_p99_ms": 1000 * percentile(polls_s, 0.99),
            "others_poll_max_ms": 1000 * max(polls_s),
            "polls_per_cycle": len(re.findall(rb"^replaywatch_polls_total\{", body, re.M)),
            "cycle_p50_ms": 1000 * statistics.median(cycle_s),
            "cycle_p99_ms": 1000 * percentile(cycle_s, 0.99), "cycle_max_ms": 1000 * max(cycle_s),
            "metrics_p50_ms": 1000 * statistics.median(latencies),
            "metrics_p99_ms": 1000 * percentile(latencies, 0.99), "scrapes": len(latencies),
            "api_metrics_p50_ms": 1000 * statistics.median(api_latencies),
            "api_metrics_p99_ms": 1000 * percentile(api_latencies, 0.99),
            "metrics_bytes": len(body)}


def _cpu(pid: int) -> float:
    """The sidecar's CPU seconds and its /metrics process's."""
    return sum(cpu_seconds(p) for p in (pid, *descendants(pid)))


def _summed(body: bytes, name: str, but: str = "") -> float:
    return sum(_values(body, name, but))


def _values(body: bytes, name: str, but: str = "") -> list[float]:
    """Each series of `name`, but those naming the target `but`."""
    return [float(line.split()[-1]) for line in body.decode().splitlines()
            if line.startswith(name + "{") and not (but and f'target="{but}"' in line)]


def polled_targets(base: str) -> set[str]:
    body = _scrape(base).decode()
    return set(re.findall(r'^replaywatch_target_up\{[^}]*target="([^"]+)"', body, re.M))


def shards(tmp: Path, listed: Path, servers: list[str]) -> dict[str, Any]:
    cars = [sidecar(tmp, listed, f"shard{i}", "--shard", f"{i}/2") for i in (0, 1)]
    try:
        time.sleep(3.0)
        owned = [polled_targets(base) for _, base, _ in cars]
        counts = [(_metric(_scrape(base), 'replaywatch_targets{state="owned"}'),
                   _metric(_scrape(base), 'replaywatch_targets{state="others"}'))
                  for _, base, _ in cars]
    finally:
        for proc, _, _ in cars:
            proc.kill()
    every = set(servers)  # the blocked one's process is running again by now
    return {"owned": [len(o) for o in owned], "counts": counts, "servers": len(every),
            "union_is_all": owned[0] | owned[1] == every, "overlap": len(owned[0] & owned[1])}


def render(phases: dict[str, dict[str, Any]], split: dict[str, Any], minutes: float,
           seconds: float, blocked_s: float, warm_s: float) -> str:
    return "\n".join([
        HEADING, "",
        f"`make bench-fleet` ({minutes:.1f} min, this 2-core machine): {SERVERS} real Reverb "
        f"servers (one process) and {FARMS * PER_FARM} trainer probes ({FARMS} processes of "
        f"{PER_FARM}, each probe its own HTTP server), 16 probes to a server, and one more "
        f"server in a process of its own, in one targets file; one sidecar at 1 Hz, after "
        f"{warm_s:.0f} s of polling (the views' reach filled), over {seconds:.0f} s, then "
        "with that server stopped (SIGSTOP, as a server held by a "
        f"checkpoint is from outside) for {blocked_s:.0f} s, then two sidecars with --shard 0/2 "
        "and 1/2. Skipped polls and poll times are the other targets' and probes'.",
        "",
        "| phase | sources polled a cycle | CPU s per cycle (= cores at 1 Hz) | cycle p50 / p99 / "
        "max ms | late cycles | others' skipped polls | others' poll p50 / p99 / max ms "
        "| /metrics p50 / p99 ms, its own port | on the API's port | /metrics bytes |",
        "| --- | ---: | ---: | --- | ---: | ---: | --- | --- | --- | ---: |",
        *(f"| {phase} | {one['polls_per_cycle']} | {one['cpu_s_per_cycle']:.3f} | "
          f"{one['cycle_p50_ms']:.0f} / {one['cycle_p99_ms']:.0f} / {one['cycle_max_ms']:.0f} | "
          f"{one['late_cycles']:.0f} of {one['cycles']} | {one['skipped_polls']:.0f} | "
          f"{one['others_poll_p50_ms']:.1f} / {one['others_poll_p99_ms']:.1f} / "
          f"{one['others_poll_max_ms']:.1f} | "
          f"{one['metrics_p50_ms']:.1f} / {one['metrics_p99_ms']:.1f} ({one['scrapes']} "
          f"scrapes) | {one['api_metrics_p50_ms']:.1f} / {one['api_metrics_p99_ms']:.1f} | "
          f"{one['metrics_bytes']:,} |" for phase, one in phases.items()),
        "",
        "A cycle waits for each poll up to its deadline (0.8 of the interval) and a margin "
        "(what the interval leaves after it and 0.1 s), and no longer than leaves the "
        "recording of its answers the time the last ten took; a poll not done by then is "
        "recorded at the next cycle, and a source whose last poll ran into its deadline is "
        "polled but not waited on. So only the cycle the server stopped in waits for it. A "
        "cycle's diagnosis runs beside the next cycle's polls, and a cycle's duration here is "
        "from its polls' start to its picture's publication: it holds the diagnosis that "
        "overlapped the next polls, so it may pass the interval (the blocked phase's longest: "
        f"{phases['one server blocked']['cycle_max_ms']:.0f} ms) where no cycle was late.",
        "",
        f"Two shards: they poll {split['owned'][0]} and {split['owned'][1]} of the "
        f"{split['servers']} servers; every server by exactly one: "
        f"{'yes' if split['union_is_all'] and not split['overlap'] else 'NO'} (overlap "
        f"{split['overlap']}); replaywatch_targets owned/others: "
        f"{', '.join(f'{o:.0f}/{x:.0f}' for o, x in split['counts'])}.", ""])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # The views reach back 63 s (the SPI window and three stall windows): until the history
    # holds that much, every cycle costs less than it will for the rest of the run.
    p.add_argument("--warm-s", type=float, default=120.0)
    p.add_argument("--seconds", type=float, default=120.0)
    p.add_argument("--blocked-s", type=float, default=60.0)
    p.add_argument("--results", type=Path, default=None)
    args = p.parse_args()
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="rwfleet-") as tmp_name:
        tmp = Path(tmp_name)
        procs, listed, servers, alone, blocked = fleet(tmp)
        try:
            car, base, own = sidecar(tmp, listed, "one")
            try:
                time.sleep(args.warm_s)
                one = measure(base, own, car.pid, args.seconds, blocked)
                print(json.dumps(one))
                print(f"stopped at cycle {get_json(f'{base}/readyz')[1]['cycle']}")
                alone.signal(signal.SIGSTOP)
                try:
                    held = measure(base, own, car.pid, args.blocked_s, blocked)
                finally:
                    alone.signal(signal.SIGCONT)
                print(f"continued at cycle {get_json(f'{base}/readyz')[1]['cycle']}")
                print(json.dumps(held))
            finally:
                car.kill()
            # The sidecar says where a late cycle's time went (its wait, its diagnosis, its
            # renders): each has another remedy.
            late = [line.split("ran late, ", 1)[1] for line in
                    (tmp / "one.log").read_text(errors="replace").splitlines()
                    if "ran late, " in line]
            print("\n".join(["late cycles:", *late]) if late else "no late cycle logged")
            split = shards(tmp, listed, servers)
            print(json.dumps(split))
        finally:
            for proc in procs:
                proc.kill()
    phases = {"all answer": one, "one server blocked": held}
    text = render(phases, split, (time.monotonic() - began) / 60, args.seconds, args.blocked_s,
                  args.warm_s)
    print(text)
    if args.results:
        write_sections(args.results, [text])
    ok = (all(r["late_cycles"] == 0 and r["metrics_p99_ms"] < 50 for r in phases.values())
          and held["skipped_polls"] == 0 and held["others_poll_p99_ms"] <= max(
              2 * one["others_poll_p99_ms"], one["others_poll_p99_ms"] + 20)
          and split["union_is_all"] and not split["overlap"])
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
