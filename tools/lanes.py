"""Reads a REPLAYWATCH_LANE_LOG written by make test: each xdist lane's busy time, when it
finished, and its longest modules; the lane that finished last is make test's critical path.

    REPLAYWATCH_LANE_LOG=/tmp/lanes.tsv make test; python tools/lanes.py /tmp/lanes.tsv
"""

from __future__ import annotations

import sys
from collections import defaultdict


def main(path: str) -> int:
    rows = []
    with open(path) as f:
        for line in f:
            worker, began, ended, nodeid = line.rstrip("\n").split("\t", 3)
            rows.append((worker, float(began), float(ended), nodeid))
    if not rows:
        print(f"{path}: no tests logged")
        return 1
    start = min(r[1] for r in rows)
    lanes: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    for worker, began, ended, nodeid in rows:
        lanes[worker].append((began, ended, nodeid))
    for worker, tests in sorted(lanes.items(), key=lambda kv: max(t[1] for t in kv[1])):
        busy = sum(e - b for b, e, _ in tests)
        modules: dict[str, float] = defaultdict(float)
        for b, e, nodeid in tests:
            modules[nodeid.split("::")[0]] += e - b
        top = sorted(modules.items(), key=lambda kv: -kv[1])[:6]
        print(f"{worker}: finished at {max(t[1] for t in tests) - start:.0f} s, "
              f"busy {busy:.0f} s, {len(tests)} tests")
        for module, spent in top:
            print(f"    {spent:6.1f} s  {module}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python tools/lanes.py LANE_LOG")
        raise SystemExit(2)
    raise SystemExit(main(sys.argv[1]))
