"""Decodes Reverb's `ServerInfoResponse` from protobuf wire bytes, stdlib only.

Why not `reverb.Client.server_info`: importing reverb pulls TensorFlow (4-5 s
and ~1 GB), its deadline is in whole seconds (a dead server costs 1 s per poll)
and its generated protos need TensorFlow's `StructuredValue` for the table
signature. The sidecar calls the same `ServerInfo` RPC with plain grpcio and
decodes the few messages it needs here, by field number, following
reverb/cc/schema.proto and reverb/cc/reverb_service.proto of dm-reverb 0.14.
The signature (field 6 of TableInfo) is skipped: only its presence is kept.
Unknown fields are skipped too, so a newer server still decodes.
"""

from __future__ import annotations

import struct
from typing import Any

SERVICE_METHOD = "/deepmind.reverb.ReverbService/ServerInfo"

# A schema maps a field number to (name, kind, sub-schema or None, repeated).
# Kinds: "int" (varint, two's complement), "bool", "double", "string",
# "message", "present" (length-delimited, kept only as True).
Schema = dict[int, tuple[str, str, Any, bool]]

_CALL_STATS: Schema = {2: ("completed", "int", None, False)}

_RATE_LIMITER_INFO: Schema = {
    1: ("samples_per_insert", "double", None, False),
    2: ("min_diff", "double", None, False),
    3: ("max_diff", "double", None, False),
    4: ("min_size_to_sample", "int", None, False),
    5: ("insert_stats", "message", _CALL_STATS, False),
    6: ("sample_stats", "message", _CALL_STATS, False),
}

_TABLE_WORKER_TIME: Schema = {
    1: ("running_ms", "int", None, False),
    2: ("sampling_ms", "int", None, False),
    3: ("inserting_ms", "int", None, False),
    4: ("sleeping_ms", "int", None, False),
    5: ("waiting_for_sampling_ms", "int", None, False),
    6: ("waiting_for_inserts_ms", "int", None, False),
}

_KEY_DISTRIBUTION_OPTIONS: Schema = {
    1: ("fifo", "bool", None, False),
    2: ("uniform", "bool", None, False),
    3: ("prioritized", "message", {1: ("priority_exponent", "double", None, False)}, False),
    4: ("heap", "message", {1: ("min_heap", "bool", None, False)}, False),
    6: ("lifo", "bool", None, False),
    7: ("is_deterministic", "bool", None, False),
}

TABLE_INFO: Schema = {
    8: ("name", "string", None, False),
    1: ("sampler_options", "message", _KEY_DISTRIBUTION_OPTIONS, False),
    2: ("remover_options", "message", _KEY_DISTRIBUTION_OPTIONS, False),
    3: ("max_size", "int", None, False),
    4: ("max_times_sampled", "int", None, False),
    5: ("rate_limiter_info", "message", _RATE_LIMITER_INFO, False),
    6: ("signature", "present", None, False),
    7: ("current_size", "int", None, False),
    9: ("num_episodes", "int", None, False),
    10: ("num_deleted_episodes", "int", None, False),
    11: ("num_unique_samples", "int", None, False),
    12: ("table_worker_time", "message", _TABLE_WORKER_TIME, False),
}

SERVER_INFO_RESPONSE: Schema = {
    1: ("tables_state_id", "message", {1: ("high", "int", None, False),
                                       2: ("low", "int", None, False)}, False),
    2: ("table_info", "message", TABLE_INFO, True),
}


class WireError(ValueError):
    """The bytes are not a well-formed message of the expected shape."""


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise WireError("truncated varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise WireError("varint longer than 10 bytes")


def _signed(value: int) -> int:
    """int64 fields carry negatives as 64-bit two's complement varints."""
    return value - (1 << 64) if value >= 1 << 63 else value


def decode(buf: bytes, schema: Schema) -> dict[str, Any]:
    """Decodes `buf` by `schema`; absent fields are absent from the result."""
    out: dict[str, Any] = {}
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire_type = key >> 3, key & 7
        if wire_type == 0:
            raw, pos = _varint(buf, pos)
            value: Any = raw
        elif wire_type == 1:
            if pos + 8 > len(buf):
                raise WireError("truncated 64-bit field")
            value, pos = buf[pos : pos + 8], pos + 8
        elif wire_type == 2:
            length, pos = _varint(buf, pos)
            if pos + length > len(buf):
                raise WireError(f"field {number} runs past the end of the message")
            value, pos = buf[pos : pos + length], pos + length
        elif wire_type == 5:
            value, pos = buf[pos : pos + 4], pos + 4
        else:
            raise WireError(f"unsupported wire type {wire_type} in field {number}")
        if number in schema:
            name, kind, sub, repeated = schema[number]
            converted = _convert(value, kind, sub, wire_type, name)
            if repeated:
                out.setdefault(name, []).append(converted)
            else:
                out[name] = converted
    return out


def _convert(value: Any, kind: str, sub: Schema | None, wire_type: int, name: str) -> Any:
    expected = {"int": 0, "bool": 0, "double": 1, "string": 2, "message": 2, "present": 2}
    if expected[kind] != wire_type:
        raise WireError(f"field {name!r} has wire type {wire_type}, expected {expected[kind]}")
    if kind == "int":
        return _signed(value)
    if kind == "bool":
        return bool(value)
    if kind == "double":
        return struct.unpack("<d", value)[0]
    if kind == "string":
        return bytes(value).decode("utf-8", errors="replace")
    if kind == "present":
        return True
    assert sub is not None
    return decode(bytes(value), sub)


def decode_server_info(buf: bytes) -> list[dict[str, Any]]:
    """The `table_info` list of a `ServerInfoResponse`, one dict per table."""
    return list(decode(buf, SERVER_INFO_RESPONSE).get("table_info", []))
