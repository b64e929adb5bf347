"""The probe protocol is declared once: replaywatch/probe/protocol.py's keys are the only
spelling of a `GET /probe` key, in the probes that write documents and in the sidecar's
reader, and the declared and the read pipeline are chosen between in one place.

A key written as a literal on either end is a key that can drift from the other: the probe
renames it and the sidecar reads nothing, silently (a `.get()` with a default). The scan
below reads the syntax trees: the reader may not spell any protocol key as a string, and the
code that builds a document may not write a dict key or a keyword of `dict()`/`.update()` by
hand.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from replaywatch.diagnosis import consumption, ratelimiter, rules_config
from replaywatch.model import PipelineShape
from replaywatch.probe import protocol
from replaywatch.probe.protocol import Doc, Role, Shape, Trainer
from replaywatch.sources.probe_http import snapshot_from_probe
from tests.builders import probe_history, seconds, table_history

ROOT = Path(__file__).resolve().parents[1]
READER = ROOT / "replaywatch" / "sources" / "probe_http.py"
PROBE = ROOT / "replaywatch" / "probe"
# Where documents are built; None: the whole module. pipeline.py's Graph describes the graph
# for `shape` in the same module (its words are the graph's, not the protocol's), and
# serving.py's thread_stacks writes the /stacks document, not /probe.
WRITERS: dict[str, tuple[str, ...] | None] = {
    "trainer.py": None, "actor.py": None, "replay.py": None, "sections.py": None,
    "batch_stats.py": None, "serving.py": ("thread_counts",),
    "pipeline.py": ("read", "_not_read", "shape"),
    # rllib.py's callbacks() spells RLlib's hook names, not the protocol's keys.
    "rllib.py": ("snapshot", "on_train_result", "_flat", "_buffer", "_queue"),
}


def _docstrings(tree: ast.AST) -> set[int]:
    nodes = [n for n in ast.walk(tree)
             if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef)]
    return {id(n.body[0].value) for n in nodes
            if n.body and isinstance(n.body[0], ast.Expr)
            and isinstance(n.body[0].value, ast.Constant)}


def keys_spelled(source: str) -> list[str]:
    """Every string constant that is a protocol key, docstrings, f-strings and getattr's
    attribute names (an exception's `reason`) aside."""
    tree = ast.parse(source)
    skip = _docstrings(tree) | {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr)
                                for v in n.values} | {
        id(n.args[1]) for n in ast.walk(tree) if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Name) and n.func.id == "getattr" and len(n.args) > 1}
    return [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)
            and isinstance(n.value, str) and id(n) not in skip and n.value in protocol.keys()]


def keys_written(source: str, functions: tuple[str, ...] | None = None) -> list[str]:
    """Dict keys written as literals, and keywords of dict() and .update() (a key by another
    spelling), in the module or in the named functions."""
    tree = ast.parse(source)
    scopes: list[ast.AST] = [tree] if functions is None else [
        n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name in functions]
    found = []
    for scope in scopes:
        for n in ast.walk(scope):
            if isinstance(n, ast.Dict):
                found += [k.value for k in n.keys
                          if isinstance(k, ast.Constant) and isinstance(k.value, str)]
            elif isinstance(n, ast.Call) and n.keywords and (
                    (isinstance(n.func, ast.Name) and n.func.id == "dict")
                    or (isinstance(n.func, ast.Attribute) and n.func.attr == "update")):
                found += [k.arg for k in n.keywords if k.arg is not None]
    return found


def test_the_scans_catch_a_key_written_by_hand() -> None:
    assert keys_spelled('x = _opt_int(doc, "batch_size") or doc.get("pid")') == [
        "batch_size", "pid"]
    assert keys_spelled('"""batch_size"""\ny = f"batch_size {x}" + Doc.PID') == []
    assert keys_spelled('why = getattr(error, "reason", error)') == []
    assert keys_written('def snapshot():\n    doc.update(now=1)\n    return {"pid": 2}',
                        ("snapshot",)) == ["now", "pid"]
    assert keys_written("doc = {Doc.PID: 2, **other}\ndoc.update({Doc.NOW: 1})") == []


def test_the_sidecars_reader_spells_no_probe_key() -> None:
    assert keys_spelled(READER.read_text()) == []


