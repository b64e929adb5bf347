"""`make bench-rllib-memory`: the RLlib driver's memory at its replay buffer's capacity,
projected while the buffer fills, against what it used once full.

Real DQN jobs (harness/rllib_job.py in .venv-rllib: CartPole-v1 with each observation padded
to `--obs-kib` of noise, so a step costs what a frame does; one EnvRunner, the learner in the
driver, learning held off past the capacity so that only the fill runs) with the RLlibProbe in
their config. Each second the probe is read as the sidecar reads it (`--ray-results URL`:
sources/ray_results.py) and the driver at capacity projected (diagnosis/rllib_memory.py);
the projections made once a quarter and once half of the capacity was stored are compared
with the driver's resident memory when the buffer first held its capacity. One shape per
row, each a job of its own.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.results_md import replace_sections
from harness.procs import ROOT, Proc
from replaywatch.diagnosis import rllib_job as rj
from replaywatch.diagnosis.rllib_memory import driver_at_capacity
from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.ray_model import RaySnapshot
from replaywatch.sources.ray_results import ResultProbe

HEADING = "## An RLlib driver's replay buffer: its memory at capacity, projected as it fills"
RLLIB_PY = ROOT / ".venv-rllib" / "bin" / "python"
SHAPES = ((16, 12_000), (64, 6_000))  # (observation KiB, capacity in env steps)


def run(where: Path, obs_kib: int, capacity: int) -> dict[str, Any]:
    job = Proc([str(RLLIB_PY), "harness/rllib_job.py", "--algo", "dqn", "--num-learners", "0",
                "--num-env-runners", "1", "--min-steps-per-iteration", "200",
                "--learning-starts", str(10 * capacity), "--replay-capacity", str(capacity),
                "--uniform-replay", "--obs-kib", str(obs_kib), "--num-cpus", "2",
                "--seconds", "900", "--temp-dir", str(where / "ray"),
                "--logdir", str(where / "log"), "--probe-listen", "127.0.0.1:0", "--no-rows"],
               stdout_path=where / "job.log", env={"OMP_NUM_THREADS": "1"})
    try:
        url = job.announce(timeout_s=240, match=lambda r: r.get("event") == "rllib_job")[
            "rllib_probe"]
        reader, history = ResultProbe(url, timeout_s=2.0), []
        th = Thresholds()
        at: dict[float, dict[str, Any]] = {}
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            reader.read()
            live = reader.live
            if live is not None and live.env_steps_stored is not None:
                history.append(RaySnapshot("bench", live.observed_at, "job", None, live=live))
                stored = live.env_steps_stored
                if stored >= capacity:
                    full = live.rss_bytes
                    break
                job_now = rj.read_job("bench", history, th, live.observed_at)
                said = driver_at_capacity(job_now) if job_now is not None else None
                for share in (0.25, 0.5):
                    if said is not None and share not in at and stored >= share * capacity:
                        at[share] = said
            time.sleep(1.0)
        else:
            raise SystemExit(f"the buffer of {capacity} steps did not fill in 600 s")
    finally:
        job.kill()
    return {"obs_kib": obs_kib, "capacity": capacity, "full_bytes": full,
            "projections": {share: (s["at_capacity_bytes"], s["bytes_per_env_step"])
                            for share, s in at.items()}}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", type=Path, default=None)
    args = p.parse_args()
    if not RLLIB_PY.exists():
        print("no .venv-rllib (make rllib-venv): the RLlib bench cannot run")
        return 2
    began, rows = time.monotonic(), []
    for obs_kib, capacity in SHAPES:
        with tempfile.TemporaryDirectory(prefix="rwrm-", dir="/tmp") as tmp:
            rows.append(run(Path(tmp), obs_kib, capacity))
            print(rows[-1], flush=True)
    text = render(rows, (time.monotonic() - began) / 60)
    print(text)
    if args.results:
        args.results.write_text(replace_sections(args.results.read_text(), [text]))
    errors = [abs(a / r["full_bytes"] - 1) for r in rows for a, _ in r["projections"].values()]
    return 0 if errors and len(errors) == 2 * len(rows) and max(errors) <= 0.1 else 1


def render(rows: list[dict[str, Any]], minutes: float) -> str:
    mib = lambda b: f"{b / 2**20:,.0f}"  # noqa: E731
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    lines = [f"{HEADING} ({minutes:.1f} min, {stamp})",
             "", "`make bench-rllib-memory` (bench/rllib_memory.py): real DQN jobs (Ray 2.60, "
             "CartPole-v1, each observation padded with noise to the size given, one "
             "EnvRunner, the learner in the driver, learning held off so that only the fill "
             "runs) with the RLlibProbe, read every second as the sidecar reads it; the "
             "driver's memory at capacity projected once a quarter and half of it was stored "
             "(diagnosis/rllib_memory.py: an env step's bytes measured over the fill since 5 % "
             "of it), against its resident memory when the buffer first held its capacity.", "",
             "| observation | capacity (env steps) | bytes a step, at a quarter | projected at a "
             "quarter (MiB) | at half (MiB) | used when full (MiB) | error at a quarter, at "
             "half |", "| ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        pr, full = r["projections"], r["full_bytes"]
        q, h = pr.get(0.25), pr.get(0.5)
        err = lambda x, full=full: (  # noqa: E731
            "-" if x is None else f"{100 * (x[0] / full - 1):+.1f} %")
        per = "-" if q is None else f"{q[1]:,.0f}"
        lines.append(f"| {r['obs_kib']} KiB | {r['capacity']:,} | {per} | "
                     f"{'-' if q is None else mib(q[0])} | {'-' if h is None else mib(h[0])} | "
                     f"{mib(full)} | {err(q)}, {err(h)} |")
    lines += ["", "The projection is the driver's memory now plus the steps still to store at "
              "the bytes a step cost so far; `memory_exhaustion` is said when it passes the "
              "driver's limit (its memory cgroup's, counted as the cgroup's usage, else the "
              "host's), with the capacity that keeps it under 90 % of it. No job here was run "
              "into a real limit.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
