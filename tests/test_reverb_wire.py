"""The protobuf ServerInfo decoder on recorded answers of real Reverb servers, without reverb.

tests/fixtures/record_server_info.py (Reverb 0.14) and record_server_info_0_7.py
(Reverb 0.7.2, Launchpad's venv) recorded the bytes and, from the same bytes, what
that Reverb's own generated `TableInfo` class reads (the .json); the live comparison
with `reverb.Client.server_info` is tests/test_reverb_source.py for 0.14 and the
slow test at the end of this module for 0.7.2.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.descriptor import FieldDescriptor

from replaywatch.diagnosis import ratelimiter
from replaywatch.errors import SourceProtocolError
from replaywatch.model import FLOAT_MAX, TableSnapshot
from replaywatch.sources.reverb import (
    ReverbSource,
    snapshot_from_info,
    snapshots_from_response,
)
from replaywatch.sources.reverb_wire import (
    ServerInfoResponse,
    TableInfo,
    WireError,
    decode_server_info,
    signature_item_bytes,
)

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
KINDS = ("fifo", "uniform", "prioritized", "heap", "lifo")
# Reverb version -> its recorded 4-table answer.
RECORDINGS = {"0.14.0": "server_info_4tables", "0.7.2": "server_info_0_7_2_4tables"}
OLD = RECORDINGS["0.7.2"]


def _recorded(stem: str) -> bytes:
    return (FIXTURES / f"{stem}.bin").read_bytes()


def _recorded_doc(stem: str) -> Any:
    return json.loads((FIXTURES / f"{stem}.json").read_text())


def _reverbs_reading(stem: str) -> dict[str, dict[str, Any]]:
    doc = _recorded_doc(stem)
    # 0.7.2's file holds its client's report and its schema beside its TableInfo reading.
    tables = doc["table_info"] if isinstance(doc, dict) else doc
    return {t["name"]: t for t in tables}


def _ours(stem: str) -> dict[str, TableSnapshot]:
    return {s.name: s for s in snapshots_from_response(_recorded(stem), "127.0.0.1:1", 5.0)}


@pytest.mark.parametrize("stem", RECORDINGS.values(), ids=RECORDINGS.keys())
def test_every_recorded_table_decodes_as_reverb_reads_it(stem: str) -> None:
    ours, theirs = _ours(stem), _reverbs_reading(stem)
    assert set(ours) == set(theirs) == {"uniform_fifo", "prioritized_heap", "queue",
                                        "lifo_maxheap"}
    for name, info in theirs.items():
        snap = ours[name]
        # MessageToDict omits zeros and spells int64 as strings.
        for field in ("max_size", "current_size", "max_times_sampled", "num_episodes",
                      "num_deleted_episodes", "num_unique_samples"):
            assert getattr(snap, field) == int(info.get(field, 0)), (name, field)
        rl = info["rate_limiter_info"]
        assert snap.rate_limiter.samples_per_insert == rl.get("samples_per_insert", 0.0)
        assert snap.rate_limiter.min_diff == rl.get("min_diff", 0.0)
        assert snap.rate_limiter.max_diff == rl.get("max_diff", 0.0)
        assert snap.rate_limiter.min_size_to_sample == int(rl.get("min_size_to_sample", 0))
        assert snap.rate_limiter.inserts == int(rl["insert_stats"].get("completed", 0))
        assert snap.rate_limiter.samples == int(rl["sample_stats"].get("completed", 0))
        for state in snap.worker_time.STATES:
            assert snap.worker_time.ms(state) == int(
                info.get("table_worker_time", {}).get(f"{state}_ms", 0)), (name, state)
        for ours_opts, key in ((snap.sampler, "sampler_options"),
                               (snap.remover, "remover_options")):
            assert ours_opts.kind == next(k for k in KINDS if k in info[key]), (name, key)
            assert ours_opts.is_deterministic == info[key].get("is_deterministic", False)
        assert snap.has_signature == info["has_signature"]
        assert (snap.target, snap.observed_at) == ("127.0.0.1:1", 5.0)


@pytest.mark.parametrize("stem", RECORDINGS.values(), ids=RECORDINGS.keys())
def test_recorded_values_that_the_rules_depend_on(stem: str) -> None:
    ours = _ours(stem)
    assert ours["prioritized_heap"].sampler.priority_exponent == pytest.approx(0.6)
    assert ours["prioritized_heap"].remover.min_heap is True
    assert ours["lifo_maxheap"].remover.min_heap is False
    assert ours["prioritized_heap"].rate_limiter.max_diff == FLOAT_MAX
    assert ours["uniform_fifo"].rate_limiter.inserts == 30
    assert ours["uniform_fifo"].rate_limiter.samples == 7
    assert ours["uniform_fifo"].has_signature and not ours["queue"].has_signature
    # {"obs": float32[3]}: 12 bytes an item, as the budget model reads a response's count.
    assert ours["uniform_fifo"].item_bytes == 12 and ours["queue"].item_bytes is None


def _declared(descriptor: Any) -> dict[str, dict[str, list[int]]]:
    """What reverb_wire declares, from TableInfo down: message -> field -> [number, type]."""
    out = {descriptor.full_name.removeprefix("deepmind.reverb."):
           {f.name: [f.number, f.type] for f in descriptor.fields}}
    for f in descriptor.fields:
        if f.message_type is not None:
            out.update(_declared(f.message_type))
    return out


def test_reverb_0_7_2_sends_every_field_we_decode_with_the_same_number_and_type() -> None:
    # proto3 writes no zeros, so a field 0.7.2 lacked would read as 0 and a rule would take it
    # for a real zero (no deleted episodes, an idle worker). It lacks none: the schema is
    # field for field 0.14's, so every field is read as sent and nothing needs to be "absent".
    theirs = _recorded_doc(OLD)["schema"]
    for message, fields in _declared(TableInfo.DESCRIPTOR).items():
        for field, (number, kind) in fields.items():
            assert field in theirs[message], f"{message}.{field} is absent in Reverb 0.7.2"
            if (message, field) == ("TableInfo", "signature"):
                # Opaque bytes here, tensorflow.StructuredValue there: one wire type.
                kind = FieldDescriptor.TYPE_MESSAGE
            assert theirs[message][field] == [number, kind], (message, field)


def _assert_agrees_with_client(ours: dict[str, TableSnapshot], report: dict[str, Any]) -> None:
    """Our snapshots against Reverb 0.7.2's `Client.server_info()` and its live tables."""
    assert set(ours) == set(report) == {"uniform_fifo", "prioritized_heap", "queue",
                                        "lifo_maxheap"}
    for name, info in report.items():
        snap, rl = ours[name], ours[name].rate_limiter
        for field in ("max_size", "current_size", "max_times_sampled", "num_episodes",
                      "num_deleted_episodes", "num_unique_samples", "has_signature"):
            assert getattr(snap, field) == info[field], (name, field)
        for field in ("samples_per_insert", "min_diff", "max_diff", "min_size_to_sample",
                      "inserts", "samples"):
            assert getattr(rl, field) == info[field], (name, field)
        assert (snap.sampler.kind, snap.remover.kind) == (info["sampler"], info["remover"])
        assert info["has_table_worker_time"], name
        for state in snap.worker_time.STATES:
            # Read after the client's report: the worker's clock only runs forward.
            assert snap.worker_time.ms(state) >= int(info["table_worker_time"][f"{state}_ms"])
        for n, live in info["can_sample"].items():
            assert ratelimiter.can_sample(snap, int(n)) == live, (name, "can_sample", n)
        for n, live in info["can_insert"].items():
            assert ratelimiter.can_insert(snap, int(n)) == live, (name, "can_insert", n)


