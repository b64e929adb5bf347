"""`make bench-rllib-cost`: what watching an RLlib job from outside costs the job.

One real DQN job (harness/rllib_job.py in .venv-rllib: CartPole-v1, one EnvRunner, one
Learner actor, a local cluster of its own) runs for the whole bench; a `replaywatch watch
--ray` sidecar (its own process, polling every second: Ray's state API, every node's metrics
endpoint, the result rows) is started and stopped so that the job alternates between
windows unwatched and watched, ABA...BA, each `--window-s` long. Pairing the windows inside
one job keeps the cluster and the machine the same on both sides, which separate runs do
not; each watched window is compared with the unwatched ones either side of it, so a trend
in the job (its buffer filling) cancels.

Per window, from the job's own result rows (each row's `timestamp` places it): env steps
sampled per second and the mean time of an iteration. The first window (start-up, warm-up)
is left out. The sidecar's CPU and that of the cluster's processes that answer it (the
dashboard, its agent, the GCS) come from /proc.
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

from bench.results_md import write_sections
from bench.rllib_venv import RLLIB_PY
from harness.procs import PYTHON, Proc, free_port, get_json, wait_until

HEADING = "## Watching an RLlib job: its cost to the job"
PROBE_HEADING = "## The RLlibProbe in an RLlib job: its cost to the job"
CLK_TCK = 100.0


def cpu_seconds(pid: int) -> float:
    """utime + stime of one process (its threads included)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def serving_cpu_seconds(temp: Path) -> float:
    """CPU seconds so far of the cluster's processes that answer the sidecar (the dashboard
    and its agent, which serve the state API and read the GCS, and the GCS), found by the
    cluster's own temp dir in their command lines. They run on the job's cores: what they
    spend on the sidecar's polls is a cost to the job that the sidecar's own CPU omits."""
    total = 0.0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if str(temp) in cmd and ("dashboard" in cmd or "gcs_server" in cmd):
                total += cpu_seconds(int(proc.name))
        except (OSError, ValueError, IndexError):
            continue  # gone between the listing and the read
    return total


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


def start_sidecar(where: Path, dashboard: str, temp: str, results: str) -> Proc:
    port = free_port()
    proc = Proc([PYTHON, "-m", "replaywatch", "watch", "--listen", f"127.0.0.1:{port}",
                 "--ray", dashboard.removeprefix("http://"), "--ray-temp-dir", temp,
                 "--ray-results", results, "--db", str(where / f"i-{port}.db")],
                stdout_path=where / f"sidecar-{port}.log")
    wait_until(lambda: get_json(f"http://127.0.0.1:{port}/healthz", 1.0)[0] == 200,
               timeout_s=60)
    return proc


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--window-s", type=float, default=40.0)
    p.add_argument("--pairs", type=int, default=3, help="unwatched + watched windows")
    p.add_argument("--results", type=Path, default=None)
    p.add_argument("--probe", action="store_true",
                   help="the job runs the RLlibProbe, and the watched windows read the rows "
                        "from it (--ray-results URL): what the probe adds to the driver")
    args = p.parse_args()
    if not RLLIB_PY.exists():
        print("no .venv-rllib (make rllib-venv): the RLlib bench cannot run")
        return 2
    began = time.monotonic()
    total_s = args.window_s * (2 * args.pairs + 2) + 90
    with tempfile.TemporaryDirectory(prefix="rwrl-", dir="/tmp") as tmp:
        where = Path(tmp)
        job = Proc([str(RLLIB_PY), "harness/rllib_job.py", "--algo", "dqn", "--num-learners",
                    "1", "--num-env-runners", "1", "--learning-starts", "200",
                    "--min-steps-per-iteration", "200", "--num-cpus", "4",
                    "--seconds", str(total_s), "--temp-dir", str(where / "ray"),
                    "--logdir", str(where / "log"),
                    *(["--probe-listen", "127.0.0.1:0"] if args.probe else [])],
                   stdout_path=where / "job.log")
        windows: list[tuple[str, float, float, float | None, float, float]] = []
        ray_temp = where / "ray"

        def driver_cpu() -> float:
            return cpu_seconds(job.popen.pid)

        def unwatched() -> None:
            serving0, driver0, start = serving_cpu_seconds(ray_temp), driver_cpu(), time.time()
            time.sleep(args.window_s)
            windows.append(("unwatched", start, time.time(), None,
                            serving_cpu_seconds(ray_temp) - serving0, driver_cpu() - driver0))

        try:
            announced = job.announce(timeout_s=240,
                                     match=lambda r: r.get("event") == "rllib_job")
            time.sleep(args.window_s)  # start-up and warm-up: not measured
            for _ in range(args.pairs):
                unwatched()
                car = start_sidecar(where, announced["dashboard_url"], str(ray_temp),
                                    announced["rllib_probe"] if args.probe
                                    else announced["logdir"])
                try:
                    cpu0, serving0 = cpu_seconds(car.popen.pid), serving_cpu_seconds(ray_temp)
                    driver0, start = driver_cpu(), time.time()
                    time.sleep(args.window_s)
                    windows.append(("watched", start, time.time(),
                                    cpu_seconds(car.popen.pid) - cpu0,
                                    serving_cpu_seconds(ray_temp) - serving0,
                                    driver_cpu() - driver0))
                finally:
                    car.kill()
            unwatched()  # each watched window between two unwatched ones: a trend cancels
            time.sleep(5)  # the last window's rows
            rows = rows_of(Path(announced["result_json"]))
        finally:
            job.kill()
    measured = [{"window": w, **window_figures(rows, s, e), "sidecar_cpu_s": cpu,
                 "serving_cpu_s": serving, "driver_cpu_s": driver}
                for w, s, e, cpu, serving, driver in windows]
    for m in measured:
        print(json.dumps(m), flush=True)
    text = render(measured, args, (time.monotonic() - began) / 60)
    print(text)
    if args.results:
        write_sections(args.results, [text])
    return 0 if all(m["rows"] for m in measured) else 1


