"""Benchmark: what watching costs the trainer, against what users do today.

Runs the agents/ learner (sync, healthy, Pendulum) several times in each of
these set-ups, interleaved A/B/C/D/A/B/C/D so that drift on the machine hits
them all alike:

  none       no sidecar
  watch_1hz  replaywatch at 1 Hz (Reverb polling + probe)
  watch_10hz replaywatch at 10 Hz
  seed_loop  no sidecar, the seed incident's debugging loop: `table.info` read
             and printed before every learner step (see shared seeds/000)

and reports env steps/s and learner steps/s over a fixed window after warm-up,
as ratios to `none` with their spread (min..max over the repetitions) and the 95%
confidence interval of the mean ratio (Student's t over the repetitions), and the
agent process's CPU per learner step (its process CPU clock), which load on the
machine disturbs far less than steps/s.

`--pin` is the cross-check that does not need an hour of repetitions: the agent
runs on core 0 and the sidecar on core 1 (os.sched_setaffinity, inherited by every
thread), so the sidecar's own CPU cannot take the trainer's core and what is left
is what it induces inside the trainer's process (bench/induced_cost.py predicts it).

    python -m bench.trainer_cost [--reps 2] [--window 40] [--pin]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from harness.procs import PYTHON, Proc, free_port, wait_until

ROOT = Path(__file__).resolve().parents[1]
AGENT = ["--mode", "sync", "--steps", "100000000", "--eval-every", "0", "--log-every", "2",
         "--probe-listen", "127.0.0.1:0"]
SETUPS = ("none", "watch_1hz", "watch_10hz", "seed_loop")
# Two-sided 95% Student t quantiles by degrees of freedom; 1.96 past 30.
_T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26,
        10: 2.23, 12: 2.18, 15: 2.13, 20: 2.09, 30: 2.04}


def ci95(values: list[float]) -> float:
    """Half-width of the 95% confidence interval of the mean (inf from one value)."""
    if len(values) < 2:
        return float("inf")
    df = len(values) - 1
    t = next((_T95[k] for k in sorted(_T95) if k >= df), 1.96)
    return t * statistics.stdev(values) / len(values) ** 0.5


def cpu_seconds(pid: int) -> float:
    """The process's CPU clock (all threads, exited ones included), in seconds."""
    return time.clock_gettime(((~pid) << 3) | 2)  # Linux's MAKE_PROCESS_CPUCLOCK(pid, SCHED)


def _pin(cpu: int | None) -> Any:
    return None if cpu is None else (lambda: os.sched_setaffinity(0, {cpu}))


def _progress(lines: list[str]) -> list[dict[str, Any]]:
    out = []
    for line in lines:
        if line.startswith("{"):
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if record.get("event") in ("start", "progress"):
                out.append(record)
    return out


def _fresh(lines: list[str], seen: int, timeout_s: float = 30) -> dict[str, Any]:
    """The first progress record after the `seen` first ones, as soon as it is printed."""
    return wait_until(lambda: _progress(lines)[seen:][:1], timeout_s, interval_s=0.01)[0]


