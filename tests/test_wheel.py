"""The wheel is the sidecar alone: no top-level package but `replaywatch`, and installing it
pulls no TensorFlow, JAX or Reverb (those are the `agents` extra, for the repo's own use).

Built from a copy of the sources, so a stale build/ in the working tree cannot leak into
it; installed into a fresh venv, as a user would (by uv, as the Makefile installs every venv).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.long]

ROOT = Path(__file__).resolve().parents[1]
UV = Path(sys.executable).parent / "uv"  # the Makefile installs it first in the venv
HEAVY = ("tensorflow", "jax", "jaxlib", "reverb", "dm-reverb", "ray")
IMPORT_CHECK = (
    "import sys, replaywatch.probe, replaywatch.cli; "
    "heavy = sorted(m for m in ('tensorflow', 'jax', 'reverb') if m in sys.modules); "
    "assert not heavy, heavy"
)


def _run(args: list[str], timeout_s: float, **kwargs: object) -> subprocess.CompletedProcess:
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout_s, **kwargs)
    assert done.returncode == 0, f"{args} exited {done.returncode}: {done.stderr[-2000:]}"
    return done


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "replaywatch", src / "replaywatch",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = tmp_path_factory.mktemp("wheels")
    # No build isolation: the repo venv's setuptools builds it, offline and in seconds.
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
          "-w", str(out), str(src)], 180)
    (built,) = out.glob("replaywatch-*.whl")
    return built


def test_the_wheel_holds_replaywatch_and_its_static_files_only(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names}
    dist_info = [t for t in top if t.endswith(".dist-info")]
    assert top == {"replaywatch", *dist_info} and len(dist_info) == 1, sorted(top)
    assert dist_info[0].startswith("replaywatch-")
    assert "replaywatch/api/static/index.html" in names


def test_a_fresh_venv_runs_the_cli_and_imports_no_tensorflow(wheel: Path, tmp_path: Path
                                                             ) -> None:
    venv = tmp_path / "venv"
    # uv, as the Makefile installs every venv: resolves and installs what pip would from the
    # same index and constraints, in a fifth of pip's CPU (make test's budget is CPU-bound)
    _run([str(UV), "venv", "-q", "--seed", "--python", sys.executable, str(venv)], 120)
    python = venv / "bin" / "python"
    _run([str(UV), "pip", "install", "-q", "--python", str(python), "--system-certs",
          "-c", str(ROOT / "constraints.txt"), str(wheel)], 420)
    installed = _run([str(python), "-m", "pip", "list", "--format=freeze"], 60).stdout.lower()
    pulled = [p for p in HEAVY if f"\n{p}==" in f"\n{installed}"]
    assert not pulled, f"installing replaywatch pulled {pulled}"
    help_text = _run([str(venv / "bin" / "replaywatch"), "--help"], 60, cwd=tmp_path).stdout
    assert "watch" in help_text
    # cwd=tmp_path: the import must come from the venv, not from a checkout on sys.path.
    _run([str(python), "-c", IMPORT_CHECK], 60, cwd=tmp_path)
