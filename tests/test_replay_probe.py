"""The ReplayProbe: a Reverb server's memory served from inside its process, for a sidecar
that cannot read the server's host. A real server (harness/memory_hog.py) filling with frames,
its probe read by the sidecar's own poller over HTTP: the memory, its limit and the table's
bytes per item come from the probe (kept over the sidecar's own read of a local process),
the probe is listed with role "replay" and never judged as a trainer's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from fastapi.testclient import TestClient

from harness.procs import PYTHON, Proc, get_json
from replaywatch.api.app import create_app
from replaywatch.config import PollConfig, ProbeTarget, WatchConfig
from replaywatch.history import History
from replaywatch.metrics import make_registry, render_published
from replaywatch.model import MemorySnapshot, PollOutcome, SourceKind
from replaywatch.probe import ReplayProbe
from replaywatch.sources.probe_http import memory_from_probe
from replaywatch.wiring import build_sidecar


def test_a_replay_probe_serves_its_process_memory_and_limit() -> None:
    probe = ReplayProbe(name="replay-0")
    probe.start()
    url = str(probe.url)
    try:
        status, doc = get_json(f"{url}/probe", 5.0)
    finally:
        probe.stop()
    assert status == 200 and doc["role"] == "replay" and doc["name"] == "replay-0"
    assert doc["rss_bytes"] > 10 << 20 and doc["limit_bytes"] >= doc["rss_bytes"]
    assert doc["limit_from"] in ("host", "cgroup v1", "cgroup v2")
    m = memory_from_probe(doc, url, "replay-0:8000", 5.0)
    assert (m.target, m.rss_bytes, m.found_by) == ("replay-0:8000", doc["rss_bytes"],
                                                   f"replay probe {url}")


def test_the_sidecar_reads_a_servers_memory_from_its_replay_probe(
        spawn: Callable[..., Proc], tmp_path: Path) -> None:
    hog = spawn([PYTHON, "harness/memory_hog.py", "--max-size", "20000", "--rate", "200",
                 "--replay-probe"], name="replay")
    start = hog.announce()
    target, url = start["reverb"], start["replay_probe"]
    config = WatchConfig(targets=(target,), probes=(ProbeTarget(url, target),),
                         poll=PollConfig(interval_s=1.0, history_s=900.0))
    with build_sidecar(config, incidents_path=str(tmp_path / "i.db")) as sidecar:
        began = time.monotonic()
        while True:
            t0 = time.monotonic()
            state = sidecar.poller.tick()
            f = state.figures.get((target, "replay"))
            tm = f.memory if f is not None else None
            if tm is not None and tm.measured or time.monotonic() - began > 60:
                break
            time.sleep(max(0.0, 1.0 - (time.monotonic() - t0)))
        m = state.memory[target]
        assert m.found_by == f"replay probe {url}" and m.pid == start["pid"], m
        assert tm is not None and tm.measured, tm  # 63,504-byte frames and their chunks
        assert 60_000 <= tm.bytes_per_item <= 90_000 and tm.projected_bytes is not None
        assert not state.findings, state.findings  # a replay probe is no trainer's
        api = TestClient(create_app(sidecar.store, make_registry(sidecar.store.current),
                                    sidecar.history, None))
        [probe] = api.get("/api/v1/probes").json()["probes"]
        assert (probe["probe"], probe["role"], probe["up"]) == (url, "replay", True)
        [table] = api.get("/api/v1/memory").json()["tables"]
        assert table["measured"] and table["bytes_per_item"] == tm.bytes_per_item
        text = render_published(state).decode()
        assert f'replaywatch_probe_up{{probe="{url}",role="replay",target="{target}"}} 1' in text
        assert (f'replaywatch_replay_item_bytes{{measured="true",table="replay",'
                f'target="{target}"}}') in text


def test_the_history_keeps_the_replay_probes_reading_and_the_local_one_once_it_is_gone() -> None:
    history = History()
    target, url = "127.0.0.1:8000", "http://127.0.0.1:8002"

    def local(t: float, pid: int | None) -> PollOutcome:
        m = MemorySnapshot(target, t, pid, 100 if pid else None, 1000, "cgroup v1", None, 0,
                           "listening on port 8000")
        return PollOutcome(target, SourceKind.REVERB, t, 0.01, memory=m)

    def probed(t: float) -> PollOutcome:
        m = MemorySnapshot(target, t, 7, 200, 1000, "cgroup v1", None, 0, f"replay probe {url}")
        return PollOutcome(url, SourceKind.PROBE, t, 0.01, memory=m)

    for t in range(10):  # both answer: the probe's reading is the one kept
        history.record(local(float(t), 7))
        history.record(probed(t + 0.1))
    for t in range(10, 20):  # the server is killed, its probe with it
        history.record(local(float(t), None))
    kept = history.view(target, [url], 0.0, coarse_start=0.0).memory
    # (the first local reading came before the probe had answered)
    assert {m.found_by for m in kept if 1 <= m.observed_at < 10} == {f"replay probe {url}"}
    # Three local gaps after the probe's last reading, the local ones are kept: the OOM count.
    assert [m.observed_at for m in kept if m.observed_at >= 10] == [13.0, 14.0, 15.0, 16.0,
                                                                    17.0, 18.0, 19.0]
    # A replay probe is no trainer's: the view holds it in no probe history.
    assert history.view(target, [url], 0.0).probes == {}
