"""`make bench`: every benchmark, one after another, into bench/RESULTS.md.

First the healthy false-alarm runs (bench/healthy.py: sync, async and distributed
agents, then an on-policy queue, a sync loop that evaluates and checkpoints, and a learner
whose first step takes 60 s, three at a time side by side for 150 s,
each watched with its probes and from Reverb alone), then the detection scenarios,
one at a time: running them in parallel lanes, or beside the healthy runs, starves the
distributed actors of CPU for over 10 s on 2 cores, which is a real `sample_blocked`,
and pushes latencies past the window. The cost runs come after, alone, since they
measure the machine's speed and its CPU clocks. The last section says where the time
went; the goal is 20 minutes on the 2-core machine, where agent and Ray
start-ups take most of it.

RESULTS.md's sections after "Where make bench's time goes" are earlier runs kept for the
record: a new run replaces its own sections and leaves those."""

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

from bench import (
    detection,
    healthy,
    induced_cost,
    load,
    probe_cost,
    render_cost,
    scale,
    server_info_cost,
    trainer_paired,
)
from bench.results_md import detection_section, healthy_section

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


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


# What fits `make bench` in 20 minutes on the 2-core machine: the healthy runs
# watched for 150 s side by side (10-minute runs are in RESULTS.md's history), two runs
# of each detection scenario. Every other section is as long as before.
# Two groups of three healthy runs (the queue and eval/checkpoint runs joined them) took
# 7.7 min at 150 s and the whole 20.3 min.
HEALTHY_S = 135.0  # 180 s (one group of four) made the whole 20.2 min
FIRST_STEP_S = 135.0
DETECTION_RUNS = 2
GOAL_MIN = 20.0


def main() -> None:
    sections: list[str] = []
    parts: list[tuple[str, float]] = []
    t0 = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="rw-detect-"))

    def timed(name: str, fn: Callable[[], Any]) -> Any:
        print(f"== {name} (at {(time.monotonic() - t0) / 60:.1f} min)", file=sys.stderr,
              flush=True)
        began = time.monotonic()
        value = fn()
        parts.append((name, time.monotonic() - began))
        return value

    healthy_runs = timed("healthy runs", lambda: [
        r for group in healthy.BENCH_GROUPS
        for r in healthy.healthy(HEALTHY_S, tmp, group, FIRST_STEP_S)])
    results = timed("detection", lambda: detection.run_lanes(
        [list(detection.SCENARIOS)], DETECTION_RUNS, tmp))
    sections.append(detection_section(results, DETECTION_RUNS, parts[-1][1]))
    sections.append(healthy_section(healthy_runs, HEALTHY_S, FIRST_STEP_S, parts[0][1]))
    # Alone on the machine from here: these measure its speed or its CPU clocks.
    text, _, took = timed("induced cost", lambda: _capture(lambda: induced_cost.main(
        ["--seconds", "3", "--cycle-window", "15"])))
    sections.append(f"## CPU induced in the trainer's process, by accounting ({took / 60:.1f} min)"
                    "\n\nbench/induced_cost.py says how: the target's CPU clock read from "
                    "outside, before and after calls made the way the sidecar makes them.\n\n"
                    + text)
    text, cost, took = timed("trainer cost", lambda: _capture(lambda: trainer_paired.main(
        ["--phases", "10", "--phase-s", "5", "--interval", "0.1"])))
    sections.append(f"## Cost to the trainer, wall clock ({took / 60:.1f} min)\n\n"
                    "bench/trainer_paired.py says how: one agent process throughout, the "
                    "sidecar on the other core paused and resumed in alternating phases, each "
                    "on-phase against the off-phases either side. (bench/trainer_cost.py's "
                    "comparison of separate agent processes spread ±20-30% here: each process "
                    "runs at its own speed.)\n\n" + text)
    step_ms = cost["learner_step_ms"]
    text, _, _ = timed("probe cost", lambda: _capture(lambda: _argv(
        probe_cost.main, ["--learner-step-ms", f"{step_ms:.3f}"])))
    sections.append("## The probe's cost per next()\n\n```\n" + text + "```\n")
    text, _, _ = timed("server_info cost", lambda: _capture(lambda: server_info_cost.main([])))
    sections.append("## One ServerInfo call, by table count\n\n" + text)
    text, _, took = timed("scale", lambda: _capture(lambda: scale.main(["--quick"])))
    render_text, _, _ = timed("render cost", lambda: _capture(
        lambda: render_cost.main(["--runs", "20"])))
    sections.append(f"## Sidecar scale ({took / 60:.1f} min)\n\n" + text
                    + "\n```\n" + render_text + "```\n")
    text, _, _ = timed("load", lambda: _capture(lambda: _argv(load.main, ["--duration", "20"])))
    sections.append("## Load: 20 targets x 5 tables at 1 Hz, 100 concurrent clients, 20 s\n\n"
                    + text)
    total = (time.monotonic() - t0) / 60
    sections.append(time_section(parts, total))
    old = RESULTS.read_text() if RESULTS.exists() else ""
    RESULTS.write_text(
        "# Benchmark results\n\n"
        f"Machine: {machine()}. `make bench` took {total:.1f} minutes (goal {GOAL_MIN:g}); "
        "every section up to \"Where make bench's time goes\" is from that run, the sections "
        "after it are earlier runs kept for the record.\n\n"
        + "\n".join(s.rstrip("\n") + "\n" for s in [*sections, *kept_sections(old, sections)]))
    print(f"wrote {RESULTS} in {total:.1f} min", file=sys.stderr)


def heading(section: str) -> str:
    """A section's name: its first line up to any "(" (the part a run fills in)."""
    return section.split("\n", 1)[0].split("(", 1)[0].split(":", 1)[0].strip()


def kept_sections(old: str, new: list[str]) -> list[str]:
    """The earlier file's `## ` sections that this run did not write: the record."""
    names = {heading(s) for s in new}
    parts = ["## " + p for p in old.split("\n## ")[1:]]
    return [p for p in parts if heading(p) not in names]


def time_section(parts: list[tuple[str, float]], total_min: float) -> str:
    rows = "\n".join(f"| {name} | {took / 60:.1f} |" for name, took in parts)
    return (f"## Where make bench's time goes ({total_min:.1f} min in all, goal {GOAL_MIN:g})"
            "\n\n| part | minutes |\n| --- | ---: |\n" + rows + "\n")


def _capture(fn: Callable[[], Any]) -> tuple[str, Any, float]:
    out = io.StringIO()
    t0 = time.monotonic()
    with contextlib.redirect_stdout(out):
        value = fn()
    print(out.getvalue(), file=sys.stderr, flush=True)
    return out.getvalue(), value, time.monotonic() - t0


def _argv(fn: Callable[[], Any], argv: list[str]) -> Any:
    saved = sys.argv
    sys.argv = [fn.__module__, *argv]
    try:
        return fn()
    finally:
        sys.argv = saved


if __name__ == "__main__":
    main()
