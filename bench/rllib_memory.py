"""`make bench-rllib-memory`: the RLlib driver's memory at its replay buffer's capacity,
projected while the buffer fills, against what it used once full.

Real DQN jobs (harness/rllib_job.py in .venv-rllib: CartPole-v1 with each observation padded
to `--obs-kib` of noise, so a step costs what a frame does; one EnvRunner, the learner in the
driver, learning held off past the capacity so that only the fill runs) with the RLlibProbe in
their config. Each second the probe is read as the sidecar reads it (`--ray-results URL`:
sources/ray_results.py) and the driver at capacity projected (diagnosis/rllib_memory.py);
the projections made once a quarter and once half of the capacity was stored are compared
with the driver's resident memory when the buffer first held its capacity. One shape per
row, each a job of its own.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.results_md import write_sections
from bench.rllib_venv import RLLIB_PY, bench_args
from harness.cgroups import remove_group
from harness.procs import Proc
from replaywatch.config import PollConfig, RayTarget, WatchConfig
from replaywatch.diagnosis import rllib_job as rj
from replaywatch.diagnosis.rllib_memory import driver_at_capacity
from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.model import Name
from replaywatch.ray_model import RaySnapshot, RllibLive
from replaywatch.sources.ray_results import ResultProbe
from replaywatch.state import Published
from replaywatch.wiring import Sidecar, build_sidecar

V1 = Path("/sys/fs/cgroup/memory")
LIMITED = (64, 6_000)  # the shape run into a real limit: half its remaining fill's bytes
HOLD_S = 150.0  # how long it is watched once its limit is set
FULL_S = 60.0  # how long the printed capacity is watched once its buffer is full

HEADING = "## An RLlib driver's replay buffer: its memory at capacity, projected as it fills"
SHAPES = ((16, 12_000), (64, 6_000))  # (observation KiB, capacity in env steps)


def job_args(where: Path, obs_kib: int, capacity: int) -> list[str]:
    return [str(RLLIB_PY), "harness/rllib_job.py", "--algo", "dqn", "--num-learners", "0",
                "--num-env-runners", "1", "--min-steps-per-iteration", "200",
                "--learning-starts", str(10 * capacity), "--replay-capacity", str(capacity),
                "--uniform-replay", "--obs-kib", str(obs_kib), "--num-cpus", "2",
                "--seconds", "900", "--temp-dir", str(where / "ray"),
                "--logdir", str(where / "log"), "--probe-listen", "127.0.0.1:0", "--no-rows"]


def run(where: Path, obs_kib: int, capacity: int) -> dict[str, Any]:
    job = Proc(job_args(where, obs_kib, capacity), stdout_path=where / "job.log",
               env={"OMP_NUM_THREADS": "1"})
    try:
        url = job.announce(timeout_s=240, match=lambda r: r.get("event") == "rllib_job")[
            "rllib_probe"]
        reader, history = ResultProbe(url, timeout_s=2.0), []
        th = Thresholds()
        at: dict[float, dict[str, Any]] = {}
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            reader.read()
            live = reader.live
            if live is not None and live.env_steps_stored is not None:
                history.append(RaySnapshot("bench", live.observed_at, "job", None, live=live))
                stored = live.env_steps_stored
                if stored >= capacity:
                    full = live.rss_bytes
                    break
                job_now = rj.read_job("bench", history, th, live.observed_at)
                said = driver_at_capacity(job_now) if job_now is not None else None
                for share in (0.25, 0.5):
                    if said is not None and share not in at and stored >= share * capacity:
                        at[share] = said
            time.sleep(1.0)
        else:
            raise SystemExit(f"the buffer of {capacity} steps did not fill in 600 s")
    finally:
        job.kill()
    return {"obs_kib": obs_kib, "capacity": capacity, "full_bytes": full,
            "projections": {share: (s["at_capacity_bytes"], s["bytes_per_env_step"])
                            for share, s in at.items()}}


@contextlib.contextmanager
def watched(where: Path, obs_kib: int, capacity: int, group: Path
            ) -> Iterator[tuple[Proc, Sidecar, str]]:
    """The job in memory cgroup `group` (v1, as root; removed after), and a sidecar core
    reading it through its probe (`--ray-results URL`), ticked by the caller: (the job, the
    sidecar, the target's name)."""
    job = Proc([*job_args(where, obs_kib, capacity), "--cgroup", str(group)],
               stdout_path=where / "job.log", env={"OMP_NUM_THREADS": "1"})
    try:
        announced = job.announce(timeout_s=240, match=lambda r: r.get("event") == "rllib_job")
        target = RayTarget(announced["dashboard_url"], temp_dir=str(where / "ray"),
                           results=announced["rllib_probe"])
        config = WatchConfig(targets=(), ray=(target,),
                             poll=PollConfig(interval_s=1.0, timeout_s=3.0))
        with build_sidecar(config, incidents_path=str(where / "i.db")) as car:
            yield job, car, target.name
    finally:
        job.kill()
        _empty(group)


def tick(car: Sidecar, target: str) -> tuple[Published, RllibLive | None]:
    """One cycle, a second apart from the last: the picture and the probe's reading."""
    t0 = time.monotonic()
    state = car.poller.tick()
    snap = state.ray.get(target)
    time.sleep(max(0.0, 1.0 - (time.monotonic() - t0)))
    return state, snap.live if snap is not None else None


def limited(where: Path, obs_kib: int, capacity: int) -> dict[str, Any]:
    """The job in a memory cgroup whose limit, set once a tenth of the buffer is stored,
    leaves room for half of what the rest of the fill needs, watched every second until the
    kernel kills it or HOLD_S after the limit."""
    group = V1 / f"replaywatch-bench-{os.getpid()}-rllib"
    group.mkdir()
    out: dict[str, Any] = {"obs_kib": obs_kib, "capacity": capacity}
    th = Thresholds()
    began = time.monotonic()
    held = cycles = 0
    with watched(where, obs_kib, capacity, group) as (job, car, target):
        while (time.monotonic() - began < 600 and job.popen.poll() is None
               and time.monotonic() - out.get("limit_set_at", time.monotonic()) < HOLD_S):
            state, live = tick(car, target)
            if live is not None and live.env_steps_stored is not None:
                out["stored"] = live.env_steps_stored
            if "limit_bytes" not in out and live is not None and live.env_steps_stored \
                    and live.env_steps_stored >= 0.1 * capacity:
                job_now = rj.read_job(target, car.history.ray(target), th, time.time())
                said = driver_at_capacity(job_now) if job_now is not None else None
                if said is not None:
                    usage = int((group / "memory.usage_in_bytes").read_text())
                    out["limit_bytes"] = int(usage + 0.5 * (capacity - said[
                        "env_steps_stored"]) * said["bytes_per_env_step"])
                    (group / "memory.limit_in_bytes").write_text(str(out["limit_bytes"]))
                    out["limit_set_at"] = time.monotonic()
            found = [f for f in state.findings if f.kind == Name.MEMORY_EXHAUSTION]
            if found and "named_at" not in out:
                out.update(named_at=time.monotonic(), named_stored=out.get("stored"),
                           evidence=found[0].evidence, fix=found[0].fix)
            if "named_at" in out:
                cycles, held = cycles + 1, held + bool(found)
            if "first_kill_at" not in out and _oom_kills(group):
                out["first_kill_at"] = time.monotonic()
        out["killed_at"] = time.monotonic() if job.popen.poll() is not None else None
        out.update(oom_kills=_oom_kills(group), held=held, cycles=cycles)
    return out


def printed(where: Path, obs_kib: int, capacity: int, limit: int) -> dict[str, Any]:
    """The fix printed, run: the same job with the capacity `memory_exhaustion` gave, in a
    memory cgroup with the same limit from its start, watched by a sidecar until its buffer
    has been full for FULL_S: its OOM kills and the cycles the finding was said in."""
    group = V1 / f"replaywatch-bench-{os.getpid()}-fits"
    group.mkdir()
    (group / "memory.limit_in_bytes").write_text(str(limit))
    out: dict[str, Any] = {"capacity": capacity, "limit_bytes": limit}
    began, full_at, said = time.monotonic(), None, 0
    with watched(where, obs_kib, capacity, group) as (job, car, target):
        while (time.monotonic() - began < 400 and job.popen.poll() is None
               and (full_at is None or time.monotonic() - full_at < FULL_S)):
            state, live = tick(car, target)
            if full_at is None and live is not None and live.env_steps_stored is not None \
                    and live.env_steps_stored >= capacity:
                full_at = time.monotonic()
            said += any(f.kind == Name.MEMORY_EXHAUSTION for f in state.findings)
        out.update(full=full_at is not None, oom_kills=_oom_kills(group), said=said,
                   driver_died=job.popen.poll() is not None,
                   peak_bytes=int((group / "memory.max_usage_in_bytes").read_text()))
    return out


def _oom_kills(group: Path) -> int | None:
    for line in (group / "memory.oom_control").read_text().splitlines():
        if line.startswith("oom_kill "):
            return int(line.split()[1])
    return None


def _empty(group: Path) -> None:
    """Kills what the job left in its group (the local cluster's processes), then removes it."""
    for _ in range(50):
        pids = [int(p) for p in (group / "cgroup.procs").read_text().split()]
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)
    remove_group(group)


