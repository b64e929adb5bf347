"""`make bench`: every benchmark, one after another, into bench/RESULTS.md.

First the healthy false-alarm runs (bench/healthy.py: sync, async and
distributed agents for 10 minutes, a learner whose first step takes 60 s for
150 s; side by side, each watched with its probes and from Reverb alone), then
the detection scenarios, one at a time: running the scenarios in parallel lanes,
or beside the healthy runs, starves the distributed actors of CPU for over 10 s on
2 cores, which is a real `sample_blocked`, and pushes latencies past the window.
(Two local Ray clusters now coexist: the agent's `ray.init(address="local")`.)
The detection part takes about 35 minutes on the 2-core CI machine, the whole set
about 45. The trainer-cost runs come after, alone, since they measure the
machine's speed.
"""

from __future__ import annotations

import contextlib
import io
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import detection, healthy, load, probe_cost, scale, server_info_cost, trainer_cost
from bench.results_md import detection_section, healthy_section

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


def _run(title: str, fn: Callable[[], Any]) -> tuple[str, Any, float]:
    print(f"== {title}", file=sys.stderr, flush=True)
    out = io.StringIO()
    t0 = time.monotonic()
    with contextlib.redirect_stdout(out):
        value = fn()
    took = time.monotonic() - t0
    print(out.getvalue(), file=sys.stderr, flush=True)
    return out.getvalue(), value, took


def machine() -> str:
    cpu = "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                         text=True).stdout.strip()
    return (f"{platform.node()}: {os.cpu_count()} cores ({cpu}), {mem:.0f} GiB, "
            f"Python {platform.python_version()}, {platform.system()} {platform.release()}; "
            f"commit {rev or '?'}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")


def main() -> None:
    sections: list[str] = []
    t0 = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="rw-detect-"))
    t_healthy = time.monotonic()
    healthy_runs = healthy.healthy(600.0, tmp, healthy.DEFAULT_RUNS, 150.0)
    healthy_took = time.monotonic() - t_healthy
    t_detect = time.monotonic()
    results = detection.run_lanes([list(detection.SCENARIOS)], 5, tmp)
    sections.append(detection_section(results, 5, time.monotonic() - t_detect))
    sections.append(healthy_section(healthy_runs, 600.0, 150.0, healthy_took))
    text, cost, took = _run("trainer cost", lambda: trainer_cost.main(["--reps", "2",
                                                                        "--window", "20"]))
    sections.append(f"## Cost to the trainer ({took / 60:.1f} min)\n\n" + text)
    step_ms = cost["learner_step_ms"]
    text, _, _ = _run("probe cost", lambda: _argv(probe_cost.main,
                                                    ["--learner-step-ms", f"{step_ms:.3f}"]))
    sections.append("## The probe's cost per next()\n\n```\n" + text + "```\n")
    text, _, _ = _run("server_info cost", lambda: server_info_cost.main([]))
    sections.append("## One ServerInfo call, by table count\n\n" + text)
    text, _, took = _run("scale", lambda: scale.main(["--quick"]))
    sections.append(f"## Sidecar scale ({took / 60:.1f} min)\n\n" + text)
    text, _, _ = _run("load", lambda: _argv(load.main, ["--duration", "60"]))
    sections.append("## Load: 20 targets x 5 tables at 1 Hz, 100 concurrent clients, 60 s\n\n"
                    + text)
    total = (time.monotonic() - t0) / 60
    RESULTS.write_text(
        "# Benchmark results\n\n"
        f"Machine: {machine()}. `make bench` took {total:.1f} minutes.\n\n"
        + "\n".join(sections))
    print(f"wrote {RESULTS} in {total:.1f} min", file=sys.stderr)


def _argv(fn: Callable[[], Any], argv: list[str]) -> Any:
    saved = sys.argv
    sys.argv = [fn.__module__, *argv]
    try:
        return fn()
    finally:
        sys.argv = saved


if __name__ == "__main__":
    main()
