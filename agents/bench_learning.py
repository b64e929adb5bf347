"""Benchmark: does the sync agent learn Pendulum-v1 within 30,000 environment steps?

    .venv/bin/python -m agents.bench_learning            # ~5-8 minutes on 2 cores
    .venv/bin/python -m agents.bench_learning --steps 10000 -- --batch-size 128

Runs `python -m agents.run --mode sync` as a subprocess (so the numbers include
the real Reverb pipeline and the probe), reads its JSON lines, and prints the
evaluation-return curve, env steps/s and learner steps/s. Exits 1 when the mean
return of the last 10 evaluation episodes is not above `--target` (-400).

Not a test: it is too slow for `make test`; its output is recorded in agents/README.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from typing import Any


def run(steps: int, extra: list[str]) -> tuple[list[dict[str, Any]], float]:
    argv = [
        sys.executable, "-m", "agents.run", "--mode", "sync", "--steps", str(steps),
        "--eval-every", "2000", "--eval-episodes", "10", "--log-every", "10", *extra,
    ]  # fmt: skip
    print("$", " ".join(argv[1:]), flush=True)
    started = time.monotonic()
    records = []
    with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            records.append(record)
            if record.get("event") == "eval":
                print(
                    f"  env_steps {record['env_steps']:>6}  learner_steps "
                    f"{record['learner_steps']:>6}  mean_return {record['mean_return']:>8.1f}",
                    flush=True,
                )
        proc.wait()
        if proc.returncode != 0:
            raise SystemExit(f"agents.run exited {proc.returncode}")
    return records, time.monotonic() - started


def summarize(records: list[dict[str, Any]], wall_s: float, target: float) -> bool:
    evals = [r for r in records if r.get("event") == "eval"]
    progress = [r for r in records if r.get("event") == "progress"]
    # Rates after warm-up (replay filling, jit compiles): the steady state.
    steady = [p for p in progress if p["learner_steps"] > 0][1:] or progress
    env_rate = sum(p["env_steps_per_s"] for p in steady) / max(1, len(steady))
    learner_rate = sum(p["learner_steps_per_s"] for p in steady) / max(1, len(steady))
    done = next((r for r in records if r.get("event") == "done"), {})
    final = evals[-1]["mean_return"] if evals else float("nan")
    print(
        json.dumps(
            {
                "wall_s": round(wall_s, 1),
                "env_steps": done.get("env_steps"),
                "learner_steps": done.get("learner_steps"),
                "env_steps_per_s": round(env_rate, 1),
                "learner_steps_per_s": round(learner_rate, 1),
                "first_eval_return": evals[0]["mean_return"] if evals else None,
                "last_10_episodes_mean_return": final,
                "target": target,
                "curve": [[e["env_steps"], e["mean_return"]] for e in evals],
            }
        ),
        flush=True,
    )
    return final > target


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m agents.bench_learning")
    parser.add_argument("--steps", type=int, default=30_000)
    parser.add_argument("--target", type=float, default=-400.0)
    parser.add_argument("extra", nargs="*", help="more agents.run flags, after --")
    args = parser.parse_args()
    records, wall_s = run(args.steps, args.extra)
    return 0 if summarize(records, wall_s, args.target) else 1


if __name__ == "__main__":
    sys.exit(main())
