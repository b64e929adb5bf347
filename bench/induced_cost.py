"""Benchmark: the CPU the sidecar induces in the trainer's process, by accounting.

A stopwatch A/B of the learner's steps/s cannot see a cost smaller than the run-to-run
spread (±4% on two shared cores). CPU time can: the kernel counts the time each
process runs, whatever else the machine is doing. So, against otherwise idle
processes in their own sessions, this reads the target's CPU time (its process CPU
clock: /proc/PID/stat's utime+stime in nanoseconds, exited threads included) before
and after back-to-back calls made the way the sidecar makes them, minus what the
process burns idle over the same time:

  ServerInfo   a real Reverb server (1, 10, 100 tables), `ReverbSource.poll()`
  GET /probe   a TrainerProbe and an ActorProbe, `HttpProbeSource.poll()` (one kept-alive
               connection) and `get_json` (a new connection per request: older sidecars)

and then a real `replaywatch watch` at 10 Hz on one Reverb server, a trainer probe and
an actor probe: its own CPU per poll cycle and what each target spent meanwhile
(the end-to-end check of the per-call rows). The bound on the trainer's slowdown at
f Hz: f x (CPU induced per poll) is the core-seconds per second taken from the
trainer's process; in the worst case all of it sits on the learner's critical path
(the probe's Python work holds the GIL), so that fraction is the bound. Where the
sidecar shares the trainer's cores its own CPU per cycle adds to it; spread over N
busy cores it is that sum / N.

    python -m bench.induced_cost [--seconds 4] [--tables 1,10,100] [--cores N]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.procs import PYTHON, Proc, free_port, get_json, wait_until

HZ = (1.0, 10.0)


def cpu_seconds(pid: int) -> float:
    """CPU seconds of the whole process (all its threads, exited ones included).

    Linux's process CPU clock, what clock_getcpuclockid(3) returns: the scheduler's
    nanosecond count that /proc/PID/stat rounds to 10 ms ticks as utime+stime. A
    10 Hz poll costing 0.3 ms is 3 ms a second, so ticks would need minutes per row.
    """
    try:
        return time.clock_gettime(((~pid) << 3) | 2)  # MAKE_PROCESS_CPUCLOCK(pid, SCHED)
    except OSError:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def induced_per_call(pid: int, call: Callable[[], Any], seconds: float,
                     idle_s: float = 1.0, min_calls: int = 0) -> dict[str, float]:
    """Target CPU ms and our own CPU ms per call, calls made back to back for `seconds`, and
    on until `min_calls` were made (a loaded host makes fewer in the same seconds)."""
    for _ in range(20):
        call()  # connections, channels and caches warm
    c0, w0 = cpu_seconds(pid), time.monotonic()
    time.sleep(idle_s)
    idle_rate = (cpu_seconds(pid) - c0) / (time.monotonic() - w0)
    calls, c0, own0, w0 = 0, cpu_seconds(pid), time.process_time(), time.monotonic()
    while time.monotonic() - w0 < seconds or calls < min_calls:
        call()
        calls += 1
    target, own, wall = (cpu_seconds(pid) - c0, time.process_time() - own0,
                         time.monotonic() - w0)
    return {"calls": calls, "target_ms": 1000 * max(0.0, target - idle_rate * wall) / calls,
            "client_ms": 1000 * own / calls, "wall_ms": 1000 * wall / calls,
            "idle_ms_per_s": 1000 * idle_rate}


def _reverb(tables: int, tmp: Path) -> tuple[Proc, str]:
    proc = Proc([PYTHON, "harness/reverb_workload.py", "--tables", str(tables), "--no-load"],
                stdout_path=tmp / f"reverb{tables}.log")
    return proc, str(proc.announce(timeout_s=180)["reverb"])


def _probe(role: str, tmp: Path) -> tuple[Proc, str]:
    proc = Proc([PYTHON, "-m", "bench.induced_cost", "--serve", role],
                stdout_path=tmp / f"{role}.log")
    return proc, str(proc.announce(timeout_s=60)["url"])


def serve(role: str) -> None:
    """The `--serve` child: one idle probe, as a trainer or an actor would hold it."""
    from replaywatch.probe import ActorProbe, TrainerProbe

    probe: Any = (TrainerProbe(batch_size=256, num_parallel_calls=12, table="replay")
                  if role == "trainer" else ActorProbe(table="replay", name="actor-0"))
    probe.start()
    print(f'{{"url": "{probe.url}", "pid": {os.getpid()}}}', flush=True)
    while True:
        time.sleep(3600)


def per_call_rows(table_counts: list[int], seconds: float, tmp: Path) -> list[dict[str, Any]]:
    from replaywatch.sources.probe_http import HttpProbeSource
    from replaywatch.sources.probe_http import get_json as one_shot
    from replaywatch.sources.reverb import ReverbSource

    rows = []
    for tables in table_counts:
        proc, address = _reverb(tables, tmp)
        try:
            source = ReverbSource(address, timeout_s=2.0)
            rows.append({"what": f"ServerInfo, {tables} table{'s' * (tables > 1)}",
                         "key": f"server_info_{tables}",
                         **induced_per_call(proc.pid, source.poll, seconds)})
            source.close()
        finally:
            proc.kill()
    for role in ("trainer", "actor"):
        proc, url = _probe(role, tmp)
        try:
            probe = HttpProbeSource(url, timeout_s=2.0)
            rows.append({"what": f"GET /probe, {role} probe (kept-alive connection)",
                         "key": f"probe_{role}",
                         **induced_per_call(proc.pid, probe.poll, seconds)})
            probe.close()
            rows.append({"what": f"GET /probe, {role} probe (new connection per request)",
                         "key": f"probe_{role}_new_connection",
                         **induced_per_call(proc.pid, lambda u=url: one_shot(f"{u}/probe", 2.0),
                                            seconds)})
        finally:
            proc.kill()
    return rows


def sidecar_cycle(tables: int, window_s: float, tmp: Path) -> dict[str, Any]:
    """A real `replaywatch watch` at 10 Hz: CPU per cycle, its own and each target's."""
    procs: list[Proc] = []
    try:
        reverb, address = _reverb(tables, tmp)
        trainer, trainer_url = _probe("trainer", tmp)
        actor, actor_url = _probe("actor", tmp)
        procs += [reverb, trainer, actor]
        targets = {"reverb": reverb.pid, "trainer_probe": trainer.pid, "actor_probe": actor.pid}
        idle0, w0 = {k: cpu_seconds(p) for k, p in targets.items()}, time.monotonic()
        time.sleep(2.0)  # what each burns unpolled, subtracted below as in the rows
        idle = {k: (cpu_seconds(p) - idle0[k]) / (time.monotonic() - w0)
                for k, p in targets.items()}
        port = free_port()
        sidecar = Proc([PYTHON, "-m", "replaywatch", "watch", "--reverb", address, "--probe",
                        trainer_url, "--probe", actor_url, "--interval", "0.1", "--listen",
                        f"127.0.0.1:{port}", "--db", str(tmp / "side.db"), "--log-level",
                        "warning"], stdout_path=tmp / "sidecar.log")
        procs.append(sidecar)
        ready = f"http://127.0.0.1:{port}/readyz"
        wait_until(lambda: get_json(ready)[1].get("cycle", 0) > 20, 120)
        pids = {"sidecar": sidecar.pid, **targets}
        cycle0, cpu0 = get_json(ready)[1]["cycle"], {k: cpu_seconds(p) for k, p in pids.items()}
        w0 = time.monotonic()
        time.sleep(window_s)
        cpu1 = {k: cpu_seconds(p) for k, p in pids.items()}
        cycles = max(1, get_json(ready)[1]["cycle"] - cycle0)
        wall = time.monotonic() - w0
    finally:
        for proc in procs:
            proc.kill()
    return {"cycles": cycles, "tables": tables,
            **{f"{k}_ms": 1000 * max(0.0, cpu1[k] - cpu0[k] - idle.get(k, 0.0) * wall) / cycles
               for k in pids}}


