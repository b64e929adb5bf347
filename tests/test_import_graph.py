"""The repository's import graph, read from the source: no cycles, and serving never polls.

Every Python file of the repository counts (the package, bench/, harness/, tests/, agents/,
tools/, examples/, deploy/, dashboards/), and every import, at module level and inside
functions alike: a function-level import hides a cycle from Python at start-up, not from
this test. Imports under `if TYPE_CHECKING:` never run and are left out, except in
replaywatch/probe/, the part users copy patterns from, where a type-only circle counts too.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "replaywatch"
FOLDERS = ("replaywatch", "bench", "harness", "tests", "agents", "tools", "examples", "deploy",
           "dashboards")
TYPED_TOO = "replaywatch.probe"  # type-only imports count here


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for folder in FOLDERS for p in sorted((ROOT / folder).rglob("*.py"))}


def _resolve(node: ast.ImportFrom, here: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = here.split(".")
    base = base[: len(base) - node.level + (1 if is_package else 0)]
    return ".".join(base + ([node.module] if node.module else []))


def _is_type_checking(node: ast.AST) -> bool:
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _walk_runtime(tree: ast.AST, typed_too: bool = False) -> list[ast.AST]:
    """ast.walk, less the bodies of `if TYPE_CHECKING:` (their `else:` runs and stays)."""
    out, todo = [], [tree]
    while todo:
        node = todo.pop()
        out.append(node)
        if _is_type_checking(node) and not typed_too:
            assert isinstance(node, ast.If)
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))
    return out


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """Our modules that `name` imports, anywhere in its body."""
    out: set[str] = set()
    typed_too = name == TYPED_TOO or name.startswith(TYPED_TOO + ".")
    for node in _walk_runtime(ast.parse(path.read_text(), str(path)), typed_too):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(node, name, path.name == "__init__.py")
            # `from pkg import mod` imports the module pkg.mod; `from mod import x`, mod.
            targets = [f"{source}.{a.name}" if f"{source}.{a.name}" in known else source
                       for a in node.names]
        else:
            continue
        out.update(t for t in targets if t in known and t != name)
    return out


def import_graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    return {name: imports_of(name, path, known) for name, path in found.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as [a, b, ..., a], or None (depth-first search, three colours)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def reaches(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in graph.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_the_graph_is_read_from_every_module() -> None:
    graph = import_graph()
    assert {"replaywatch.cli", "replaywatch.wiring", "replaywatch.poller",
            "replaywatch.api.app"} <= set(graph)
    assert "replaywatch.wiring" in graph["replaywatch.check"]
    # A function-level import counts like any other.
    assert "replaywatch.watch" in graph["replaywatch.cli"]
    assert {"bench.predict_grid", "harness.procs", "tests.builders"} <= set(graph)
    assert "harness.procs" in graph["bench.predict_grid"]


def test_there_is_no_import_cycle() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_serving_reads_state_and_never_imports_the_poller() -> None:
    graph = import_graph()
    for name in sorted(n for n in graph if n == "replaywatch.api" or
                       n.startswith("replaywatch.api.")):
        assert "replaywatch.poller" not in reaches(graph, name), (
            f"{name} reaches replaywatch.poller; the API must read the published state")


def test_the_checks_themselves_find_a_cycle_and_a_path() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    assert reaches(graph, "d") == {"a", "b", "c"}
    node = ast.parse("from . import rates").body[0]
    assert isinstance(node, ast.ImportFrom)
    assert _resolve(node, "replaywatch.diagnosis.engine", False) == "replaywatch.diagnosis"
    tree = ast.parse("if TYPE_CHECKING:\n    import a\nelse:\n    import b\n"
                     "def f():\n    import c\n")
    names = {a.name for n in _walk_runtime(tree) if isinstance(n, ast.Import) for a in n.names}
    assert names == {"b", "c"}


def test_check_and_the_cli_start_without_the_web_stack() -> None:
    """`check`, `--help` and bad command lines must not pay ~0.9 s of fastapi/uvicorn imports.

    cli.py reaches replaywatch.watch only through its one function-level import, in the
    `watch` branch; everything it imports at module level stays clear of the API.
    """
    graph = import_graph()
    assert not {"replaywatch.api", "replaywatch.watch"} & reaches(graph, "replaywatch.check")
    top_level = set(graph["replaywatch.cli"]) - {"replaywatch.watch"}
    for name in top_level:
        assert "replaywatch.api" not in reaches(graph, name) | {name}, name


def test_bench_harness_agents_and_tools_never_import_the_tests() -> None:
    # Tests may use bench and harness; the other way round would ship test scaffolding
    # into what `make bench` and the demo run.
    offenders = []
    for folder in ("bench", "harness", "agents", "tools", "examples"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in _walk_runtime(ast.parse(path.read_text(), str(path))):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom)
                         and not node.level else [])
                offenders += [f"{path.relative_to(ROOT)}: {n}" for n in names
                              if n == "tests" or n.startswith("tests.")]
    assert not offenders, offenders
