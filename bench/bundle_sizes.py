"""make bench-bundles: every reproduction's bundles, how large and whether they replay.

Runs the real-Reverb reproductions (tests/test_repro_*.py, tests/test_bundle_kinds.py) with
REPLAYS_LOG set: at every cycle they tick, tests/support/repro.py's assert_replays builds
the cycle's bundle, checks it is at most 5 MB and that `bundle.verdict` gives the published
verdict byte for byte, and logs its size and the kinds in it. A failed replay fails the run.
The table: per kind, the cycles whose verdict held it, and the largest and median bundle.

    python -m bench.bundle_sizes --results bench/RESULTS.md     # about 3 minutes
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.results_md import write_sections
from replaywatch import bundle as bd
from replaywatch.diagnosis import kinds

ROOT = Path(__file__).resolve().parent.parent
MODULES = ("tests/test_repro_startup.py", "tests/test_repro_actors.py",
           "tests/test_repro_stacks.py", "tests/test_repro_queue.py",
           "tests/test_repro_throughput.py", "tests/test_bundle_kinds.py")
HEADING = "## Bundles of every reproduction"


def run(log: Path) -> tuple[int, float]:
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-n", "2", *MODULES], cwd=ROOT,
                          env={**os.environ, "REPLAYS_LOG": str(log)}, check=False)
    return done.returncode, time.monotonic() - began


def render(lines: list[dict], code: int, took_s: float) -> str:
    by_kind: dict[str, list[int]] = {}
    for line in lines:
        for kind in set(line["kinds"]) or {"(no findings)"}:
            by_kind.setdefault(kind, []).append(line["bytes"])
    order = [k.name for k in kinds.ALL] + ["(no findings)"]
    rows = ["| kind | severity | cycles replayed | largest bundle | median bundle |",
            "| --- | --- | ---: | ---: | ---: |"]
    for name in order:
        sizes = by_kind.get(name)
        severity = kinds.BY_NAME[name].severity.label if name in kinds.BY_NAME else "-"
        if sizes is None:
            rows.append(f"| `{name}` | {severity} | 0 | - | - |")
            continue
        rows.append(f"| `{name}` | {severity} | {len(sizes)} | {max(sizes):,} B | "
                    f"{int(statistics.median(sizes)):,} B |")
    largest = max((line["bytes"] for line in lines), default=0)
    return "\n".join([
        f"{HEADING} ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"{took_s / 60:.1f} min)", "",
        f"`make bench-bundles` (bench/bundle_sizes.py): {len(lines)} cycles of the real-Reverb "
        f"reproductions, each cycle's bundle built, kept under {bd.MAX_BYTES:,} bytes and "
        "replayed offline against the verdict the sidecar published; pytest exit "
        f"{code} ({'every replay equal' if code == 0 else 'A REPLAY OR A TEST FAILED'}). "
        f"Largest bundle: {largest:,} bytes. Kinds with 0 cycles are reproduced only by the "
        "agent tests.", "", *rows, ""])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", help="replace this section of a RESULTS.md")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "replays.jsonl"
        code, took = run(log)
        lines = [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
    section = render(lines, code, took)
    print(section)
    if args.results:
        path = Path(args.results)
        write_sections(path, [section])
    return code


if __name__ == "__main__":
    sys.exit(main())
