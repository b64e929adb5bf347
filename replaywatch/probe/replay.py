"""ReplayProbe: the replay process's memory and its limit, served from inside it.

Where the sidecar runs on the Reverb server's host it reads the process itself
(replaywatch/sources/memory.py). Where the server runs elsewhere (another machine, a pod the
sidecar does not share), the same numbers come from a ReplayProbe started inside the server's
process, beside `reverb.Server` or in Launchpad's `ReverbNode` table factory:

    from replaywatch.probe import ReplayProbe
    server = reverb.Server(tables, port=8000)
    ReplayProbe(listen="0.0.0.0:8002").start()

and the sidecar is pointed at it like any probe (`--probe 'replay-host:8000=http://
replay-host:8002'`). Its document (role "replay") has the process's resident memory, its
memory cgroup's limit and counts (v1 or v2), else the host's memory: what the sidecar reads
on a local host, read by the same code (process_memory.py). A process the kernel killed takes
its probe with it; its OOM count is then only readable on its host.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from replaywatch.probe.process_memory import Cgroup, cgroup_of, limit_of, rss_of
from replaywatch.probe.protocol import Doc, Replay, Role
from replaywatch.probe.serving import ProbeServer, Served, thread_counts


class ReplayProbe(Served):
    """Serves its own process's memory and its limit as JSON (`GET /probe`, role "replay")."""

    def __init__(self, name: str = "replay", listen: str = "127.0.0.1:0",
                 clock: Callable[[], float] = time.time):
        if not isinstance(name, str) or not name:
            raise ValueError(f"name ({name!r}) must be a non-empty string")
        self._http = ProbeServer(listen, self.snapshot, self.stacks)
        self._clock = clock
        self._static: dict[str, Any] = {Doc.ROLE: str(Role.REPLAY), Doc.PID: os.getpid(),
                                        Doc.NAME: name, Doc.TABLE: None}
        self._started = clock()
        # Read once: the group a process runs in is the one it is killed in.
        self._group: Cgroup | None = cgroup_of(os.getpid())

    def snapshot(self) -> dict[str, Any]:
        """The `GET /probe` document (role "replay"), bytes throughout.

        rss_bytes: the process's resident memory. limit_bytes, limit_from ("cgroup v1",
        "cgroup v2", "host"): what it may use before the kernel kills it. cgroup_usage_bytes,
        cgroup_anon_bytes (what counts against a cgroup's limit), oom_kills: the cgroup's own
        counts (null: no cgroup limit, or not readable).
        """
        limit = limit_of(self._group)
        doc = dict(self._static)
        doc.update({Replay.RSS_BYTES: rss_of(os.getpid()), Replay.LIMIT_BYTES: limit.bytes,
                    Replay.LIMIT_FROM: limit.source, Replay.CGROUP_USAGE_BYTES: limit.usage,
                    Replay.CGROUP_ANON_BYTES: limit.anon, Replay.OOM_KILLS: limit.oom_kills,
                    Doc.STARTED_AT: self._started, Doc.NOW: self._clock()})
        doc.update(thread_counts())
        return doc
