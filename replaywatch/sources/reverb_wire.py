"""Reverb's `ServerInfoResponse`, decoded by the `protobuf` library (its upb C backend).

Why not `reverb.Client.server_info`: importing reverb pulls TensorFlow (4-5 s
and ~1 GB), its deadline is in whole seconds (a dead server costs 1 s per poll)
and its generated protos need TensorFlow's `StructuredValue` for the table
signature. The sidecar calls the same `ServerInfo` RPC with plain grpcio and
declares here only the messages it reads, with the field numbers and types of
reverb/cc/schema.proto and reverb/cc/reverb_service.proto (dm-reverb 0.14; the
schema.proto of 0.7.2, Launchpad's, declares these fields alike: tests/test_reverb_wire.py).

The messages are built from descriptors at import, in a private pool: no
generated code to keep in step with a protoc version, no clash with reverb's own
`deepmind.reverb` classes when both are imported (the tests do), and nothing to
build at install. The signature (field 6 of TableInfo) is declared as opaque
bytes: same wire type as `tensorflow.StructuredValue`, so TensorFlow's protos are
never needed. Its presence is read, and `signature_item_bytes` decodes it (with the
few struct.proto messages declared below) for one number the budget model needs:
an item's size, which decides how many items one sample response carries (1 MiB at
most). Fields a newer server adds are
kept as unknown fields and ignored. The file is proto2 only so that
`HasField("signature")` tells an absent signature from an empty one; proto2 and
proto3 read the same bytes the same way for these scalar fields.

Decoding a 100-table answer takes ~0.2 ms here (the hand-written pure-Python
decoder it replaces took ~10 ms: bench/server_info_cost.py).
"""

from __future__ import annotations

import functools
import math
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message, message_factory

SERVICE_METHOD = "/deepmind.reverb.ReverbService/ServerInfo"

_F = descriptor_pb2.FieldDescriptorProto
_INT64, _INT32, _UINT64 = _F.TYPE_INT64, _F.TYPE_INT32, _F.TYPE_UINT64
_DOUBLE, _BOOL, _STRING, _BYTES, _MESSAGE = (
    _F.TYPE_DOUBLE, _F.TYPE_BOOL, _F.TYPE_STRING, _F.TYPE_BYTES, _F.TYPE_MESSAGE)

# message -> [(field, number, type, message type or "", oneof or "")], as in Reverb's .proto;
# a nested message ("Outer.Inner") follows its outer one.
_MESSAGES: dict[str, list[tuple[str, int, int, str, str]]] = {
    "Uint128": [("high", 1, _UINT64, "", ""), ("low", 2, _UINT64, "", "")],
    "RateLimiterCallStats": [("completed", 2, _INT64, "", "")],
    "RateLimiterInfo": [
        ("samples_per_insert", 1, _DOUBLE, "", ""),
        ("min_diff", 2, _DOUBLE, "", ""),
        ("max_diff", 3, _DOUBLE, "", ""),
        ("min_size_to_sample", 4, _INT64, "", ""),
        ("insert_stats", 5, _MESSAGE, "RateLimiterCallStats", ""),
        ("sample_stats", 6, _MESSAGE, "RateLimiterCallStats", ""),
    ],
    "TableWorkerTime": [
        ("running_ms", 1, _INT64, "", ""),
        ("sampling_ms", 2, _INT64, "", ""),
        ("inserting_ms", 3, _INT64, "", ""),
        ("sleeping_ms", 4, _INT64, "", ""),
        ("waiting_for_sampling_ms", 5, _INT64, "", ""),
        ("waiting_for_inserts_ms", 6, _INT64, "", ""),
    ],
    "KeyDistributionOptions": [
        ("fifo", 1, _BOOL, "", "distribution"),
        ("uniform", 2, _BOOL, "", "distribution"),
        ("prioritized", 3, _MESSAGE, "KeyDistributionOptions.Prioritized", "distribution"),
        ("heap", 4, _MESSAGE, "KeyDistributionOptions.Heap", "distribution"),
        ("lifo", 6, _BOOL, "", "distribution"),
        ("is_deterministic", 7, _BOOL, "", ""),
    ],
    "KeyDistributionOptions.Prioritized": [("priority_exponent", 1, _DOUBLE, "", "")],
    "KeyDistributionOptions.Heap": [("min_heap", 1, _BOOL, "", "")],
    "TableInfo": [
        ("name", 8, _STRING, "", ""),
        ("sampler_options", 1, _MESSAGE, "KeyDistributionOptions", ""),
        ("remover_options", 2, _MESSAGE, "KeyDistributionOptions", ""),
        ("max_size", 3, _INT64, "", ""),
        ("max_times_sampled", 4, _INT32, "", ""),
        ("rate_limiter_info", 5, _MESSAGE, "RateLimiterInfo", ""),
        ("signature", 6, _BYTES, "", ""),  # tensorflow.StructuredValue, kept opaque
        ("current_size", 7, _INT64, "", ""),
        ("num_episodes", 9, _INT64, "", ""),
        ("num_deleted_episodes", 10, _INT64, "", ""),
        ("num_unique_samples", 11, _INT64, "", ""),
        ("table_worker_time", 12, _MESSAGE, "TableWorkerTime", ""),
    ],
    "ServerInfoResponse": [
        ("tables_state_id", 1, _MESSAGE, "Uint128", ""),
        ("table_info", 2, _MESSAGE, "TableInfo", ""),  # repeated: see _REPEATED
    ],
    # The signature's tensorflow.StructuredValue (tensorflow/core/protobuf/struct.proto), as
    # far as item sizes go: nests of TensorSpecs. The other kinds of value are left unknown,
    # so a signature holding one reads as "size unknown".
    "StructuredValue": [
        ("tensor_spec_value", 33, _MESSAGE, "TensorSpec", "kind"),
        ("bounded_tensor_spec_value", 35, _MESSAGE, "TensorSpec", "kind"),
        ("list_value", 51, _MESSAGE, "Values", "kind"),
        ("tuple_value", 52, _MESSAGE, "Values", "kind"),
        ("dict_value", 53, _MESSAGE, "DictValue", "kind"),
        ("named_tuple_value", 54, _MESSAGE, "NamedTupleValue", "kind"),
    ],
    "Values": [("values", 1, _MESSAGE, "StructuredValue", "")],  # ListValue, TupleValue
    "DictValue": [("fields", 1, _MESSAGE, "DictValue.Entry", "")],  # a map on the wire
    "DictValue.Entry": [("key", 1, _STRING, "", ""), ("value", 2, _MESSAGE, "StructuredValue", "")],
    "NamedTupleValue": [("name", 1, _STRING, "", ""),
                        ("values", 2, _MESSAGE, "DictValue.Entry", "")],  # PairValue alike
    "TensorSpec": [("name", 1, _STRING, "", ""), ("shape", 2, _MESSAGE, "TensorShape", ""),
                   ("dtype", 3, _INT32, "", "")],  # an enum on the wire: a varint
    "TensorShape": [("dim", 2, _MESSAGE, "TensorShape.Dim", ""),
                    ("unknown_rank", 3, _BOOL, "", "")],
    "TensorShape.Dim": [("size", 1, _INT64, "", "")],
}
_REPEATED = {("ServerInfoResponse", "table_info"), ("Values", "values"), ("DictValue", "fields"),
             ("NamedTupleValue", "values"), ("TensorShape", "dim")}
