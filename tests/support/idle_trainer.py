"""A trainer process that only serves a TrainerProbe (for fault tests).

Prints {"probe": URL, "pid": PID} and then takes one batch per second.
"""

from __future__ import annotations

import itertools
import json
import os
import time

from replaywatch.probe import TrainerProbe


def main() -> None:
    probe = TrainerProbe(batch_size=32, num_parallel_calls=1, name="idle-learner")
    iterator = probe.wrap(itertools.count())
    probe.start()
    print(json.dumps({"probe": probe.url, "pid": os.getpid()}), flush=True)
    while True:
        next(iterator)
        probe.step()
        time.sleep(1.0)


if __name__ == "__main__":
    main()
