"""The diagnosis core imports the stdlib and our model only: no clock, I/O or edges."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORE = sorted((ROOT / "replaywatch" / "diagnosis").glob("*.py")) + [ROOT / "replaywatch" /
                                                                     "model.py"]
# Stdlib modules that read the clock, do I/O or start threads: a rule must get them as data.
FORBIDDEN_STDLIB = {
    "time", "datetime", "logging", "socket", "threading", "multiprocessing", "subprocess",
    "asyncio", "concurrent", "os", "sys", "io", "sqlite3", "http", "urllib", "random",
    "signal", "select", "selectors", "shutil", "tempfile", "pathlib", "builtins",
}
# The probe protocol is the standard library's too: its words (layouts, gates) are the model's;
# so are a Ray job's records (ray_model.py), the RLlib rules' input.
OURS = ("replaywatch.model", "replaywatch.ray_model", "replaywatch.diagnosis",
        "replaywatch.probe.protocol")


def imported_modules(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative import: inside replaywatch.diagnosis
                names.append("replaywatch.diagnosis")
            elif node.module:
                names.append(node.module)
    return names


def is_allowed(module: str) -> bool:
    top = module.split(".")[0]
    if module == "__future__":
        return True
    if top == "replaywatch":
        return any(module == ours or module.startswith(ours + ".") for ours in OURS)
    return top in sys.stdlib_module_names and top not in FORBIDDEN_STDLIB


@pytest.mark.parametrize("path", CORE, ids=[p.name for p in CORE])
def test_core_module_imports_only_the_stdlib_and_our_model(path: Path) -> None:
    outward = [m for m in imported_modules(path) if not is_allowed(m)]
    assert outward == [], f"{path.relative_to(ROOT)} reaches outward: {outward}"


@pytest.mark.parametrize("module,allowed", [
    ("time", False),  # the clock is an argument
    ("logging", False),
    ("reverb", False),
    ("fastapi", False),
    ("prometheus_client", False),
    ("grpc", False),
    ("replaywatch.sources.reverb", False),
    ("replaywatch.history", False),
    ("replaywatch.model", True),
    ("replaywatch.probe.protocol", True),
    ("replaywatch.ray_model", True),
    ("replaywatch.sources.ray_cluster", False),
    ("replaywatch.probe.trainer", False),  # a probe serves HTTP from a thread
    ("replaywatch.diagnosis.window", True),
    ("dataclasses", True),
    ("math", True),
])
def test_the_purity_check_itself_tells_in_from_out(module: str, allowed: bool) -> None:
    assert is_allowed(module) is allowed
