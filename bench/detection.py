"""Benchmark: detection latency and false alarms on the real agents/ workload.

Each scenario runs `python -m agents.run` with a fault it can produce and two
sidecars: one with the learner's trainer probe and every actor probe of the start
line (`actor_probes`), one with the Reverb address alone. The latency is from the
fault's onset, taken from the trainer itself, to the first time the finding shows
in the sidecar's /api/v1/findings:

  seed_hang      sync, 12 batching workers: onset = the probe's `blocked_since`
  actor_exit     distributed, every actor exits: onset = the exit (its stderr line)
  learner_hang   distributed, the learner stops: onset = the probe's last learner step
  batch_headroom limiter slack below one batch: onset = the sidecar's first poll
  warmup         min_replay_size far away: only `warmup` may show

A false alarm is any warning or critical finding other than the expected ones
(`deadlock_risk` is expected wherever the configuration predicts a hang; `probe_down`
where every actor exits, since their probes go with them).

First come the healthy runs (bench/healthy.py: sync, async, distributed for
--healthy-s, a learner whose first step takes 60 s for --first-step-s), side by side;
then the scenarios, one at a time (in parallel they starve each other of CPU).

    python -m bench.detection [--runs 5] [--scenarios seed_hang,actor_exit] [--healthy-s 600]
    python -m bench.detection --runs 0 --healthy-s 600    # the healthy runs alone
    python -m bench.detection --healthy-runs "" --runs 1  # the scenarios alone
    python -m bench.detection ... --results bench/RESULTS.md  # replace its two sections
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agents import seed_hang
from bench import healthy
from bench.results_md import detection_section, healthy_section, summarize, write_sections
from bench.watched import DISTRIBUTED, SEED, attach, spawn_agent
from harness.agent import AgentProcess
from harness.procs import Proc, get_json, wait_until


@dataclasses.dataclass(frozen=True)
class Scenario:
    name: str
    flags: list[str]
    expect_probe: frozenset[str]  # kinds the probe-attached sidecar must raise
    expect_reverb: frozenset[str]  # kinds the Reverb-only sidecar must raise
    tolerated: frozenset[str] = frozenset({"deadlock_risk"})
    timeout_s: float = 150.0


SCENARIOS = {
    "seed_hang": Scenario("seed_hang", SEED, frozenset({"worker_starvation"}),
                          frozenset({"sample_blocked"})),
    # Every actor exits, and its probe with it: probe_down is true there, not a false alarm.
    "actor_exit": Scenario("actor_exit", [*DISTRIBUTED, "--inject-stall", "actors-exit@25"],
                           frozenset({"sample_blocked"}), frozenset({"sample_blocked"}),
                           tolerated=frozenset({"deadlock_risk", "probe_down"})),
    "learner_hang": Scenario("learner_hang", [*DISTRIBUTED, "--inject-stall",
                                              "learner-hang@25"],
                             frozenset({"insert_blocked", "learner_stalled"}),
                             frozenset({"insert_blocked"})),
    # An actor held by a policy-lag bound of 2 steps at 8 samples per insert frees 16
    # samples a learner step against batches of 256: the budget model's will_hang, named from
    # the actor probe's declared bound on the first poll (Reverb alone cannot know the lag).
    "batch_headroom": Scenario("batch_headroom", ["--mode", "distributed", "--num-actors", "1",
                                                  "--max-policy-lag", "2",
                                                  "--batch-size", "256",
                                                  "--samples-per-insert", "8",
                                                  "--min-replay-size", "1000",
                                                  "--tolerance", "0.5"],
                               frozenset({"batch_exceeds_headroom"}), frozenset(),
                               timeout_s=90.0),
    "warmup": Scenario("warmup", ["--mode", "sync", "--min-replay-size", "1000000",
                                  "--max-replay-size", "1000000"],
                       frozenset({"warmup"}), frozenset({"warmup"}), timeout_s=90.0),
}


def _first_seen(base: str, seen: dict[str, float], alarms: set[str]) -> None:
    try:
        found = get_json(f"{base}/api/v1/findings", 5)[1]["findings"]
    except OSError:
        # A sidecar slow to answer on a loaded machine (make test's lanes beside it) is
        # looked at again on the next round; a missed look only delays what is seen.
        return
    for f in found:
        seen.setdefault(f["kind"], time.time())
        if f["severity"] in ("warning", "critical"):
            alarms.add(f["kind"])


def run_once(scenario: Scenario, tmp: Path, seed: int = 0) -> dict[str, Any]:
    agent = spawn_agent([*scenario.flags, "--seed", str(seed)],
                        tmp / f"{scenario.name}-{seed}-agent.log")
    procs: list[Proc] = []
    try:
        start = wait_until(lambda: agent.event(lambda r: r.get("reverb")), 180)[1]
        probe = start["probe"]
        procs, bases = attach(start, tmp, scenario.name)
        base_probe, base_alone = bases["probe"], bases["reverb"]
        first_poll = time.time()
        seen: dict[str, dict[str, float]] = {"probe": {}, "reverb": {}}
        alarms: dict[str, set[str]] = {"probe": set(), "reverb": set()}
        deadline = time.monotonic() + scenario.timeout_s
        fed = False
        while time.monotonic() < deadline:
            if scenario.name == "seed_hang":
                fed = seed_hang.warmup_outcome(get_json(f"{probe}/probe", 2)[1]) == "passed"
                if fed:
                    break
            _first_seen(base_probe, seen["probe"], alarms["probe"])
            _first_seen(base_alone, seen["reverb"], alarms["reverb"])
            if (scenario.expect_probe <= set(seen["probe"])
                    and scenario.expect_reverb <= set(seen["reverb"])):
                break
            time.sleep(0.25)
        doc = get_json(f"{probe}/probe", 2)[1]
        onset = _onset(scenario, agent, doc, first_poll)
    finally:
        for p in procs:
            p.kill()
        agent.kill()
    out: dict[str, Any] = {"scenario": scenario.name, "onset": onset, "fed": fed,
                           "actor_probes": len(start.get("actor_probes", []))}
    for side, expected in (("probe", scenario.expect_probe), ("reverb", scenario.expect_reverb)):
        for kind in expected:
            at = seen[side].get(kind)
            out[f"{side}:{kind}"] = None if at is None or onset is None else at - onset
        allowed = scenario.expect_probe | scenario.expect_reverb | scenario.tolerated
        out[f"{side}:false_alarms"] = sorted(alarms[side] - allowed)
    return out


def _onset(scenario: Scenario, agent: AgentProcess, probe: dict, first_poll: float) -> float | None:
    if scenario.name == "seed_hang":
        return probe.get("blocked_since")
    if scenario.name == "learner_hang":
        return probe.get("last_step_at")
    if scenario.name == "actor_exit":
        hit = agent.event(lambda r: r.get("event") == "stall_injected")
        return hit[0] if hit else None
    return first_poll


def run_lanes(lanes: list[list[str]], runs: int, tmp: Path,
              run: Callable[[Scenario, Path, int], dict[str, Any]] | None = None,
              ) -> list[dict[str, Any]]:
    """Each lane's scenarios run `runs` times in order; the lanes run side by side.

    A run of seed_hang whose start was fed is started again with the next seed, up to
    seed_hang.ATTEMPTS starts: each run is a hang measured (the fed starts are kept, counted
    apart). Without the retries, a bench where every start was fed had no seed_hang rows.
    """
    run = run or run_once
    results: list[dict[str, Any]] = []
    seeds = itertools.count(1)  # shared by the lanes: next() on a count is atomic in CPython

    def lane(names: list[str]) -> None:
        for _ in range(runs):
            for name in names:
                for _attempt in range(seed_hang.ATTEMPTS):
                    r = run(SCENARIOS[name], tmp, next(seeds))
                    print(json.dumps(r), file=sys.stderr, flush=True)
                    results.append(r)
                    if not r["fed"]:
                        break

    threads = [threading.Thread(target=lane, args=(names,)) for names in lanes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5, help="runs per scenario; 0: none")
    p.add_argument("--scenarios", default=",".join(SCENARIOS))
    p.add_argument("--healthy-s", type=float, default=600.0, metavar="SECONDS",
                   help="how long each healthy run is watched (default 600)")
    p.add_argument("--first-step-s", type=float, default=150.0, metavar="SECONDS",
                   help="how long the first-step runs are watched (default 150)")
    p.add_argument("--healthy-runs", default=",".join(healthy.DEFAULT_RUNS),
                   help=f"side by side, from {', '.join(healthy.RUNS)}; empty: none")
    p.add_argument("--lanes", type=int, default=1, choices=(1, 2),
                   help="2: sync and distributed scenarios side by side")
    p.add_argument("--results", type=Path, default=None, metavar="FILE",
                   help="replace the detection and false-alarm sections of FILE "
                   "(bench/RESULTS.md) with this run's")
    args = p.parse_args(argv)
    names = [s for s in args.scenarios.split(",") if s]
    runs = [s for s in args.healthy_runs.split(",") if s]
    for name in names + runs:
        if name not in SCENARIOS and name not in healthy.RUNS:
            p.error(f"unknown scenario or healthy run {name!r}")
    tmp = Path(tempfile.mkdtemp(prefix="rw-detect-"))
    out: dict[str, Any] = {"tmp": str(tmp)}
    sections = []
    if runs:
        t0 = time.monotonic()
        out["healthy"] = healthy.healthy(args.healthy_s, tmp, tuple(runs), args.first_step_s)
        print(json.dumps(out["healthy"], indent=1, default=str), file=sys.stderr, flush=True)
        sections.append(healthy_section(out["healthy"], args.healthy_s, args.first_step_s,
                                        time.monotonic() - t0))
        print(sections[-1], flush=True)
    if args.lanes == 2:
        distributed = [n for n in names if "distributed" in SCENARIOS[n].flags]
        lanes = [[n for n in names if n not in distributed], distributed]
    else:
        lanes = [names]
    t0 = time.monotonic()
    results = run_lanes([lane for lane in lanes if lane], args.runs, tmp) if args.runs else []
    if results:
        out["rows"] = summarize(results)
        out["fed"] = sum(1 for r in results if r.get("fed"))
        sections.insert(0, detection_section(results, args.runs, time.monotonic() - t0))
        print(sections[0], flush=True)
    if args.results is not None and sections:
        write_sections(args.results, sections)
        print(f"replaced {len(sections)} section(s) of {args.results}", file=sys.stderr)
    return out


if __name__ == "__main__":
    main()