def main() -> int:
    args = bench_args(__doc__)
    if args is None:
        return 2
    began, rows = time.monotonic(), []
    for obs_kib, capacity in SHAPES:
        with tempfile.TemporaryDirectory(prefix="rwrm-", dir="/tmp") as tmp:
            rows.append(run(Path(tmp), obs_kib, capacity))
            print(rows[-1], flush=True)
    with tempfile.TemporaryDirectory(prefix="rwrm-", dir="/tmp") as tmp:
        killed = limited(Path(tmp), *LIMITED)
        print({k: v for k, v in killed.items() if k != "evidence"}, flush=True)
    fits = (killed.get("evidence") or {}).get("capacity_that_fits")
    fixed: dict[str, Any] = {}
    if fits and killed.get("limit_bytes"):
        with tempfile.TemporaryDirectory(prefix="rwrm-", dir="/tmp") as tmp:
            fixed = printed(Path(tmp), LIMITED[0], int(fits), killed["limit_bytes"])
            print(fixed, flush=True)
    text = render(rows, killed, fixed, (time.monotonic() - began) / 60)
    print(text)
    if args.results:
        write_sections(args.results, [text])
    errors = [abs(a / r["full_bytes"] - 1) for r in rows for a, _ in r["projections"].values()]
    named, kill = killed.get("named_at"), killed.get("first_kill_at")
    named_first = named is not None and (kill is None or named < kill)
    held = fixed.get("full") and fixed.get("oom_kills") == 0 and not fixed.get("said")
    return 0 if (errors and len(errors) == 2 * len(rows) and max(errors) <= 0.1
                 and named_first and held) else 1


