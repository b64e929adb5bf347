"""The budget model's words are compared as enums, never as strings.

A verdict, layout, gate, batching or fix knob written as a string literal where code
decides by it (`verdict == "safe"`, `kind in ("sync", "sync-ratio")`, `{"schedule": ...}`,
`case "can_hang":`) is a word the enums no longer check: a typo there is silently false.
The enums' own declarations (`SAFE = "safe"`) are assignments, so they are not flagged.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "replaywatch"

VERDICTS = {"safe", "can_hang", "will_hang"}
LAYOUTS = {"sync", "sync-ratio", "async", "async-lag"}
GATES = {"can_sample", "can-sample", "schedule"}
BATCHING = {"per-worker", "after-interleave"}
# The knobs are also the names of evidence keys and flags, so only a comparison is flagged.
KNOBS = {"num_parallel_calls", "cycle_length", "error_buffer", "batch_size", "max_policy_lag",
         "max_items_ahead", "first_step_at", "inserts_per_step"}
WORDS = VERDICTS | LAYOUTS | GATES | BATCHING


def _literal(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _members(node: ast.AST) -> list[str]:
    """The string literals of a tuple, list or set display, or the one literal itself."""
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [s for e in node.elts if (s := _literal(e)) is not None]
    return [s] if (s := _literal(node)) is not None else []


def _compared(left: ast.AST, op: ast.cmpop, right: ast.AST) -> list[str]:
    """The words one comparison decides by. A knob named on the left of `in` is a key looked
    up (`"error_buffer" in settings`), not a knob compared."""
    if isinstance(op, (ast.In, ast.NotIn)):
        return ([w for w in _members(right) if w in WORDS | KNOBS]
                + [w for w in _members(left) if w in WORDS])
    return [w for side in (left, right) for w in _members(side) if w in WORDS | KNOBS]


def string_words(source: str, filename: str = "<source>") -> list[tuple[int, str]]:
    """(line, word) for each word compared, matched or used as a dict key as a string."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Compare):
            sides = (node.left, *node.comparators)
            for left, op, right in zip(sides[:-1], node.ops, sides[1:], strict=True):
                found += [(node.lineno, w) for w in _compared(left, op, right)]
        elif isinstance(node, ast.Dict):
            found += [(node.lineno, w) for key in node.keys if key is not None
                      for w in _members(key) if w in WORDS]
        elif isinstance(node, ast.MatchValue):
            found += [(node.lineno, w) for w in _members(node.value) if w in WORDS | KNOBS]
    return found


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_no_module_compares_a_verdict_layout_gate_or_knob_as_a_string() -> None:
    # One test over every module (a hundred cases of a few milliseconds each cost make test
    # more in pytest's own overhead than in the check).
    found = {p.relative_to(ROOT).as_posix(): words for p in _modules()
             if (words := string_words(p.read_text(), str(p)))}
    assert len(_modules()) > 50 and found == {}, f"compare the enum, not {found}"


@pytest.mark.parametrize("source,words", [
    ('if b.verdict == "safe": pass', ["safe"]),
    ('ok = kind in ("sync", "sync-ratio")', ["sync", "sync-ratio"]),
    ('words = {"can_hang": "CAN HANG"}', ["can_hang"]),
    ('if f.knob != "batch_size": pass', ["batch_size"]),
    ('match gate:\n    case "schedule": pass', ["schedule"]),
    ('SAFE = "safe"', []),  # a declaration
    ('doc = {"batch_size": 4}', []),  # an evidence key named as the knob is
    ('if "error_buffer" in settings: pass', []),  # a key looked up
    ('if knob in ("batch_size", "inserts_per_step"): pass', ["batch_size", "inserts_per_step"]),
    ('if verdict == Verdict.SAFE: pass', []),
])
def test_the_check_itself_tells_a_string_word_from_an_enum(source: str, words: list[str]) -> None:
    assert [w for _, w in string_words(source)] == words
