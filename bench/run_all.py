"""`make bench`: every benchmark, one after another, into bench/RESULTS.md.

The healthy false-alarm runs (10 minutes of a sync and a distributed agent,
each watched with its probe) run beside the detection scenarios, which run one
at a time: running the scenarios in parallel lanes as well (tried) starved the
distributed actors of CPU for over 10 s, which is a real `sample_blocked`, and
pushed latencies past the window. On the 2-core CI machine the whole set takes
about half an hour; see RESULTS.md for what would bring it under 20 minutes.
The trainer-cost runs come after, alone, since they measure the machine's speed.
"""

from __future__ import annotations

import contextlib
import io
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import detection, load, probe_cost, scale, server_info_cost, trainer_cost

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
    healthy: dict[str, Any] = {}
    healthy_thread = threading.Thread(
        target=lambda: healthy.update(detection.healthy(600.0, Path(tempfile.mkdtemp()))),
        daemon=True)
    healthy_thread.start()
    sync = [n for n, sc in detection.SCENARIOS.items() if "distributed" not in sc.flags]
    distributed = [n for n in detection.SCENARIOS if n not in sync]
    tmp = Path(tempfile.mkdtemp(prefix="rw-detect-"))
    t_detect = time.monotonic()
    results = detection.run_lanes([sync], 5, tmp)
    healthy_thread.join()
    # Two local Ray clusters on one machine got in each other's way (actors never
    # scheduled): the distributed scenarios wait for the healthy distributed run.
    results += detection.run_lanes([distributed], 5, tmp)
    took = time.monotonic() - t_detect
    sections.append(f"## Detection latency (5 runs per scenario, {took / 60:.1f} min)\n\n"
                    "Onset from the trainer itself (the probe's `blocked_since` or last step, "
                    "the actor's exit line; the first poll for the configuration finding and "
                    "for warm-up); detection = first time the finding shows in "
                    "`/api/v1/findings`. Two sidecars per run: with the probe, and with the "
                    "Reverb address alone. The sync scenarios ran beside the healthy runs "
                    "below.\n\n" + detection.render(detection.summarize(results)) + "\n"
                    + f"\nseed_hang starts that fed the workers (the race went the healthy way, "
                    f"agents/seed_hang.py), not counted above: "
                    f"{sum(1 for r in results if r.get('fed'))}\n")
    sections.append(
        "## False alarms on healthy runs (10 minutes, sync and distributed side by side)\n\n"
        + "\n".join(f"- {mode}: warning/critical findings seen: "
                    f"{', '.join(kinds) or 'none'}; incidents logged (non-info): "
                    f"{', '.join(healthy.get('incidents', {}).get(mode, [])) or 'none'}"
                    for mode, kinds in healthy.get("false_alarms", {}).items()) + "\n")
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
