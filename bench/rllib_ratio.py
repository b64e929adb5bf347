"""`make bench-rllib-ratio`: the replay ratio real RLlib DQN jobs train at, against
`replaywatch predict --rllib` (diagnosis/rllib_ratio.py), and the printed fix applied.

Each cell is a real DQN job on CartPole-v1 (harness/rllib_job.py in .venv-rllib, its learner
in the driver, a local Ray cluster of its own), run for a few iterations after its warm-up.
The measured ratio is counted from its result rows, not from RLlib's own ratio: env steps
the learner trained on over env steps its EnvRunners sampled, over the rows after the one
learning started in (that row also holds the warm-up's steps, which trained nothing). A
cell agrees when the measured ratio is within 10 % of the predicted one.

The two cells measured while the model was written (docs/research/rllib-observables.md:
`no_intensity_2_runners`, `intensity_4_1_runner`) are marked `seen`; the others it never saw.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.results_md import write_sections
from bench.rllib_venv import RLLIB_PY
from harness.procs import Proc
from replaywatch.diagnosis.rllib_ratio import RatioVerdict, RllibReplay, intensity_for, ratio

HEADING = "## RLlib replay ratio"
AGREE = 0.10


@dataclasses.dataclass(frozen=True)
class Cell:
    name: str
    batch: int
    runners: int
    fragment: int | None = None  # None: auto
    intensity: float | None = None
    seen: bool = False
    fix_of: str | None = None  # the cell whose printed fix this one applies

    def config(self) -> RllibReplay:
        return RllibReplay(train_batch_size=self.batch, num_env_runners=self.runners,
                           rollout_fragment_length=self.fragment,
                           training_intensity=self.intensity)


CELLS = (
    Cell("no_intensity_2_runners", 32, 2, seen=True),
    Cell("intensity_4_1_runner", 32, 1, intensity=4.0, seen=True),
    Cell("intensity_4_local_runner", 32, 0, intensity=4.0),
    Cell("fragment_4_2_runners", 64, 2, fragment=4),
    Cell("intensity_8_fragment_4_2_runners", 64, 2, fragment=4, intensity=8.0),
    Cell("no_intensity_3_runners_fragment_2", 16, 3, fragment=2),
)


def with_fixes(cells: tuple[Cell, ...]) -> tuple[Cell, ...]:
    """Each cell whose prediction is OFF gets a cell of its own with the printed fix."""
    out = list(cells)
    for c in cells:
        if c.intensity is None:
            continue
        fixed = intensity_for(c.config(), c.intensity)
        if ratio(c.config()).verdict is RatioVerdict.OFF and fixed is not None:
            out.append(dataclasses.replace(c, name=f"{c.name}_fixed", intensity=fixed,
                                           seen=False, fix_of=c.name))
    return tuple(out)


def run_cell(c: Cell, iterations: int, where: Path) -> dict[str, Any]:
    logdir = where / c.name
    args = [str(RLLIB_PY), "harness/rllib_job.py", "--algo", "dqn", "--num-learners", "0",
            "--num-env-runners", str(c.runners), "--train-batch-size", str(c.batch),
            "--learning-starts", "100", "--min-steps-per-iteration", "200",
            "--iterations", str(iterations), "--seconds", "0", "--uniform-replay",
            "--num-cpus", "4", "--temp-dir", str(where / "ray"), "--logdir", str(logdir)]
    if c.fragment is not None:
        args += ["--rollout-fragment-length", str(c.fragment)]
    if c.intensity is not None:
        args += ["--training-intensity", repr(c.intensity)]
    began = time.monotonic()
    proc = Proc(args, stdout_path=where / f"{c.name}.log")
    try:
        code = proc.popen.wait(timeout=900)
    finally:
        proc.kill()
    rows = [json.loads(line) for line in (logdir / "result.json").read_text().splitlines()
            if line.strip()] if (logdir / "result.json").exists() else []
    trained = sampled = 0.0
    started = False
    for row in rows:
        t = row.get("learners", {}).get("__all_modules__", {}).get("num_env_steps_trained")
        s = row.get("env_runners", {}).get("num_env_steps_sampled")
        if not t or not s or (isinstance(t, float) and math.isnan(t)):
            continue  # warm-up rows train nothing; a NaN is a row without a learner result
        if not started:
            # The row learning started in also sampled the warm-up's steps, which trained
            # nothing: the steady state is counted from the next row.
            started = True
            continue
        trained += float(t)
        sampled += float(s)
    predicted = ratio(c.config()).trained_per_sampled
    measured = trained / sampled if sampled else None
    return {"cell": c.name, "seen": c.seen, "fix_of": c.fix_of, "exit": code,
            "rows": len(rows), "trained": trained, "sampled": sampled,
            "predicted": predicted, "measured": measured,
            "agrees": measured is not None and abs(measured / predicted - 1) <= AGREE,
            "asked": c.intensity, "seconds": round(time.monotonic() - began, 1),
            "flags": " ".join(args[3:])}


def render(rows: list[dict[str, Any]]) -> str:
    out = ["| cell | seen | training_intensity | predicted | measured (trained / sampled) "
           "| agrees | fix of |", "| --- | --- | ---: | ---: | --- | --- | --- |"]
    for r in rows:
        measured = ("no rows" if r["measured"] is None else
                    f"{r['measured']:.2f} ({r['trained']:g} / {r['sampled']:g})")
        asked = "-" if r["asked"] is None else f"{r['asked']:g}"
        out.append(f"| {r['cell']} | {'yes' if r['seen'] else 'no'} | {asked} | "
                   f"{r['predicted']:g} | {measured} | {'yes' if r['agrees'] else 'NO'} | "
                   f"{r['fix_of'] or '-'} |")
    return "\n".join(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cells", default="", help="comma-separated names (default: all)")
    p.add_argument("--iterations", type=int, default=5)
    p.add_argument("--results", type=Path, default=None)
    args = p.parse_args()
    if not RLLIB_PY.exists():
        print("no .venv-rllib (make rllib-venv): the RLlib bench cannot run")
        return 2
    cells = with_fixes(CELLS)
    if args.cells:
        wanted = set(args.cells.split(","))
        cells = tuple(c for c in cells if c.name in wanted)
    began = time.monotonic()
    rows = []
    with tempfile.TemporaryDirectory(prefix="rwrl-", dir="/tmp") as tmp:
        for c in cells:
            rows.append(run_cell(c, args.iterations, Path(tmp)))
            print(json.dumps(rows[-1]), flush=True)
    text = (f"{HEADING} ({sum(r['agrees'] for r in rows)} of {len(rows)} cells agree, "
            f"{(time.monotonic() - began) / 60:.1f} min, "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})\n\n"
            "`make bench-rllib-ratio` (bench/rllib_ratio.py): real DQN jobs (Ray 2.60, torch on "
            "the CPU, CartPole-v1, learner in the driver, uniform replay, learning starts at "
            f"100, {args.iterations} iterations of at least 200 env steps); measured = env steps "
            "trained over env steps sampled in the result rows after the one learning started "
            "in (it also sampled the warm-up, which trained nothing); "
            f"agrees within {AGREE:.0%} of `replaywatch predict --rllib`. A `_fixed` cell runs "
            "the training_intensity that predict printed for the cell it names.\n\n"
            + render(rows) + "\n")
    print(text)
    if args.results:
        write_sections(args.results, [text])
    return 0 if all(r["agrees"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
