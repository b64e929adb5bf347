"""The learner's tf.data pipeline, read from its graph instead of declared.

Everything the budget model asks of a pipeline is in the trainer's memory:
`Dataset._as_serialized_graph()` is the GraphDef of every dataset op with its attributes and
its constant inputs, the interleaved function in its library, and an iterator keeps the
dataset it was made from (`iter(ds)` holds `_dataset`; `as_numpy_iterator()` wraps `iter(ds)`,
tensorflow/python/data/ops/iterator_ops.py and dataset_ops.py). From the graph's output down:

    PrefetchDataset              a prefetch depth (complete batches: they reach the learner)
    BatchDataset(V2)             a batch: above the interleave one batch gathers every
                                 sampler's samples (TF-Agents' as_dataset), inside the
                                 interleaved function each sampler batches on its own (Acme)
    ParallelInterleaveDatasetV4  cycle_length, num_parallel_calls (-1: AUTOTUNE), and what it
    (and V2, V3, Interleave)     interleaves: a range of N datasets, or an endless
                                 `from_tensors(0).repeat()` (Acme before dea9307)
    ReverbTrajectoryDataset      the table, max_in_flight_samples_per_worker,
    (ReverbDataset)              num_workers_per_iterator, max_samples_per_stream,
                                 rate_limiter_timeout_ms, and an item's shapes and dtypes

TensorFlow is touched only when the trainer already imported it (the probe never imports it
itself), and a graph that does not read as one of these shapes is said ("not read: ..."),
never guessed.
"""

from __future__ import annotations

import sys
from typing import Any

from replaywatch.probe.protocol import Pipeline, Shape

# A Reverb dataset's outputs start with SampleInfo's fields (key, probability, table_size,
# priority, times_sampled); an item's own tensors follow.
SAMPLE_INFO_FIELDS = 5
PASS_THROUGH = frozenset({
    "MapDataset", "ParallelMapDataset", "ParallelMapDatasetV2", "FilterDataset",
    "OptionsDataset", "ModelDataset", "MaxIntraOpParallelismDataset", "AssertCardinalityDataset",
    "PrivateThreadPoolDataset", "ShuffleDataset", "ShuffleDatasetV2", "ShuffleDatasetV3",
    "UnbatchDataset", "TakeDataset", "SkipDataset", "CacheDatasetV2", "Identity",
    "IgnoreErrorsDataset", "ApplyDataset", "AutoShardDataset", "DatasetToGraphV2",
})
INTERLEAVES = frozenset({"ParallelInterleaveDatasetV4", "ParallelInterleaveDatasetV3",
                         "ParallelInterleaveDatasetV2", "InterleaveDataset",
                         "LegacyParallelInterleaveDatasetV2"})
BATCHES = frozenset({"BatchDataset", "BatchDatasetV2", "ParallelBatchDataset"})
REVERB = frozenset({"ReverbTrajectoryDataset", "ReverbDataset"})
SOURCES = frozenset({"RangeDataset", "TensorDataset", "TensorSliceDataset", "TFRecordDataset",
                     "TextLineDataset", "GeneratorDataset", "RepeatDataset"})
SAMPLER_ATTRS = ("max_in_flight_samples_per_worker", "num_workers_per_iterator",
                 "max_samples_per_stream", "rate_limiter_timeout_ms")


class NotRead(Exception):
    """The graph is not one of the shapes this module reads; the message says why."""


def find_dataset(obj: Any, depth: int = 4) -> Any | None:
    """The tf.data dataset behind an iterator (or the dataset itself): `_dataset` of an
    OwnedIterator, `_iterator` of a NumpyIterator, `_inner`/`_iterable`/`_iterator` of the
    wrappers around them (the probe's, Acme's prefetching iterators)."""
    for _ in range(depth + 1):
        if obj is None:
            return None
        if callable(getattr(obj, "_as_serialized_graph", None)):
            return obj
        nxt = None
        for attr in ("_dataset", "_iterator", "_inner", "_iterable", "iterator"):
            candidate = getattr(obj, attr, None)
            if candidate is not None and candidate is not obj:
                nxt = candidate
                break
        obj = nxt
    return None


