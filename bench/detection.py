"""Benchmark: detection latency and false alarms on the real agents/ workload.

Each scenario runs `python -m agents.run` with a fault it can produce and two
sidecars: one with the trainer probe, one with the Reverb address alone. The
latency is from the fault's onset, taken from the trainer itself, to the
first time the finding shows in the sidecar's /api/v1/findings:

  seed_hang      sync, 12 batching workers: onset = the probe's `blocked_since`
  actor_exit     distributed, every actor exits: onset = the exit (its stderr line)
  learner_hang   distributed, the learner stops: onset = the probe's last learner step
  batch_headroom limiter slack below one batch: onset = the sidecar's first poll
  warmup         min_replay_size far away: only `warmup` may show

A false alarm is any warning or critical finding other than the expected ones
(`deadlock_risk` is expected wherever the configuration predicts a hang).

    python -m bench.detection [--runs 5] [--scenarios seed_hang,actor_exit]
    python -m bench.detection --healthy 600    # false alarms over 10 min, sync + distributed
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from agents import seed_hang
from harness.agent import AgentProcess
from harness.procs import PYTHON, Proc, free_port, get_json, wait_until

ROOT = Path(__file__).resolve().parents[1]
INTERVAL_S = 1.0
STALL_WINDOW_S = 10.0
# A start whose workers were fed (the race of agents/seed_hang.py went the healthy way) ends
# as soon as the probe shows it, marked `fed`: left out of the latencies, counted apart.
SEED = list(seed_hang.FLAGS)
DISTRIBUTED = ["--mode", "distributed", "--num-actors", "4", "--batch-size", "64",
               "--samples-per-insert", "8", "--min-replay-size", "500", "--tolerance", "0.5"]


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
    "actor_exit": Scenario("actor_exit", [*DISTRIBUTED, "--inject-stall", "actors-exit@25"],
                           frozenset({"sample_blocked"}), frozenset({"sample_blocked"})),
    "learner_hang": Scenario("learner_hang", [*DISTRIBUTED, "--inject-stall",
                                              "learner-hang@25"],
                             frozenset({"insert_blocked", "learner_stalled"}),
                             frozenset({"insert_blocked"})),
    # A blocking layout whose slack (2 x error_buffer = 160) is below one batch + spi.
    "batch_headroom": Scenario("batch_headroom", ["--mode", "distributed", "--num-actors", "2",
                                                  "--batch-size", "256",
                                                  "--samples-per-insert", "8",
                                                  "--min-replay-size", "1000",
                                                  "--tolerance", "0.01"],
                               frozenset({"batch_exceeds_headroom"}), frozenset(),
                               timeout_s=90.0),
    "warmup": Scenario("warmup", ["--mode", "sync", "--min-replay-size", "1000000",
                                  "--max-replay-size", "1000000"],
                       frozenset({"warmup"}), frozenset({"warmup"}), timeout_s=90.0),
}


def _agent(flags: list[str], log: Path) -> AgentProcess:
    """The agent with no end and no evals, so only the fault changes its course."""
    return AgentProcess([*flags, "--steps", "100000000", "--eval-every", "0",
                         "--probe-listen", "127.0.0.1:0"], log=log).spawn()


def _sidecar(flags: list[str], tmp: Path, name: str) -> tuple[Proc, str]:
    port = free_port()
    proc = Proc([PYTHON, "-m", "replaywatch", "watch", *flags, "--listen", f"127.0.0.1:{port}",
                 "--interval", str(INTERVAL_S), "--stall-window-s", str(STALL_WINDOW_S),
                 "--db", str(tmp / f"{name}.sqlite3")], stdout_path=tmp / f"{name}.log")
    base = f"http://127.0.0.1:{port}"
    wait_until(lambda: get_json(f"{base}/healthz", 1)[0] == 200, 30)
    return proc, base


def _first_seen(base: str, seen: dict[str, float], alarms: set[str]) -> None:
    for f in get_json(f"{base}/api/v1/findings", 2)[1]["findings"]:
        seen.setdefault(f["kind"], time.time())
        if f["severity"] in ("warning", "critical"):
            alarms.add(f["kind"])


def run_once(scenario: Scenario, tmp: Path) -> dict[str, Any]:
    agent = _agent(scenario.flags, tmp / f"{scenario.name}-agent.log")
    procs: list[Proc] = []
    try:
        start = wait_until(lambda: agent.event(lambda r: r.get("reverb")), 180)[1]
        reverb, probe = start["reverb"], start["probe"]
        with_probe, base_probe = _sidecar(["--reverb", reverb, "--probe", probe], tmp, "p")
        alone, base_alone = _sidecar(["--reverb", reverb], tmp, "r")
        procs += [with_probe, alone]
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
    out: dict[str, Any] = {"scenario": scenario.name, "onset": onset, "fed": fed}
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


def healthy(seconds: float, tmp: Path) -> dict[str, Any]:
    """Healthy sync and distributed runs side by side: every warning/critical is false."""
    runs = {"sync": ["--mode", "sync"], "distributed": DISTRIBUTED}
    agents, procs, bases = {}, [], {}
    try:
        for name, flags in runs.items():
            agents[name] = _agent(flags, tmp / f"healthy-{name}.log")
        for name, agent in agents.items():
            start = wait_until(lambda a=agent: a.event(lambda r: r.get("reverb")), 180)[1]
            proc, base = _sidecar(["--reverb", start["reverb"], "--probe", start["probe"]],
                                  tmp, f"healthy-{name}")
            procs.append(proc)
            bases[name] = base
        alarms: dict[str, set[str]] = {name: set() for name in runs}
        polls = 0
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for name, base in bases.items():
                _first_seen(base, {}, alarms[name])
            polls += 1
            time.sleep(1.0)
        incidents = {name: get_json(f"{base}/api/v1/incidents?state=all&limit=1000", 5)[1]
                     ["incidents"] for name, base in bases.items()}
    finally:
        for p in procs:
            p.kill()
        for agent in agents.values():
            agent.kill()
    return {"seconds": seconds, "false_alarms": {n: sorted(a) for n, a in alarms.items()},
            "incidents": {n: [i["kind"] for i in rows if i["severity"] != "info"]
                          for n, rows in incidents.items()}}


def summarize(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Latency rows per scenario, sidecar and finding; starts without the fault (`fed`)
    are not runs of it."""
    rows = []
    results = [r for r in results if not r.get("fed")]
    keys = sorted({k for r in results for k in r if ":" in k and not k.endswith("alarms")})
    for key in keys:
        latencies = [r[key] for r in results if r.get(key) is not None]
        runs = [r for r in results if key in r]
        rows.append({
            "scenario": runs[0]["scenario"], "sidecar": key.split(":")[0],
            "finding": key.split(":")[1], "runs": len(runs), "detected": len(latencies),
            "p50_s": statistics.median(latencies) if latencies else None,
            "max_s": max(latencies) if latencies else None,
            "false_alarms": sorted({a for r in runs
                                    for a in r.get(f"{key.split(':')[0]}:false_alarms", [])}),
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


def run_lanes(lanes: list[list[str]], runs: int, tmp: Path) -> list[dict[str, Any]]:
    """Each lane's scenarios run `runs` times in order; the lanes run side by side."""
    results: list[dict[str, Any]] = []

    def lane(names: list[str]) -> None:
        for _ in range(runs):
            for name in names:
                r = run_once(SCENARIOS[name], tmp)
                print(json.dumps(r), file=sys.stderr, flush=True)
                results.append(r)

    threads = [threading.Thread(target=lane, args=(names,)) for names in lanes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--scenarios", default=",".join(SCENARIOS))
    p.add_argument("--healthy", type=float, default=0.0, metavar="SECONDS")
    p.add_argument("--lanes", type=int, default=1, choices=(1, 2),
                   help="2: sync and distributed scenarios side by side")
    args = p.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="rw-detect-"))
    out: dict[str, Any] = {}
    if args.healthy:
        out["healthy"] = healthy(args.healthy, tmp)
        print(json.dumps(out["healthy"], indent=2))
    names = [s for s in args.scenarios.split(",") if s]
    if args.lanes == 2:
        distributed = [n for n in names if "distributed" in SCENARIOS[n].flags]
        lanes = [[n for n in names if n not in distributed], distributed]
    else:
        lanes = [names]
    results = run_lanes([lane for lane in lanes if lane], args.runs, tmp)
    if results:
        out["rows"] = summarize(results)
        out["fed"] = sum(1 for r in results if r.get("fed"))
        print(render(out["rows"]))
        if out["fed"]:
            print(f"seed_hang: {out['fed']} start(s) fed the workers (the race went the "
                  "healthy way, agents/seed_hang.py); not counted as runs")
    return out


if __name__ == "__main__":
    main()
