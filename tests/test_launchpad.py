"""The Launchpad tier: replaywatch on real Launchpad programs, in seed 002's topology.

The programs (harness/launchpad_program.py) run from a second venv, on Python 3.10 with
dm-launchpad 0.5.2, Reverb 0.7.2 and TensorFlow 2.8 (`make launchpad-venv`; its interpreter
in REPLAYWATCH_LAUNCHPAD_PYTHON), launched as Launchpad launches locally:
`lp.launch(program, launch_type="local_mp", terminal="current_terminal")`, one process per
node. replaywatch watches from this venv by the addresses the nodes report: the
`ReverbNode`'s server, the learner's `TrainerProbe` and each producer's `ActorProbe`. Two
sidecar cores tick by hand, one given every probe, one Reverb alone.

Acme's own distributed program is not a case here. dm-acme 0.4.0 (the release of the seeds'
time) pins dm-launchpad==0.5.0 and dm-reverb 0.7.0, so it does not install beside this
Launchpad (0.5.2, which resolves with TensorFlow 2.8); resolved on its own it takes jax 0.6,
numpy 2 and protobuf 7, and then TensorFlow 2.8 fails to import ("Descriptors cannot be created
directly", seen here). The seed's topology is built here node for node instead.

Without a Python 3.10 the module is skipped with that reason, unless
REPLAYWATCH_REQUIRE_LAUNCHPAD=1 (CI's .ci/run), where it fails.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from harness.procs import ROOT, Proc
from replaywatch.config import PollConfig, ProbeTarget, WatchConfig
from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.model import Finding, Severity
from replaywatch.state import Published
from replaywatch.wiring import Sidecar, build_sidecar

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400), pytest.mark.frameworks,
              pytest.mark.launchpad]

PROGRAM = "harness/launchpad_program.py"
POLL_S = 0.25
THRESHOLDS = Thresholds(stall_window_s=3.0, min_history_s=1.0, startup_grace_s=1.0)
HEALTHY_S = 12.0  # four stall windows of a healthy program
# A stall window and polls, with room for four busy nodes on 2 cores.
NAMED_WITHIN_S = 20.0
# The seed's batch and samples per insert, with a small error buffer (a short warm-up).
SEED_COLOCATED = ("--form", "colocated", "--batch-size", "256", "--samples-per-insert", "128",
                  "--min-size", "1000", "--error-buffer", "256")


def launchpad_python() -> str:
    """The Launchpad venv's interpreter; skip (or fail, where CI requires the tier)."""
    path = os.environ.get("REPLAYWATCH_LAUNCHPAD_PYTHON") or str(
        ROOT / ".venv-launchpad" / "bin" / "python")
    if Path(path).exists():
        return path
    reason = (f"no Launchpad venv ({path}): `make launchpad-venv` needs a Python 3.10 "
              "(on PATH or under pyenv)")
    if os.environ.get("REPLAYWATCH_REQUIRE_LAUNCHPAD") == "1":
        pytest.fail(f"REPLAYWATCH_REQUIRE_LAUNCHPAD=1: {reason}")
    pytest.skip(reason)


class Program:
    """A running Launchpad program: its nodes' reports, and control over the learner."""

    def __init__(self, proc: Proc, control: Path):
        self.proc, self.control = proc, control

    def nodes(self, count: int, timeout_s: float = 150.0) -> dict[str, dict[str, Any]]:
        deadline = time.monotonic() + timeout_s
        report = self.control / "nodes.jsonl"
        while time.monotonic() < deadline:
            lines = report.read_text().splitlines() if report.exists() else []
            if len(lines) >= count:
                return {d["node"]: d for d in map(json.loads, lines)}
            assert self.proc.returncode is None, self.proc.log_path.read_text()[-3000:]
            time.sleep(0.2)
        raise TimeoutError(f"{count} nodes did not report in {timeout_s} s")

    def hang_learner(self, hung: bool) -> None:
        flag = self.control / "hang"
        flag.touch() if hung else flag.unlink()


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Callable[..., Program]]:
    python = launchpad_python()
    procs: list[Proc] = []

    def start(*flags: str) -> Program:
        control = tmp_path / f"program-{len(procs)}"
        control.mkdir()
        proc = Proc([python, PROGRAM, "--control-dir", str(control), *flags],
                    stdout_path=tmp_path / f"program-{len(procs)}.log")
        procs.append(proc)
        return Program(proc, control)

    yield start
    for proc in procs:
        proc.kill()  # the launcher's group: every node and its output wrapper


def sidecar(stack: ExitStack, nodes: dict[str, dict[str, Any]], probes: bool) -> Sidecar:
    reverb = nodes["learner"]["reverb"].replace("localhost", "127.0.0.1")
    urls = sorted(n["probe"] for n in nodes.values()) if probes else []
    # Polled every 0.25 s, each poll given 1 s: at the default 0.2 s, three slow answers in a
    # row on loaded cores (0.75 s) read as probe_down on a healthy loop. The default 1 s
    # interval gives a probe 3 s.
    config = WatchConfig(targets=(reverb,), probes=tuple(ProbeTarget(u, None) for u in urls),
                         thresholds=THRESHOLDS,
                         poll=PollConfig(interval_s=POLL_S, timeout_s=1.0, history_s=300.0))
    return stack.enter_context(build_sidecar(config, incidents_path=":memory:"))


def alarms(state: Published) -> list[Finding]:
    return [f for f in state.findings if f.severity >= Severity.WARNING]


