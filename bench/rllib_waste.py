"""`make bench-rllib-waste`: experience an RLlib replay buffer evicts never sampled, as the
sidecar estimates it (diagnosis/rllib_waste.py: e^-s from the RLlibProbe's buffer counters)
against what the buffer really evicted, and the training_intensity the finding prints, run.

Real DQN jobs (harness/rllib_job.py in .venv-rllib: CartPole-v1, the learner in the driver, a
uniform buffer; two shapes of buffer, batch, fragment and EnvRunners) at several replay
ratios, each set by the training_intensity that rllib_ratio gives for it. The
job's buffer (`--count-samples`) records every env step drawn as a batch's start and counts,
at each eviction, the evicted steps never drawn: the truth the sidecar cannot read. Each
second the probe is read as the sidecar reads it (`--ray-results URL`) and the estimate made
over the newest stretch the buffer stayed full; the truth is the evictions over the same
stretch. Then the training_intensity the finding printed for the most wasteful cell is run.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.results_md import write_sections
from bench.rllib_venv import RLLIB_PY, bench_args
from harness.procs import Proc
from replaywatch.diagnosis import rllib_job as rj
from replaywatch.diagnosis import rllib_ratio as rr
from replaywatch.diagnosis.rllib_waste import buffer_waste, is_buffer_wasted
from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.diagnosis.waste import WASTED_SHARE
from replaywatch.ray_model import RaySnapshot
from replaywatch.sources.ray_results import ResultProbe

HEADING = "## An RLlib buffer's experience never sampled: estimated against counted"


@dataclasses.dataclass(frozen=True)
class Shape:
    """A job's buffer and batches: the estimate should not care which."""

    capacity: int
    batch: int
    fragment: int
    runners: int

    def config(self, intensity: float | None) -> rr.RllibReplay:
        return rr.RllibReplay(train_batch_size=self.batch, num_env_runners=self.runners,
                              rollout_fragment_length=self.fragment,
                              training_intensity=intensity)

    def __str__(self) -> str:
        return (f"{self.capacity:,} env steps, batch {self.batch}, fragment {self.fragment}, "
                f"{self.runners} EnvRunner(s)")


# (the shape, the replay ratios asked of it): the first is the one the fix is run on
CELLS = ((Shape(2_000, 32, 8, 1), (0.25, 0.5, 1.0)), (Shape(5_000, 64, 16, 2), (0.4,)))
WATCH_S = 90.0  # watched once the buffer is full, past learning's start


def run(where: Path, shape: Shape, intensity: float) -> dict[str, Any]:
    """One job at `intensity`: the estimate and the truth over the newest full stretch."""
    log = where / "job.log"
    job = Proc([str(RLLIB_PY), "harness/rllib_job.py", "--algo", "dqn", "--num-learners", "0",
                "--num-env-runners", str(shape.runners),
                "--rollout-fragment-length", str(shape.fragment),
                "--train-batch-size", str(shape.batch), "--learning-starts", "200",
                "--replay-capacity", str(shape.capacity), "--count-samples",
                "--training-intensity", f"{intensity:.6g}", "--min-steps-per-iteration", "200",
                "--num-cpus", "2", "--seconds", "600", "--temp-dir", str(where / "ray"),
                "--logdir", str(where / "log"), "--probe-listen", "127.0.0.1:0", "--no-rows"],
               stdout_path=log, env={"OMP_NUM_THREADS": "1"})
    try:
        url = job.announce(timeout_s=240, match=lambda r: r.get("event") == "rllib_job")[
            "rllib_probe"]
        reader, history = ResultProbe(url, timeout_s=2.0), []
        th = Thresholds()
        full_at, truth, said, found = None, [], None, None
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline and (full_at is None
                                               or time.monotonic() - full_at < WATCH_S):
            rows, _, _ = reader.read()
            live = reader.live
            if live is not None and live.env_steps_stored is not None:
                history.append(RaySnapshot("bench", live.observed_at, "job", None,
                                           results=rows[-1:], live=live))
                if full_at is None and live.env_steps_stored >= 0.9 * shape.capacity:
                    full_at = time.monotonic()
            time.sleep(1.0)
        if full_at is None:
            raise SystemExit(f"the buffer of {shape.capacity} steps did not fill in 400 s")
        now = history[-1].observed_at
        job_now = rj.read_job("bench", history, th, now)
        assert job_now is not None
        said = buffer_waste(job_now, th)
        found = is_buffer_wasted(job_now, th)
        truth = [json.loads(line) for line in log.read_text().splitlines()
                 if line.startswith("{") and '"evicted_steps"' in line]
    finally:
        job.kill()
    if said is None:
        raise SystemExit(f"no estimate at training_intensity {intensity}: {history[-1].live}")
    # The truth over the estimate's stretch: the iteration lines it spans (the lines carry
    # the buffer's added count, the stretch its first and last)
    first = said["env_steps_added"]
    last_added = truth[-1]["added"]
    inside = [t for t in truth if t["added"] >= last_added - first]
    a, b = inside[0], truth[-1]
    evicted = b["evicted_steps"] - a["evicted_steps"]
    never = b["evicted_never_drawn"] - a["evicted_never_drawn"]
    return {"intensity": intensity, "estimate": said, "evicted": evicted, "never": never,
            "true_share": never / evicted if evicted else None,
            "true_spi": (b["sampled"] - a["sampled"]) / max(1, b["added"] - a["added"]),
            "fix": None if found is None else found.evidence.get("training_intensity_fix"),
            "fix_words": None if found is None else found.fix}


