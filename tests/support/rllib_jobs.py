"""Real RLlib jobs for the tests: harness/rllib_job.py run by .venv-rllib's Python on a local
cluster of its own, and a sidecar in the test's process watching it from outside with `--ray`
(the dashboard, the metrics endpoints in the job's temp dir, the result rows) every second."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from harness.procs import ROOT, Proc, free_port, wait_until
from replaywatch.config import PollConfig, RayTarget, WatchConfig
from replaywatch.model import Finding, Severity
from replaywatch.wiring import build_sidecar

RLLIB_PY = ROOT / ".venv-rllib" / "bin" / "python"
RLLIB_READY = ROOT / ".venv-rllib" / ".installed"  # make rllib-venv's stamp: a whole venv
INTERVAL_S = 1.0
SLACK_S = 3.0  # a poll of the state API and every metrics endpoint lags on 2 loaded cores
DQN = ["--algo", "dqn", "--num-learners", "1", "--num-env-runners", "1",
       "--min-steps-per-iteration", "200", "--learning-starts", "200", "--num-cpus", "4"]
APPO = ["--algo", "appo", "--num-learners", "1", "--num-env-runners", "2",
        "--min-time-per-iteration", "2", "--num-cpus", "4"]


# What a job's driver and actors import beyond the harness itself (torch's optimizers pull in
# its compiler's modules, sympy among them; RLlib's learners, scipy), imported once by one
# process so that its bytecode is written before the jobs start. On a fresh venv (make
# test's: .venv-rllib is not compiled when built) five jobs' thirteen processes starting
# together each compiled what none had written yet: 148 CPU-s for make test's case against
# 112 with the bytecode there.
PRELUDE = "; ".join(f"import {m}" for m in (
    "harness.rllib_job", "ray.rllib.algorithms.dqn.torch.dqn_torch_learner",
    "ray.rllib.algorithms.appo.torch.appo_torch_learner",
    "ray.rllib.env.single_agent_env_runner", "ray.rllib.core.learner.learner_group",
    "ray.train", "ray.data", "ray.util.state", "torch.optim", "torch.distributed",
    "torch._dynamo", "scipy.stats", "scipy.optimize", "scipy.signal", "scipy.interpolate",
    "scipy.integrate", "sympy"))


def write_bytecode(spawn: Callable[..., Proc]) -> Proc:
    """One process importing what the jobs will (PRELUDE), its bytecode written where the
    environment lets it (make test empties PYTHONDONTWRITEBYTECODE); wait on it before the
    jobs start."""
    return spawn([str(RLLIB_PY), "-c", PRELUDE], name="rllib-bytecode")


def start_job(spawn: Callable[..., Proc], tmp_path: Path, temp: Path, *flags: str,
              algo: list[str] = DQN) -> tuple[dict, Path]:
    # One torch thread per process, as Ray gives its actors (OMP_NUM_THREADS=1) but not the
    # driver, whose learner here is in the driver: a second intra-op thread bought nothing on
    # 2 cores shared with make test's other lanes and cost the case 37 CPU-s against 27.
    job = spawn([str(RLLIB_PY), "harness/rllib_job.py", *algo, "--seconds", "400",
                 "--temp-dir", str(temp), "--logdir", str(tmp_path / "log"), *flags],
                name="rllib-job", env={"OMP_NUM_THREADS": "1"})
    return job.announce(timeout_s=240, match=lambda r: r.get("event") == "rllib_job"), temp


def watch(tmp_path: Path, announced: dict, temp: Path, seconds: float,
          until: Callable[[Finding], bool] = lambda f: False, bundle_within_s: float = 0.0,
          results: str | None = None, seen: list | None = None
          ) -> tuple[list[tuple[float, Finding]], list[float], float]:
    """(findings seen at warning or worse with the time, the times the job's trained counter
    was seen to move, the time watching began). `bundle_within_s`: once `until` holds, the
    sidecar goes on that long or until a bundle is written (tmp_path/bundles). `results`:
    where the rows are read (default: the job's logdir; an RLlibProbe's URL); `seen` gets
    every poll's snapshot of the job."""
    target = RayTarget(announced["dashboard_url"], temp_dir=str(temp),
                       results=results or announced["logdir"])
    config = WatchConfig(targets=(), ray=(target,),
                         poll=PollConfig(interval_s=INTERVAL_S, timeout_s=3.0))
    paged: list[tuple[float, Finding]] = []
    moved: list[float] = []
    last: float | None = None
    began = time.time()
    with build_sidecar(config, incidents_path=str(tmp_path / "i.db")) as car:
        while time.time() - began < seconds:
            state = car.poller.tick()
            snap = state.ray.get(target.name)
            if seen is not None and snap is not None:
                seen.append(snap)
            trained = sum(c.env_steps_trained or 0.0 for c in snap.counters) if snap else None
            if trained is not None and trained != last:
                moved.append(time.time())
                last = trained
            for f in state.findings:
                if f.severity >= Severity.WARNING:
                    paged.append((time.time(), f))
            if any(until(f) for _, f in paged):
                break
            time.sleep(max(0.0, INTERVAL_S - (time.time() - began) % INTERVAL_S))
        # The stacks and the bundle are taken off the poller's thread: no more polls needed
        deadline = time.time() + bundle_within_s
        while time.time() < deadline and not list((tmp_path / "bundles").glob("*.json")):
            time.sleep(0.2)
    return paged, moved, began


def windows_in(doc: object) -> list[float]:
    """Every `window_s` an evidence document states, however nested."""
    if isinstance(doc, dict):
        own = [float(doc["window_s"])] if "window_s" in doc else []
        return own + [w for v in doc.values() for w in windows_in(v)]
    if isinstance(doc, list):
        return [w for v in doc for w in windows_in(v)]
    return []


def start_head(spawn: Callable[..., Proc], home: Path, temp: Path,
               monkeypatch: pytest.MonkeyPatch, num_cpus: int) -> tuple[int, str]:
    """A `ray start --head` on this machine, answering: its GCS port and dashboard URL. No
    token is set or read (HOME is `home`, Ray's auth variables unset), as on a cluster
    started with Ray's defaults."""
    for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(name, raising=False)
    (home / ".ray").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))  # the machine's own token is not read
    port, dash = free_port(), free_port()
    spawn([str(RLLIB_PY.parent / "ray"), "start", "--head", "--block", "--port", str(port),
           "--node-ip-address", "127.0.0.1", "--num-cpus", str(num_cpus), "--dashboard-host",
           "127.0.0.1", "--dashboard-port", str(dash), "--temp-dir", str(temp),
           "--disable-usage-stats", "--ray-client-server-port", str(free_port()),
           "--dashboard-agent-listen-port", str(free_port())], name="ray-head")
    dashboard = f"http://127.0.0.1:{dash}"
    wait_until(lambda: _answers(f"{dashboard}/api/v0/actors?limit=1"), timeout_s=120)
    return port, dashboard


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2.0) as r:
            return r.status == 200
    except OSError:
        return False