def read(obj: Any) -> dict[str, Any]:
    """The pipeline document: `{"read": True, ...}` (the graph's description beside it) or
    `{"read": False, "reason": ...}`."""
    tf = sys.modules.get("tensorflow")
    if tf is None:
        return _not_read("TensorFlow is not imported in this process")
    ds = find_dataset(obj)
    if ds is None:
        return _not_read(f"no tf.data dataset behind {type(obj).__name__}")
    try:
        graph = tf.compat.v1.GraphDef()
        graph.ParseFromString(ds._as_serialized_graph().numpy())
        return {Pipeline.READ: True, **Graph(graph, tf).describe()}
    except NotRead as e:
        return _not_read(str(e))
    except Exception as e:  # a probe never breaks on the trainer's graph
        return _not_read(f"{type(e).__name__}: {e}"[:300])


def _not_read(reason: str) -> dict[str, Any]:
    return {Pipeline.READ: False, Pipeline.REASON: reason}


class Graph:
    """A GraphDef and its function library, walked from the output down."""

    def __init__(self, graph: Any, tf: Any):
        self._tf = tf
        self._top = {n.name: n for n in graph.node}
        self._functions = {f.signature.name: f for f in graph.library.function}

    def describe(self) -> dict[str, Any]:
        ret = next((n for n in self._top.values() if n.op == "_Retval"), None)
        if ret is None:
            raise NotRead("the graph has no output")
        found: dict[str, Any] = {"prefetch": [], "batches": [], "interleave": None,
                                 "samplers": []}
        self._walk(self._top, ret.input[0], found, inside=False)
        if not found["samplers"]:
            raise NotRead("no Reverb dataset in the pipeline")
        return found

    def _walk(self, scope: dict[str, Any], ref: str, found: dict[str, Any],
              inside: bool) -> None:
        node = scope.get(ref.lstrip("^").split(":")[0])
        while node is not None:
            op = node.op
            if op == "PrefetchDataset":
                found["prefetch"].append(self._const(scope, node.input[1]))
            elif op in BATCHES:
                drop = self._const(scope, node.input[2]) if len(node.input) > 2 else False
                found["batches"].append({"size": self._const(scope, node.input[1]),
                                         "drop_remainder": bool(drop),
                                         "inside_interleave": inside})
            elif op in INTERLEAVES:
                self._interleave(scope, node, found)
                return
            elif op in REVERB:
                found["samplers"].append(self._sampler(scope, node))
                return
            elif op in SOURCES:
                raise NotRead(f"no Reverb dataset in the pipeline: it reads {op}")
            elif op not in PASS_THROUGH:
                raise NotRead(f"op {op} is not one this reader knows")
            node = scope.get(node.input[0].lstrip("^").split(":")[0]) if node.input else None

    def _interleave(self, scope: dict[str, Any], node: Any, found: dict[str, Any]) -> None:
        if found["interleave"] is not None:
            raise NotRead("an interleave inside an interleave")
        extra = len(node.attr["Targuments"].list.type)
        tail = [self._const(scope, ref) for ref in node.input[1 + extra:]]
        cycle = tail[0] if tail else None
        parallel = tail[-1] if node.op != "InterleaveDataset" and len(tail) > 2 else 1
        found["interleave"] = {
            "op": node.op, "cycle_length": cycle, "num_parallel_calls": parallel,
            "over": self._source(scope, node.input[0]),
            "deterministic": node.attr["deterministic"].s.decode() or "default"
            if "deterministic" in node.attr else "default"}
        function = self._functions.get(node.attr["f"].func.name)
        if function is None:
            raise NotRead("the interleaved function is not in the graph's library")
        inner = {n.name: n for n in function.node_def}
        out = next(iter(function.ret.values()), None)
        if out is None:
            raise NotRead("the interleaved function returns nothing")
        self._walk(inner, out, found, inside=True)

    def _source(self, scope: dict[str, Any], ref: str) -> str:
        """What the interleave reads from: `range N`, `repeat` (an endless repeat), or the
        op's name."""
        node = scope.get(ref.lstrip("^").split(":")[0])
        while node is not None and node.op in PASS_THROUGH:
            node = scope.get(node.input[0].split(":")[0])
        if node is None:
            return "unknown"
        if node.op == "RangeDataset":
            start, stop, step = (self._const(scope, r) for r in node.input[:3])
            return f"range {max(0, -(-(stop - start) // step))}"
        if node.op == "RepeatDataset":
            return "repeat" if self._const(scope, node.input[1]) < 0 else "repeat finite"
        return node.op

    def _sampler(self, scope: dict[str, Any], node: Any) -> dict[str, Any]:
        doc: dict[str, Any] = {"op": node.op}
        for attr in SAMPLER_ATTRS:
            doc[attr] = node.attr[attr].i if attr in node.attr else None
        table = next((r for r in node.input if r.split(":")[0].endswith("table")), None)
        doc["table"] = self._const(scope, table) if table else None
        doc["item_bytes"] = self._item_bytes(node)
        return doc

    def _item_bytes(self, node: Any) -> int | None:
        """An item's uncompressed bytes from the op's shapes and dtypes (its data after
        SampleInfo's fields); None when a dimension is unknown."""
        shapes = list(node.attr["shapes"].list.shape)[SAMPLE_INFO_FIELDS:]
        dtypes = list(node.attr["dtypes"].list.type)[SAMPLE_INFO_FIELDS:]
        total = 0
        for shape, dtype in zip(shapes, dtypes, strict=False):
            dims = [d.size for d in shape.dim]
            if shape.unknown_rank or any(d < 0 for d in dims):
                return None
            count = 1
            for d in dims:
                count *= d
            total += count * self._tf.dtypes.as_dtype(dtype).size
        return total or None

    def _const(self, scope: dict[str, Any], ref: str) -> Any:
        node = scope.get(ref.lstrip("^").split(":")[0])
        if node is None or node.op != "Const":
            raise NotRead(f"input {ref} is not a constant")
        value = self._tf.make_ndarray(node.attr["value"].tensor)
        value = value.item() if hasattr(value, "item") else value
        return value.decode() if isinstance(value, bytes) else value



