"""`make bench-rllib-cost`: what watching an RLlib job from outside costs the job.

One real DQN job (harness/rllib_job.py in .venv-rllib: CartPole-v1, one EnvRunner, one
Learner actor, a local cluster of its own) runs for the whole bench; a `replaywatch watch
--ray` sidecar (its own process, polling every second: Ray's state API, every node's metrics
endpoint, the result rows) is started and stopped so that the job alternates between
windows unwatched and watched, ABAB..., each `--window-s` long. Pairing the windows inside
one job keeps the cluster, the warm caches and the machine's drift the same on both sides,
which separate runs do not: two runs of the same job here differ by more than the cost.

Per window, from the job's own result rows (each row's `timestamp` places it): env steps
sampled and trained per second, and the mean time of an iteration. The first window (start-
up, warm-up) is left out. The sidecar's own CPU seconds come from /proc over its watched
windows.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.results_md import replace_sections
from harness.procs import PYTHON, ROOT, Proc, free_port, get_json, wait_until

HEADING = "## Watching an RLlib job: its cost to the job"
RLLIB_PY = ROOT / ".venv-rllib" / "bin" / "python"
CLK_TCK = 100.0


def cpu_seconds(pid: int) -> float:
    """utime + stime of one process (its threads included)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rows_of(result_json: Path) -> list[dict[str, Any]]:
    if not result_json.exists():
        return []
    return [json.loads(line) for line in result_json.read_text().splitlines() if line.strip()]


def window_figures(rows: list[dict[str, Any]], start: float, end: float) -> dict[str, Any]:
    """Rates over the rows whose iteration ended inside [start, end)."""
    inside = [r for r in rows if start <= r.get("timestamp", 0) < end]
    sampled = sum(float(r.get("env_runners", {}).get("num_env_steps_sampled", 0) or 0)
                  for r in inside)
    trained = sum(float(r.get("learners", {}).get("__all_modules__", {})
                        .get("num_env_steps_trained", 0) or 0) for r in inside)
    span = end - start
    iters = [float(r["time_this_iter_s"]) for r in inside if "time_this_iter_s" in r]
    return {"rows": len(inside), "sampled_per_s": sampled / span,
            "trained_per_s": trained / span,
            "iteration_s": statistics.mean(iters) if iters else None}


def start_sidecar(where: Path, dashboard: str, temp: str, logdir: str) -> Proc:
    port = free_port()
    proc = Proc([PYTHON, "-m", "replaywatch", "watch", "--listen", f"127.0.0.1:{port}",
                 "--ray", dashboard.removeprefix("http://"), "--ray-temp-dir", temp,
                 "--ray-results", logdir, "--db", str(where / f"i-{port}.db")],
                stdout_path=where / f"sidecar-{port}.log")
    wait_until(lambda: get_json(f"http://127.0.0.1:{port}/healthz", 1.0)[0] == 200,
               timeout_s=60)
    return proc


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--window-s", type=float, default=40.0)
    p.add_argument("--pairs", type=int, default=3, help="unwatched + watched windows")
    p.add_argument("--results", type=Path, default=None)
    args = p.parse_args()
    if not RLLIB_PY.exists():
        print("no .venv-rllib (make rllib-venv): the RLlib bench cannot run")
        return 2
    began = time.monotonic()
    total_s = args.window_s * (2 * args.pairs + 1) + 60
    with tempfile.TemporaryDirectory(prefix="rwrl-", dir="/tmp") as tmp:
        where = Path(tmp)
        job = Proc([str(RLLIB_PY), "harness/rllib_job.py", "--algo", "dqn", "--num-learners",
                    "1", "--num-env-runners", "1", "--learning-starts", "200",
                    "--min-steps-per-iteration", "200", "--num-cpus", "4",
                    "--seconds", str(total_s), "--temp-dir", str(where / "ray"),
                    "--logdir", str(where / "log")], stdout_path=where / "job.log")
        windows: list[tuple[str, float, float, float | None]] = []
        try:
            announced = job.announce(timeout_s=240,
                                     match=lambda r: r.get("event") == "rllib_job")
            time.sleep(args.window_s)  # start-up and warm-up: not measured
            for _ in range(args.pairs):
                start = time.time()
                time.sleep(args.window_s)
                windows.append(("unwatched", start, time.time(), None))
                car = start_sidecar(where, announced["dashboard_url"], str(where / "ray"),
                                    announced["logdir"])
                try:
                    cpu0, start = cpu_seconds(car.popen.pid), time.time()
                    time.sleep(args.window_s)
                    windows.append(("watched", start, time.time(),
                                    cpu_seconds(car.popen.pid) - cpu0))
                finally:
                    car.kill()
            time.sleep(5)  # the last window's rows
            rows = rows_of(Path(announced["result_json"]))
        finally:
            job.kill()
    measured = [{"window": w, **window_figures(rows, s, e), "sidecar_cpu_s": cpu}
                for w, s, e, cpu in windows]
    for m in measured:
        print(json.dumps(m), flush=True)
    text = render(measured, args, (time.monotonic() - began) / 60)
    print(text)
    if args.results:
        args.results.write_text(replace_sections(args.results.read_text(), [text]))
    return 0 if all(m["rows"] for m in measured) else 1


def render(measured: list[dict[str, Any]], args: argparse.Namespace, minutes: float) -> str:
    def mean(kind: str, key: str) -> float:
        values = [m[key] for m in measured if m["window"] == kind and m[key] is not None]
        return statistics.mean(values) if values else float("nan")

    lines = [f"{HEADING} ({args.pairs} pairs of {args.window_s:g} s windows, {minutes:.1f} min, "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})", "",
             "`make bench-rllib-cost` (bench/rllib_cost.py): one real DQN job (Ray 2.60, torch "
             "on the CPU, CartPole-v1, one EnvRunner, one Learner actor) alternating windows "
             "unwatched and watched by a `replaywatch watch --ray` sidecar polling every second "
             "(state API, metrics endpoints, result rows); figures from the job's own rows. "
             "This machine has 2 cores, so the sidecar's CPU is taken from the job's.", "",
             "| window | rows | env steps sampled/s | trained/s | iteration (s) | sidecar CPU "
             "(s per s) |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for i, m in enumerate(measured):
        cpu = "-" if m["sidecar_cpu_s"] is None else f"{m['sidecar_cpu_s'] / args.window_s:.3f}"
        it = "-" if m["iteration_s"] is None else f"{m['iteration_s']:.2f}"
        lines.append(f"| {i + 1}: {m['window']} | {m['rows']} | {m['sampled_per_s']:.1f} | "
                     f"{m['trained_per_s']:.1f} | {it} | {cpu} |")
    off, on = mean("unwatched", "sampled_per_s"), mean("watched", "sampled_per_s")
    lines += ["", f"Mean env steps sampled per second: {off:.1f} unwatched, {on:.1f} watched "
              f"({(on / off - 1) * 100:+.1f} %); mean iteration "
              f"{mean('unwatched', 'iteration_s'):.2f} s unwatched, "
              f"{mean('watched', 'iteration_s'):.2f} s watched; the sidecar used "
              f"{mean('watched', 'sidecar_cpu_s') / args.window_s:.3f} CPU-seconds per "
              "second.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