def main() -> int:
    args = bench_args(__doc__)
    if args is None:
        return 2
    began, rows = time.monotonic(), []
    for shape, ratios in CELLS:
        for wanted in ratios:
            intensity = rr.intensity_for(shape.config(None), wanted)
            assert intensity is not None, wanted
            with tempfile.TemporaryDirectory(prefix="rwrw-", dir="/tmp") as tmp:
                rows.append({"shape": shape, "wanted": wanted,
                             **run(Path(tmp), shape, intensity)})
            print({k: v for k, v in rows[-1].items() if k != "fix_words"}, flush=True)
    worst = max(rows, key=lambda r: r["estimate"]["never_sampled_share"])
    fixed: dict[str, Any] | None = None
    if worst["fix"]:
        with tempfile.TemporaryDirectory(prefix="rwrw-", dir="/tmp") as tmp:
            fixed = {"shape": worst["shape"], **run(Path(tmp), worst["shape"], worst["fix"])}
        print({k: v for k, v in fixed.items() if k != "fix_words"}, flush=True)
    text = render(rows, worst, fixed, (time.monotonic() - began) / 60)
    print(text)
    if args.results:
        write_sections(args.results, [text])
    errors = [abs(r["estimate"]["never_sampled_share"] - r["true_share"]) for r in rows
              if r["true_share"] is not None]
    held = fixed is not None and fixed["true_share"] is not None and \
        fixed["true_share"] <= WASTED_SHARE
    return 0 if len(errors) == len(rows) and max(errors) <= 0.05 and held else 1


def render(rows: list[dict[str, Any]], worst: dict[str, Any], fixed: dict[str, Any] | None,
           minutes: float) -> str:
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    lines = [f"{HEADING} ({minutes:.1f} min, {stamp})", "",
             "`make bench-rllib-waste` (bench/rllib_waste.py): real DQN jobs (Ray 2.60, "
             "CartPole-v1, the learner in the driver, a uniform buffer; two shapes) at the "
             "training_intensity rllib_ratio gives for each replay ratio; the buffer counts, for "
             "the bench only, each evicted env step never drawn as a batch's start. The "
             "estimate (diagnosis/rllib_waste.py) is e^-s from the RLlibProbe's counters over "
             "the newest stretch the buffer stayed full; the count is over the same stretch.",
             "", "| buffer and batches | replay ratio asked | training_intensity | s measured "
             "(probe) | estimated never sampled | counted never sampled (of evicted) | error |",
             "| --- | ---: | ---: | ---: | ---: | --- | ---: |"]
    for r in [*rows, *([fixed] if fixed else [])]:
        e = r["estimate"]
        share = r["true_share"]
        asked = r.get("wanted")
        cell = f"fix of {worst['wanted']:g}" if asked is None else f"{asked:g}"
        lines.append(
            f"| {r['shape']} | {cell} "
            f"| {r['intensity']:.6g} | {e['sampled_per_added']:.3f} | "
            f"{e['never_sampled_share']:.1%} | "
            + ("-" if share is None else f"{share:.1%} ({r['never']:,} of {r['evicted']:,})")
            + " | " + ("-" if share is None else
                       f"{100 * (e['never_sampled_share'] - share):+.1f} pts") + " |")
    lines += ["", f"`wasted_experience` is said above {WASTED_SHARE:.0%}; at a replay ratio of "
              f"{worst['wanted']:g} it printed: {worst['fix_words']}"]
    if fixed:
        lines[-1] += (f" Run at that training_intensity, the buffer evicted "
                      f"{fixed['true_share']:.1%} never sampled"
                      f" (e^-s at its measured s: {math.exp(-fixed['true_spi']):.1%}).")
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
