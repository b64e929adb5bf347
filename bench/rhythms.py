"""make bench-rhythms: jobs of every rhythm, healthy for 10 minutes with nothing paged, and
their hangs named within the window their own rhythm sets.

Every cell is one real job (harness/loop_workload.py: a Reverb server, a tf.data pipeline
shaped like Acme's, a learner whose step takes `step_s`, actors inserting as fast as the
limiter lets them) watched from its start line by three sidecars in one process, ticked once
a second: Reverb alone, with the learner's trainer probe, and with every probe. Families (a
table each in bench/RESULTS.md):

    step       asynchronous, prefetch(8) after four batching workers: steps 0.05 s to 60 s
    prefetch   asynchronous, a 12 s step, one worker: prefetch 0, 2, 8
    actors     asynchronous, a 1 s step, prefetch(2): 1, 16 and 64 actor threads
    sync       the synchronous loop (insert blocking off, the can-sample gate): 0.05 to 12 s
    hang       the learner hung outside next() (steps 12, 30, 60 s), or every actor (1 s)

A healthy cell passes with no warning or critical finding on any sidecar. A hang cell
passes when each sidecar names a right kind within the window its finding states plus two
polls of the onset (the learner's last batch, or, for the actors, the table's last sample,
as the every-probe sidecar's rhythms saw them: the learner trains on the limiter's credit a
while after the actors stop), and that window is within k x the series' learned gap (or, from
Reverb alone, the pipeline's fill: rhythm.py). Cells run side by side (up to --parallel), each
in its own process.

    python -m bench.rhythms --results bench/RESULTS.md   # make bench-rhythms (about 35 min)
    python -m bench.rhythms --cells step_12s,hang_learner_12s --seconds 180   # a quick look
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench.results_md import write_sections
from harness.procs import PYTHON
from replaywatch.config import PollConfig, ProbeTarget, WatchConfig
from replaywatch.diagnosis import rhythm as rh
from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.model import Severity
from replaywatch.wiring import build_sidecar

HEALTHY_S = 600.0
POLL_S = 1.0
BASE = ["--batch-size", "16", "--samples-per-insert", "4", "--min-size", "100",
        "--error-buffer", "64", "--timeout-s", "7200", "--hang-after", "7200",
        "--train-s", "7200"]
LEARNER_KINDS = {"learner_stalled", "insert_blocked"}
ACTOR_KINDS = {"sample_blocked", "writer_stalled"}
HEADING = "## Rhythms"


@dataclasses.dataclass(frozen=True)
class Cell:
    name: str
    family: str
    flags: tuple[str, ...]
    hang: str | None = None  # "learner" or "actors"
    hang_at_s: float = 0.0
    watch_s: float = HEALTHY_S  # after the start line


def _async(step: float, prefetch: int, workers: int, actors: int = 1) -> tuple[str, ...]:
    return ("--layout", "async", "--learner-step-s", f"{step:g}", "--prefetch", str(prefetch),
            "--workers", str(workers), "--actors", str(actors))


def _hang_learner(step: float) -> Cell:
    at = max(120.0, 8 * step)
    # From Reverb alone the deep pipeline's fill may hold the stall back up to
    # startup_grace_s (900 s): watched past it.
    return Cell(f"hang_learner_{step:g}s", "hang", (*_async(step, 8, 4),
                "--learner-hang-at-s", f"{at:g}"), "learner", at, at + 960)


CELLS = [
    *(Cell(f"step_{s:g}s", "step", _async(s, 8, 4)) for s in (0.05, 2.0, 12.0, 30.0, 60.0)),
    *(Cell(f"prefetch_{p}", "prefetch", _async(12.0, p, 1)) for p in (0, 2, 8)),
    *(Cell(f"actors_{a}", "actors", _async(1.0, 2, 1, a)) for a in (1, 16, 64)),
    Cell("sync_0.05s", "sync", ("--layout", "sync", "--learner-step-s", "0.05", "--workers",
                                "1")),
    Cell("sync_2s_prefetch_4", "sync", ("--layout", "sync", "--learner-step-s", "2",
                                        "--workers", "1", "--prefetch", "4")),
    Cell("sync_12s", "sync", ("--layout", "sync", "--learner-step-s", "12", "--workers",
                              "1")),
    *(_hang_learner(s) for s in (12.0, 30.0, 60.0)),
    Cell("hang_actors_1s", "hang", (*_async(1.0, 2, 1, 16), "--actors-hang-at-s", "120"),
         "actors", 120.0, 240.0),
]
BY_NAME = {c.name: c for c in CELLS}


def run_cell(cell: Cell, watch_s: float | None, db_dir: Path) -> dict[str, Any]:
    """One job and its three sidecars; what each paged, and for a hang when and by what."""
    job = subprocess.Popen([PYTHON, "harness/loop_workload.py", *BASE, *cell.flags],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert job.stdout is not None
        start = json.loads(job.stdout.readline())
        began = time.time()
        reverb = start["reverb"].replace("localhost", "127.0.0.1")
        trainer = ProbeTarget(start["probe"], None)
        actor = (ProbeTarget(start["actor_probe"], None),) if start.get("actor_probe") else ()
        modes = {"reverb": (), "probe": (trainer,), "all": (trainer, *actor)}
        th = Thresholds()
        rows: dict[str, Any] = {m: {"paged": [], "named": None, "info": set()} for m in modes}
        limit = watch_s if watch_s is not None else cell.watch_s
        with ExitStack() as stack:
            cars = {m: stack.enter_context(build_sidecar(WatchConfig(
                targets=(reverb,), probes=probes, thresholds=th,
                poll=PollConfig(interval_s=POLL_S, history_s=900.0)),
                incidents_path=str(db_dir / f"{cell.name}-{m}.db"))) for m, probes in
                modes.items()}
            while time.time() - began < limit:
                t0 = time.time()
                for mode, car in cars.items():
                    row = rows[mode]
                    for f in car.poller.tick().findings:
                        at = round(time.time() - began, 1)
                        if f.severity < Severity.WARNING:
                            row["info"].add(f.kind)
                        elif cell.hang is None or at < cell.hang_at_s:
                            row["paged"].append([at, str(f.kind), f.evidence.get("window_why")])
                        elif row["named"] is None and f.severity is Severity.CRITICAL:
                            row["named"] = {"at": at, "kind": str(f.kind),
                                            "window_s": f.evidence.get("window_s"),
                                            "window_why": f.evidence.get("window_why")}
                if cell.hang is not None and all(r["named"] for r in rows.values()):
                    break
                time.sleep(max(0.0, POLL_S - (time.time() - t0)))
            learned = cars["all"].keeper.rhythms.of(reverb)
            gaps = {k: rh.longest_normal(r.gaps) for k, r in learned.items()}
            onset = None
            if cell.hang is not None:
                # The learner's last batch; for the actors, the table's last sample: the
                # learner trains on the limiter's credit a while after the actors stop.
                key = "probe" if cell.hang == "learner" else "samples"
                moved = [r.last_event_at for k, r in learned.items()
                         if k.startswith(key) and r.last_event_at is not None]
                onset = round(max(moved) - began, 1) if moved else None
        for row in rows.values():
            row["paged"] = row["paged"][:5]
            row["info"] = sorted(row["info"])
        return {"cell": cell.name, "family": cell.family, "hang": cell.hang, "onset": onset,
                "seconds": round(time.time() - began), "modes": rows,
                "longest_gaps": {k: g and round(g, 1) for k, g in gaps.items()}}
    finally:
        job.kill()
        job.wait()


def verdict(r: dict[str, Any]) -> str:
    """ok, or what failed."""
    bad = [m for m, row in r["modes"].items() if row["paged"]]
    if bad:
        return "paged: " + ", ".join(f"{m} {r['modes'][m]['paged'][0][1]}" for m in bad)
    if r["hang"] is None:
        return "ok"
    right = LEARNER_KINDS if r["hang"] == "learner" else ACTOR_KINDS
    late = []
    for m, row in r["modes"].items():
        n = row["named"]
        if n is None or n["kind"] not in right or r["onset"] is None:
            late.append(f"{m}: {'not named' if n is None else n['kind']}")
        elif n["at"] - r["onset"] > (n["window_s"] or 0) + 2 * POLL_S + 1:
            late.append(f"{m}: {n['at'] - r['onset']:.0f} s > window {n['window_s']} s")
    return "ok" if not late else "; ".join(late)


def render(results: list[dict[str, Any]]) -> str:
    out = []
    for family in dict.fromkeys(r["family"] for r in results):
        rows = [r for r in results if r["family"] == family]
        out.append(f"### {family}\n")
        if family == "hang":
            out.append("| cell | onset s | mode | named | after onset s | window s | why | "
                       "verdict |\n| --- | --- | --- | --- | --- | --- | --- | --- |")
            for r in rows:
                for m, row in r["modes"].items():
                    n = row["named"] or {}
                    after = (round(n["at"] - r["onset"], 1) if n and r["onset"] is not None
                             else "")
                    why = str(n.get("window_why") or "").replace("|", "/")[:110]
                    out.append(f"| {r['cell']} | {r['onset']} | {m} | {n.get('kind', '-')} | "
                               f"{after} | {n.get('window_s', '')} | {why} | {verdict(r)} |")
        else:
            out.append("| cell | seconds | warnings+criticals (reverb / probe / all) | info "
                       "kinds | longest normal gaps | verdict |\n"
                       "| --- | --- | --- | --- | --- | --- |")
            for r in rows:
                counts = " / ".join(str(len(r["modes"][m]["paged"])) for m in r["modes"])
                info = sorted({k for row in r["modes"].values() for k in row["info"]})
                gaps = ", ".join(f"{k.split()[0]} {g}" for k, g in sorted(
                    r["longest_gaps"].items()) if g is not None)
                out.append(f"| {r['cell']} | {r['seconds']} | {counts} | {', '.join(info)} | "
                           f"{gaps} | {verdict(r)} |")
        out.append("")
    return "\n".join(out)


def section(results: list[dict[str, Any]], took_s: float) -> str:
    ok = sum(1 for r in results if verdict(r) == "ok")
    return (f"{HEADING} ({ok} of {len(results)} cells ok, {took_s / 60:.1f} min, "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})\n\n"
            "`make bench-rhythms` (bench/rhythms.py): each cell a real job watched from its "
            "start by three sidecars ticked once a second at the default thresholds: Reverb "
            "alone, the learner's trainer probe, every probe. A healthy cell is ok with no "
            "warning or critical finding in its whole run on any sidecar (info kinds listed); a "
            "hang cell when each sidecar names a right kind (learner: learner_stalled or "
            "insert_blocked; actors: sample_blocked or writer_stalled) within the window its "
            "finding states plus two polls of the onset.\n\n" + render(results))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cells", default=",".join(BY_NAME))
    p.add_argument("--seconds", type=float, default=None, help="watch each cell this long")
    p.add_argument("--parallel", type=int, default=10)
    p.add_argument("--results", default=None)
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    names = [n for n in args.cells.split(",") if n]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        sys.exit(f"bench.rhythms: unknown cell(s) {', '.join(unknown)}; known: "
                 f"{', '.join(BY_NAME)}")
    if args.one:
        with tempfile.TemporaryDirectory() as tmp:
            print(json.dumps(run_cell(BY_NAME[args.one], args.seconds, Path(tmp))), flush=True)
        return
    began = time.time()
    results = []
    pending = list(names)
    running: list[tuple[str, subprocess.Popen[str]]] = []
    while pending or running:
        while pending and len(running) < args.parallel:
            name = pending.pop(0)
            cmd = [PYTHON, "-m", "bench.rhythms", "--one", name]
            if args.seconds is not None:
                cmd += ["--seconds", str(args.seconds)]
            err = open(Path(tempfile.gettempdir()) / f"bench-rhythms-{name}.err", "w")
            running.append((name, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err,
                                                   text=True)))
        for name, proc in list(running):
            if proc.poll() is None:
                continue
            running.remove((name, proc))
            out = (proc.stdout.read() if proc.stdout else "").strip().splitlines()
            if proc.returncode != 0 or not out:
                why = (Path(tempfile.gettempdir()) / f"bench-rhythms-{name}.err").read_text()
                results.append({"cell": name, "family": BY_NAME[name].family, "hang": None,
                                "onset": None, "seconds": 0, "longest_gaps": {},
                                "modes": {"reverb": {"paged": [[0, "bench failed", why[-300:]]],
                                                     "named": None, "info": []}}})
            else:
                results.append(json.loads(out[-1]))
            print(f"{name}: {verdict(results[-1])}", flush=True)
        time.sleep(1.0)
    order = {n: i for i, n in enumerate(BY_NAME)}
    results.sort(key=lambda r: order[r["cell"]])
    text = section(results, time.time() - began)
    print(text)
    if args.results:
        path = Path(args.results)
        write_sections(path, [text])


if __name__ == "__main__":
    main()
