"""The rule registry (diagnosis/rules.py) and the rule families it gathers: every declared
kind has one rule, rules name kinds by their declaration, and every family
(diagnosis/rules_<family>.py) has its test module tests/test_rules_<family>.py.

The rules themselves are tested in their family's module, one table row per case.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from replaywatch.diagnosis import kinds, rules

# -- the declaration and the rules agree --------------------------------------------------------

def test_every_declared_kind_has_a_rule_and_every_rule_a_declared_kind() -> None:
    assert set(rules.BY_KIND) == set(kinds.ALL)


RULE_MODULES = sorted((Path(rules.__file__).parent).glob("rules_*.py"))


@pytest.mark.parametrize("path", RULE_MODULES, ids=[p.name for p in RULE_MODULES])
def test_rules_name_kinds_by_their_declaration_not_by_string(path: Path) -> None:
    calls = [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Call)]
    assert not [n for n in calls if getattr(n.func, "id", None) == "Finding"]
    named = [n.args[0] for n in calls if getattr(n.func, "attr", None) == "finding"
             and n.args and isinstance(n.args[0], ast.Constant)]
    assert named == []


# -- the tests mirror the families ----------------------------------------------------------------

TESTS = Path(__file__).parent

def family(path: Path, prefix: str) -> str:
    return path.stem.removeprefix(prefix)


def test_every_rule_family_has_its_test_module_and_every_test_module_its_family() -> None:
    families = {family(p, "rules_") for p in RULE_MODULES}
    mirrored = {family(p, "test_rules_") for p in TESTS.glob("test_rules_*.py")}
    assert families == mirrored


def test_every_family_test_module_imports_its_rule_module() -> None:
    def imported(path: Path) -> set[str]:
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "replaywatch.diagnosis":
                names |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module.removeprefix("replaywatch.diagnosis."))
            elif isinstance(node, ast.Import):
                names |= {a.name.removeprefix("replaywatch.diagnosis.") for a in node.names}
        return names
    modules = sorted(TESTS.glob("test_rules_*.py"))
    assert modules
    assert [p.name for p in modules if f"rules_{family(p, 'test_rules_')}" not in imported(p)
            ] == []
