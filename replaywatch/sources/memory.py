"""The replay process's memory and its limit, read on its own host: one file read each.

The failure Reverb users report most is the replay server growing until the kernel kills it.
ServerInfo carries no bytes; the process does. On the same host (or in the same Kubernetes pod
with a shared process namespace) the sidecar finds the process listening on the target's port
(/proc/net/tcp{,6} -> the socket's inode -> the /proc/PID/fd that holds it), or is told it
(`--reverb-pid`), and reads:

    resident memory   /proc/PID/statm (pages)
    its limit         its memory cgroup: v1 memory.limit_in_bytes (usage_in_bytes, oom_control's
                      oom_kill, memory.stat's total_rss), v2 memory.max (memory.current,
                      memory.events' oom_kill, memory.stat's anon); no limit there: the host's
                      MemTotal

Against a cgroup's limit the cgroup's anonymous memory is what counts: its page cache is
reclaimed before the OOM killer acts, and the library pages in a process's resident memory are
charged to whichever cgroup loaded them first (measured: a Reverb server's resident memory
was 250 MB above its cgroup's usage).

The cgroup is remembered: a process the OOM killer took is gone, its cgroup's oom_kill count
is what says so. Discovery walks every process's fds, so it runs once and again only when the
process is gone (at most every `REDISCOVER_S`); a poll reads three small files. The readers of
a process and its cgroup are in replaywatch/probe/process_memory.py (standard library only),
which the ReplayProbe shares for a server on another host.
"""

from __future__ import annotations

import ipaddress
import os
import time
from collections.abc import Callable
from pathlib import Path

from replaywatch.model import MemorySnapshot
from replaywatch.probe.process_memory import (
    CGROUP,
    PROC,
    Cgroup,
    Limit,
    cgroup_of,
    host_memory,
    limit_of,
    rss_of,
)

__all__ = ["CGROUP", "PROC", "Cgroup", "Limit", "MemoryWatch", "cgroup_of", "host_memory",
           "is_local", "limit_of", "listening_inodes", "pid_holding", "port_of", "rss_of"]

REDISCOVER_S = 10.0
LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "[::1]", "0.0.0.0"})


def listening_inodes(port: int, proc: Path = PROC) -> set[int]:
    """Inodes of the sockets listening on `port` (any address), from /proc/net/tcp{,6}."""
    found: set[int] = set()
    for name in ("tcp", "tcp6"):
        try:
            lines = (proc / "net" / name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1],
                                                                16) == port:
                found.add(int(fields[9]))
    return found


def pid_holding(inodes: set[int], proc: Path = PROC) -> int | None:
    """The process with a file descriptor on one of the sockets, if it can be seen."""
    wanted = {f"socket:[{i}]" for i in inodes}
    if not wanted:
        return None
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fds = list((entry / "fd").iterdir())
        except OSError:
            continue  # gone, or not ours to read
        for fd in fds:
            try:
                if os.readlink(fd) in wanted:
                    return int(entry.name)
            except OSError:
                continue
    return None


class MemoryWatch:
    """One Reverb target's process: found once, read at every poll."""

    def __init__(self, target: str, port: int | None, pid: int | None = None,
                 proc: Path = PROC, root: Path = CGROUP,
                 clock: Callable[[], float] = time.monotonic):
        self.target = target
        self._port = port
        self._given = pid
        self._pid = pid
        self._proc, self._root, self._clock = proc, root, clock
        self._cgroup: Cgroup | None = None
        self._cgroup_of: int | None = None  # the process whose cgroup that is
        self._looked_at = float("-inf")

    @property
    def found_by(self) -> str:
        return "--reverb-pid" if self._given is not None else f"listening on port {self._port}"

    def _discover(self) -> None:
        now = self._clock()
        if self._given is not None or self._port is None or now - self._looked_at < REDISCOVER_S:
            return
        self._looked_at = now
        self._pid = pid_holding(listening_inodes(self._port, self._proc), self._proc)

    def read(self, observed_at: float) -> MemorySnapshot | None:
        """The process's memory now; after it is gone, its cgroup's (None: never found)."""
        if self._pid is None:
            self._discover()
        rss = rss_of(self._pid, self._proc) if self._pid is not None else None
        if rss is None and self._given is None:
            self._pid = None  # gone: look for its successor on the port, now and then
            self._discover()
            rss = rss_of(self._pid, self._proc) if self._pid is not None else None
        if self._pid is not None and rss is not None and self._cgroup_of != self._pid:
            # Read once per process: the group it runs in is the one it is killed in.
            self._cgroup = cgroup_of(self._pid, self._proc, self._root) or self._cgroup
            self._cgroup_of = self._pid
        if rss is None and self._cgroup is None:
            return None
        try:
            lim = limit_of(self._cgroup, self._proc)
        except (OSError, ValueError):
            return None
        return MemorySnapshot(self.target, observed_at, self._pid if rss is not None else None,
                              rss, lim.bytes, lim.source, lim.usage, lim.oom_kills,
                              self.found_by, lim.anon, limit_scope=lim.scope)


def is_local(target: str) -> bool:
    """Whether a target's host is this one: only then can its process be read."""
    host = target.rsplit(":", 1)[0]
    if host in LOCAL_HOSTS or host == os.uname().nodename:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback  # all of 127.0.0.0/8
    except ValueError:
        return False


def port_of(target: str) -> int | None:
    try:
        return int(target.rsplit(":", 1)[1])
    except (IndexError, ValueError):
        return None