def render(measured: list[dict[str, Any]], args: argparse.Namespace, minutes: float) -> str:
    lines = [f"{PROBE_HEADING if args.probe else HEADING} ({args.pairs} watched windows of "
             f"{args.window_s:g} s between "
             f"unwatched ones, {minutes:.1f} min, "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})", "",
             "`make bench-rllib-cost` (bench/rllib_cost.py): one real DQN job (Ray 2.60, torch "
             "on the CPU, CartPole-v1, one EnvRunner, one Learner actor, iterations of 200 "
             "env steps) alternating windows unwatched and watched by a `replaywatch watch "
             "--ray` sidecar polling every second (state API, metrics endpoints, result rows); "
             "the job's figures from its own rows. The job is CPU-bound on this 2-core "
             "machine, so what the sidecar and the cluster's dashboard, agent and GCS spend "
             "answering it is taken from the job."
             + (" With `--probe` (`make bench-rllib-probe-cost`) the job runs the RLlibProbe "
                "(its callbacks in the config) throughout, and the sidecar reads the rows from "
                "it (`--ray-results URL`): the driver's CPU is where the probe's answers "
                "cost." if args.probe else ""), "",
             "| window | rows | env steps sampled/s | iteration (s) | sidecar CPU (s/s) "
             "| dashboard, agent, GCS CPU (s/s) | driver CPU (s/s) |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for i, m in enumerate(measured):
        cpu = "-" if m["sidecar_cpu_s"] is None else f"{m['sidecar_cpu_s'] / args.window_s:.3f}"
        it = "-" if m["iteration_s"] is None else f"{m['iteration_s']:.2f}"
        lines.append(f"| {i + 1}: {m['window']} | {m['rows']} | {m['sampled_per_s']:.1f} | "
                     f"{it} | {cpu} | {m['serving_cpu_s'] / args.window_s:.3f} | "
                     f"{m['driver_cpu_s'] / args.window_s:.3f} |")
    # Each watched window against the mean of the unwatched ones on either side of it.
    changes, extra, driver = [], [], []
    for i, m in enumerate(measured):
        if m["window"] != "watched" or not 0 < i < len(measured) - 1:
            continue
        around = [measured[i - 1], measured[i + 1]]
        base = [a["iteration_s"] for a in around if a["iteration_s"] is not None]
        if base and m["iteration_s"] is not None:
            changes.append(m["iteration_s"] / statistics.mean(base) - 1)
        extra.append(m["serving_cpu_s"] / args.window_s
                     - statistics.mean(a["serving_cpu_s"] for a in around) / args.window_s)
        driver.append(m["driver_cpu_s"] / args.window_s
                      - statistics.mean(a["driver_cpu_s"] for a in around) / args.window_s)
    sidecar = statistics.mean(m["sidecar_cpu_s"] for m in measured
                              if m["sidecar_cpu_s"] is not None) / args.window_s
    lines += ["", "Iteration time of each watched window against the unwatched windows either "
              "side of it: " + ", ".join(f"{c * 100:+.1f} %" for c in changes)
              + (f" (mean {statistics.mean(changes) * 100:+.1f} %)" if changes else "")
              + f". The sidecar used {sidecar:.3f} CPU-seconds per second, and the cluster's "
              "dashboard, agent and GCS "
              + (f"{statistics.mean(extra):+.3f}" if extra else "?")
              + " more while it polled. The driver: "
              + (f"{statistics.mean(driver):+.3f}" if driver else "?")
              + " CPU-seconds per second watched against unwatched.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