def test_a_recorded_reverb_0_7_2_answer_reads_as_its_own_client_reports() -> None:
    _assert_agrees_with_client(_ours(OLD), _recorded_doc(OLD)["server_info"])


def test_a_reverb_0_7_2_answer_sends_the_worker_time_of_every_table() -> None:
    # A message field does have presence: were it missing, TableWorkerTime would read as
    # all zeros, an idle worker. 0.7.2 sends it for every table, as 0.14 does.
    infos = decode_server_info(_recorded(OLD))
    assert infos and all(i.HasField("table_worker_time") for i in infos)
    assert all(i.table_worker_time.sleeping_ms > 0 for i in infos)


def test_a_100_table_answer_decodes_every_table() -> None:
    infos = decode_server_info(_recorded("server_info_100tables"))
    assert sorted(i.name for i in infos) == sorted(f"table_{k}" for k in range(100))
    assert all(i.max_size == 1000 for i in infos)


def test_unknown_fields_from_a_newer_server_are_skipped() -> None:
    raw = _recorded(RECORDINGS["0.14.0"])
    # Field 99 (varint) at the top level and field 50 (bytes) inside a TableInfo.
    extra_table = ServerInfoResponse.FromString(raw).table_info[0]
    table_bytes = extra_table.SerializeToString() + b"\x92\x03\x02hi"
    raw_newer = raw + b"\x98\x06\x07" + b"\x12" + bytes([len(table_bytes)]) + table_bytes
    infos = decode_server_info(raw_newer)
    assert len(infos) == 5 and infos[-1].name == extra_table.name


