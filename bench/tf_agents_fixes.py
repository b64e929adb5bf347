"""TF-Agents' own DQN job that hangs, attached both ways, and every fix the sidecar prints
applied and trained 300 steps under its watch.

The job (examples/tf_agents_dqn.py, tf-agents 0.19.0): spi 8, min_size 200, error_buffer 40,
batch 64, 3 interleave threads over `as_dataset`'s 32 Reverb datasets, one collect step a
train step. It is attached as the README's plain tf.data recipe (the probe told the batch and
the threads, the observer's client wrapped: `--probe-plain`) and as the README's TF-Agents
recipe (the pipeline's shape and the loop's schedule declared), its server in the job's process
and in one of its own (gRPC). A sidecar built in this process (`build_sidecar`) ticks every
0.25 s from the start line; every fix any finding prints over the run (deadlock_risk,
batch_exceeds_headroom, worker_starvation) is then applied to the job's flags and the job run
for 300 train steps under a sidecar attached the same way: a fix holds when the job trains
to the end with no warning or critical finding.

One job at a time (`make bench-tf-agents-fixes`, about 5 minutes):

    python -m bench.tf_agents_fixes --results bench/RESULTS.md
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.results_md import write_sections
from harness.procs import PYTHON, Proc
from replaywatch.config import PollConfig, ProbeTarget, WatchConfig
from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.model import Severity
from replaywatch.wiring import build_sidecar

HEADING = "## TF-Agents' printed fixes"
EXAMPLE = "examples/tf_agents_dqn.py"
POLL_S = 0.25
BROKEN = ["--samples-per-insert", "8", "--min-size", "200", "--error-buffer", "40",
          "--batch-size", "64", "--num-parallel-calls", "3", "--collect-steps", "1"]
ATTACH = {"plain": ["--probe-plain"], "tf-agents": []}
# The server in the job's process (TF-Agents' local_server, reached at localhost:PORT, which
# Reverb's client serves from the table itself), or in a process of its own over gRPC.
SERVERS = {"in-process": [], "grpc": ["--server-process"]}
# What the plain recipe printed before the stride was kept out of fixes: run to
# show they hang, not counted among the fixes.
BEFORE = [["--error-buffer", "222"], ["--batch-size", "10"]]
FLAGS = {"batch_size": "--batch-size", "error_buffer": "--error-buffer",
         "num_parallel_calls": "--num-parallel-calls", "cycle_length": "--max-cycle-length",
         "inserts_per_step": "--collect-steps", "first_step_at": "--initial-collect"}
FIX_KINDS = ("deadlock_risk", "batch_exceeds_headroom", "worker_starvation")
TRAIN_STEPS = 300


def fix_flags(fix: dict[str, Any]) -> list[str]:
    """A printed fix as the example's flags, every knob of a chain; a first step at N items
    is an initial collect of N + 2 steps (the observer's items trail its steps by two)."""
    flags: list[str] = []
    part: dict[str, Any] | None = fix
    while part is not None:
        value = part["value"] + 2 if part["knob"] == "first_step_at" else part["value"]
        flags += [FLAGS[part["knob"]], str(value)]
        part = part.get("together_with")
    return flags


def watch(flags: list[str], attach: str, limit_s: float, tmp: Path, server: str = "in-process"
          ) -> dict[str, Any]:
    """The job under a sidecar from its start line: its outcome, every warning or critical
    finding named (kind, seconds after the start line), and every fix printed."""
    log = tmp / f"job-{time.monotonic_ns()}.log"
    proc = Proc([PYTHON, EXAMPLE, *flags, *ATTACH[attach], *SERVERS[server], "--train-steps",
                 str(TRAIN_STEPS), "--hang-after", "20"], stdout_path=log)
    named: dict[str, float] = {}
    info: set[str] = set()
    fixes: list[dict[str, Any]] = []
    outcome: dict[str, Any] = {"outcome": "timeout"}
    try:
        job = proc.announce(timeout_s=150)
        config = WatchConfig(
            targets=(job["reverb"].replace("localhost", "127.0.0.1"),),
            probes=(ProbeTarget(job["probe"], None),), thresholds=Thresholds(min_history_s=1.0),
            poll=PollConfig(interval_s=POLL_S, history_s=300.0))
        with build_sidecar(config, incidents_path=str(tmp / f"{log.stem}.db")) as sidecar:
            start = time.monotonic()
            while time.monotonic() - start < limit_s:
                for f in sidecar.poller.tick().findings:
                    if f.severity >= Severity.WARNING:
                        named.setdefault(str(f.kind), round(time.monotonic() - start, 1))
                    else:
                        info.add(str(f.kind))
                    for fix in f.evidence.get("fixes", []) if f.kind in FIX_KINDS else []:
                        if fix not in fixes:
                            fixes.append(fix)
                done = [x for x in log.read_text(errors="replace").splitlines()
                        if x.startswith('{"outcome"')]
                if done:
                    outcome = json.loads(done[-1])
                    break
                time.sleep(POLL_S)
    finally:
        proc.kill()
    return {**outcome, "named": named, "info": sorted(info), "fixes": fixes}


def describe(fix: dict[str, Any]) -> str:
    parts, part = [], fix
    while part is not None:
        was = "unknown" if part["was"] is None else f"{part['was']:g}"
        parts.append(f"{part['knob']}={part['value']} (was {was})")
        part = part.get("together_with")
    return " + ".join(parts)


def run(attach: str, server: str, tmp: Path) -> list[dict[str, Any]]:
    def note(row: dict[str, Any]) -> dict[str, Any]:
        print(f"{attach} {server}: {row['job']} -> {row['outcome']} "
              f"{row.get('train_steps', row.get('batches'))}, named {row['named']}", flush=True)
        return row

    broken = watch(BROKEN, attach, 120, tmp, server)
    rows = [note({"attach": attach, "server": server, "job": "as configured", **broken})]
    for fix in broken["fixes"]:
        # The example's argparse takes a flag's last value: the fix's override the job's.
        fixed = watch([*BROKEN, *fix_flags(fix)], attach, 180, tmp, server)
        rows.append(note({"attach": attach, "server": server, "job": describe(fix), **fixed}))
    if attach == "plain" and server == "in-process":
        for flags in BEFORE:
            old = watch([*BROKEN, *flags], attach, 180, tmp, server)
            rows.append(note({"attach": attach, "server": server, "before": True,
                              "job": f"{flags[0][2:].replace('-', '_')}={flags[1]} "
                                     "(printed before)", **old}))
    return rows


def holds(row: dict[str, Any]) -> bool:
    return row["outcome"] == "ran" and not row["named"]


def render(rows: list[dict[str, Any]]) -> str:
    lines = ["| attached | server | job | outcome | train steps | named (s after the start "
             "line) | info | holds |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        steps = r.get("train_steps", r.get("batches", "-"))
        named = ", ".join(f"{k} ({s:g})" for k, s in r["named"].items()) or "nothing"
        verdict = ("-" if r["job"] == "as configured" or r.get("before")
                   else "yes" if holds(r) else "**no**")
        lines.append(f"| {r['attach']} | {r['server']} | {r['job']} | {r['outcome']} | {steps} "
                     f"| {named} | {', '.join(r['info']) or '-'} | {verdict} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", type=Path, default=None)
    p.add_argument("--attach", choices=sorted(ATTACH), default=None)
    args = p.parse_args(argv)
    t0 = time.monotonic()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for server in SERVERS:
            for attach in [args.attach] if args.attach else list(ATTACH):
                rows += run(attach, server, Path(tmp))
    fixed = [r for r in rows if r["job"] != "as configured" and not r.get("before")]
    text = (f"{HEADING} ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
            f"{(time.monotonic() - t0) / 60:.1f} min)\n\n"
            "`make bench-tf-agents-fixes` (bench/tf_agents_fixes.py): TF-Agents' DQN job "
            "(examples/tf_agents_dqn.py, tf-agents 0.19.0; spi 8, min_size 200, error_buffer 40, "
            "batch 64, 3 interleave threads, one collect step a train step) attached as the "
            "README's plain tf.data recipe (`plain`: the probe told the batch and the threads) "
            "and as its TF-Agents recipe, its Reverb server in the job's process (TF-Agents' "
            "`local_server`, reached at `localhost:PORT`) or in one of its own over gRPC "
            "(`--server-process`), watched by a sidecar from the start line; every fix "
            "any finding printed is applied and the job run for 300 train steps under the same "
            "watch. A fix holds when it trains to the end with no warning or critical "
            f"finding (info findings listed apart). Fixes that held: "
            f"{sum(holds(r) for r in fixed)} of {len(fixed)}. \"printed before\": the two "
            "fixes the plain recipe printed when the loop's stride was taken as batch / spi, "
            "applied the same way.\n\n"
            + render(rows))
    print(text)
    if args.results:
        write_sections(args.results, [text])
    return 0 if all(holds(r) for r in fixed) and fixed else 1


if __name__ == "__main__":
    raise SystemExit(main())
