"""Priority updates on real Reverb: counted by the learner's probe, judged against the table.

Two servers, each with a table of 200 items and a learner whose trainer probe wraps its
client with `wrap_client(client, inserts=False)` (it samples and updates priorities, it does
not insert): one table Uniform (acme#69's "priority table"), one Prioritized. The learner
samples keys and sends them new priorities. The sidecar's own poller must name
priorities_ignored on the Uniform table within two polls of the first update, with the
counts in its evidence, and never on the Prioritized one; a NaN priority, which Reverb
refuses, is counted as rejected with Reverb's error and named priority_updates_rejected (a
warning: one call of two); a learner whose every update is refused is named critical, and
resolved once its priorities are finite. Each cycle a finding opens in replays to the live
verdict from its bundle.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import reverb
import tensorflow as tf

from harness.procs import get_json
from replaywatch.config import PollConfig, ProbeTarget, WatchConfig
from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.metrics import make_registry, render
from replaywatch.model import Severity
from replaywatch.probe import TrainerProbe
from replaywatch.state import Published
from replaywatch.wiring import build_sidecar
from tests.support.repro import assert_replays, tick_until

pytestmark = pytest.mark.long


def job(sampler: Any) -> tuple[reverb.Server, reverb.Client, TrainerProbe, Any]:
    server = reverb.Server([reverb.Table("replay", sampler, reverb.selectors.Fifo(), 1000,
                                         reverb.rate_limiters.MinSize(1))], port=None)
    client = reverb.Client(f"127.0.0.1:{server.port}")
    for _ in range(200):
        client.insert([np.zeros(4, np.float32)], {"replay": 1.0})
    probe = TrainerProbe(table="replay", batch_size=8)
    probe.start()
    return server, client, probe, probe.wrap_client(client, inserts=False)


def keys(client: reverb.Client, n: int = 8) -> list[int]:
    # Samples are drawn with replacement: draw until n distinct keys, so an update's key
    # count is n and not n less the repeats.
    seen: dict[int, None] = {}
    while len(seen) < n:
        for s in client.sample("replay", num_samples=n):
            seen.setdefault(int(s[0].info.key))
    return list(seen)[:n]


def test_updates_to_a_uniform_table_are_ignored_and_a_nan_is_rejected(tmp_path: Path) -> None:
    uniform, prioritized = job(reverb.selectors.Uniform()), job(
        reverb.selectors.Prioritized(0.8))
    targets = [f"127.0.0.1:{j[0].port}" for j in (uniform, prioritized)]
    config = WatchConfig(targets=tuple(targets), probes=tuple(
        ProbeTarget(str(j[2].url), t) for j, t in zip((uniform, prioritized), targets)),
        poll=PollConfig(interval_s=1.0, history_s=300.0))
    try:
        with build_sidecar(config, incidents_path=str(tmp_path / "i.db")) as sidecar:
            for _ in range(3):
                assert not sidecar.poller.tick().findings
            for _, client, _, learner in (uniform, prioritized):
                learner.mutate_priorities("replay", {k: 2.0 for k in keys(client)})
            polls, state = 0, None
            while polls < 2:
                state = sidecar.poller.tick()
                polls += 1
                if any(f.kind == "priorities_ignored" for f in state.findings):
                    break
            assert state is not None
            [f] = [f for f in state.findings if f.kind == "priorities_ignored"]
            assert f.target == targets[0] and f.table == "replay"
            assert (f.evidence["sampler"], f.evidence["update_calls"]) == ("uniform", 1)
            assert f.evidence["keys_updated"] == 8
            assert_replays(sidecar, state)
            exposed = render(make_registry(lambda: state)).decode()
            assert (f'replaywatch_probe_priority_update_keys_total{{probe="{uniform[2].url}",'
                    f'table="replay",target="{targets[0]}"}} 8.0') in exposed

            # A NaN priority: Reverb refuses the request; the probe counts it and says why.
            _, client, probe, learner = prioritized
            with pytest.raises(Exception) as refused:
                learner.mutate_priorities("replay", {keys(client, 1)[0]: math.nan})
            doc = get_json(f"{probe.url}/probe", 5.0)[1]["priority_updates"]["replay"]
            assert (doc["calls"], doc["errors"], doc["rejected_keys"]) == (2, 1, 1)
            assert doc["last_error"].startswith(type(refused.value).__name__)
            # Within two polls, as above: on a loaded host a probe's answer can miss its
            # poll's deadline and be recorded at the next (CI once saw none at the first).
            for _ in range(2):
                state = sidecar.poller.tick()
                if any(f.target == targets[1] for f in state.findings):
                    break
            # One call refused of two: named, as a warning (not every update was refused).
            [f] = [f for f in state.findings if f.target == targets[1]]
            assert (f.kind, f.severity) == ("priority_updates_rejected", Severity.WARNING)
            assert (f.evidence["refused_in_window"], f.evidence["rejected_keys"]) == (1, 1)
            assert "NaN" in f.evidence["last_error"]
            assert_replays(sidecar, state)
    finally:
        for server, _, probe, _ in (uniform, prioritized):
            probe.stop()
            server.stop()


def test_a_learner_whose_every_update_is_refused_pages_until_its_priorities_are_finite(
        tmp_path: Path) -> None:
    server, client, probe, learner = job(reverb.selectors.Prioritized(0.8))
    target = f"127.0.0.1:{server.port}"
    config = WatchConfig(targets=(target,), probes=(ProbeTarget(str(probe.url), target),),
                         poll=PollConfig(interval_s=1.0, history_s=300.0),
                         thresholds=Thresholds(stall_window_s=3.0))
    try:
        with build_sidecar(config, incidents_path=str(tmp_path / "i.db")) as sidecar:
            sidecar.poller.tick()
            for _ in range(3):  # a diverged loss: every TD error NaN
                with pytest.raises(Exception, match="Priority must not be NaN"):
                    learner.mutate_priorities("replay", {k: math.nan for k in keys(client)})
            for _ in range(2):  # within two polls: a late probe answer lands at the next
                state = sidecar.poller.tick()
                if named("priority_updates_rejected")(state):
                    break
            [f] = [f for f in state.findings if f.kind == "priority_updates_rejected"]
            assert f.severity is Severity.CRITICAL and f.evidence["refused_in_window"] == 3
            assert "no priority lands" in f.summary
            assert_replays(sidecar, state)
            # Finite priorities again: once a window passes with no refusal, resolved.
            def healthy(state: Published) -> bool:
                learner.mutate_priorities("replay", {k: 0.5 for k in keys(client)})
                return not named("priority_updates_rejected")(state)

            assert tick_until(sidecar, healthy, 8, replay_each=False) is not None
    finally:
        probe.stop()
        server.stop()


def filled(n: int, sampler: Any) -> tuple[reverb.Server, reverb.Client]:
    signature = {"x": tf.TensorSpec([4], tf.float32)}
    server = reverb.Server([reverb.Table("replay", sampler, reverb.selectors.Fifo(), n,
                                         reverb.rate_limiters.MinSize(1), signature=signature)],
                           port=None)
    client = reverb.Client(f"127.0.0.1:{server.port}")
    with client.trajectory_writer(num_keep_alive_refs=1) as writer:
        for i in range(n):
            writer.append({"x": np.zeros(4, np.float32)})
            writer.create_item("replay", 1.0, {"x": writer.history["x"][-1]})
            if i % 5000 == 4999:
                writer.flush()
    return server, client


class Learner:
    """A learner loop on its own thread: batches of 256 through the probe, `step()` each."""

    def __init__(self, address: str, probe: TrainerProbe, again_every: int = 0,
                 step_s: float = 0.02):
        dataset = reverb.TrajectoryDataset.from_table_signature(
            server_address=address, table="replay", max_in_flight_samples_per_worker=512,
        ).batch(256, drop_remainder=True).prefetch(1)
        source = iter(dataset)
        if again_every:  # keeps a batch and yields it again every `again_every` batches
            source = self._again(source, again_every)
        self._batches = probe.wrap(source)
        self._probe, self._stop, self._step_s = probe, threading.Event(), step_s
        self.taken = 0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @staticmethod
    def _again(source: Any, every: int) -> Any:
        kept = None
        for i, batch in enumerate(source):
            kept = batch if kept is None else kept
            yield kept if i % every == every - 1 else batch

    def _run(self) -> None:
        while not self._stop.is_set():
            next(self._batches)
            self.taken += 1
            self._probe.step()
            time.sleep(self._step_s)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def named(kind: str) -> Callable[[Published], bool]:
    return lambda state: any(f.kind == kind for f in state.findings)


def watch(targets: list[str], probes: list[TrainerProbe], tmp_path: Path) -> Any:
    return build_sidecar(WatchConfig(
        targets=tuple(targets), probes=tuple(ProbeTarget(str(p.url), t)
                                             for p, t in zip(probes, targets)),
        poll=PollConfig(interval_s=1.0, history_s=300.0)),
        incidents_path=str(tmp_path / "i.db"))


@pytest.mark.long(seconds=30)
def test_one_key_at_1e9_collapses_a_prioritized_table_and_capping_it_resolves(
        tmp_path: Path) -> None:
    server, client = filled(100_000, reverb.selectors.Prioritized(0.8))
    address = f"127.0.0.1:{server.port}"
    probe = TrainerProbe(table="replay", batch_size=256)
    probe.start()
    learner = Learner(address, probe)
    try:
        with watch([address], [probe], tmp_path) as sidecar:
            seen: list[Published] = []
            # Healthy: the sampler draws from the whole table.
            assert tick_until(sidecar, named("priority_collapse"), 12, seen, False) is None
            healthy = seen[-1].probes[str(probe.url)].batch_stats
            assert healthy is not None and healthy.effective_sample_size > 10_000
            exposed = render(make_registry(lambda: seen[-1])).decode()
            assert "replaywatch_probe_batch_effective_sample_size{" in exposed
            assert probe.snapshot()["batch_stats"]["cpu_seconds"] > 0  # what reading costs
            key = int(next(iter(client.sample("replay", num_samples=1)))[0].info.key)
            client.mutate_priorities("replay", {key: 1e9})
            took = tick_until(sidecar, named("priority_collapse"), 30, seen, False)
            assert took is not None, "no priority_collapse in 30 s"
            [found] = [f for f in seen[-1].findings if f.kind == "priority_collapse"]
            assert found.evidence["effective_sample_size"] < 1_000
            assert found.evidence["table_size"] == 100_000
            # The fix: the priority capped (here, set back), the collapse resolves.
            client.mutate_priorities("replay", {key: 1.0})
            assert tick_until(sidecar, lambda s: not named("priority_collapse")(s), 40,
                              replay_each=False) is not None
    finally:
        learner.stop()
        probe.stop()
        server.stop()


def test_a_learner_that_yields_a_kept_batch_again_is_named_within_ten_batches(
        tmp_path: Path) -> None:
    servers = [filled(5_000, reverb.selectors.Uniform())[0] for _ in range(2)]
    targets = [f"127.0.0.1:{s.port}" for s in servers]
    probes = [TrainerProbe(table="replay", batch_size=256) for _ in range(2)]
    for p in probes:
        p.start()
    learners: list[Learner] = []
    try:
        with watch(targets, probes, tmp_path) as sidecar:
            # A step of 0.2 s (ten batches are two polls); the 5th, 10th, ... batch the
            # first one again.
            learners = [Learner(targets[0], probes[0], again_every=5, step_s=0.2),
                        Learner(targets[1], probes[1], step_s=0.2)]
            seen: list[Published] = []
            taken: list[int] = []

            def repeated(state: Published) -> bool:
                # The learner's count when the verdict is published, not after the replay
                # check that follows it: on a loaded host that check took seconds while the
                # learner went on (CI read 365 batches).
                hit = named("repeated_batches")(state)
                if hit:
                    taken.append(learners[0].taken)
                return hit

            assert tick_until(sidecar, repeated, 20, seen, False) is not None
            assert taken[0] <= 5 + 10, taken  # within ten batches of the first repeat (5th)
            [found] = seen[-1].findings
            assert (found.kind, found.target) == ("repeated_batches", targets[0])
            assert found.evidence["batches_repeated"] >= 1
    finally:
        for learner in learners:
            learner.stop()
        for p in probes:
            p.stop()
        for server in servers:
            server.stop()
