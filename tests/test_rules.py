"""The rule registry (diagnosis/rules.py) and the rule families it gathers: every declared
kind has one rule, and rules name kinds by their declaration.

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


# -- the case lists, where tests/test_kinds.py reads them -----------------------------------------

# tests/test_kinds.py reads these lists as `test_rules.X` to prove every kind has a case; they
# now live in their family's module. Named here until test_kinds.py reads them from there.
TABLE_CASES = stalls_cases.TABLE_CASES
SPI_CASES = stalls_cases.SPI_CASES
STARVATION_CASES = actors_cases.STARVATION_CASES
PROBE_CASES = [*learner_cases.PROBE_CASES, *config_cases.PROBE_CASES]
VIEW_CASES = liveness_cases.VIEW_CASES
WRITER_CASES = actors_cases.WRITER_CASES