def bounds(induced_ms: float, sidecar_ms: float, cores: int) -> list[dict[str, float]]:
    """Slowdown bounds in percent at each polling rate (see the module docstring)."""
    out = []
    for hz in HZ:
        in_process = hz * induced_ms / 1000
        shared = hz * (induced_ms + sidecar_ms) / 1000
        out.append({"hz": hz, "in_process_pct": 100 * in_process,
                    "shared_worst_pct": 100 * shared, "shared_spread_pct": 100 * shared / cores})
    return out


def induced_per_poll(rows: list[dict[str, Any]], cycle: dict[str, Any]) -> tuple[float, int]:
    """CPU ms one poll takes from a trainer process hosting the Reverb server and the probe.

    Polls 0.1-1 s apart each wake the target's idle threads, which back-to-back calls
    amortise: the 10 Hz run's per-cycle figures are the larger, realistic ones. The
    widest table count's extra over the 10 Hz run's own comes from the back-to-back rows.
    """
    by_tables = {int(r["key"].rsplit("_", 1)[1]): r["target_ms"] for r in rows
                 if r["key"].startswith("server_info_")}
    widest = max(by_tables)
    extra = max(0.0, by_tables[widest] - by_tables.get(cycle["tables"], min(by_tables.values())))
    probe = max(cycle["trainer_probe_ms"],
                next(r["target_ms"] for r in rows if r["key"] == "probe_trainer"))
    return max(cycle["reverb_ms"] + extra, by_tables[widest]) + probe, widest