def test_signature_presence_is_read_even_when_empty() -> None:
    msg = ServerInfoResponse()
    msg.table_info.add(name="empty_sig", signature=b"")
    msg.table_info.add(name="no_sig")
    snaps = {i.name: snapshot_from_info(i, "t", 0.0)
             for i in decode_server_info(msg.SerializeToString())}
    assert snaps["empty_sig"].has_signature and not snaps["no_sig"].has_signature
    assert snaps["empty_sig"].item_bytes is None and snaps["no_sig"].item_bytes is None
    assert snaps["no_sig"].sampler.kind == "unknown"


@pytest.mark.parametrize("raw", [b"\x9a\x02\x05abc", b"\xff" * 7, b"\x08\x01"])
def test_a_signature_that_is_not_a_nest_of_specs_has_no_item_size(raw: bytes) -> None:
    assert signature_item_bytes(raw) is None


@pytest.mark.parametrize("raw", [b"\x12\x05abc", b"\x12", b"\x0b", b"\xff" * 12])
def test_garbage_bytes_raise_wire_error(raw: bytes) -> None:
    with pytest.raises(WireError):
        decode_server_info(raw)


def test_garbage_bytes_are_a_protocol_error_of_the_source() -> None:
    with pytest.raises(SourceProtocolError, match="not a Reverb ServerInfo response"):
        snapshots_from_response(b"\x12\x05abc", "127.0.0.1:1", 0.0)


def test_decoding_needs_neither_reverb_nor_tensorflow() -> None:
    # In a fresh interpreter: in the full suite other modules have imported reverb already.
    code = ("import sys; from replaywatch.sources.reverb import snapshots_from_response; "
            f"snapshots_from_response(open({str(FIXTURES / 'server_info_4tables.bin')!r}, 'rb')"
            ".read(), 't', 0.0); print(sorted(m for m in ('reverb', 'tensorflow') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def _launchpad_python() -> Path:
    """Launchpad's venv's interpreter (`make launchpad-venv`), or the test is skipped."""
    value = os.environ.get("REPLAYWATCH_LAUNCHPAD_PYTHON", "")
    python = ROOT / value if value else None  # relative to the repository, as make passes it
    if python is None or not python.exists():
        reason = (f"Reverb 0.7.2 needs Launchpad's venv: REPLAYWATCH_LAUNCHPAD_PYTHON is "
                  f"{'unset' if python is None else f'{value!r}, which does not exist'} "
                  "(make launchpad-venv, then REPLAYWATCH_LAUNCHPAD_PYTHON="
                  ".venv-launchpad/bin/python)")
        if os.environ.get("REPLAYWATCH_REQUIRE_LAUNCHPAD") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    return python


def test_a_live_reverb_0_7_2_server_reads_as_its_own_client_reports(spawn: Any) -> None:
    python = _launchpad_python()
    child = spawn([str(python), "tests/fixtures/record_server_info_0_7.py", "--serve"],
                  name="reverb-0.7.2")
    announced = child.announce(match=lambda record: "port" in record)
    source = ReverbSource(f"127.0.0.1:{announced['port']}", timeout_s=2.0)
    try:
        outcome = source.poll()
    finally:
        source.close()
    assert outcome.ok, outcome.error
    _assert_agrees_with_client({t.name: t for t in outcome.tables}, announced["server_info"])
