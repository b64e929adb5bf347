"""The grpcio ServerInfo decoder agrees with reverb.Client on a real server."""

from __future__ import annotations

import collections
import contextlib
import socket
import sys
from collections.abc import Iterator

import pytest
import reverb
import tensorflow as tf
from tensorflow.python.framework import tensor_spec

from replaywatch.diagnosis import ratelimiter
from replaywatch.model import FLOAT_MAX, NO_ANSWER
from replaywatch.sources.reverb import ReverbSource, snapshot_from_info
from replaywatch.sources.reverb_wire import decode_server_info
from tests.fixtures.tables import fill, make_tables

pytestmark = pytest.mark.slow  # a Reverb server and TensorFlow (see tests/conftest.py)


@pytest.fixture(scope="module")
def server() -> Iterator[reverb.Server]:
    tables = make_tables()
    server = reverb.Server(tables=tables)
    server.live_tables = {t.name: t for t in tables}  # type: ignore[attr-defined]
    fill(reverb.Client(f"localhost:{server.port}"))
    yield server
    server.stop()


def test_every_tableinfo_field_matches_reverb_client(server: reverb.Server) -> None:
    address = f"127.0.0.1:{server.port}"
    raw = ReverbSource(address, timeout_s=2.0).fetch()
    ours = {info.name: snapshot_from_info(info, address, 1.0) for info in
            decode_server_info(raw)}
    theirs = reverb.Client(address).server_info(timeout=5)
    assert set(ours) == set(theirs)
    for name, info in theirs.items():
        snap = ours[name]
        rl = info.rate_limiter_info
        assert (snap.max_size, snap.current_size, snap.max_times_sampled) == (
            info.max_size, info.current_size, info.max_times_sampled)
        assert (snap.num_episodes, snap.num_deleted_episodes, snap.num_unique_samples) == (
            info.num_episodes, info.num_deleted_episodes, info.num_unique_samples)
        assert snap.rate_limiter.samples_per_insert == rl.samples_per_insert
        assert snap.rate_limiter.min_diff == rl.min_diff
        assert snap.rate_limiter.max_diff == rl.max_diff
        assert snap.rate_limiter.min_size_to_sample == rl.min_size_to_sample
        assert snap.rate_limiter.inserts == rl.insert_stats.completed
        assert snap.rate_limiter.samples == rl.sample_stats.completed
        for state in snap.worker_time.STATES:
            # The worker keeps counting between the two calls; never backwards.
            assert snap.worker_time.ms(state) <= getattr(info.table_worker_time, f"{state}_ms")
        assert snap.sampler.kind == info.sampler_options.WhichOneof("distribution")
        assert snap.remover.kind == info.remover_options.WhichOneof("distribution")
        assert snap.remover.is_deterministic == info.remover_options.is_deterministic
        assert snap.has_signature == (info.signature is not None)
        assert snap.item_bytes == spec_bytes(info.signature), name
    assert ours["prioritized_heap"].sampler.priority_exponent == pytest.approx(0.6)
    assert ours["prioritized_heap"].remover.min_heap is True
    assert ours["lifo_maxheap"].remover.min_heap is False
    assert ours["uniform_fifo"].rate_limiter.inserts == 30
    assert ours["uniform_fifo"].rate_limiter.samples == 7


def spec_bytes(signature: object) -> int | None:
    """An item's bytes as TensorFlow reads the signature's specs; None where unknown."""
    if signature is None:
        return None
    total = 0
    for spec in tf.nest.flatten(signature):
        if not spec.shape.is_fully_defined() or spec.dtype == tf.string:
            return None
        total += spec.shape.num_elements() * spec.dtype.size
    return total or None


