"""What answers for the replay probe while `reverb.Server(...)` restores a checkpoint.

Reverb's Server constructor holds Python's GIL for the whole load (measured on 0.14: a
300 MB checkpoint froze every Python thread of the process for 0.45 s; one of 100 GiB would
for minutes), so the probe's own serving thread cannot answer while it lasts. For that long
a child process (restore_child.py) serves the probe's listening socket instead: the parent
hands it the socket and the document it would have served, and the child answers it with the
parent's memory, the time, and what the parent has read since the load began (its
/proc/PID/io), from which the sidecar tells the load's rate. Closing the child's stdin ends
it. Without a child (it could not start) the probe is silent through the load.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
from pathlib import Path
from typing import Any

from replaywatch.probe.protocol import Doc, Replay, RestoreKeys

CHILD = Path(__file__).with_name("restore_child.py")
READY_S = 5.0  # the child's start, on a host the load may already keep busy
STACKS_ERROR = ("restoring: reverb.Server holds the GIL while it loads a checkpoint, so no "
                "Python thread of the replay process runs")


class Watcher:
    """`with Watcher(fd, doc, baseline):` the child answers on `fd` for the block."""

    def __init__(self, fd: int | None, doc: dict[str, Any], baseline: int | None):
        self._fd, self._doc, self._baseline = fd, doc, baseline
        self._child: subprocess.Popen[str] | None = None

    def __enter__(self) -> Watcher:
        if self._fd is None:
            return self
        config = {"doc": self._doc, "pid": self._doc[Doc.PID], "baseline": self._baseline,
                  "keys": {"now": Doc.NOW, "rss": Replay.RSS_BYTES, "restore": Replay.RESTORE,
                           "read": RestoreKeys.READ_BYTES,
                           "started_at": RestoreKeys.STARTED_AT},
                  "stacks_error": STACKS_ERROR}
        try:
            child = subprocess.Popen([sys.executable, "-I", "-S", str(CHILD), str(self._fd)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     pass_fds=(self._fd,), text=True)
            assert child.stdin is not None and child.stdout is not None
            child.stdin.write(json.dumps(config) + "\n")
            child.stdin.flush()
            # Serving before the load begins: once it holds the GIL, nothing here waits.
            if select.select([child.stdout], [], [], READY_S)[0]:
                child.stdout.readline()
            self._child = child
        except OSError:
            self._child = None
        return self

    def __exit__(self, *exc: object) -> None:
        child, self._child = self._child, None
        if child is None:
            return
        try:
            assert child.stdin is not None
            child.stdin.close()
            child.wait(timeout=READY_S)
        except (OSError, subprocess.TimeoutExpired):
            child.kill()
        if self._fd is not None:
            # The child's timeout made the shared socket non-blocking: the probe's own
            # server expects it blocking.
            os.set_blocking(self._fd, True)
