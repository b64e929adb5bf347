"""Old versions of our own modules, read from git, so a benchmark times "before" and "after"
in the same run on the same input."""

from __future__ import annotations

import subprocess
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def module_at(spec: str, name: str) -> types.ModuleType | None:
    """The module `git show spec` ("REV:path.py") holds, executed under `name`; None where
    git or that history is missing (a shallow clone, an exported tarball)."""
    try:
        source = subprocess.run(["git", "show", spec], capture_output=True, text=True,
                                timeout=10, check=True, cwd=ROOT).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    module = types.ModuleType(name)
    exec(compile(source, spec, "exec"), module.__dict__)  # our own code, from our history
    return module