Step = collections.namedtuple("Step", "observation action reward discount")
SIGNATURES = {
    "frames": {"x": tf.TensorSpec([84, 84, 9], tf.uint8)},
    # Acme's transition signature: a namedtuple, bounded specs, scalars of four dtypes.
    "acme_like": Step(tensor_spec.BoundedTensorSpec([84, 84, 9], tf.uint8, 0, 255),
                      tensor_spec.BoundedTensorSpec([], tf.int32, 0, 5),
                      tf.TensorSpec([], tf.float32), tf.TensorSpec([], tf.float64)),
    "trajectory": {"obs": tf.TensorSpec([10, 4], tf.float16),
                   "extras": [tf.TensorSpec([10], tf.bool), (tf.TensorSpec([10, 2], tf.int64),)]},
    "unknown_dim": {"x": tf.TensorSpec([None, 3], tf.float32)},
    "strings": {"x": tf.TensorSpec([3], tf.string), "y": tf.TensorSpec([3], tf.float32)},
}


def test_item_bytes_read_from_the_signature_agree_with_tensorflow() -> None:
    tables = [reverb.Table(name, reverb.selectors.Uniform(), reverb.selectors.Fifo(), 10,
                           reverb.rate_limiters.MinSize(1), signature=sig)
              for name, sig in SIGNATURES.items()]
    server = reverb.Server(tables=tables)
    try:
        address = f"127.0.0.1:{server.port}"
        ours = {info.name: snapshot_from_info(info, address, 1.0)
                for info in decode_server_info(ReverbSource(address, 2.0).fetch())}
    finally:
        server.stop()
    for name, sig in SIGNATURES.items():
        assert ours[name].item_bytes == spec_bytes(sig), name
    assert ours["frames"].item_bytes == 63_504 and ours["acme_like"].item_bytes == 63_520
    assert ours["trajectory"].item_bytes == 80 + 10 + 160
    assert ours["unknown_dim"].item_bytes is None and ours["strings"].item_bytes is None


def test_rebuilt_can_sample_and_can_insert_agree_with_the_server(server: reverb.Server) -> None:
    address = f"127.0.0.1:{server.port}"
    snaps = {s.name: snapshot_from_info(s, address, 1.0)
             for s in decode_server_info(ReverbSource(address, 2.0).fetch())}
    for name, live in server.live_tables.items():  # type: ignore[attr-defined]
        snap = snaps[name]
        for n in (1, 2, 10, 100, 10_000):
            assert ratelimiter.can_sample(snap, n) == live.can_sample(n), (name, n)
            assert ratelimiter.can_insert(snap, n) == live.can_insert(n), (name, n)


def test_minsize_limiter_reads_as_insert_blocking_disabled(server: reverb.Server) -> None:
    address = f"127.0.0.1:{server.port}"
    snaps = {s.name: snapshot_from_info(s, address, 1.0)
             for s in decode_server_info(ReverbSource(address, 2.0).fetch())}
    assert snaps["prioritized_heap"].rate_limiter.max_diff == FLOAT_MAX
    assert ratelimiter.is_insert_blocking_disabled(snaps["prioritized_heap"])
    assert not ratelimiter.is_insert_blocking_disabled(snaps["uniform_fifo"])


def test_a_dead_address_fails_fast_as_data_not_an_exception() -> None:
    outcome = ReverbSource("127.0.0.1:9", timeout_s=2.0).poll()
    assert not outcome.ok and "unreachable" in (outcome.error or "")
    assert outcome.duration_s < 1.0  # refused at once, not waited out to the deadline


def test_a_connection_nothing_answers_is_no_answer_not_unreachable() -> None:
    # A listener whose backlog is full answers no SYN: the connect never completes, as with
    # a server whose threads all wait on its table lock. Nothing refused it: every poll is
    # "did not answer" (checkpointing, then target_down), never "unreachable".
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    for _ in range(8):
        filler = socket.socket()
        filler.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            filler.connect(("127.0.0.1", port))
        fillers.append(filler)
    source = ReverbSource(f"127.0.0.1:{port}", timeout_s=0.5)
    try:
        errors = [source.poll().error for _ in range(3)]
    finally:
        source.close()
        for sock in (listener, *fillers):
            sock.close()
    assert all(e and NO_ANSWER in e and "(connecting, no answer)" in e for e in errors), errors


def test_the_sidecar_source_does_not_import_tensorflow() -> None:
    import subprocess

    code = ("import sys, replaywatch.sources.reverb, replaywatch.cli, replaywatch.api;"
            "bad=[m for m in ('tensorflow','reverb','jax') if m in sys.modules];"
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
