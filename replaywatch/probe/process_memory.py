"""A process's resident memory and its memory cgroup's limit, from /proc and the cgroup files.

Standard library only: the sidecar reads a local Reverb server with these
(replaywatch/sources/memory.py), and the ReplayProbe reads its own process with them inside a
replay server on another host (replaywatch/probe/replay.py).

    resident memory   /proc/PID/statm (pages)
    its limit         its memory cgroup: v1 memory.limit_in_bytes (usage_in_bytes, oom_control's
                      oom_kill, memory.stat's total_rss), v2 memory.max (memory.current,
                      memory.events' oom_kill, memory.stat's anon); no limit there: the host's
                      MemTotal
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

PROC = Path("/proc")
CGROUP = Path("/sys/fs/cgroup")
UNLIMITED = 1 << 62  # v1 writes "no limit" as a page-rounded 2**63 - 1


@dataclasses.dataclass(frozen=True)
class Cgroup:
    version: int  # 1 or 2
    path: Path  # its directory


def cgroup_of(pid: int, proc: Path = PROC, root: Path = CGROUP) -> Cgroup | None:
    """The process's memory cgroup directory: v1's memory controller, else v2's."""
    try:
        lines = (proc / str(pid) / "cgroup").read_text().splitlines()
    except OSError:
        return None
    v2 = None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return Cgroup(1, root / "memory" / path.lstrip("/"))
        if controllers == "":
            v2 = path
    if v2 is None:
        return None
    for base in (root, root / "unified"):
        if (base / v2.lstrip("/") / "memory.max").exists():
            return Cgroup(2, base / v2.lstrip("/"))
    return None


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return None if text == "max" else int(text)


def _field(path: Path, name: str) -> int | None:
    """`name N` from a flat keyed file (memory.oom_control, memory.events)."""
    try:
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == name:
                return int(value)
    except (OSError, ValueError):
        return None
    return None


def host_memory(proc: Path = PROC) -> int:
    for line in (proc / "meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise OSError("no MemTotal in /proc/meminfo")


def rss_of(pid: int, proc: Path = PROC) -> int | None:
    """Resident bytes; None when the process is gone, or a zombie (it exited: no pages, and
    its /proc/PID/cgroup no longer names the group it died in)."""
    try:
        pages = int((proc / str(pid) / "statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE") if pages > 0 else None


@dataclasses.dataclass(frozen=True)
class Limit:
    bytes: int
    source: str  # "cgroup v1", "cgroup v2", "host"
    usage: int | None = None  # the cgroup's, page cache included
    oom_kills: int | None = None
    anon: int | None = None  # the cgroup's anonymous memory: what the OOM killer weighs
    scope: str | None = None  # what the limit covers (scope_of); None: not readable


def boot_id(proc: Path = PROC) -> str | None:
    """The running kernel's id: one per host and boot, the same in every container on it."""
    try:
        return (proc / "sys" / "kernel" / "random" / "boot_id").read_text().strip() or None
    except OSError:
        return None


def scope_of(group: Cgroup | None, source: str, proc: Path = PROC) -> str | None:
    """What a limit covers, the same string for every process it covers: the host (its
    kernel's boot id) and, for a cgroup's limit, the group's inode. A path would not do: in a
    container's cgroup namespace every group reads as `/`."""
    boot = boot_id(proc)
    if boot is None:
        return None
    if source == "host" or group is None:
        return f"{boot} host"
    try:
        return f"{boot} {source} {group.path.stat().st_ino}"
    except OSError:
        return None


def limit_of(group: Cgroup | None, proc: Path = PROC) -> Limit:
    """The cgroup's own limit and counts, else the host's memory."""
    usage = kills = limit = anon = None
    if group is not None and group.version == 1:
        limit = _read_int(group.path / "memory.limit_in_bytes")
        usage = _read_int(group.path / "memory.usage_in_bytes")
        kills = _field(group.path / "memory.oom_control", "oom_kill")
        anon = _field(group.path / "memory.stat", "total_rss")
    elif group is not None:
        limit = _read_int(group.path / "memory.max")
        usage = _read_int(group.path / "memory.current")
        kills = _field(group.path / "memory.events", "oom_kill")
        anon = _field(group.path / "memory.stat", "anon")
    host = host_memory(proc)
    if group is None or limit is None or limit >= min(host, UNLIMITED):
        return Limit(host, "host", usage, kills, scope=scope_of(None, "host", proc))
    source = f"cgroup v{group.version}"
    return Limit(limit, source, usage, kills, anon, scope_of(group, source, proc))
