"""Reads a REPLAYWATCH_LANE_LOG written by make test: each xdist lane's busy time, when it
finished, and its longest modules; the lane that finished last is make test's critical path.
Where the log has each test's CPU seconds (root on cgroup v1), it also prints what each lane
and module cost and the tests that cost most: on 2 shared cores, the minutes to win back.

    REPLAYWATCH_LANE_LOG=/tmp/lanes.tsv make test; python tools/lanes.py /tmp/lanes.tsv
"""

from __future__ import annotations

import sys
from collections import defaultdict
from typing import NamedTuple


class Row(NamedTuple):
    worker: str
    began: float
    ended: float
    nodeid: str
    cpu_s: float | None


def read(path: str) -> list[Row]:
    rows = []
    with open(path) as f:
        for line in f:
            worker, began, ended, nodeid, *rest = line.rstrip("\n").split("\t")
            cpu = float(rest[0]) if rest and rest[0] else None
            rows.append(Row(worker, float(began), float(ended), nodeid, cpu))
    return rows


def main(path: str) -> int:
    rows = read(path)
    if not rows:
        print(f"{path}: no tests logged")
        return 1
    start = min(r.began for r in rows)
    costed = all(r.cpu_s is not None for r in rows)
    lanes: dict[str, list[Row]] = defaultdict(list)
    for r in rows:
        lanes[r.worker].append(r)
    for worker, tests in sorted(lanes.items(), key=lambda kv: max(t.ended for t in kv[1])):
        busy = sum(t.ended - t.began for t in tests)
        cost = f", {sum(t.cpu_s or 0.0 for t in tests):.0f} CPU-s" if costed else ""
        wall: dict[str, float] = defaultdict(float)
        cpu: dict[str, float] = defaultdict(float)
        for t in tests:
            module = t.nodeid.split("::")[0]
            wall[module] += t.ended - t.began
            cpu[module] += t.cpu_s or 0.0
        print(f"{worker}: finished at {max(t.ended for t in tests) - start:.0f} s, "
              f"busy {busy:.0f} s{cost}, {len(tests)} tests")
        for module, spent in sorted(wall.items(), key=lambda kv: -kv[1])[:6]:
            print(f"    {spent:6.1f} s" + (f" {cpu[module]:6.1f} CPU-s" if costed else "")
                  + f"  {module}")
    if costed:
        print(f"\nall lanes: {sum(r.cpu_s or 0.0 for r in rows):.0f} CPU-s; the costliest tests:")
        for r in sorted(rows, key=lambda r: -(r.cpu_s or 0.0))[:15]:
            print(f"    {r.cpu_s:6.1f} CPU-s {r.ended - r.began:6.1f} s  {r.nodeid}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python tools/lanes.py LANE_LOG")
        raise SystemExit(2)
    raise SystemExit(main(sys.argv[1]))
