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
from tests import test_rules_actors as actors_cases
from tests import test_rules_config as config_cases
from tests import test_rules_learner as learner_cases
from tests import test_rules_liveness as liveness_cases
from tests import test_rules_stalls as stalls_cases

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

# Families whose rule tests still live in a module named for something else, and the module
# that should become their tests/test_rules_<family>.py. The test below fails once one is
# mirrored, so this shrinks as they move (and never hides a new family).
NOT_YET_MIRRORED = {
    "health": "tests/test_replay_health.py",
    "memory": "tests/test_memory.py",
    "windows": "tests/test_windows_core.py",
}


def family(path: Path, prefix: str) -> str:
    return path.stem.removeprefix(prefix)


def test_every_rule_family_has_its_test_module_but_those_not_yet_mirrored() -> None:
    families = {family(p, "rules_") for p in RULE_MODULES}
    mirrored = {family(p, "test_rules_") for p in TESTS.glob("test_rules_*.py")}
    assert families - mirrored == set(NOT_YET_MIRRORED)
    assert mirrored <= families  # no test module for a family that is gone
    assert all((TESTS.parent / f).is_file() for f in NOT_YET_MIRRORED.values())


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


# -- the case lists, where tests/test_kinds.py reads them -----------------------------------------

# tests/test_kinds.py reads these lists as `test_rules.X` to prove every kind has a case; they
# now live in their family's module. Named here until test_kinds.py reads them from there.
TABLE_CASES = stalls_cases.TABLE_CASES
SPI_CASES = stalls_cases.SPI_CASES
STARVATION_CASES = actors_cases.STARVATION_CASES
PROBE_CASES = [*learner_cases.PROBE_CASES, *config_cases.PROBE_CASES]
VIEW_CASES = liveness_cases.VIEW_CASES
WRITER_CASES = actors_cases.WRITER_CASES
