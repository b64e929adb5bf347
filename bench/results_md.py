"""The detection and false-alarm sections of bench/RESULTS.md, and replacing them in place.

`python -m bench.detection --results bench/RESULTS.md` and `make bench` (bench/run_all.py)
write them; every other section of the file is left as it was.
"""

from __future__ import annotations

import re
import statistics
import time
from pathlib import Path
from typing import Any

from bench import healthy
from bench.watched import INTERVAL_S, STALL_WINDOW_S

DETECTION_HEADING = "## Detection latency"
HEALTHY_HEADING = "## False alarms on healthy runs"


def detection_section(results: list[dict[str, Any]], runs: int, took_s: float) -> str:
    fed = sum(1 for r in results if r.get("fed"))
    return (f"{DETECTION_HEADING} ({runs} runs per scenario, {took_s / 60:.1f} min, "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})\n\n"
            "Onset from the trainer itself (the probe's `blocked_since` or last step, the "
            "actor's exit line; the first poll for the configuration finding and for warm-up); "
            "detection = first time the finding shows in `/api/v1/findings`. Two sidecars per "
            "run: with the learner's probe and every actor probe (`actor_probes` of the start "
            "line), and with the Reverb address alone. One scenario at a time, after the "
            "healthy runs.\n\n" + render(summarize(results)) + "\n"
            f"\nseed_hang starts that fed the workers (the race went the healthy way, "
            f"agents/seed_hang.py), not counted above: {fed}\n")


def healthy_section(results: list[dict[str, Any]], seconds: float, first_step_s: float,
                    took_s: float) -> str:
    return (f"{HEALTHY_HEADING} ({', '.join(r['run'] for r in results)}, three side by side; "
            f"{seconds:g} s each, first-step runs {first_step_s:g} s; {took_s / 60:.1f} min, "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})\n\n"
            "Watched from the start line by a sidecar with the learner's probe and every actor "
            "probe, and by one with the Reverb address alone (bench/healthy.py says what each "
            "run is). Every warning or critical finding is a false alarm; info kinds are listed "
            "apart (`learner_starting` is the start-up grace at work). \"first step s\": from "
            "the probe's first batch to its first step.\n\n" + healthy.render(results) + "\n")


def write_sections(path: Path, sections: list[str]) -> None:
    """Replaces (or appends) each section in the results file at `path`; a file not there yet
    is started with them, so a run pointed at a new file does not lose its table."""
    text = path.read_text() if path.exists() else ""
    path.write_text(replace_sections(text, sections))


def replace_sections(text: str, sections: list[str]) -> str:
    """Each section replaces the one whose heading starts like its own first line (up to
    the next `## ` heading), or is appended; the rest of the file is left as it was."""
    for section in sections:
        heading = section.split("(", 1)[0].split("\n", 1)[0].strip()
        pattern = re.compile(rf"^{re.escape(heading)}.*?(?=^## |\Z)", re.MULTILINE | re.DOTALL)
        body = section.rstrip("\n") + "\n\n"
        text, n = pattern.subn(lambda _, body=body: body, text, count=1)
        if not n:
            text = (text.rstrip("\n") + "\n\n" if text.strip() else "") + body
    return text.rstrip("\n") + "\n"


def summarize(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Latency rows per scenario, sidecar and finding; starts without the fault (`fed`)
    are not runs of it. (Keyed by scenario too: two scenarios expecting the same kind on
    the same sidecar, seed_hang's and actor_exit's Reverb-only `sample_blocked`, were one
    row under the first scenario's name before.)"""
    rows = []
    results = [r for r in results if not r.get("fed")]
    keys = sorted({(r["scenario"], k) for r in results for k in r
                   if ":" in k and not k.endswith("alarms")}, key=lambda sk: (sk[1], sk[0]))
    for scenario, key in keys:
        runs = [r for r in results if r["scenario"] == scenario and key in r]
        latencies = [r[key] for r in runs if r[key] is not None]
        side, finding = key.split(":")
        rows.append({
            "scenario": scenario, "sidecar": side, "finding": finding, "runs": len(runs),
            "detected": len(latencies),
            "p50_s": statistics.median(latencies) if latencies else None,
            "max_s": max(latencies) if latencies else None,
            "false_alarms": sorted({a for r in runs for a in r.get(f"{side}:false_alarms", [])}),
        })
    return rows


def render(rows: list[dict[str, Any]]) -> str:
    lines = [f"poll interval {INTERVAL_S:g} s, stall window {STALL_WINDOW_S:g} s "
             f"(goal: within {STALL_WINDOW_S + 2 * INTERVAL_S:g} s)",
             "| scenario | sidecar | finding | detected | p50 s | max s | false alarms |",
             "| --- | --- | --- | ---: | ---: | ---: | --- |"]
    for r in rows:
        p50 = "-" if r["p50_s"] is None else f"{r['p50_s']:.1f}"
        mx = "-" if r["max_s"] is None else f"{r['max_s']:.1f}"
        lines.append(f"| {r['scenario']} | {r['sidecar']} | `{r['finding']}` | "
                     f"{r['detected']}/{r['runs']} | {p50} | {mx} | "
                     f"{', '.join(r['false_alarms']) or 'none'} |")
    return "\n".join(lines)
