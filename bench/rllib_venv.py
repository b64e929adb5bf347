"""What the RLlib benches share: the RLlib venv's Python (.venv-rllib, torch on the CPU) and
their command line, refused in one line where that venv is not built."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.procs import ROOT

RLLIB_PY = ROOT / ".venv-rllib" / "bin" / "python"


def bench_args(doc: str | None) -> argparse.Namespace | None:
    """`--results FILE`; None (said in one line) where .venv-rllib is not built."""
    p = argparse.ArgumentParser(description=(doc or "").splitlines()[0] if doc else None)
    p.add_argument("--results", type=Path, default=None)
    args = p.parse_args()
    if not RLLIB_PY.exists():
        print("no .venv-rllib (make rllib-venv): the RLlib bench cannot run")
        return None
    return args