@pytest.mark.parametrize("module", sorted(WRITERS))
def test_the_probes_write_no_document_key_by_hand(module: str) -> None:
    functions = WRITERS[module]
    source = (PROBE / module).read_text()
    if functions is not None:  # the names are real: a renamed function is not scanned blind
        defined = {n.name for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef)}
        assert set(functions) <= defined
    assert keys_written(source, functions) == []


def test_every_key_is_declared_once_per_meaning() -> None:
    # Two classes may share a spelling (`count` of a section and of a writer call), but one
    # class may not declare a key twice: two names for one key would read as two keys.
    for cls in protocol.KEY_CLASSES:
        values = [v for k, v in vars(cls).items() if k.isupper() and isinstance(v, str)]
        assert len(values) == len(set(values)), cls.__name__


# -- the declared and the read pipeline, one choice --------------------------------------------

def trainer_document(**fields: object) -> dict[str, object]:
    return {Doc.ROLE: Role.TRAINER.value, Doc.PID: 7, Trainer.BATCHES_RETRIEVED: 3,
            Trainer.BLOCKED_IN_NEXT: False, **fields}


READ_64 = {Shape.BATCH_SIZE: 64, Shape.NUM_PARALLEL_CALLS: 3, Shape.MAX_IN_FLIGHT: 128,
           Shape.PREFETCH_SIZE: None, Shape.ITEM_BYTES: None, Shape.TABLE: "replay"}


def test_the_read_pipeline_wins_and_the_declared_fills_what_it_left_unknown() -> None:
    snap = snapshot_from_probe(trainer_document(
        **{Shape.BATCH_SIZE: 32, Shape.NUM_PARALLEL_CALLS: 12, Shape.ITEM_BYTES: 400,
           Shape.PREFETCH_SIZE: 2, Trainer.PIPELINE: {"read": True},
           Trainer.PIPELINE_SHAPE: READ_64}), "http://p:1", 1.0)
    assert snap.declared.batch_size == 32 and snap.read is not None
    chosen = snap.pipeline
    assert (chosen.batch_size, chosen.num_parallel_calls) == (64, 3)  # read
    assert (chosen.item_bytes, chosen.prefetch_size) == (400, 2)  # declared, the graph silent
    assert rules_config.declared_differs(snap) == {
        "batch_size": {"declared": 32, "read": 64},
        "num_parallel_calls": {"declared": 12, "read": 3}}


def test_a_read_pipeline_without_a_declared_batch_size_gets_its_consumption_figure() -> None:
    # The probe was told nothing (TrainerProbe()) and read batches of 64 from the graph: the
    # verdict and the learner's consumption both rest on that one batch size.
    doc = trainer_document(**{Trainer.PIPELINE: {"read": True},
                              Trainer.PIPELINE_SHAPE: READ_64})
    read = snapshot_from_probe(doc, "http://p:1", 1.0).read
    assert read is not None
    times = seconds(6)
    probes = probe_history(times, [0, 10, 20, 30, 40, 50], batch_size=None, workers=None,
                           prefetch=None, pipeline=read)
    assert probes[-1].declared.batch_size is None and probes[-1].pipeline.batch_size == 64
    table = table_history(times, [0, 640, 1280, 1920, 2560, 3200],
                          [0, 640, 1280, 1920, 2560, 3200], size=100)
    figures = consumption.consumption(table, [probes], times[-1], 10.0)
    assert figures is not None and figures.consumed_per_insert == pytest.approx(1.0)
    stranded = ratelimiter.stranded_samples(table, [probes[-1]])
    assert stranded is not None and stranded.delivered == 50 * 64
    ds = rules_config.dataset_of(probes[-1], table[-1])
    assert ds is not None and (ds.batch_size, ds.workers) == (64, 3)


def test_a_shape_over_another_keeps_its_own_values_and_takes_only_the_unknown() -> None:
    mine = PipelineShape(batch_size=8, num_parallel_calls_autotune=True)
    theirs = PipelineShape(batch_size=16, num_parallel_calls=4, table="t")
    assert mine.over(theirs) == dataclasses.replace(mine, num_parallel_calls=4, table="t")
    assert PipelineShape().over(theirs) == theirs
