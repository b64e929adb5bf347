"""Sync and distributed mode print the same `progress` and `eval` fields.

Without starting an agent: both modes must build these lines through agents/reporting.py
(read from their source, so neither JAX nor Ray is imported), passing the same keywords,
and no other module may build one by hand. The fields themselves are checked on a call.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from agents import reporting

AGENTS = Path(__file__).resolve().parents[1] / "agents"
MODES = ("local.py", "distributed.py")
BUILDERS = {"progress": reporting.progress_event, "eval": reporting.eval_event}
# What tests/ and bench/ read off these lines.
READ = {"progress": {"env_steps", "env_steps_per_s", "learner_steps", "learner_steps_per_s",
                     "inserts", "samples", "actors_alive", "table_size"},
        "eval": {"mean_return", "min_return", "max_return", "episodes"}}


class _Counts:
    def __init__(self, size: int, inserts: int, samples: int):
        self.current_size = size
        self.rate_limiter_info = self
        self.insert_stats = type("S", (), {"completed": inserts})()
        self.sample_stats = type("S", (), {"completed": samples})()


def _calls(module: str, function: str) -> list[ast.Call]:
    tree = ast.parse((AGENTS / module).read_text())
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute) and node.func.attr == function
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "reporting"]


@pytest.mark.parametrize("event", sorted(BUILDERS))
def test_both_modes_build_the_line_through_reporting_with_every_keyword(event: str) -> None:
    builder = BUILDERS[event]
    params = set(inspect.signature(builder).parameters)
    for module in MODES:
        calls = _calls(module, builder.__name__)
        assert calls, f"agents/{module} does not call reporting.{builder.__name__}"
        for call in calls:
            assert not call.args, f"agents/{module}: pass {builder.__name__}'s fields by name"
            assert {k.arg for k in call.keywords} == params, module


@pytest.mark.parametrize("event", sorted(BUILDERS))
def test_no_module_builds_the_line_by_hand(event: str) -> None:
    for path in AGENTS.glob("*.py"):
        if path.name == "reporting.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Dict):
                pairs = zip(node.keys, node.values)
                assert not any(isinstance(k, ast.Constant) and k.value == "event"
                               and isinstance(v, ast.Constant) and v.value == event
                               for k, v in pairs), f"agents/{path.name} builds `{event}` itself"


def test_the_lines_carry_what_tests_and_bench_read() -> None:
    first = reporting.Reading(at=10.0, env_steps=0, learner_steps=0)
    now = reporting.Reading(at=12.0, env_steps=400, learner_steps=150)
    progress = reporting.progress_event(
        elapsed_s=12.04, now=now, last=first, episodes=2, train_return=-1234.567,
        actors_alive=4, table=reporting.table_counts(_Counts(300, 400, 9600)))
    assert READ["progress"] <= set(progress)
    assert (progress["env_steps_per_s"], progress["learner_steps_per_s"]) == (200.0, 75.0)
    assert (progress["table_size"], progress["inserts"], progress["samples"]) == (300, 400, 9600)
    assert (progress["elapsed_s"], progress["train_return"]) == (12.0, -1234.6)
    assert reporting.progress_event(
        elapsed_s=0, now=first, last=first, episodes=0, train_return=None, actors_alive=1,
        table={"table_size": 0, "inserts": 0, "samples": 0})["env_steps_per_s"] == 0.0

    evaluation = reporting.eval_event(env_steps=400, learner_steps=150,
                                      returns=[-100.0, -300.004, -200.0])
    assert READ["eval"] <= set(evaluation)
    assert (evaluation["mean_return"], evaluation["min_return"], evaluation["max_return"],
            evaluation["episodes"]) == (-200.0, -300.0, -100.0, 3)
