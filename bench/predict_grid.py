"""The prediction grid: the budget model against real runs, cell by cell, fixes included.

Each cell is one configuration (layout, workers, batch, samples per insert, error_buffer,
min_size, dataset shape, item size). For each run the cell's workload
(harness/loop_workload.py: a real Reverb server and Acme's dataset shape in one process)
starts, and a sidecar (build_sidecar, polling every 0.5 s) is attached from the start line,
before the first insert. The truth is the workload's own: the learner inside one next() for
8 s. Runs alternate between two schedules: the machine's CPUs, and the workload pinned to
one CPU (`taskset -c 0`: a learner in a one-core container). A race at warm-up needs the
loop's `can_sample` check to read credit the table worker has not dealt yet, and how often
it does depends on the schedule far more than on the configuration; a configuration that
hangs under either is one that can hang. Recorded per run: the schedule, the outcome, when
the hang began, the sidecar's verdict and when it first said it.

A cell the model calls `safe` agrees when no run hangs, `will_hang` when every run hangs,
`can_hang` when at least one of up to `CAN_HANG_RUNS` runs hangs (a race: the runs stop at
the first hang). Every fix the model proves for a cell is then applied and run once on one
CPU, the schedule where races show: a fix holds when that run does not hang.

    python -m bench.predict_grid --results bench/RESULTS.md      # make bench-grid
    python -m bench.predict_grid --cells 3 --runs 1              # a quick look
    python -m bench.predict_grid --buffer-fixes --results bench/RESULTS.md

`--buffer-fixes` runs no cell: it runs each error_buffer fix the model proves, the value
above it and the next hundred, on one CPU (`make bench-grid-fixes`). The model calls every
value from the one it prints safe (a user rounds it up); those runs are what say so.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.results_md import write_sections
from harness.procs import PYTHON, ROOT, Proc
from replaywatch import config as cfg
from replaywatch.diagnosis import budget, budget_fixes
from replaywatch.wiring import build_sidecar

HEADING = "## Prediction grid"
# Not "## Prediction grid..." : replace_sections matches a heading by its start.
SHAPES_HEADING = "## Shapes not our own: the prediction grid"
SHAPES_JSON = Path(__file__).resolve().parent / "predict_shapes_cells.json"
CAN_HANG_RUNS = 8  # a race may need several runs to be seen
CELLS_JSON = ROOT / "bench" / "predict_grid_cells.json"


@dataclasses.dataclass(frozen=True)
class Cell:
    layout: str
    workers: int
    batch_size: int
    spi: float
    error_buffer: float
    min_size: int = 1000
    lag: int | None = None
    shape: str = "per-worker"  # or "repeat" (Acme at the seed's commit)
    item: str = "small"  # or "frames" (84x84x9 uint8)
    # or "seed": the seed's own loop, run long (SEED_LOOP); "tf-agents": TF-Agents' own DQN
    # job (TF_AGENTS_EXAMPLE), a sync-ratio loop on its after-interleave pipeline
    loop: str = "plain"
    # Shapes not our own (bench/predict_shapes_cells.json): a sync loop's gate, the pipeline,
    # the actors' bound by items ahead of what was consumed.
    gate: str = "can-sample"  # sync only: or "schedule"
    pipeline: str = "per-worker"  # or "after-interleave" (TF-Agents' as_dataset)
    ahead: int | None = None  # async-lag: max_items_ahead instead of lag
    inserts_per_step: float | None = None  # schedule: default batch / spi
    first_step_at: int | None = None  # schedule: default min_size
    cycle_length: int | None = None  # after-interleave: default min(batch, 32)

    @property
    def name(self) -> str:
        lag = f" L{self.lag}" if self.lag else f" ahead{self.ahead}" if self.ahead else ""
        extra = "".join(f" {x}" for x in (self.shape, self.item)
                        if x not in ("per-worker", "small"))
        extra += " seed-loop" if self.loop == "seed" else ""
        extra += " tf-agents-dqn" if self.loop == "tf-agents" else ""
        if self.layout == budget.SYNC and self.gate != "can-sample":
            extra += f" {self.gate}"
        extra += "" if self.inserts_per_step is None else f" K{self.inserts_per_step:g}"
        extra += "" if self.first_step_at is None else f" first{self.first_step_at}"
        extra += " tf-agents" if self.pipeline == "after-interleave" else ""
        extra += "" if self.cycle_length is None else f" C{self.cycle_length}"
        return (f"{self.layout}{lag} P{self.workers} B{self.batch_size} spi{self.spi:g} "
                f"e{self.error_buffer:g} min{self.min_size}{extra}")

    def model(self) -> tuple[budget.Limiter, budget.Dataset, budget.JobLayout]:
        lim = budget.Limiter.ratio(self.spi, self.min_size, self.error_buffer,
                                   insert_blocking=self.layout != budget.SYNC)
        ds = budget.Dataset(self.workers, self.batch_size,
                            iterators_per_worker=3 if self.shape == "repeat" else 1,
                            item_bytes=84 * 84 * 9 if self.item == "frames" else 16,
                            shape=self.pipeline, cycle_length=self.cycle_length)
        # The harness's `sync` loop steps while can_sample (Acme's LocalLayout) unless the
        # cell says it steps on a schedule; either way the harness declares it.
        gate = ({"can-sample": budget.CAN_SAMPLE, "schedule": budget.SCHEDULE}[self.gate]
                if self.layout == budget.SYNC else None)
        return lim, ds, budget.JobLayout(self.layout, self.lag, gate, self.inserts_per_step,
                                      self.first_step, self.ahead)

    @property
    def first_step(self) -> int | None:
        """TF-Agents' job says its first step comes at its initial collect less the two items
        its observer trails by (examples/tf_agents_dqn.py: min_size + 4 steps by default)."""
        if self.first_step_at is not None or self.loop != "tf-agents":
            return self.first_step_at
        return self.min_size + 2

    def predict(self) -> budget.Budget:
        return budget.predict(*self.model())

    def fixed(self, fix: budget_fixes.Fix) -> Cell:
        """The cell with the fix applied, both knobs of a pair."""
        changes: dict[str, Any] = {}
        part: budget_fixes.Fix | None = fix
        while part is not None:
            key = {"num_parallel_calls": "workers", "max_policy_lag": "lag",
                   "max_items_ahead": "ahead"}.get(part.knob, part.knob)
            changes[key] = part.value
            part = part.together
        return dataclasses.replace(self, **changes)

    def tf_agents_args(self) -> list[str]:
        """The cell as examples/tf_agents_dqn.py's flags: its loop collects K steps (one item
        each) and trains one; a first step at N items is an initial collect of N + 2 steps
        (its observer's items trail its steps by about two, and it says so to its probe)."""
        out = ["--batch-size", str(self.batch_size), "--num-parallel-calls", str(self.workers),
               "--samples-per-insert", f"{self.spi:g}", "--min-size", str(self.min_size),
               "--error-buffer", f"{self.error_buffer:g}",
               "--collect-steps", f"{self.inserts_per_step or self.batch_size / self.spi:g}"]
        if self.first_step_at is not None:
            out += ["--initial-collect", str(self.first_step_at + 2)]
        if self.cycle_length is not None:
            out += ["--max-cycle-length", str(self.cycle_length)]
        return out

    def args(self) -> list[str]:
        out = ["--layout", self.layout, "--workers", str(self.workers), "--batch-size",
               str(self.batch_size), "--samples-per-insert", f"{self.spi:g}",
               "--error-buffer", f"{self.error_buffer:g}", "--min-size", str(self.min_size),
               "--shape", self.shape, "--item", self.item]
        out += ["--max-policy-lag", str(self.lag)] if self.lag else []
        out += ["--max-items-ahead", str(self.ahead)] if self.ahead is not None else []
        if self.layout == budget.SYNC:
            out += ["--gate", self.gate]
        if self.pipeline != "per-worker":
            out += ["--pipeline", self.pipeline]
        if self.inserts_per_step is not None:
            out += ["--inserts-per-step", f"{self.inserts_per_step:g}"]
        if self.first_step is not None:
            out += ["--first-step-at", str(self.first_step)]
        if self.cycle_length is not None:
            out += ["--cycle-length", str(self.cycle_length)]
        return out


# The seed's hang came "after 10K steps sometimes", in steady state, where a warm-up run of
# seconds cannot see it: its cell runs the seed's own loop (Acme's transition adder with 5
# items in flight, the `_batch_size_upper_bounds` gate of its commit, a learner step that
# takes time) for 8 minutes a run, pinned to one CPU, and at most 6 runs (by hand it hung
# in 1 of 4).
SEED_LOOP = ["--adder-in-flight", "5", "--acme-bound", "--learner-step-s", "0.005"]
SEED_LOOP_TRAIN_S = 480.0
SEED_LOOP_RUNS = 6


# TF-Agents' own DQN job (examples/tf_agents_dqn.py: its replay buffer, observer, driver and
# as_dataset) for the cells whose `loop` is "tf-agents"; a run trains this many steps.
TF_AGENTS_EXAMPLE = "examples/tf_agents_dqn.py"
TF_AGENTS_TRAIN_STEPS = 600


def default_cells() -> list[Cell]:
    """Around each configuration's boundaries: below a batch, inside the band, above what
    the iterators can strand (bench/predict_grid_cells.json is this list, for the tests)."""
    return [Cell(**c) for c in json.loads(CELLS_JSON.read_text())]


def shape_cells() -> list[Cell]:
    """Shapes not our own: scheduled loops, TF-Agents' pipeline, actors paced ahead of what
    was consumed, each around its boundaries."""
    return [Cell(**c) for c in json.loads(SHAPES_JSON.read_text())]


def one_cpu_prefix() -> list[str]:
    """`taskset -c 0` where the machine has more than one CPU to take away (and taskset)."""
    if (os.cpu_count() or 1) > 1 and shutil.which("taskset"):
        return ["taskset", "-c", "0"]
    return []


def run_once(cell: Cell, workdir: Path, one_cpu: bool = False) -> dict[str, Any]:
    """One run of the workload with a sidecar attached from its start line; `one_cpu` pins
    the workload (not the sidecar) to one CPU."""
    log = workdir / "workload.log"
    seed = cell.loop == "seed"
    pin = one_cpu_prefix() if one_cpu or seed else []
    train_s = SEED_LOOP_TRAIN_S if seed else 5.0
    command = ([PYTHON, TF_AGENTS_EXAMPLE, *cell.tf_agents_args(), "--start-delay", "1.5",
                "--train-steps", str(TF_AGENTS_TRAIN_STEPS), "--hang-after", "8"]
               if cell.loop == "tf-agents" else
               [PYTHON, "harness/loop_workload.py", *cell.args(), *(SEED_LOOP if seed else []),
                "--start-delay", "1.5", "--train-s", f"{train_s:g}", "--hang-after", "8",
                "--timeout-s", f"{train_s + 120:g}"])
    proc = Proc([*pin, *command], stdout_path=log)
    try:
        start = proc.announce(timeout_s=90, match=lambda record: "reverb" in record)
        config = cfg.WatchConfig(
            targets=(cfg.parse_address(start["reverb"].replace("localhost", "127.0.0.1")),),
            probes=tuple(cfg.parse_probe(u) for u in (start["probe"], start.get("actor_probe"))
                         if u),
            poll=cfg.PollConfig(interval_s=0.5, timeout_s=0.4, history_s=120.0))
        live: str | None = None
        live_at: float | None = None
        with build_sidecar(config, incidents_path=":memory:") as sidecar:
            while proc.returncode is None:
                state = sidecar.poller.tick()
                verdict = live_verdict(state.findings)
                if verdict != budget.SAFE and live is None:
                    live, live_at = verdict, time.time()
                time.sleep(0.5)
        end = _last_json(log)
        return {**end, "live": live or budget.SAFE, "live_at": live_at,
                "cpus": "one" if pin else "all"}
    finally:
        proc.kill()


def live_verdict(findings: Any) -> str:
    """The sidecar's prediction: batch_exceeds_headroom is will_hang, deadlock_risk says its
    own verdict, neither is safe."""
    for f in findings:
        if f.kind == "batch_exceeds_headroom":
            return budget.WILL_HANG
        if f.kind == "deadlock_risk":
            return str(f.evidence.get("verdict", budget.CAN_HANG))
    return budget.SAFE


def _last_json(log: Path) -> dict[str, Any]:
    for line in reversed(log.read_text(errors="replace").splitlines()):
        if line.startswith('{"outcome"'):
            return json.JSONDecoder().raw_decode(line)[0]
    return {"outcome": "error", "log": log.read_text(errors="replace")[-500:]}


def run_cell(cell: Cell, runs: int, workdir: Path, fixes: bool = True) -> dict[str, Any]:
    predicted = cell.predict()
    limit = ((SEED_LOOP_RUNS if cell.loop == "seed" else CAN_HANG_RUNS)
             if predicted.verdict == budget.CAN_HANG else runs)
    results: list[dict[str, Any]] = []
    while len(results) < max(runs, 1):
        results.append(run_once(cell, workdir, one_cpu=len(results) % 2 == 1))
    while (predicted.verdict == budget.CAN_HANG and len(results) < limit
           and not any(r["outcome"] == "hang" for r in results)):
        results.append(run_once(cell, workdir, one_cpu=len(results) % 2 == 1))
    row: dict[str, Any] = {"cell": cell.name, "spec": dataclasses.asdict(cell),
                           "predicted": predicted.verdict, "released": predicted.released,
                           "strandable": predicted.strandable, "runs": results}
    hangs = sum(r["outcome"] == "hang" for r in results)
    row["hangs"] = hangs
    row["agrees"] = agrees(predicted.verdict, hangs, len(results))
    row["live_equals_offline"] = all(r["live"] == predicted.verdict for r in results)
    row["predicted_before_hang"] = all(
        r["outcome"] != "hang" or (r["live_at"] is not None and r["live_at"] < r["hang_since"])
        for r in results)
    row["fixes"] = []
    if fixes:
        for fix in budget_fixes.fixes(*cell.model()):
            fixed = cell.fixed(fix)
            run = run_once(fixed, workdir, one_cpu=True)
            row["fixes"].append({"fix": fix.text(), "cell": fixed.name,
                                 "model": fixed.predict().verdict, "outcome": run["outcome"],
                                 "held": run["outcome"] == "ran"})
    return row


BUFFER_HEADING = "## Error-buffer fixes, and the values above them"


def buffer_values(value: int) -> list[int]:
    """The printed error_buffer, the one above it (where the granularity is 1, the model's
    thinnest margin) and the next hundred (what a user rounds it to)."""
    return sorted({value, value + 1, (value // 100 + 1) * 100})


# Configurations whose only fix is a pair (one worker together with an error_buffer): thin
# answers need one worker, and on Acme's repeat-interleave that worker still has unread
# iterators for the warm-up burst to strand in. No grid cell needs a pair; these are where
# the model prints one. The seed-loop one runs its pair for 480 s, on the seed's own loop.
PAIR_CELLS = (
    Cell("sync", 12, 256, 128.0, 2560.0, 2000, shape="repeat", item="frames"),
    Cell("sync", 4, 32, 64.0, 100.0, 1000, shape="repeat", item="frames"),
    Cell("sync", 4, 64, 16.0, 200.0, 1000, shape="repeat", item="frames"),
    Cell("sync", 12, 256, 128.0, 2560.0, 2000, shape="repeat", item="frames", loop="seed"),
)


def _buffer_fix(fix: budget_fixes.Fix, value: int) -> budget_fixes.Fix:
    """`fix` with its error_buffer (itself, or the second knob of a pair) at `value`."""
    if fix.together is not None:
        return dataclasses.replace(fix, together=dataclasses.replace(fix.together, value=value))
    return dataclasses.replace(fix, value=value)


def run_buffer_fixes(cells: list[Cell], runs: int, workdir: Path) -> list[dict[str, Any]]:
    """Every error_buffer fix the model proves for `cells` (alone, or the second knob of a
    pair), at each of buffer_values, `runs` times on one CPU; a fixed configuration two cells
    share is run once. A seed-loop cell runs 480 s: its printed fix only, once."""
    rows: list[dict[str, Any]] = []
    seen: set[str] = set()
    for cell in cells:
        seed = cell.loop == "seed"
        for fix in budget_fixes.fixes(*cell.model()):
            buffer = fix.together if fix.together is not None else fix
            if buffer.knob != "error_buffer":
                continue
            for value in [buffer.value] if seed else buffer_values(buffer.value):
                fixed = cell.fixed(_buffer_fix(fix, value))
                if fixed.name in seen:
                    continue
                seen.add(fixed.name)
                outcomes = [run_once(fixed, workdir, one_cpu=True)["outcome"]
                            for _ in range(1 if seed else runs)]
                rows.append({"cell": cell.name, "printed": _fix_values(fix), "value":
                             _fix_values(_buffer_fix(fix, value)),
                             "model": fixed.predict().verdict, "outcomes": outcomes})
                print(f"{fixed.name}: model {rows[-1]['model']}, {outcomes}", flush=True)
    return rows


def _fix_values(fix: budget_fixes.Fix) -> str:
    """error_buffer=30, or num_parallel_calls=1 + error_buffer=3326 for a pair."""
    parts = [f"{fix.knob}={fix.value}"]
    if fix.together is not None:
        parts.append(f"{fix.together.knob}={fix.together.value}")
    return " + ".join(parts)


def _section_head(heading: str, configurations: int, runs: int, took_s: float,
                  what: str) -> list[str]:
    """A fix check's heading (what ran, how long, when) and the paragraph saying what."""
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    return [f"{heading} ({configurations} configurations, {runs} runs: {took_s / 60:.1f} min "
            f"on {when})", "", what, ""]


def render_buffer_fixes(rows: list[dict[str, Any]], took_s: float) -> str:
    held = sum(o == "ran" for r in rows for o in r["outcomes"])
    total = sum(len(r["outcomes"]) for r in rows)
    lines = _section_head(
        BUFFER_HEADING, len(rows), total, took_s,
        "`python -m bench.predict_grid --buffer-fixes` (`make bench-grid-fixes`). The "
        "error_buffer a finding prints is the least from which the model calls every value "
        "safe, since a user rounds it up: the granularity is a gcd with error_buffer, so a "
        "value can be safe and the one above it not (the seed's numbers: 39,892 safe with "
        "g = 4, 39,893 not with g = 1; the fix is 39,900). Each fix runs at its value, the "
        "one above and the next hundred, pinned to one CPU, where the grid's races show; so does "
        "each pair the model prints where no single knob suffices (`PAIR_CELLS`: one worker "
        "together with an error_buffer, Acme's repeat-interleave and frames), the seed-loop one "
        "once, 480 s on the seed's own loop.")
    lines += [
        f"- runs that did not hang: **{held}/{total}**",
        "",
        "| cell | printed | run at | model | runs | hung |",
        "| --- | ---: | ---: | --- | ---: | ---: |",
    ]
    for r in rows:
        hung = sum(o != "ran" for o in r["outcomes"])
        lines.append(f"| {r['cell']} | {r['printed']} | {r['value']} | {r['model']} | "
                     f"{len(r['outcomes'])} | {'**' + str(hung) + '**' if hung else 0} |")
    return "\n".join(lines) + "\n"


WARNING_HEADING = "## Smaller batches a batch fix warns of"


def run_batch_warnings(cells: list[Cell], runs: int, workdir: Path) -> list[dict[str, Any]]:
    """For each cell whose batch_size fix warns that a smaller batch can hang, the largest
    such batch, run as a grid cell is (up to CAN_HANG_RUNS runs for a race)."""
    rows: list[dict[str, Any]] = []
    for cell in cells:
        if cell.loop == "seed":
            continue
        for fix in budget_fixes.fixes(*cell.model()):
            if fix.knob != "batch_size" or "not always safer" not in fix.cost:
                continue
            lim, ds, layout = cell.model()
            warned = budget_fixes.unsafe_batches_below(lim, ds, layout, fix.value)[0]
            row = run_cell(dataclasses.replace(cell, batch_size=warned), runs, workdir,
                           fixes=False)
            rows.append({"cell": cell.name, "fix": f"batch_size={fix.value}",
                         "warned": warned, **{k: row[k] for k in (
                             "predicted", "hangs", "agrees")}, "runs": len(row["runs"])})
            print(f"{cell.name}: batch {warned} (fix {fix.value}): model {row['predicted']}, "
                  f"{row['hangs']}/{len(row['runs'])} hung", flush=True)
    return rows


def render_batch_warnings(rows: list[dict[str, Any]], took_s: float) -> str:
    seen = sum(r["hangs"] > 0 for r in rows)
    lines = _section_head(
        WARNING_HEADING, len(rows), sum(r["runs"] for r in rows), took_s,
        "`python -m bench.predict_grid --batch-warnings` (`make bench-grid-fixes`). A "
        "batch_size fix is the largest batch below the current one that the model calls "
        "safe; a smaller one is not always safer (the granularity, a gcd with the batch, "
        "and which side of error_buffer and spi the batch lies), so the fix says which "
        "smaller sizes can hang. The largest of them is run here as a grid cell is: "
        f"`can_hang` agrees when one of up to {CAN_HANG_RUNS} runs hangs, runs alternating "
        "all CPUs and one.")
    lines += [
        f"- warned batch sizes seen to hang: **{seen}/{len(rows)}**",
        "",
        "| cell | fix | warned batch | model | runs | hangs | agrees |",
        "| --- | --- | ---: | --- | ---: | ---: | --- |",
    ]
    for r in rows:
        lines.append(f"| {r['cell']} | {r['fix']} | {r['warned']} | {r['predicted']} | "
                     f"{r['runs']} | {r['hangs']} | {'yes' if r['agrees'] else '**no**'} |")
    return "\n".join(lines) + "\n"


START_HEADING = "## First-step fixes on the grid's scheduled cells"


def run_first_step_fixes(cells: list[Cell], runs: int, workdir: Path) -> list[dict[str, Any]]:
    """Each `first_step_at` fix the model prints for a grid cell (a scheduled loop that
    starts training later has released more when it first asks), run `runs` times."""
    rows: list[dict[str, Any]] = []
    for cell in cells:
        if cell.loop == "seed":
            continue
        for fix in budget_fixes.fixes(*cell.model()):
            if fix.knob != "first_step_at":
                continue
            fixed = cell.fixed(fix)
            outcomes = [run_once(fixed, workdir, one_cpu=i % 2 == 1)["outcome"]
                        for i in range(runs)]
            rows.append({"cell": cell.name, "fix": f"first_step_at={fix.value}",
                         "model": fixed.predict().verdict, "outcomes": outcomes,
                         "held": all(o == "ran" for o in outcomes)})
            print(f"{cell.name}: {rows[-1]['fix']}: {outcomes}", flush=True)
    return rows


def render_first_step_fixes(rows: list[dict[str, Any]], took_s: float) -> str:
    lines = _section_head(
        START_HEADING, len(rows), sum(len(r["outcomes"]) for r in rows), took_s,
        "`python -m bench.predict_grid --first-step-fixes` (`make bench-grid-fixes`). A "
        "scheduled loop (the harness's `sync-ratio`: Acme's older `Agent`) that first steps "
        "once the table holds more items has released error_buffer + spi per item past "
        "min_size when it first asks; the least such start the model calls safe, run on "
        "all CPUs and on one.")
    lines += [f"- fixes that held in every run: **{sum(r['held'] for r in rows)}/{len(rows)}**",
              "", "| cell | fix | model | runs |", "| --- | --- | --- | --- |"]
    lines += [f"| {r['cell']} | {r['fix']} | {r['model']} | {', '.join(r['outcomes'])} |"
              for r in rows]
    return "\n".join(lines) + "\n"


def agrees(verdict: str, hangs: int, runs: int) -> bool:
    if verdict == budget.SAFE:
        return hangs == 0
    if verdict == budget.WILL_HANG:
        return hangs == runs
    return hangs > 0


def predict_seconds(runs: int = 5) -> float:
    """Median wall time of `replaywatch predict` on the seed's numbers, each in a fresh
    process (interpreter start and imports included): what a user's script waits."""
    argv = [PYTHON, "-m", "replaywatch", "predict", "--samples-per-insert", "128",
            "--min-size-to-sample", "2000", "--error-buffer", "25600", "--batch-size", "256",
            "--num-parallel-calls", "12", "--layout", "sync", "--json"]
    took = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(argv, cwd=ROOT, capture_output=True, timeout=60, check=True)
        took.append(time.perf_counter() - t0)
    return sorted(took)[len(took) // 2]


def family(spec: dict[str, Any]) -> str:
    """The shape family a cell belongs to, for a table of its own."""
    if spec.get("loop") == "tf-agents":
        return "TF-Agents' own DQN job (tf-agents 0.19.0): its observer, driver and as_dataset"
    if spec.get("pipeline") == "after-interleave":
        return "One batch after the interleave (TF-Agents' as_dataset), a scheduled loop"
    if spec.get("gate") == "schedule":
        return "A loop that steps on a schedule, insert blocking disabled, per-worker batching"
    if spec.get("ahead") is not None:
        return "Actors paced by items ahead of what the learner consumed, and by the limiter"
    return "Acme's shapes and our harness"


def render_shapes(rows: list[dict[str, Any]], took_s: float) -> str:
    """The shapes grid: one summary and one table per family (`make bench-grid-shapes`)."""
    families: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        families.setdefault(family(r["spec"]), []).append(r)
    runs = sum(len(r["runs"]) for r in rows)
    fixes = sum(len(r["fixes"]) for r in rows)
    head = [f"{SHAPES_HEADING} ({len(rows)} cells, {runs} runs + {fixes} fix runs, "
            f"{took_s / 60:.1f} min, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})",
            "",
            "`make bench-grid-shapes` (bench/predict_shapes_cells.json): shapes the first grid "
            "did not have, each family judged on its own. Method as in the grid above; the "
            "harness's loop declares its gate to the probe (a test runs the undeclared one).",
            ""]
    parts = [render(rs, took_s, title=f"### {name}", intro=False)
             for name, rs in families.items()]
    return "\n".join(head) + "\n" + "\n".join(parts)


def render(rows: list[dict[str, Any]], took_s: float, predict_s: float | None = None,
           title: str | None = None, intro: bool = True) -> str:
    n = len(rows)
    agree = sum(r["agrees"] for r in rows)
    safe_hung = sum(1 for r in rows if r["predicted"] == budget.SAFE and r["hangs"])
    hung_runs = [(r, x) for r in rows for x in r["runs"] if x["outcome"] == "hang"]
    before = sum(1 for r, x in hung_runs if x["live_at"] is not None
                 and x["live_at"] < x["hang_since"])
    fixes = [f for r in rows for f in r["fixes"]]
    held = sum(f["held"] for f in fixes)
    live_eq = sum(r["live_equals_offline"] for r in rows)
    warned_never = sum(1 for r in rows if r["predicted"] != budget.SAFE and not r["hangs"])
    will_not_all = sum(1 for r in rows
                       if r["predicted"] == budget.WILL_HANG and 0 < r["hangs"] < len(r["runs"]))
    sure = [r for r in rows if r["predicted"] != budget.CAN_HANG]
    races = [r for r in rows if r["predicted"] == budget.CAN_HANG]
    lines = [
        title or f"{HEADING} ({n} cells, {sum(len(r['runs']) for r in rows)} runs + "
        f"{len(fixes)} fix runs, {took_s / 60:.1f} min, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})",
        "",
        *(["`make bench-grid` (bench/predict_grid.py). Truth in the workload's own process "
        "(harness/loop_workload.py): the learner inside one next() for 8 s. A sidecar polls "
        "every 0.5 s from the start line, 1.5 s before the first insert. Runs alternate "
        "between all the machine's CPUs and the workload pinned to one (`taskset -c 0`); "
        "fix runs are on one CPU. `can_hang` agrees "
        f"when one of up to {CAN_HANG_RUNS} runs hangs, `safe` when none does, `will_hang` "
        "when all do. Each fix the model proves is applied and run once. A `can_hang` cell is "
        "a race: whether a run hangs depends on how the released samples split across the "
        "iterators' requests and, for `sync`, on whether the loop's `can_sample(batch)` "
        "check runs while the warm-up burst is still undrawn.", ""] if intro else []),
        f"- agreement: **{agree}/{n}** cells ({100 * agree / max(n, 1):.0f}%): the `safe` and "
        f"`will_hang` cells {sum(r['agrees'] for r in sure)}/{len(sure)}, the `can_hang` cells "
        f"(races) seen to hang {sum(r['agrees'] for r in races)}/{len(races)}",
        f"- false predictions: **{safe_hung + warned_never + will_not_all}** (called safe and "
        f"hung: {safe_hung}; warned and never hung: {warned_never}; will_hang that did not "
        f"hang every run: {will_not_all})",
        f"- cells the model calls safe that hung: **{safe_hung}**",
        f"- hung runs predicted before the hang began: **{before}/{len(hung_runs)}**",
        f"- live verdict equal to `replaywatch predict`'s in every run: **{live_eq}/{n}** cells",
        f"- fixes that held: **{held}/{len(fixes)}**",
        *([f"- `replaywatch predict` on the seed's numbers: {predict_s:.2f} s (median of 5 "
           "fresh processes, interpreter start included; no server, no TensorFlow)"]
          if predict_s is not None else []),
        "",
        "| cell | model | released | strandable | runs | hangs (all CPUs + one CPU) | live | "
        "agrees | fixes held |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        live = sorted({x["live"] for x in r["runs"]})
        fx = r["fixes"]
        lines.append(
            f"| {r['cell']} | {r['predicted']} | {_n(r['released'])} | {_n(r['strandable'])} | "
            f"{len(r['runs'])} | {_hangs(r['runs'])} | {'/'.join(live)} | "
            f"{'yes' if r['agrees'] else '**no**'} | "
            f"{_held(fx)} |")
    bad = [f for f in fixes if not f["held"]]
    if bad:
        lines += ["", "Fixes that did not hold:", ""]
        lines += [f"- {f['cell']}: {f['fix']} -> {f['outcome']}" for f in bad]
    return "\n".join(lines) + "\n"


def _hangs(runs: list[dict[str, Any]]) -> str:
    """Hangs split by schedule; a run recorded before schedules alternated counts as all."""
    def n(cpus: str) -> int:
        return sum(1 for x in runs if x["outcome"] == "hang" and x.get("cpus", "all") == cpus)
    return f"{n('all') + n('one')} ({n('all')} + {n('one')})"


def _held(fixes: list[dict[str, Any]]) -> str:
    return f"{sum(f['held'] for f in fixes)}/{len(fixes)}" if fixes else "-"


def _n(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--cells", type=int, default=None, help="only the first N cells")
    p.add_argument("--only", default=None, help="only cells whose name contains this")
    p.add_argument("--no-fixes", action="store_true")
    p.add_argument("--results", type=Path, default=None, help="replace the section here")
    p.add_argument("--json", type=Path, default=None, help="write every row here")
    p.add_argument("--from-json", type=Path, default=None,
                   help="render the rows a run wrote with --json (no runs)")
    p.add_argument("--resume", type=Path, default=None,
                   help="keep the rows a stopped run wrote with --json; run the other cells")
    p.add_argument("--took-min", type=float, default=None,
                   help="with --from-json: how long that run took, for the heading")
    p.add_argument("--buffer-fixes", action="store_true",
                   help="run only the error_buffer fixes, at their value and above it")
    p.add_argument("--batch-warnings", action="store_true",
                   help="run only the smaller batches the batch_size fixes warn of")
    p.add_argument("--first-step-fixes", action="store_true",
                   help="run only the first_step_at fixes of the grid's cells")
    p.add_argument("--shapes", action="store_true",
                   help="the cells of bench/predict_shapes_cells.json, a table per family")
    args = p.parse_args(argv)
    if args.buffer_fixes:
        return _buffer_fixes_main(args)
    if args.batch_warnings:
        return _batch_warnings_main(args)
    if args.first_step_fixes:
        return _fix_checks_main(args, default_cells(), run_first_step_fixes,
                                render_first_step_fixes)
    if args.from_json:
        rows = json.loads(args.from_json.read_text())
        text = (render_shapes(rows, 60 * (args.took_min or 0)) if args.shapes
                else render(rows, 60 * (args.took_min or 0), predict_seconds()))
        print(text)
        if args.results:
            write_sections(args.results, [text])
        return 0
    cells = (shape_cells() if args.shapes else default_cells())
    if args.only:
        cells = [c for c in cells if args.only in c.name]
    cells = cells[: args.cells] if args.cells else cells
    started = time.time()
    rows = json.loads(args.resume.read_text()) if args.resume else []
    done = {r["cell"] for r in rows}
    with tempfile.TemporaryDirectory() as tmp:
        for i, cell in enumerate(cells, 1):
            if cell.name in done:
                continue
            row = run_cell(cell, args.runs, Path(tmp), fixes=not args.no_fixes)
            rows.append(row)
            print(f"[{i}/{len(cells)}] {row['cell']}: model {row['predicted']}, "
                  f"{row['hangs']}/{len(row['runs'])} hung, live "
                  f"{sorted({x['live'] for x in row['runs']})}, agrees {row['agrees']}, "
                  f"fixes {[(f['fix'].split(' ')[0], f['outcome']) for f in row['fixes']]}",
                  flush=True)
            if args.json:
                args.json.write_text(json.dumps(rows, indent=1))
    text = (render_shapes(rows, time.time() - started) if args.shapes
            else render(rows, time.time() - started, predict_seconds()))
    print(text)
    if args.results:
        write_sections(args.results, [text])
    return 0


def _buffer_fixes_main(args: argparse.Namespace) -> int:
    return _fix_checks_main(args, (*default_cells(), *PAIR_CELLS), run_buffer_fixes,
                            render_buffer_fixes)


def _batch_warnings_main(args: argparse.Namespace) -> int:
    return _fix_checks_main(args, default_cells(), run_batch_warnings, render_batch_warnings)


def _fix_checks_main(args: argparse.Namespace, cells: Sequence[Cell],
                     run: Callable[[list[Cell], int, Path], list[dict[str, Any]]],
                     render: Callable[[list[dict[str, Any]], float], str]) -> int:
    """A check of what the fixes say beyond their value: runs (or --from-json rows), its
    section printed, and written with --json and --results."""
    if args.from_json:
        rows, took_s = json.loads(args.from_json.read_text()), 60 * (args.took_min or 0)
    else:
        chosen = [c for c in cells if not args.only or args.only in c.name]
        started = time.time()
        with tempfile.TemporaryDirectory() as tmp:
            rows = run(chosen, max(args.runs, 1), Path(tmp))
        took_s = time.time() - started
    text = render(rows, took_s)
    print(text)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    if args.results:
        write_sections(args.results, [text])
    return 0


if __name__ == "__main__":
    sys.exit(main())
