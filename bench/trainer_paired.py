"""Benchmark: the sidecar's cost to the trainer, wall clock, paired within one agent process.

bench/trainer_cost.py compares agent processes run one after another: each process has
its own start, replay fill and speed (±15% between 12 s windows here), so its interval
stayed at ±20-30%, far wider than the 1% the accounting bound (bench/induced_cost.py)
predicts. Here one agent process runs throughout and the sidecar, pinned to the other
core, is paused (SIGSTOP) and resumed (SIGCONT) in alternating phases: off, on, off,
on, ..., off. Each on-phase's learner steps/s is divided by the mean of the off-phases
either side of it, which cancels the process's own drift to first order; the ratios'
mean and 95% interval (Student's t) say what watching costs while it watches.

The learner's steps are read from its TrainerProbe at each phase boundary (one GET, the
same in both kinds of phase). A paused sidecar keeps its connections and polls nothing;
resumed, its poller does not catch up on missed cycles (it never bursts).

    python -m bench.trainer_paired [--phases 12] [--phase-s 5] [--interval 0.1]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.trainer_cost import AGENT, ROOT, _pin, _progress, ci95
from harness.procs import PYTHON, Proc, free_port, get_json, wait_until


def _steps(probe: str) -> tuple[float, int]:
    status, doc = get_json(f"{probe}/probe", timeout_s=5)
    if status != 200:
        raise RuntimeError(f"the trainer probe answered {status}: {doc}")
    return time.monotonic(), int(doc["learner_steps"])


def paired_ratios(rates: list[float]) -> list[float]:
    """Each on-phase's rate over the mean of the off-phases either side (off, on, ..., off):
    a drift linear in time cancels."""
    if len(rates) < 3 or len(rates) % 2 == 0:
        raise ValueError(f"need off, on, ..., off phases, got {len(rates)}")
    return [rates[i] / ((rates[i - 1] + rates[i + 1]) / 2) for i in range(1, len(rates) - 1, 2)]


def run(phases: int, phase_s: float, interval: str, tmp: Path) -> dict[str, Any]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    agent = subprocess.Popen([PYTHON, "-m", "agents.run", *AGENT], cwd=ROOT, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                             start_new_session=True, preexec_fn=_pin(0))
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(agent.stdout or []), daemon=True).start()
    sidecar = None
    try:
        start = wait_until(lambda: next((r for r in _progress(lines) if r.get("reverb")), None),
                           180)
        wait_until(lambda: next((r for r in _progress(lines) if r.get("learner_steps", 0) > 0),
                                None), 180)
        sidecar = Proc([PYTHON, "-m", "replaywatch", "watch", "--reverb", start["reverb"],
                        "--probe", start["probe"], "--interval", interval, "--listen",
                        f"127.0.0.1:{free_port()}", "--db", str(tmp / "paired.db"),
                        "--log-level", "warning"], stdout_path=tmp / "paired.log")
        os.sched_setaffinity(sidecar.pid, {1})
        time.sleep(8.0)  # imports and the first polls: the sidecar is watching from here
        rates: list[tuple[bool, float]] = []
        on = False
        os.kill(sidecar.pid, signal.SIGSTOP)
        mark = _steps(start["probe"])
        for _ in range(2 * phases + 1):
            time.sleep(phase_s)
            now = _steps(start["probe"])
            rates.append((on, (now[1] - mark[1]) / (now[0] - mark[0])))
            on = not on
            os.kill(sidecar.pid, signal.SIGCONT if on else signal.SIGSTOP)
            mark = _steps(start["probe"])
    finally:
        if sidecar is not None:
            os.kill(sidecar.pid, signal.SIGCONT)
            sidecar.kill()
        os.killpg(agent.pid, signal.SIGKILL)
        agent.wait(timeout=10)
    off = [r for is_on, r in rates if not is_on]
    ratios = paired_ratios([r for _, r in rates])
    return {"ratios": ratios, "ratio": statistics.mean(ratios), "ratio_ci95": ci95(ratios),
            "ratio_min": min(ratios), "ratio_max": max(ratios),
            "off_steps_per_s": statistics.mean(off),
            "on_steps_per_s": statistics.mean(r for is_on, r in rates if is_on),
            "learner_step_ms": 1000.0 / statistics.mean(off)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--phases", type=int, default=12, help="on-phases (off-phases: one more)")
    p.add_argument("--phase-s", type=float, default=5.0)
    p.add_argument("--interval", default="0.1", help="the sidecar's poll interval, seconds")
    args = p.parse_args(argv)
    if args.phases < 2 or args.phase_s <= 0:
        raise SystemExit(f"--phases ({args.phases}) must be >= 2 and --phase-s "
                         f"({args.phase_s}) > 0")
    if len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("needs 2 cores: the agent on core 0, the sidecar on core 1")
    r = run(args.phases, args.phase_s, args.interval, Path(tempfile.mkdtemp(prefix="rw-pair-")))
    hz = 1.0 / float(args.interval)
    print(f"| sidecar at {hz:g} Hz, paired in one agent process | learner steps/s off | on | "
          "on/off ratio (min..max) | 95% CI of the ratio |")
    print("| --- | ---: | ---: | --- | ---: |")
    print(f"| {args.phases} on-phases of {args.phase_s:g} s between {args.phases + 1} off-phases "
          f"| {r['off_steps_per_s']:.1f} | {r['on_steps_per_s']:.1f} | {r['ratio']:.4f} "
          f"({r['ratio_min']:.3f}..{r['ratio_max']:.3f}) | ±{r['ratio_ci95']:.4f} |")
    print(f"\nAgent (sync, Pendulum) pinned to core 0, sidecar to core 1; learner step "
          f"{r['learner_step_ms']:.1f} ms; load average "
          f"{' '.join(Path('/proc/loadavg').read_text().split()[:3])}")
    return r


if __name__ == "__main__":
    main()