def render(rows: list[dict[str, Any]], killed: dict[str, Any], fixed: dict[str, Any],
           minutes: float) -> str:
    mib = lambda b: f"{b / 2**20:,.0f}"  # noqa: E731
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    lines = [f"{HEADING} ({minutes:.1f} min, {stamp})",
             "", "`make bench-rllib-memory` (bench/rllib_memory.py): real DQN jobs (Ray 2.60, "
             "CartPole-v1, each observation padded with noise to the size given, one "
             "EnvRunner, the learner in the driver, learning held off so that only the fill "
             "runs) with the RLlibProbe, read every second as the sidecar reads it; the "
             "driver's memory at capacity projected once a quarter and half of it was stored "
             "(diagnosis/rllib_memory.py: an env step's bytes measured over the fill since 5 % "
             "of it), against its resident memory when the buffer first held its capacity.", "",
             "| observation | capacity (env steps) | bytes a step, at a quarter | projected at a "
             "quarter (MiB) | at half (MiB) | used when full (MiB) | error at a quarter, at "
             "half |", "| ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        pr, full = r["projections"], r["full_bytes"]
        q, h = pr.get(0.25), pr.get(0.5)
        err = lambda x, full=full: (  # noqa: E731
            "-" if x is None else f"{100 * (x[0] / full - 1):+.1f} %")
        per = "-" if q is None else f"{q[1]:,.0f}"
        lines.append(f"| {r['obs_kib']} KiB | {r['capacity']:,} | {per} | "
                     f"{'-' if q is None else mib(q[0])} | {'-' if h is None else mib(h[0])} | "
                     f"{mib(full)} | {err(q)}, {err(h)} |")
    lines += ["", "The projection is the driver's memory now plus the steps still to store at "
              "the bytes a step cost so far (the driver's resident memory's growth); "
              "`memory_exhaustion` is said when it passes the driver's limit (its memory "
              "cgroup's, weighed against the group's anonymous memory, else the host's), or "
              "while the group OOM-kills (a kill within the look-back, the buffer filling or "
              "full), with the capacity that keeps it under 85 % of it as projected.", ""]
    k = killed
    if k.get("limit_bytes"):
        named, kill = k.get("named_at"), k.get("first_kill_at")
        before = ("never named" if not named else "before any OOM kill" if not kill else
                  f"{kill - named:.0f} s before the first OOM kill" if named < kill else
                  f"{named - kill:.0f} s after the first OOM kill")
        fits = (k.get("evidence") or {}).get("capacity_that_fits")
        lines += [f"Into a real limit: the {k['obs_kib']} KiB job of {k['capacity']:,} steps in "
                  f"a memory cgroup (v1) whose limit, set once a tenth was stored, was "
                  f"{k['limit_bytes'] / 2**20:,.0f} MiB (its usage then plus half of what the "
                  f"rest of the fill needs), watched {HOLD_S:g} s from then: "
                  "`memory_exhaustion` was named "
                  + (f"{named - k['limit_set_at']:.0f} s after the limit was set, at "
                     f"{k.get('named_stored')} steps stored, {before}, and held in "
                     f"{k.get('held')} of the {k.get('cycles')} cycles after" if named
                     else before)
                  + f"; the cgroup counted {k.get('oom_kills')} OOM kills"
                  + (" (the driver was killed)" if k.get("killed_at") else
                     " (the kernel killed the EnvRunner, which Ray restarted, not the driver)")
                  + f"; the capacity it printed: {fits} env steps.", ""]
    if fixed:
        lines += [f"The fix printed, run: the same job with a capacity of {fixed['capacity']:,} "
                  f"env steps in a cgroup limited to {fixed['limit_bytes'] / 2**20:,.0f} MiB "
                  "from its start, watched until its buffer had been full for "
                  f"{FULL_S:g} s: " + ("full" if fixed.get("full") else "never full")
                  + f", {fixed.get('oom_kills')} OOM kills, the group's peak "
                  f"{fixed['peak_bytes'] / 2**20:,.0f} MiB, `memory_exhaustion` said in "
                  f"{fixed.get('said')} cycles"
                  + (" (the driver died)" if fixed.get("driver_died") else "") + ".", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