def report(rows: list[dict[str, Any]], cycle: dict[str, Any], cores: int) -> dict[str, Any]:
    print("| call (made as the sidecar makes it) | target CPU ms per call | "
          "sidecar CPU ms per call | wall ms | calls | target idle CPU ms/s (subtracted) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['what']} | {r['target_ms']:.3f} | {r['client_ms']:.3f} | "
              f"{r['wall_ms']:.3f} | {r['calls']} | {r['idle_ms_per_s']:.2f} |")
    print(f"\nA real sidecar at 10 Hz on 1 Reverb server ({cycle['tables']} table(s)), a trainer "
          f"probe and an actor probe, {cycle['cycles']} cycles, CPU ms per poll cycle: "
          f"sidecar {cycle['sidecar_ms']:.2f}, Reverb server {cycle['reverb_ms']:.3f}, "
          f"trainer probe {cycle['trainer_probe_ms']:.3f}, "
          f"actor probe {cycle['actor_probe_ms']:.3f}.\n")
    induced, widest = induced_per_poll(rows, cycle)
    table = bounds(induced, cycle["sidecar_ms"], cores)
    print(f"Bound on the trainer's slowdown. Trainer process = Reverb server ({widest} tables) "
          f"+ trainer probe: {induced:.3f} ms CPU per poll (the 10 Hz run's per-cycle CPU, "
          f"plus the back-to-back rows' extra for {widest} tables); sidecar "
          f"{cycle['sidecar_ms']:.2f} ms per cycle; {cores} cores.\n")
    print("| polling | induced in the trainer's process (sidecar on other cores) | "
          f"sidecar on the trainer's cores, all on the critical path | same, spread over "
          f"{cores} busy cores |")
    print("| --- | ---: | ---: | ---: |")
    for b in table:
        print(f"| {b['hz']:g} Hz | {b['in_process_pct']:.3f}% | {b['shared_worst_pct']:.3f}% | "
              f"{b['shared_spread_pct']:.3f}% |")
    return {"rows": rows, "cycle": cycle, "induced_ms_per_poll": induced, "bounds": table,
            "cores": cores}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=4.0, help="calls per row, back to back")
    p.add_argument("--tables", default="1,10,100", help="Reverb table counts, comma-separated")
    p.add_argument("--cycle-window", type=float, default=20.0,
                   help="seconds the 10 Hz sidecar is measured for")
    p.add_argument("--cycle-tables", type=int, default=1)
    p.add_argument("--cores", type=int, default=os.cpu_count() or 1,
                   help="cores the trainer has, for the spread bound")
    p.add_argument("--serve", choices=("trainer", "actor"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve:
        serve(args.serve)
    try:
        table_counts = [int(t) for t in args.tables.split(",")]
    except ValueError:
        sys.exit(f"--tables ({args.tables!r}) must be integers separated by commas")
    tmp = Path(tempfile.mkdtemp(prefix="rw-induced-"))
    load0 = Path("/proc/loadavg").read_text().split()[:3]
    rows = per_call_rows(table_counts, args.seconds, tmp)
    cycle = sidecar_cycle(args.cycle_tables, args.cycle_window, tmp)
    out = report(rows, cycle, args.cores)
    load1 = Path("/proc/loadavg").read_text().split()[:3]
    print(f"\nLoad average {' '.join(load0)} before, {' '.join(load1)} after (CPU time, "
          f"not wall time, is what the rows count, so load only widens the wall column).")
    return {**out, "loadavg": [load0, load1]}


if __name__ == "__main__":
    main()
