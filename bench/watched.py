"""An agent under watch: the agent started for a bench, and two sidecars attached to it.

bench/detection.py (the faults) and bench/healthy.py (the false alarms) both start agents
and sidecars this way, with the same poll interval and stall window.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from agents import seed_hang
from harness.agent import AgentProcess
from harness.procs import PYTHON, Proc, free_port, get_json, wait_until

ROOT = Path(__file__).resolve().parents[1]
INTERVAL_S = 1.0
# The default stall window, not pinned: the sidecars learn each job's rhythm over it, as a
# user's do (the seed's fast loop keeps it; a slow learner's is longer).
STALL_WINDOW_S = 10.0
# A start whose workers were fed (the race of agents/seed_hang.py went the healthy way) ends
# as soon as the probe shows it, marked `fed`: left out of the latencies, counted apart, and
# the run starts the agent again (a new --seed), as the tests do, up to seed_hang.ATTEMPTS.
SEED = list(seed_hang.FLAGS)
DISTRIBUTED = ["--mode", "distributed", "--num-actors", "4", "--batch-size", "64",
               "--samples-per-insert", "8", "--min-replay-size", "500", "--tolerance", "0.5"]


_SIDECARS = itertools.count()  # each sidecar its own log and incident db


def spawn_agent(flags: list[str], log: Path) -> AgentProcess:
    """The agent with no end and no evals, so only the fault changes its course (a run's
    own flags come last and win: bench-long's evaluation pauses)."""
    return AgentProcess(["--steps", "100000000", "--eval-every", "0",
                         "--probe-listen", "127.0.0.1:0", *flags], log=log).spawn()


def attach(start: dict[str, Any], tmp: Path, name: str, trainer_side: bool = False
           ) -> tuple[list[Proc], dict[str, str]]:
    """Two sidecars on a start line: "probe" (the learner's probe and every actor probe,
    `--probe URL` each: the documents say their roles) and "reverb" (the address alone);
    with `trainer_side` a third, "trainer" (the learner's probe only). All are started
    before any is waited on: their start-ups overlap."""
    probes = [start["probe"], *start.get("actor_probes", [])]
    procs, bases = [], {}
    sides = [("probe", [a for url in probes for a in ("--probe", url)]), ("reverb", [])]
    if trainer_side:
        sides.append(("trainer", ["--probe", start["probe"]]))
    try:
        for side, extra in sides:
            proc, bases[side] = _sidecar(["--reverb", start["reverb"], *extra], tmp,
                                         f"{name}-{next(_SIDECARS)}-{side}")
            procs.append(proc)
        for base in bases.values():
            wait_until(lambda base=base: get_json(f"{base}/healthz", 1)[0] == 200, 30)
    except BaseException:
        for proc in procs:
            proc.kill()
        raise
    return procs, bases


def _sidecar(flags: list[str], tmp: Path, name: str) -> tuple[Proc, str]:
    """A sidecar started on a free port (not yet answering): its process and base URL."""
    port = free_port()
    proc = Proc([PYTHON, "-m", "replaywatch", "watch", *flags, "--listen", f"127.0.0.1:{port}",
                 "--interval", str(INTERVAL_S),
                 "--db", str(tmp / f"{name}.sqlite3")], stdout_path=tmp / f"{name}.log")
    return proc, f"http://127.0.0.1:{port}"
