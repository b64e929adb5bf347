"""examples/rllib_dqn.py, read and never imported: Ray and torch are only in .venv-rllib, and
the RLlib tier runs the same kind of loop as harness/rllib_job.py, with its faults.

What holds here: the job has no replaywatch code in it, and the two commands its docstring
shows fit together: the watch command parses to a Ray target whose --ray-results is the
job's --results-dir, where the reader finds the rows in the run directory the job makes.
"""

from __future__ import annotations

import ast
import shlex
import time
from pathlib import Path

from replaywatch import cli
from replaywatch.sources.ray_results import ResultTail

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "rllib_dqn.py"
ROWS = ROOT / "tests" / "fixtures" / "ray" / "result_dqn.jsonl"


def _tree() -> ast.Module:
    return ast.parse(EXAMPLE.read_text(), str(EXAMPLE))


def _imports() -> list[str]:
    out: list[str] = []
    for node in ast.walk(_tree()):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            out.append(node.module or "")
    return out


def _commands() -> dict[str, list[str]]:
    """The docstring's indented command lines, by their first word."""
    doc = ast.get_docstring(_tree()) or ""
    return {words[0]: words[1:] for line in doc.splitlines()
            if line.startswith("    ") and (words := shlex.split(line))}


def _options() -> set[str]:
    """The flags the example's parser declares."""
    return {arg.value for node in ast.walk(_tree())
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == "add_argument"
            for arg in node.args if isinstance(arg, ast.Constant)}


def test_the_example_is_a_plain_rllib_job_with_no_replaywatch_code() -> None:
    imports = _imports()
    assert "ray.rllib.algorithms.dqn" in imports
    assert not [n for n in imports if n.split(".")[0] == "replaywatch"], imports


def test_the_watch_command_reads_the_rows_where_the_job_writes_them(tmp_path: Path) -> None:
    commands = _commands()
    job, watch = commands["python"], commands["replaywatch"]
    assert job[0] == "examples/rllib_dqn.py"
    assert "--results-dir" in _options()
    results_dir = job[job.index("--results-dir") + 1]
    (target,) = cli.ray_targets(cli.build_parser().parse_args(watch))
    assert target.dashboard == "http://127.0.0.1:8265"
    assert (target.temp_dir, target.results) == ("/tmp/ray", results_dir)
    # The run's directory as the job names it, under the directory given to --ray-results.
    (fmt,) = [node.args[0].value for node in ast.walk(_tree())
              if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "strftime" and isinstance(node.args[0], ast.Constant)]
    run = tmp_path / time.strftime(fmt)
    run.mkdir()
    (run / "result.json").write_bytes(ROWS.read_bytes().splitlines(keepends=True)[0])
    rows, file, errors = ResultTail(tmp_path).read()
    assert (file, errors) == (str(run / "result.json"), ())
    assert [r.iteration for r in rows] == [1]
