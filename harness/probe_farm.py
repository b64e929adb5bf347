"""Many small probe processes' worth of probes in one process, for the fleet benchmark: `--probes
K` TrainerProbes, each on its own port with its own HTTP server thread, each taking one batch a
second from its own iterator, as K idle learners would.

Prints {"probes": [URL, ...], "pid": PID} once all serve, then steps them until killed.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--probes", type=int, default=32)
    p.add_argument("--name", default="farm")
    args = p.parse_args()

    from replaywatch.probe import TrainerProbe

    probes, iterators = [], []
    for i in range(args.probes):
        probe = TrainerProbe(batch_size=32, num_parallel_calls=1, name=f"{args.name}-{i}")
        iterators.append(probe.wrap(itertools.count()))
        probe.start()
        probes.append(probe)
    print(json.dumps({"probes": [p.url for p in probes], "pid": os.getpid()}), flush=True)
    began, k = time.monotonic(), 0
    while True:
        for probe, iterator in zip(probes, iterators):
            next(iterator)
            probe.step()
        k += 1
        time.sleep(max(0.0, began + k - time.monotonic()))


if __name__ == "__main__":
    main()