def one_run(setup: str, window_s: float, tmp: Path, pin: bool = False) -> dict[str, float]:
    flags = [*AGENT, "--seed-debug-loop"] if setup == "seed_loop" else AGENT
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    agent = subprocess.Popen([PYTHON, "-m", "agents.run", *flags], cwd=ROOT, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                             start_new_session=True, preexec_fn=_pin(0 if pin else None))
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(agent.stdout or []), daemon=True)
    reader.start()
    sidecar = None
    try:
        start = wait_until(lambda: next((r for r in _progress(lines) if r.get("reverb")), None),
                           180)
        if setup.startswith("watch"):
            interval = "1" if setup == "watch_1hz" else "0.1"
            sidecar = Proc([PYTHON, "-m", "replaywatch", "watch", "--reverb", start["reverb"],
                            "--probe", start["probe"], "--interval", interval, "--listen",
                            f"127.0.0.1:{free_port()}", "--db", str(tmp / f"{setup}.db"),
                            "--log-level", "warning"], stdout_path=tmp / f"{setup}.log")
            if pin:
                os.sched_setaffinity(sidecar.pid, {1})  # before its poller starts: it
                # starts threads after importing FastAPI, seconds from now
        # Measure once learning runs: the first progress line with learner steps; the CPU
        # clock is read as each bounding line arrives (lines come every 2 s).
        wait_until(lambda: next((r for r in _progress(lines)
                                 if r.get("learner_steps", 0) > 0), None), 180)
        first = _fresh(lines, len(_progress(lines)))
        cpu0 = cpu_seconds(agent.pid)
        time.sleep(window_s)
        last = _fresh(lines, len(_progress(lines)))
        cpu1 = cpu_seconds(agent.pid)
    finally:
        if sidecar is not None:
            sidecar.kill()
        os.killpg(agent.pid, signal.SIGKILL)
        agent.wait(timeout=10)
    dt = last["elapsed_s"] - first["elapsed_s"]
    steps = last["learner_steps"] - first["learner_steps"]
    return {"env_steps_per_s": (last["env_steps"] - first["env_steps"]) / dt,
            "learner_steps_per_s": steps / dt, "cpu_ms_per_step": 1000 * (cpu1 - cpu0) / steps}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--window", type=float, default=40.0)
    p.add_argument("--pin", action="store_true",
                   help="agent on core 0, sidecar on core 1 (needs 2 cores)")
    p.add_argument("--setups", default=",".join(SETUPS),
                   help=f"comma-separated, from {', '.join(SETUPS)}; the first is the base")
    args = p.parse_args(argv)
    setups = [x for x in args.setups.split(",") if x]
    if not setups or set(setups) - set(SETUPS):
        raise SystemExit(f"--setups ({args.setups!r}) must name set-ups from {SETUPS}")
    if args.pin and len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("--pin needs 2 cores")
    tmp = Path(tempfile.mkdtemp(prefix="rw-cost-"))
    runs: dict[str, list[dict[str, float]]] = {s: [] for s in setups}
    for _ in range(args.reps):
        for setup in setups:
            runs[setup].append(one_run(setup, args.window, tmp, args.pin))
    rows = table(runs, setups[0])
    base_steps = statistics.mean(r["learner_steps_per_s"] for r in runs[setups[0]])
    step_ms = 1000.0 / base_steps
    print(f"learner step incl. its share of acting: {step_ms:.1f} ms ({args.reps} x "
          f"{args.window:g} s windows per set-up, interleaved"
          f"{'; agent pinned to core 0, sidecar to core 1' if args.pin else ''}); "
          f"load average {' '.join(Path('/proc/loadavg').read_text().split()[:3])}")
    return {"rows": rows, "learner_step_ms": step_ms, "pinned": args.pin}


def table(runs: dict[str, list[dict[str, float]]], base: str) -> list[dict[str, Any]]:
    """Prints the markdown table; each set-up's ratios are to the base's mean."""
    base_steps = statistics.mean(r["learner_steps_per_s"] for r in runs[base])
    base_cpu = statistics.mean(r["cpu_ms_per_step"] for r in runs[base])
    rows = []
    print(f"| set-up | env steps/s | learner steps/s | learner ratio to {base} (min..max) | "
          "95% CI of the ratio | agent CPU ms per learner step (vs base) |")
    print("| --- | ---: | ---: | --- | ---: | ---: |")
    for setup, got in runs.items():
        ratios = [r["learner_steps_per_s"] / base_steps for r in got]
        cpu = statistics.mean(r["cpu_ms_per_step"] for r in got)
        row = {"setup": setup, "env_steps_per_s": statistics.mean(r["env_steps_per_s"]
                                                                  for r in got),
               "learner_steps_per_s": statistics.mean(r["learner_steps_per_s"] for r in got),
               "ratio": statistics.mean(ratios), "ratio_min": min(ratios),
               "ratio_max": max(ratios), "ratio_ci95": ci95(ratios), "cpu_ms_per_step": cpu,
               "cpu_delta_ms_per_step": cpu - base_cpu}
        rows.append(row)
        print(f"| {setup} | {row['env_steps_per_s']:.1f} | {row['learner_steps_per_s']:.1f} | "
              f"{row['ratio']:.3f} ({row['ratio_min']:.3f}..{row['ratio_max']:.3f}) | "
              f"±{row['ratio_ci95']:.3f} | {cpu:.2f} ({cpu - base_cpu:+.3f}) |")
    return rows


if __name__ == "__main__":
    main()
