"""Priority updates on real Reverb: counted by the learner's probe, judged against the table.

Two servers, each with a table of 200 items and a learner whose trainer probe wraps its
client with `wrap_client(client, inserts=False)` (it samples and updates priorities, it does
not insert): one table Uniform (acme#69's "priority table"), one Prioritized. The learner
samples keys and sends them new priorities. The sidecar's own poller must name
priorities_ignored on the Uniform table within two polls of the first update, with the
counts in its evidence, and never on the Prioritized one; a NaN priority, which Reverb
refuses, is counted as rejected with Reverb's error. The cycle it opens in replays to the live
verdict from its bundle.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import reverb

from harness.procs import get_json
from replaywatch.config import PollConfig, ProbeTarget, WatchConfig
from replaywatch.probe import TrainerProbe
from replaywatch.wiring import build_sidecar
from tests.support.repro import assert_replays


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
    return [int(s[0].info.key) for s in client.sample("replay", num_samples=n)]


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

            # A NaN priority: Reverb refuses the request; the probe counts it and says why.
            _, client, probe, learner = prioritized
            with pytest.raises(Exception) as refused:
                learner.mutate_priorities("replay", {keys(client, 1)[0]: math.nan})
            doc = get_json(f"{probe.url}/probe", 5.0)[1]["priority_updates"]["replay"]
            assert (doc["calls"], doc["errors"], doc["rejected_keys"]) == (2, 1, 1)
            assert doc["last_error"].startswith(type(refused.value).__name__)
            state = sidecar.poller.tick()
            assert {f.kind for f in state.findings if f.target == targets[1]} == set()
    finally:
        for server, _, probe, _ in (uniform, prioritized):
            probe.stop()
            server.stop()
