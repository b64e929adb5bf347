"""The layout known, not guessed: a trainer loop that inserts says so through its probe.

Real Reverb writers on an in-process server, the probe read over real HTTP, and the loop
workload of the prediction grid (harness/loop_workload.py) watched by `replaywatch check`.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import reverb

from harness.procs import PYTHON, ROOT, STARTUP_S, get_json
from replaywatch.probe import ActorProbe, TrainerProbe

pytestmark = [pytest.mark.timeout(300), pytest.mark.long]


@pytest.fixture(scope="module")
def client() -> Any:
    server = reverb.Server(tables=[reverb.Table(
        "replay", sampler=reverb.selectors.Uniform(), remover=reverb.selectors.Fifo(),
        max_size=1000, rate_limiter=reverb.rate_limiters.MinSize(1))], port=None)
    yield server.localhost_client()
    server.stop()


def insert(writer: Any, i: int) -> None:
    writer.append({"x": np.full((2,), i, np.float32)})
    writer.create_item("replay", priority=1.0, trajectory={"x": writer.history["x"][-1]})
    writer.flush()


def served(probe: TrainerProbe) -> dict[str, Any]:
    status, body = get_json(f"{probe.url}/probe", timeout_s=5)
    assert status == 200
    return body


def test_a_loop_that_inserts_and_calls_next_on_one_thread_is_seen_as_one(client: Any) -> None:
    probe = TrainerProbe(batch_size=4, num_parallel_calls=2, layout=None)
    probe.start()
    try:
        writer = probe.wrap_writer(client.trajectory_writer(num_keep_alive_refs=1))
        iterator = probe.wrap(iter(range(10)))
        assert served(probe)["inserts_on_next_thread"] is None  # nothing seen yet
        insert(writer, 0)
        doc = served(probe)
        assert doc["items_inserted"] == 1 and doc["writers_wrapped"] == 1
        next(iterator)
        assert served(probe)["inserts_on_next_thread"] is True
        other = threading.Thread(target=insert, args=(writer, 1))
        other.start()
        other.join()
        assert served(probe)["inserts_on_next_thread"] is False  # an actor thread inserts
    finally:
        probe.stop()


def test_a_wrapped_client_counts_its_writers_and_inserts(client: Any) -> None:
    probe = TrainerProbe(batch_size=4, num_parallel_calls=1)
    wrapped = probe.wrap_client(client)
    assert probe.wrap_client(wrapped) is wrapped
    insert(wrapped.trajectory_writer(num_keep_alive_refs=1), 0)
    wrapped.insert([np.zeros((2,), np.float32)], priorities={"replay": 1.0})
    assert probe.snapshot()["items_inserted"] == 2
    assert wrapped.server_info()["replay"].current_size >= 2  # the rest passes through


def test_wrap_builder_routes_acme_adders_through_the_loops_client(client: Any) -> None:
    class Builder:  # Acme's builder interface: make_adder(replay_client, spec, policy)
        def make_adder(self, replay_client: Any, environment_spec: Any, policy: Any) -> Any:
            return replay_client.trajectory_writer(num_keep_alive_refs=1)

        def make_learner(self, *args: Any, **kwargs: Any) -> Any:
            raise AssertionError("not called here")

    probe = TrainerProbe(batch_size=4, num_parallel_calls=1)
    builder = probe.wrap_builder(Builder())
    insert(builder.make_adder(client, None, None), 0)
    assert probe.snapshot()["items_inserted"] == 1


def test_an_actor_declares_its_policy_lag_bound() -> None:
    assert ActorProbe(max_policy_lag=3).snapshot()["max_policy_lag"] == 3
    assert ActorProbe().snapshot()["max_policy_lag"] is None
    with pytest.raises(ValueError, match="max_policy_lag"):
        ActorProbe(max_policy_lag=0)
    with pytest.raises(ValueError, match="layout"):
        TrainerProbe(layout="pipelined")


def check(tmp_path: Path, cell: list[str], duration: float, name: str,
          extra: list[str] = ()) -> dict[str, Any]:
    """Starts the loop workload and runs `replaywatch check` on it from its start line."""
    log = tmp_path / f"{name}.log"
    with open(log, "wb") as out:
        workload = subprocess.Popen(
            [PYTHON, "harness/loop_workload.py", *cell, "--hang-after", "60", "--train-s", "60",
             "--timeout-s", "60"], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    try:
        start = None
        deadline = time.monotonic() + STARTUP_S  # its imports first: a minute, once, loaded
        while time.monotonic() < deadline:
            lines = [x for x in log.read_text(errors="replace").splitlines()
                     if x.startswith('{"reverb"')]
            if lines:
                start = json.JSONDecoder().raw_decode(lines[0])[0]
                break
            assert workload.poll() is None, log.read_text()[-2000:]
            threading.Event().wait(0.1)
        assert start is not None, "no start line"
        done = subprocess.run(
            [PYTHON, "-m", "replaywatch", "check", "--reverb",
             start["reverb"].replace("localhost", "127.0.0.1"), "--probe", start["probe"],
             "--duration", str(duration), "--interval", "0.5", *extra, "--json"],
            cwd=ROOT, capture_output=True, text=True, timeout=duration + 60)
        return json.loads(done.stdout)
    finally:
        workload.kill()
        workload.wait(timeout=10)


def test_a_hand_written_loop_with_a_finite_max_diff_is_named_worker_starvation(
        tmp_path: Path) -> None:
    # sync-ratio, 2 workers of 16, error_buffer 20: hung in every grid run; the loop's
    # writer is wrapped by its trainer probe, so the layout is known.
    doc = check(tmp_path, ["--layout", "sync-ratio", "--workers", "2", "--batch-size", "16",
                           "--samples-per-insert", "4", "--min-size", "1000",
                           "--error-buffer", "20"], 9.0, "starved",
                ["--stall-window-s", "3", "--min-history-s", "2"])
    found = {f["kind"]: f for f in doc["findings"]}
    starved = found["worker_starvation"]
    assert starved["evidence"]["layout"] == "sync"
    assert starved["evidence"]["layout_basis"] == "loop writer"
    assert starved["evidence"]["gate"] == "schedule"
    assert "most likely" not in starved["fix"].lower()
    # A first step 2 inserts past min_size has released 20 + 2 x 4 = 28 > 2 x 12.
    assert {f["knob"]: f["value"] for f in starved["evidence"]["fixes"]} == {
        "num_parallel_calls": 1, "error_buffer": 30, "batch_size": 12, "first_step_at": 1002}
    assert "sample_blocked" not in found


def test_one_worker_below_a_batch_is_named_before_the_first_next(tmp_path: Path) -> None:
    # batch 256, error_buffer 100: 100 samples can never complete a batch. Watched for the
    # 1.5 s before the first insert (--start-delay 10: room for the check's own start on loaded
    # cores): named from the configuration and the loop's wrapped writer alone.
    doc = check(tmp_path, ["--layout", "sync-ratio", "--workers", "1", "--batch-size", "256",
                           "--samples-per-insert", "128", "--min-size", "1000",
                           "--error-buffer", "100", "--start-delay", "10"], 1.5, "below")
    (probe,) = [p["snapshot"] for p in doc["probes"]]
    assert probe["batches_retrieved"] == 0 and not probe["blocked_in_next"]
    assert probe["items_inserted"] == 0  # not one insert yet: the wrapped writer says it all
    (certain,) = [f for f in doc["findings"] if f["kind"] == "batch_exceeds_headroom"]
    assert certain["severity"] == "critical"
    assert certain["evidence"]["verdict"] == "will_hang"
    assert certain["evidence"]["released_samples"] == 100
    assert certain["evidence"]["layout_basis"] == "loop writer"
    # No later first step: with nothing drawn before it, max_diff (128,100) stops the loop's
    # inserts at 1000.
    assert {f["knob"]: f["value"] for f in certain["evidence"]["fixes"]} == {
        "error_buffer": 256, "batch_size": 100}


@pytest.mark.long(seconds=27)
def test_a_scheduled_loop_that_declares_nothing_is_a_risk_then_proven_when_it_asks(
        tmp_path: Path) -> None:
    # The same loop with only its iterator and writer wrapped (no gate said): before its first
    # next() a loop that waits on can_sample could not hang here, one on a schedule will, so
    # it is a risk (warning) with verdict will_hang. Once it sits in next() for a batch the
    # limiter never released, it steps on a schedule: certain, critical.
    cell = ["--layout", "sync-ratio", "--workers", "1", "--batch-size", "256",
            "--samples-per-insert", "128", "--min-size", "1000", "--error-buffer", "100",
            "--undeclared-gate"]
    doc = check(tmp_path, [*cell, "--start-delay", "10"], 1.5, "undeclared-before")
    (risk,) = [f for f in doc["findings"] if f["kind"] == "deadlock_risk"]
    assert (risk["severity"], risk["evidence"]["verdict"]) == ("warning", "will_hang")
    assert risk["evidence"]["gate"] == "unknown" and "gate is unknown" in risk["summary"]
    assert not [f for f in doc["findings"] if f["severity"] == "critical"]
    doc = check(tmp_path, cell, 8.0, "undeclared-asked")
    (probe,) = [p["snapshot"] for p in doc["probes"]]
    assert probe["blocked_in_next"] and probe["batches_retrieved"] == 0
    (certain,) = [f for f in doc["findings"] if f["kind"] == "batch_exceeds_headroom"]
    assert certain["evidence"]["gate"] == "schedule"
    assert "which a loop that waits on can_sample never does" in certain["evidence"]["gate_basis"]


def test_the_item_size_comes_from_the_table_signature_when_the_probe_does_not_say(
        tmp_path: Path) -> None:
    # Frames (84x84x9 uint8) in a sync loop of 2 workers of 32: the warm-up burst (200 against
    # 47 strandable) is safe, but a 1 MiB answer carries 17 frames, fewer than a batch. The
    # probe declares no item_bytes; ServerInfo's signature gives 63,504 and the race is named.
    doc = check(tmp_path, ["--layout", "sync", "--workers", "2", "--batch-size", "32",
                           "--samples-per-insert", "4", "--min-size", "100",
                           "--error-buffer", "200", "--item", "frames",
                           "--item-size-from-signature"], 2.0, "signature")
    (probe,) = [p["snapshot"] for p in doc["probes"]]
    assert probe["declared"]["item_bytes"] is None
    (risk,) = [f for f in doc["findings"] if f["kind"] == "deadlock_risk"]
    # The probe reads it from the tf.data graph's item shapes; the table's signature says
    # the same (tests/test_engine.py judges a probe that neither declares nor reads it).
    assert risk["evidence"]["item_bytes"] == 63_504
    assert risk["evidence"]["item_bytes_from"] == "pipeline"
    assert "17 samples an answer" in risk["summary"]
    assert [(f["knob"], f["value"]) for f in risk["evidence"]["fixes"]] == [
        ("num_parallel_calls", 1)]


@pytest.mark.long(seconds=25)
def test_the_seeds_cell_read_from_its_graph_is_judged_as_its_full_declaration(
        tmp_path: Path) -> None:
    # The seed's own numbers on its commit's repeat-interleave with frames, the probe told
    # nothing of the dataset (only the loop's gate): what it reads from the tf.data graph
    # (12 workers, 3 iterators each, 512 in flight, 63,504-byte items) gives the verdict,
    # numbers and fix that `predict` gives the full declaration.
    seed = ["--samples-per-insert", "128", "--error-buffer", "25600", "--batch-size", "256",
            "--layout", "sync"]
    doc = check(tmp_path, [*seed, "--min-size", "2000", "--workers", "12", "--shape", "repeat",
                           "--item", "frames", "--probe-reads-pipeline"], 3.0, "seed-read")
    (risk,) = [f["evidence"] for f in doc["findings"] if f["kind"] == "deadlock_risk"]
    assert risk["dataset_from"] == "the tf.data graph" and risk["declared_differs"] == {}
    declared = subprocess.run(
        [PYTHON, "-m", "replaywatch", "predict", *seed, "--min-size-to-sample", "2000",
         "--num-parallel-calls", "12", "--iterators-per-worker", "3", "--max-in-flight", "512",
         "--item-bytes", "63504", "--gate", "can-sample", "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=60)
    said = json.loads(declared.stdout)
    assert (risk["verdict"], risk["released_samples"], risk["strandable_samples"]) == (
        said["verdict"], said["budget"], said["strandable"]) == ("can_hang", 25600, 39900)
    assert risk["fixes"] == said["fixes"]