_PACKAGE = "deepmind.reverb"


def _file() -> descriptor_pb2.FileDescriptorProto:
    fdp = descriptor_pb2.FileDescriptorProto(
        name="replaywatch/reverb_server_info.proto", package=_PACKAGE, syntax="proto2")
    top: dict[str, descriptor_pb2.DescriptorProto] = {}
    for full, fields in _MESSAGES.items():
        outer, _, inner = full.partition(".")
        msg = top[outer].nested_type.add(name=inner) if inner else fdp.message_type.add(name=full)
        top.setdefault(full, msg)
        oneofs: list[str] = []
        for name, number, kind, type_name, oneof in fields:
            label = _F.LABEL_REPEATED if (full, name) in _REPEATED else _F.LABEL_OPTIONAL
            field = msg.field.add(name=name, number=number, type=kind, label=label)
            if type_name:
                field.type_name = f".{_PACKAGE}.{type_name}"
            if oneof:
                if oneof not in oneofs:
                    oneofs.append(oneof)
                    msg.oneof_decl.add(name=oneof)
                field.oneof_index = oneofs.index(oneof)
    return fdp


def _classes() -> dict[str, Any]:
    pool = descriptor_pool.DescriptorPool()  # private: reverb's own classes may coexist
    pool.Add(_file())
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(
        f"{_PACKAGE}.{name}")) for name in ("ServerInfoResponse", "TableInfo", "StructuredValue")}


_CLASSES = _classes()
ServerInfoResponse: Any = _CLASSES["ServerInfoResponse"]
TableInfo: Any = _CLASSES["TableInfo"]
StructuredValue: Any = _CLASSES["StructuredValue"]

# tensorflow.DataType -> bytes per element (tensorflow/core/framework/types.proto); strings,
# resources and variants have no fixed size.
DTYPE_BYTES = {1: 4, 2: 8, 3: 4, 4: 1, 5: 2, 6: 1, 8: 8, 9: 8, 10: 1, 11: 1, 12: 1, 13: 4,
               14: 2, 15: 2, 16: 2, 17: 2, 18: 16, 19: 2, 22: 4, 23: 8}


class WireError(ValueError):
    """The bytes are not a well-formed `ServerInfoResponse`."""


def decode_server_info(buf: bytes) -> list[Any]:
    """The `table_info` list of a `ServerInfoResponse`: one `TableInfo` message per table."""
    try:
        return list(ServerInfoResponse.FromString(buf).table_info)
    except message.DecodeError as e:
        raise WireError(str(e) or "not a ServerInfoResponse") from None


# Every poll reads every table's signature, and a table's signature never changes: decoding
# one (~40 us) would triple what a 100-table answer costs, so each is read once.
@functools.lru_cache(maxsize=1024)
def signature_item_bytes(signature: bytes) -> int | None:
    """The bytes of one item by the table's signature (uncompressed): the sum over its
    TensorSpecs of elements x element size. None when the signature is empty or holds a
    dimension, rank or dtype without a fixed size, or is not a nest of TensorSpecs."""
    try:
        total = _value_bytes(StructuredValue.FromString(signature))
    except (message.DecodeError, RecursionError):
        return None
    return total or None


def _value_bytes(v: Any) -> int | None:
    kind = v.WhichOneof("kind")
    if kind in ("tensor_spec_value", "bounded_tensor_spec_value"):
        spec = getattr(v, kind)
        per = DTYPE_BYTES.get(spec.dtype)
        if per is None or spec.shape.unknown_rank or any(d.size < 0 for d in spec.shape.dim):
            return None
        return math.prod(d.size for d in spec.shape.dim) * per
    if kind in ("list_value", "tuple_value"):
        parts = [_value_bytes(x) for x in getattr(v, kind).values]
    elif kind in ("dict_value", "named_tuple_value"):
        entries = v.dict_value.fields if kind == "dict_value" else v.named_tuple_value.values
        parts = [_value_bytes(e.value) for e in entries]
    else:
        return None
    return None if any(p is None for p in parts) else sum(p for p in parts if p is not None)