# Acme's make_reverb_dataset before dea9307 interleaves an endless repeat, and tf.data then
# opens about three sampling iterators per requested worker (the budget model's docstring).
REPEAT_ITERATORS_PER_WORKER = 3
AUTOTUNE = -1


def shape(doc: dict[str, Any]) -> dict[str, Any] | None:
    """The budget model's inputs from a read pipeline, in the TrainerProbe's own names; None
    when the pipeline was not read. An AUTOTUNE interleave may run one thread: judged so."""
    if not doc.get(Pipeline.READ):
        return None
    inter, samplers, batches = doc["interleave"], doc["samplers"], doc["batches"]
    sampler = samplers[0]
    after = [b for b in batches if not b["inside_interleave"]]
    inside = [b for b in batches if b["inside_interleave"]]
    batch = (inside or after or [{}])[0].get("size")
    parallel = inter["num_parallel_calls"] if inter else 1
    workers = sampler["num_workers_per_iterator"]
    return {
        Shape.BATCH_SIZE: batch,
        Shape.NUM_PARALLEL_CALLS: 1 if parallel == AUTOTUNE else parallel,
        Shape.NUM_PARALLEL_CALLS_AUTOTUNE: parallel == AUTOTUNE,
        Shape.MAX_IN_FLIGHT: sampler["max_in_flight_samples_per_worker"],
        # Reverb's auto (-1) is one worker, in-process and over gRPC alike (GetNumWorkers,
        # kDefaultNumWorkers 1, reverb/cc/sampler.cc); bench/RESULTS.md has the runs (one
        # iterator draws max_in_flight samples, two workers twice as many, over gRPC too).
        Shape.WORKERS_PER_ITERATOR: workers if workers and workers > 0 else 1,
        Shape.ITERATORS_PER_WORKER: (REPEAT_ITERATORS_PER_WORKER
                                     if inter and inter["over"] == "repeat" else 1),
        Shape.BATCH_AFTER_INTERLEAVE: bool(after) and not inside,
        Shape.CYCLE_LENGTH: inter["cycle_length"] if inter and after and not inside else None,
        Shape.ITEM_BYTES: sampler["item_bytes"],
        Shape.PREFETCH_SIZE: sum(doc["prefetch"]) or None,
        Shape.TABLE: sampler["table"],
    }