def watch_until(sidecars: tuple[Sidecar, ...], done: Callable[[list[Published]], bool],
                timeout_s: float) -> tuple[list[Published], float]:
    """Ticks both sidecars until `done(states)`; their states and the seconds it took."""
    began = time.monotonic()
    while True:
        states = [s.poller.tick() for s in sidecars]
        if done(states):
            return states, time.monotonic() - began
        assert time.monotonic() - began < timeout_s, [
            [(f.kind, f.summary) for f in s.findings] for s in states]
        time.sleep(POLL_S)


def finding(state: Published, kind: str) -> Finding | None:
    return next((f for f in state.findings if f.kind == kind), None)


def test_producers_and_a_learner_in_their_own_nodes_healthy_then_a_hung_learner_then_dead_producers(
        launch: Callable[..., Program]) -> None:
    program = launch("--form", "separate", "--producers", "2")
    nodes = program.nodes(3)
    with ExitStack() as stack:
        probed, alone = sidecar(stack, nodes, True), sidecar(stack, nodes, False)
        both = (probed, alone)

        # Healthy: producers insert, the learner trains; nothing warns or pages.
        seen: list[Finding] = []
        began = time.monotonic()
        while time.monotonic() - began < HEALTHY_S:
            seen += [f for s in both for f in alarms(s.poller.tick())]
            time.sleep(POLL_S)
        assert not seen, [(f.kind, f.summary) for f in seen]
        names = {a.name for a in probed.poller.tick().actors.values()}
        assert names >= {"producer-0", "producer-1"}, names

        # The learner node hangs (its probe still answers): the producers fill the table to
        # max_diff and block.
        program.hang_learner(True)
        (p_state, a_state), took = watch_until(
            both, lambda s: bool(finding(s[0], "learner_stalled")
                                 and finding(s[1], "insert_blocked")), NAMED_WITHIN_S)
        print(f"\nhung learner: learner_stalled and insert_blocked in {took:.1f} s")
        stalled = finding(p_state, "learner_stalled")
        assert stalled is not None and stalled.severity is Severity.CRITICAL
        program.hang_learner(False)
        watch_until(both, lambda s: not any(alarms(x) for x in s), NAMED_WITHIN_S)

        # A producer node dies: named by its probe; the other one goes on inserting.
        os.kill(nodes["producer-1"]["pid"], signal.SIGKILL)
        (p_state, _), took = watch_until(
            both, lambda s: finding(s[0], "probe_down") is not None, NAMED_WITHIN_S)
        down = finding(p_state, "probe_down")
        assert down is not None and nodes["producer-1"]["probe"] in json.dumps(down.evidence)
        assert nodes["producer-0"]["probe"] not in json.dumps(down.evidence)
        print(f"producer-1 killed: probe_down in {took:.1f} s")

        # The last producer dies: the learner waits in next() on a table nobody fills.
        os.kill(nodes["producer-0"]["pid"], signal.SIGKILL)
        (p_state, a_state), took = watch_until(
            both, lambda s: bool(finding(s[0], "sample_blocked")
                                 and finding(s[1], "sample_blocked")), NAMED_WITHIN_S)
        print(f"producer-0 killed: sample_blocked in {took:.1f} s")
        down = finding(p_state, "probe_down")
        assert down is not None and nodes["producer-0"]["probe"] in json.dumps(down.evidence)
        assert finding(p_state, "worker_starvation") is None  # dead actors, not a circular wait


def test_the_seeds_synchronous_loop_colocated_with_its_reverb_node_is_worker_starvation(
        launch: Callable[..., Program]) -> None:
    program = launch(*SEED_COLOCATED, "--workers", "12")
    nodes = program.nodes(1)
    with ExitStack() as stack:
        probed, alone = sidecar(stack, nodes, True), sidecar(stack, nodes, False)
        (p_state, a_state), took = watch_until(
            (probed, alone), lambda s: bool(finding(s[0], "worker_starvation")
                                            and finding(s[1], "sample_blocked")), 90.0)
    starved = finding(p_state, "worker_starvation")
    assert starved is not None and starved.severity is Severity.CRITICAL
    ev = starved.evidence
    print(f"\ncolocated seed: worker_starvation {took:.1f} s after attaching; stranded "
          f"{ev['stranded_samples']} of {ev['drawn']} drawn")
    # The loop's own writer, wrapped by the trainer probe, proves the synchronous layout.
    assert (ev["layout"], ev["layout_basis"], ev["workers"]) == ("sync", "loop writer", 12), ev
    assert 256 <= ev["stranded_samples"] < 12 * 256, ev
    assert "num_parallel_calls=1 (now 12" in starved.fix
    assert finding(a_state, "worker_starvation") is None  # Reverb alone cannot prove it


def test_the_same_colocated_loop_with_one_worker_learns_with_no_alarm(
        launch: Callable[..., Program]) -> None:
    program = launch(*SEED_COLOCATED, "--workers", "1")
    nodes = program.nodes(1)
    seen: list[Finding] = []
    steps: list[int] = []
    with ExitStack() as stack:
        probed, alone = sidecar(stack, nodes, True), sidecar(stack, nodes, False)
        began = time.monotonic()
        while time.monotonic() - began < HEALTHY_S:
            p_state, a_state = probed.poller.tick(), alone.poller.tick()
            seen += alarms(p_state) + alarms(a_state)
            steps += [p.learner_steps for p in p_state.probes.values()]
            time.sleep(POLL_S)
    assert not seen, [(f.kind, f.summary) for f in seen]
    assert steps and steps[-1] > steps[0] + 20, steps  # one step per 2 inserts goes on
