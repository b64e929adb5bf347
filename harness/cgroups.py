"""cgroup v1 groups the tests and benches make as root: a cpu group that holds a process to a
share of a core (a restore that must last long enough to watch), and their removal."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

CPU = Path("/sys/fs/cgroup/cpu")


def remove_group(group: Path, tries: int = 50) -> None:
    """Removes a cgroup once its processes have exited (they may still be exiting)."""
    for _ in range(tries):
        try:
            group.rmdir()
            return
        except OSError:
            time.sleep(0.1)


@contextmanager
def cpu_limited(share: float, name: str) -> Iterator[Path]:
    """A cpu group holding its processes to `share` of one core, removed on exit; OSError
    when none can be made (not root, no v1 cpu controller). A short period (the kernel's
    least quota is 1 ms): a thread in it waits milliseconds for its turn, not a tenth of a
    second."""
    group = CPU / f"{name}-{os.getpid()}"
    group.mkdir()
    try:
        (group / "cpu.cfs_period_us").write_text("20000")
        (group / "cpu.cfs_quota_us").write_text(str(max(1000, int(20000 * share))))
        yield group
    finally:
        remove_group(group)
