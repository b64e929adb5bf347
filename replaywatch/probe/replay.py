"""ReplayProbe: the replay process's memory and its limit, served from inside it.

Where the sidecar runs on the Reverb server's host it reads the process itself
(replaywatch/sources/memory.py). Where the server runs elsewhere (another machine, a pod the
sidecar does not share), the same numbers come from a ReplayProbe started inside the server's
process, beside `reverb.Server` or in Launchpad's `ReverbNode` table factory:

    from replaywatch.probe import ReplayProbe
    server = reverb.Server(tables, port=8000)
    ReplayProbe(listen="0.0.0.0:8002").start()

and the sidecar is pointed at it like any probe (`--probe 'replay-host:8000=http://
replay-host:8002'`). Handed the server's making and its checkpoint calls, it also says what
Reverb keeps to itself (checkpoints.py): the tables as the code wrote them (a restore
replaces them), the checkpointer, each checkpoint call, and a restore while it loads:

    probe = ReplayProbe(listen="0.0.0.0:8002")
    probe.start()                                   # serving while the restore loads
    server = probe.server(tables, port=8000, checkpointer=checkpointer,
                          checkpoint_every_s=600)   # reverb.Server(...), watched
    ...
    probe.checkpoint(client)                        # client.checkpoint(), watched
 Its document (role "replay") has the process's resident memory, its
memory cgroup's limit and counts (v1 or v2), else the host's memory: what the sidecar reads
on a local host, read by the same code (process_memory.py). A process the kernel killed takes
its probe with it; its OOM count is then only readable on its host.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from replaywatch.probe.checkpoints import CheckpointLog, make_server
from replaywatch.probe.process_memory import Cgroup, cgroup_of, limit_of, rss_of
from replaywatch.probe.protocol import Doc, Replay, Role
from replaywatch.probe.restore_watch import Watcher
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
        self._checkpoints = CheckpointLog(clock, self._started)
        # Read once: the group a process runs in is the one it is killed in.
        self._group: Cgroup | None = cgroup_of(os.getpid())

    def snapshot(self) -> dict[str, Any]:
        """The `GET /probe` document (role "replay"), bytes throughout.

        rss_bytes: the process's resident memory. limit_bytes, limit_from ("cgroup v1",
        "cgroup v2", "host"): what it may use before the kernel kills it. cgroup_usage_bytes,
        cgroup_anon_bytes (what counts against a cgroup's limit), oom_kills: the cgroup's own
        counts (null: no cgroup limit, or not readable). limit_scope: what the limit covers,
        the same string for every process under it (the kernel's boot id, and the cgroup's
        inode for a cgroup's limit).

        Once handed the server (`server`): declared_tables (each table as the code wrote it),
        checkpointer (path; temporary: Reverb's default, a fresh directory per process start;
        every_s; incomplete: checkpoints an earlier process began and never finished),
        checkpoints (the newest calls made through `checkpoint`: started_at, ended_at, path,
        bytes, error) and restore (the checkpoint `reverb.Server` loads: path, bytes,
        read_bytes, the process's reads since it began; ended_at null while it loads).
        """
        limit = limit_of(self._group)
        doc = dict(self._static)
        doc.update({Replay.RSS_BYTES: rss_of(os.getpid()), Replay.LIMIT_BYTES: limit.bytes,
                    Replay.LIMIT_FROM: limit.source, Replay.CGROUP_USAGE_BYTES: limit.usage,
                    Replay.CGROUP_ANON_BYTES: limit.anon, Replay.OOM_KILLS: limit.oom_kills,
                    Replay.LIMIT_SCOPE: limit.scope,
                    Doc.STARTED_AT: self._started, Doc.NOW: self._clock()})
        doc.update(self._checkpoints.document())
        doc.update(thread_counts())
        return doc

    def server(self, tables: list[Any], port: int | None = None, checkpointer: Any = None,
               checkpoint_every_s: float | None = None) -> Any:
        """`reverb.Server(tables, port, checkpointer)`, its making watched: the tables as
        written, the checkpointer (None: Reverb's default, a temporary directory) and the
        interval the code checkpoints at, then the restore while the server loads (start the
        probe first, so that it answers meanwhile)."""
        return make_server(self._checkpoints, list(tables), port, checkpointer,
                           checkpoint_every_s, self._loading)

    def _loading(self) -> Watcher:
        # reverb.Server holds the GIL while it loads: a child answers for this probe meanwhile.
        return Watcher(self._http.fileno(), self.snapshot(), self._checkpoints.read_at_restore)

    def checkpoint(self, client: Any) -> str:
        """`client.checkpoint()` (a `reverb.Client` of the server), its start, end, path and
        bytes kept; an error is kept and raised."""
        return self._checkpoints.checkpoint(client)
