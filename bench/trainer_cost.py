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
as ratios to `none` with their spread (min..max over the repetitions).

    python -m bench.trainer_cost [--reps 2] [--window 40]
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


def one_run(setup: str, window_s: float, tmp: Path) -> dict[str, float]:
    flags = [*AGENT, "--seed-debug-loop"] if setup == "seed_loop" else AGENT
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    agent = subprocess.Popen([PYTHON, "-m", "agents.run", *flags], cwd=ROOT, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                             start_new_session=True)
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
        # Measure once learning runs: the first progress line with learner steps.
        first = wait_until(lambda: next((r for r in _progress(lines)
                                         if r.get("learner_steps", 0) > 0), None), 180)
        time.sleep(window_s)
        last = _progress(lines)[-1]
    finally:
        if sidecar is not None:
            sidecar.kill()
        os.killpg(agent.pid, signal.SIGKILL)
        agent.wait(timeout=10)
    dt = last["elapsed_s"] - first["elapsed_s"]
    return {"env_steps_per_s": (last["env_steps"] - first["env_steps"]) / dt,
            "learner_steps_per_s": (last["learner_steps"] - first["learner_steps"]) / dt}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--window", type=float, default=40.0)
    args = p.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="rw-cost-"))
    runs: dict[str, list[dict[str, float]]] = {s: [] for s in SETUPS}
    for _ in range(args.reps):
        for setup in SETUPS:
            runs[setup].append(one_run(setup, args.window, tmp))
    base = {k: statistics.mean(r[k] for r in runs["none"])
            for k in ("env_steps_per_s", "learner_steps_per_s")}
    rows = []
    print("| set-up | env steps/s | learner steps/s | learner ratio to none (min..max) |")
    print("| --- | ---: | ---: | --- |")
    for setup in SETUPS:
        env = statistics.mean(r["env_steps_per_s"] for r in runs[setup])
        learn = [r["learner_steps_per_s"] for r in runs[setup]]
        ratios = [x / base["learner_steps_per_s"] for x in learn]
        row = {"setup": setup, "env_steps_per_s": env, "learner_steps_per_s":
               statistics.mean(learn), "ratio": statistics.mean(ratios),
               "ratio_min": min(ratios), "ratio_max": max(ratios)}
        rows.append(row)
        print(f"| {setup} | {env:.1f} | {row['learner_steps_per_s']:.1f} | "
              f"{row['ratio']:.3f} ({row['ratio_min']:.3f}..{row['ratio_max']:.3f}) |")
    step_ms = 1000.0 / base["learner_steps_per_s"]
    print(f"learner step incl. its share of acting: {step_ms:.1f} ms ({args.reps} x "
          f"{args.window:g} s windows per set-up, interleaved)")
    return {"rows": rows, "learner_step_ms": step_ms}


if __name__ == "__main__":
    main()
