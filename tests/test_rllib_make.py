"""make test's RLlib case: a `ray start --head` cluster on this machine running two real RLlib
jobs (Ray 2.60, torch on the CPU, .venv-rllib), and one sidecar with `--ray-job all`: no
per-job flag and no code change in either job.

The first job, a DQN with its replay buffer and one EnvRunner, trains, then its environment
hangs in `step()`; the second is a warm-up that cannot end in days (it samples, never trains).
Each is a target within one discovery interval of its start. Nothing is paged while the first
trains, nor ever on the second, which is said to be warming up (`warmup`, at info) and reads
none of its neighbour's trained steps; the hang is
`env_runner_stalled` within the window the finding states plus two polls of the job's last
trained step, with its fix, and its bundle carries the hung runner's stacks and replays to the
same verdict. Then the first job's driver is killed: it leaves the watch after its TTL, its
incidents closed as gone, never paged for it, and the second stays.

The rest of the RLlib tier runs in `make test-ray`: four jobs on one cluster with
`--ray-job all --ray-results DIR` (tests/test_rllib_cluster.py: a hung environment, a
warm-up told by its rows, APPO dropping steps to its own end, a training_intensity it cannot
reach then a hung Learner), and each fault on a cluster of its own (tests/test_rllib_tier.py).
In make test the four cost it 527 to 647 s against 474 to 564 with this case. make test
builds .venv-rllib beside the other venvs; where it cannot (no Python 3.11, no CPU build of
torch), this case skips with one line.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from harness.procs import Proc
from replaywatch import bundle as bd
from replaywatch.config import ALL_JOBS, PollConfig, RayTarget, WatchConfig
from replaywatch.model import Finding, Name, Severity
from replaywatch.sources.ray_jobs import DISCOVER_EVERY_S
from replaywatch.wiring import build_sidecar
from tests.support.rllib_jobs import (
    INTERVAL_S,
    RLLIB_PY,
    RLLIB_READY,
    SLACK_S,
    start_head,
    windows_in,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.frameworks,
    pytest.mark.rllib,
    pytest.mark.timeout(420),
    pytest.mark.skipif(not RLLIB_READY.exists(), reason="no .venv-rllib: make rllib-venv says why"),
]
# The cheapest job that has an EnvRunner actor: its Learner in the driver, short iterations
# (a rhythm of a few seconds).
JOB = ["--algo", "dqn", "--num-learners", "0", "--num-env-runners", "1",
       "--min-steps-per-iteration", "100", "--seconds", "400"]
HANG_AFTER = 450  # env steps: four iterations of 100, three of them training, before it
TTL_S = 20.0


def test_two_jobs_on_a_ray_start_cluster_are_found_the_hung_one_named_then_gone_after_its_ttl(
        spawn: Callable[..., Proc], tmp_path: Path, short_temp: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    port, dashboard = start_head(spawn, tmp_path / "home", short_temp, monkeypatch, 4)

    def start(name: str, *flags: str) -> Proc:
        # One torch thread per process, as Ray gives its actors (OMP_NUM_THREADS=1) but not
        # the driver, whose learner is in the driver here.
        return spawn([str(RLLIB_PY), "harness/rllib_job.py", *JOB, "--address",
                      f"127.0.0.1:{port}", *flags, "--logdir", str(tmp_path / name)],
                     name=name, env={"OMP_NUM_THREADS": "1"})

    def announced(proc: Proc) -> dict:
        said = proc.announce(timeout_s=240, match=lambda r: r.get("event") == "rllib_job")
        return {**said, "at": time.monotonic()}

    # Both start together: their start-ups (torch, RLlib) overlap.
    hung = start("hung", "--learning-starts", "100", "--hang-env-after", str(HANG_AFTER),
                 "--hang-env-runner", "1")
    # Its Learner an actor of its own: a learner in the driver exports no trained counter
    # before its first update, so from outside a warm-up could not be told from a job that
    # never learns.
    # Paced at 20 env steps a second, as a simulator would be: sampling CartPole flat out for
    # the whole case cost make test a core (136 CPU-s for the case, against 39 for one job).
    warm = start("warm", "--learning-starts", "500000000", "--num-learners", "1",
                 "--env-step-s", "0.05")
    a_said, b_said = announced(hung), announced(warm)
    a, b = (f"{dashboard} job {s['job_id']}" for s in (a_said, b_said))

    config = WatchConfig(targets=(), ray=(RayTarget(dashboard, temp_dir=str(short_temp),
                                                    job_id=ALL_JOBS, job_ttl_s=TTL_S),),
                         poll=PollConfig(interval_s=INTERVAL_S, timeout_s=3.0))
    kind = Name("env_runner_stalled")
    paged: list[tuple[float, Finding]] = []
    said: dict[str, set[str]] = {a: set(), b: set()}  # every kind said of each, any severity
    trained: dict[str, float] = {}  # each job's env steps trained, as last read
    moved: list[float] = []  # when the first job's trained count was seen to move
    found: dict[str, float] = {}
    with build_sidecar(config, incidents_path=str(tmp_path / "i.db")) as car:

        def tick_until(done: Callable[[set[str]], bool], within_s: float) -> float | None:
            began = time.monotonic()
            while time.monotonic() - began < within_s:
                state = car.poller.tick()
                now = time.monotonic()
                paged.extend((now, f) for f in state.findings if f.severity >= Severity.WARNING)
                for f in state.findings:
                    said.setdefault(f.target, set()).add(str(f.kind))
                for name, snap in state.ray.items():
                    found.setdefault(name, now)
                    steps = sum(c.env_steps_trained or 0.0 for c in snap.counters)
                    if name == a and steps != trained.get(a):
                        moved.append(now)
                    trained[name] = steps
                if done(set(state.ray)):
                    return now
                time.sleep(max(0.0, INTERVAL_S - (time.monotonic() - began) % INTERVAL_S))
            return None

        named_at = tick_until(lambda _: any(f.kind == kind and f.target == a for _, f in paged),
                              240.0)
        # The stacks and the bundle are taken off the poller's thread.
        deadline = time.monotonic() + (30.0 if named_at is not None else 0.0)
        while time.monotonic() < deadline and not any((tmp_path / "bundles").glob("*.json")):
            time.sleep(0.2)
        hung.kill()  # its driver: Ray ends its actors
        killed = time.monotonic()
        left = tick_until(lambda ray: a not in ray, TTL_S + DISCOVER_EVERY_S + 30.0)
        stayed = tick_until(lambda ray: b not in ray, 3.0) is None
        closed = car.incidents.list("all", target=a)

    print(f"\nfound the hung job {found.get(a, 0) - a_said['at']:.1f} s and the warm-up "
          f"{found.get(b, 0) - b_said['at']:.1f} s after they announced; env steps trained as "
          f"read: the hung job {trained.get(a)}, the warm-up {trained.get(b)}; said of the "
          f"warm-up: {sorted(said.get(b, ()))}; the hung job left "
          f"{left and left - killed:.1f} s after its driver was killed (TTL {TTL_S:g} s)")
    # Found with no per-job flag, each within one discovery interval of its announcement
    # (its first RLlib actor is listed before the job prints it).
    for name, s in ((a, a_said), (b, b_said)):
        assert name in found, (name, sorted(found))
        assert found[name] - s["at"] <= DISCOVER_EVERY_S + 2 * INTERVAL_S + SLACK_S, name
    named = [(t, f) for t, f in paged if f.kind == kind and f.target == a]
    assert named, [(f.target, f.kind) for _, f in paged[:5]]
    at, finding = named[0]
    # Ray reports its counters every 10 s: two iterations may show as one move.
    assert len([t for t in moved if t < at]) >= 2, "it never trained: the case proves nothing"
    assert [(f.target, f.kind) for t, f in paged if t < at] == [], "paged while it trained"
    window = max(windows_in(finding.evidence))
    last_progress = max(t for t in moved if t < at)
    print(f"{kind}: trained {len(moved)} times unpaged, named {at - last_progress:.1f} s after "
          f"its last trained step (window {window:.1f} s + 2 polls)")
    assert at - last_progress <= window + 2 * INTERVAL_S + SLACK_S, (
        at - last_progress, window, finding.evidence)
    assert finding.fix
    # The warm-up: never paged, and none of its neighbour's trained steps read as its own.
    assert [f.kind for _, f in paged if f.target == b] == []
    assert trained.get(b) == 0, "the warm-up read its neighbour's trained steps"
    assert Name.WARMUP in said[b], said[b]
    # The bundle holds the hung runner's stacks (the dashboard's py-spy where Ray serves it,
    # else this host's: the cluster is on this host), the frame it hangs in (the environment's
    # step) among them, and `analyze` gives the same verdict.
    written = sorted((tmp_path / "bundles").glob("*.json"))
    assert written, "no bundle written for a critical finding"
    doc = bd.read(str(written[0]))
    pid = finding.evidence["runner_pids"][0]
    taken = (doc.doc.get("stacks") or {}).get(f"ray:{pid}")
    assert taken is not None, (doc.doc.get("missing"), list(doc.doc.get("stacks") or {}))
    text = json.dumps(taken)
    assert "HangAfterSteps.step" in text and "harness/rllib_job.py" in text, text[:2000]
    assert {f.kind for f in bd.verdict(doc.inputs)} >= {kind}
    # Its driver killed: gone after its TTL from its last live read, not paged for it, its
    # incidents closed as gone; the warm-up is still watched.
    assert left is not None and left - killed >= TTL_S - DISCOVER_EVERY_S
    assert stayed, "the warm-up left with the hung job"
    assert [f.kind for t, f in paged if t > at and f.kind != kind] == []
    # What was open when its driver was killed (the paged stall) closes as gone; a stall
    # said at info while its start-up was slow on loaded cores resolved when it trained.
    paged_incidents = [r for r in closed if r["severity"] != "info"]
    assert paged_incidents and all(r["closed_as"] == "gone" for r in paged_incidents), [
        (r["kind"], r["severity"], r["closed_as"]) for r in closed]

