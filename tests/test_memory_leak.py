"""memory_leak on real Reverb servers, beside a full table in steady state that is not one.

Two servers (harness/memory_hog.py), each filled by a real writer with 63,504-byte frames:
  leaking   max_size 500 at 20 items/s, its writer made with num_keep_alive_refs 1,000,000
            and never ending its episode (a continuing task), through an ActorProbe: the
            server keeps every chunk alive with its table full
  steady    max_size 2,000 at 90 items/s, num_keep_alive_refs 1: FIFO evicts, and the
            chunks are freed on the next insert (the saw)
watched by one sidecar's own poller, each server named by --reverb-pid. The leaking one must be
memory_leak within 10 minutes, naming the writer; the steady one must show no memory finding
for at least 5 minutes after it is full. The cycle the leak opens in replays to the live
verdict from its bundle, its memory series in it. Six minutes: `make test-memory`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from harness.procs import PYTHON, Proc
from replaywatch.config import PollConfig, ProbeTarget, WatchConfig
from replaywatch.diagnosis import memory as mem
from replaywatch.wiring import build_sidecar
from tests.support.repro import assert_replays

pytestmark = [
    pytest.mark.slow, pytest.mark.timeout(900),
    pytest.mark.skipif(os.environ.get("REPLAYWATCH_MEMORY_TESTS") != "1",
                       reason="the six-minute real memory tests run in make test-memory"),
]

STEADY_MAX = 2_000
LEAK_WITHIN_S = 600.0


def test_a_writer_keeping_its_episode_alive_is_a_leak_and_a_steady_full_table_is_not(
        spawn: Callable[..., Proc], tmp_path: Path) -> None:
    leaking = spawn([PYTHON, "harness/memory_hog.py", "--max-size", "500", "--rate", "20",
                     "--keep-episode", "--actor-probe"], name="leaking").announce()
    steady = spawn([PYTHON, "harness/memory_hog.py", "--max-size", str(STEADY_MAX), "--rate",
                    "90"], name="steady").announce()
    config = WatchConfig(
        targets=(leaking["reverb"], steady["reverb"]),
        reverb_pids=((leaking["reverb"], leaking["pid"]), (steady["reverb"], steady["pid"])),
        probes=(ProbeTarget(leaking["actor_probe"], leaking["reverb"]),),
        poll=PollConfig(interval_s=1.0, history_s=900.0))
    began = time.monotonic()
    leak = None
    steady_full_at = None
    steady_memory = []
    with build_sidecar(config, incidents_path=str(tmp_path / "i.db")) as sidecar:
        while time.monotonic() - began < LEAK_WITHIN_S + 60:
            t0 = time.monotonic()
            state = sidecar.poller.tick()
            table = state.tables.get((steady["reverb"], "replay"))
            if steady_full_at is None and table is not None and table.current_size >= STEADY_MAX:
                steady_full_at = time.monotonic()
            assert not [f for f in state.findings if f.target == steady["reverb"]
                        and f.kind in ("memory_leak", "memory_exhaustion")], state.findings
            if (m := state.memory.get(steady["reverb"])) is not None:
                steady_memory.append(m.counted_bytes)
            found = [f for f in state.findings
                     if f.target == leaking["reverb"] and f.kind == "memory_leak"]
            if found and leak is None:
                leak = (time.monotonic() - began, found[0])
                [bundle, _] = assert_replays(sidecar, state)
                series = bundle.inputs.view.memory
                assert len(series) >= mem.LEAK_SPAN_S and series[-1].pid == leaking["pid"]
            if leak is not None and steady_full_at is not None and (
                    time.monotonic() - steady_full_at >= mem.LEAK_SPAN_S + 10):
                break
            time.sleep(max(0.0, 1.0 - (time.monotonic() - t0)))
    assert leak is not None, "no memory_leak in 10 minutes"
    at, f = leak
    assert at <= LEAK_WITHIN_S, at
    ev = f.evidence
    assert ev["cause"] == "writer" and ev["growth_bytes"] >= mem.LEAK_MIN_BYTES
    [writer] = ev["writers"]
    assert writer["holds_episode"] and writer["keep_alive_refs"] == 1_000_000
    assert "end_episode" in f.fix
    assert steady_full_at is not None and time.monotonic() - steady_full_at >= mem.LEAK_SPAN_S
    print(f"\nmemory_leak at {at:.0f} s: {ev['growth_bytes'] / 2**20:.0f} MiB over "
          f"{ev['over_s']} s, {ev['bytes_per_s'] / 2**20:.2f} MiB/s; steady table full for "
          f"{time.monotonic() - steady_full_at:.0f} s, its memory "
          f"{min(steady_memory) / 2**20:.0f}..{max(steady_memory) / 2**20:.0f} MiB, no finding")
