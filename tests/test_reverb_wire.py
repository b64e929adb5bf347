"""The protobuf ServerInfo decoder on recorded answers of a real Reverb server, without reverb.

tests/fixtures/record_server_info.py recorded the bytes and, from the same bytes,
what Reverb's own generated `TableInfo` class reads (the .json); the live
comparison with `reverb.Client.server_info` is tests/test_reverb_source.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from replaywatch.errors import SourceProtocolError
from replaywatch.model import FLOAT_MAX, TableSnapshot
from replaywatch.sources.reverb import snapshot_from_info, snapshots_from_response
from replaywatch.sources.reverb_wire import ServerInfoResponse, WireError, decode_server_info

FIXTURES = Path(__file__).resolve().parent / "fixtures"
KINDS = ("fifo", "uniform", "prioritized", "heap", "lifo")


def _recorded(stem: str) -> bytes:
    return (FIXTURES / f"{stem}.bin").read_bytes()


def _reverbs_reading() -> dict[str, dict[str, Any]]:
    tables = json.loads((FIXTURES / "server_info_4tables.json").read_text())
    return {t["name"]: t for t in tables}


def _ours() -> dict[str, TableSnapshot]:
    return {s.name: s for s in snapshots_from_response(_recorded("server_info_4tables"),
                                                       "127.0.0.1:1", 5.0)}


def test_every_recorded_table_decodes_as_reverb_reads_it() -> None:
    ours, theirs = _ours(), _reverbs_reading()
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


def test_recorded_values_that_the_rules_depend_on() -> None:
    ours = _ours()
    assert ours["prioritized_heap"].sampler.priority_exponent == pytest.approx(0.6)
    assert ours["prioritized_heap"].remover.min_heap is True
    assert ours["lifo_maxheap"].remover.min_heap is False
    assert ours["prioritized_heap"].rate_limiter.max_diff == FLOAT_MAX
    assert ours["uniform_fifo"].rate_limiter.inserts == 30
    assert ours["uniform_fifo"].rate_limiter.samples == 7
    assert ours["uniform_fifo"].has_signature and not ours["queue"].has_signature


def test_a_100_table_answer_decodes_every_table() -> None:
    infos = decode_server_info(_recorded("server_info_100tables"))
    assert sorted(i.name for i in infos) == sorted(f"table_{k}" for k in range(100))
    assert all(i.max_size == 1000 for i in infos)


def test_unknown_fields_from_a_newer_server_are_skipped() -> None:
    raw = _recorded("server_info_4tables")
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
    assert snaps["no_sig"].sampler.kind == "unknown"


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
