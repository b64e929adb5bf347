"""The probe reads the learner's pipeline from its tf.data graph (replaywatch/probe/pipeline.py):
on real graphs built by TF-Agents' `as_dataset` (tf-agents 0.19.0), Acme's
`make_reverb_dataset` (dm-acme 0.4.0), the seed commit's repeat-interleave and a hand-written
per-worker pipeline, field by field, with nothing declared."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import reverb
import tensorflow as tf

from replaywatch.probe import TrainerProbe
from replaywatch.probe import pipeline as pipe
from replaywatch.sources.probe_http import snapshot_from_probe

TABLE = "replay"
FRAMES = 84 * 84 * 9  # the seed's uint8 frames


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    table = reverb.Table(TABLE, sampler=reverb.selectors.Uniform(),
                         remover=reverb.selectors.Fifo(), max_size=1000,
                         rate_limiter=reverb.rate_limiters.MinSize(1),
                         signature={"x": tf.TensorSpec((84, 84, 9), tf.uint8)})
    srv = reverb.Server([table], port=None)
    yield f"localhost:{srv.port}"
    srv.stop()


def trajectories(address: str, in_flight: int) -> Any:
    return reverb.TrajectoryDataset.from_table_signature(
        server_address=address, table=TABLE, max_in_flight_samples_per_worker=in_flight)


def test_a_hand_written_per_worker_pipeline_reads_as_acmes_shape(server: str) -> None:
    ds = tf.data.Dataset.range(4).interleave(
        lambda _: trajectories(server, 64).batch(32, drop_remainder=True), cycle_length=4,
        num_parallel_calls=4, deterministic=False).prefetch(2)
    doc = pipe.read(ds.as_numpy_iterator())
    assert doc["read"] and doc["interleave"]["over"] == "range 4"
    assert doc["batches"] == [{"size": 32, "drop_remainder": True, "inside_interleave": True}]
    assert pipe.shape(doc) == {
        "batch_size": 32, "num_parallel_calls": 4, "num_parallel_calls_autotune": False,
        "max_in_flight": 64, "workers_per_iterator": 1, "iterators_per_worker": 1,
        "batch_after_interleave": False, "cycle_length": None, "item_bytes": FRAMES,
        "prefetch_size": 2, "table": TABLE}


def test_the_seed_commits_repeat_interleave_opens_more_iterators_per_worker(server: str
                                                                            ) -> None:
    ds = tf.data.Dataset.from_tensors(0).repeat().interleave(
        lambda _: trajectories(server, 512).batch(256, drop_remainder=True), cycle_length=12,
        num_parallel_calls=12, deterministic=False)
    shape = pipe.shape(pipe.read(iter(ds)))
    assert shape is not None
    assert (shape["batch_size"], shape["num_parallel_calls"], shape["max_in_flight"],
            shape["iterators_per_worker"], shape["batch_after_interleave"]) == (
        256, 12, 512, 3, False)


def test_acmes_make_reverb_dataset_is_read_as_it_builds_it(server: str) -> None:
    from tests.support import acme_compat

    acme_compat.apply()
    from acme import datasets

    ds = datasets.make_reverb_dataset(server, batch_size=256, table=TABLE,
                                      num_parallel_calls=12)
    shape = pipe.shape(pipe.read(ds))
    assert shape is not None
    # dm-acme 0.4.0: 12 datasets, each batching on its own, 2 x batch in flight.
    assert (shape["batch_size"], shape["num_parallel_calls"], shape["max_in_flight"],
            shape["batch_after_interleave"], shape["item_bytes"]) == (256, 12, 512, False,
                                                                      FRAMES)


def test_tf_agents_as_dataset_is_one_batch_after_32_datasets(server: str) -> None:
    from tf_agents.replay_buffers import reverb_replay_buffer
    from tf_agents.specs import tensor_spec

    spec = tensor_spec.TensorSpec((4,), tf.float32)
    table = reverb.Table("experience", sampler=reverb.selectors.Uniform(),
                         remover=reverb.selectors.Fifo(), max_size=1000,
                         rate_limiter=reverb.rate_limiters.MinSize(1),
                         signature=tensor_spec.add_outer_dim(spec, None))
    srv = reverb.Server([table], port=None)
    try:
        replay = reverb_replay_buffer.ReverbReplayBuffer(spec, "experience", sequence_length=2,
                                                         local_server=srv)
        ds = replay.as_dataset(sample_batch_size=64, num_steps=2, num_parallel_calls=3)
        shape = pipe.shape(pipe.read(iter(ds)))
    finally:
        srv.stop()
    assert shape is not None
    # min(64, 32) datasets of 3 x 64 / 32 = 6 in flight, 3 threads, one batch of 64 after.
    assert (shape["batch_size"], shape["num_parallel_calls"], shape["cycle_length"],
            shape["max_in_flight"], shape["batch_after_interleave"], shape["table"]) == (
        64, 3, 32, 6, True, "experience")


def test_an_autotuned_interleave_is_judged_as_one_thread(server: str) -> None:
    ds = tf.data.Dataset.range(8).interleave(
        lambda _: trajectories(server, 6), cycle_length=8,
        num_parallel_calls=tf.data.AUTOTUNE, deterministic=False).batch(16)
    shape = pipe.shape(pipe.read(ds))
    assert shape is not None and shape["num_parallel_calls"] == 1
    assert shape["num_parallel_calls_autotune"] is True


def test_what_is_not_read_is_said_never_guessed() -> None:
    assert pipe.read(iter([1, 2]))["reason"] == "no tf.data dataset behind list_iterator"
    plain = pipe.read(tf.data.Dataset.range(3))
    assert plain == {"read": False,
                     "reason": "no Reverb dataset in the pipeline: it reads RangeDataset"}
    assert pipe.shape(plain) is None


def test_the_probe_reads_off_the_learners_thread_and_the_sidecar_uses_the_read_values(
        server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Declared wrong, as TF-Agents users write it: num_parallel_calls=3 of 32 datasets,
    # without saying the batch forms after the interleave.
    ds = tf.data.Dataset.range(32).interleave(
        lambda _: trajectories(server, 6), cycle_length=32, num_parallel_calls=3,
        deterministic=False).batch(64, drop_remainder=True)
    probe = TrainerProbe(batch_size=64, num_parallel_calls=12, table=TABLE)
    # Which thread reads the graph, not how long wrap() took: on loaded cores a thread's
    # start alone can take longer than any bound that would tell the two apart.
    read_on: list[str] = []

    def read(iterator: Any) -> dict[str, Any]:
        read_on.append(threading.current_thread().name)
        return pipe.read(iterator)

    monkeypatch.setattr("replaywatch.probe.trainer.read_pipeline", read)
    probe.wrap(iter(ds))
    deadline = time.monotonic() + 10
    while probe.snapshot()["pipeline"] is None and time.monotonic() < deadline:
        time.sleep(0.01)
    doc = probe.snapshot()
    assert read_on == ["replaywatch-pipeline"], read_on  # never the learner's thread
    assert doc["pipeline"]["read"]
    snap = snapshot_from_probe(doc, "http://p", 1000.0)
    assert snap.pipeline_read and snap.pipeline is not None
    from replaywatch.diagnosis import rules_config

    ds_model = rules_config.dataset_of(snap)
    assert ds_model is not None
    assert (ds_model.workers, ds_model.samplers, ds_model.in_flight,
            ds_model.after_interleave) == (3, 32, 6, True)
    assert rules_config.declared_differs(snap) == {
        "num_parallel_calls": {"declared": 12, "read": 3}}
