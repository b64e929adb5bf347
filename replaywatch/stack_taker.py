"""Stack capture, the edge where replaywatch reads a trainer's threads: a probe's /stacks
over HTTP, or `py-spy dump` of `--trainer-pid`; and an RLlib job's workers, by its Ray
dashboard's py-spy (`capture_ray`).

The findings keeper is handed a `StackTaker` and asks it for two things. When a critical
finding opens, the trainer's stacks as evidence (`capture`). When a `sample_blocked` opens
on a synchronous layout that no trainer probe reads, two py-spy dumps a second apart
(`dump_loop`: one dump can catch a healthy loop inside next() for a moment); their verdict
(is the loop thread inside an iterator's next() in both?) is kept per table and handed to the
pure diagnosis as data with its time (`verdicts`), so the next cycle can name
`worker_starvation` "from stacks", and keeps doing so while the stall lasts.

Capturing is I/O that can take seconds, so it runs on short-lived daemon threads and never
delays the poll cadence; every fetch and dump has a timeout.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from replaywatch.diagnosis.stacks import StackVerdict, stack_verdict
from replaywatch.errors import SourceError
from replaywatch.sources.probe_http import get_json

log = logging.getLogger("replaywatch.stacks")

# (probe URLs, trainer pid) -> {where: its stacks}, or None when there is nowhere to look.
StackFetcher = Callable[[Sequence[str], int | None], dict[str, Any] | None]
# pid -> one `py-spy dump --json` document ({"threads": [...]} or {"error": ...}).
StackDumper = Callable[[int], dict[str, Any]]
# Where dumps go once taken: (finding id, {where: stacks}) -> stored.
Attach = Callable[[str, dict[str, Any]], bool]
# (Ray target, [(pid, node id or None)]) -> {"ray:PID": its stacks}, or None: no such cluster.
RayStacks = Callable[[str, Sequence[tuple[int, str | None]]], dict[str, Any] | None]
# Two dumps this far apart both inside next() are a loop that stays there, not a passing call.
DUMP_GAP_S = 1.0
TIMEOUT_S = 5.0


def fetch_stacks(probe_urls: Sequence[str], trainer_pid: int | None,
                 timeout_s: float = TIMEOUT_S) -> dict[str, Any] | None:
    """The trainer's stacks: from each probe's /stacks, else `py-spy dump`."""
    taken: dict[str, Any] = {}
    for url in probe_urls:
        try:
            taken[url] = get_json(f"{url}/stacks", timeout_s)
        except SourceError as e:
            taken[url] = {"error": str(e)}
    if trainer_pid is not None:
        taken[f"py-spy:{trainer_pid}"] = py_spy_dump(trainer_pid, timeout_s)
    return taken or None


def py_spy_dump(pid: int, timeout_s: float = TIMEOUT_S) -> dict[str, Any]:
    """`py-spy dump --json` of a trainer without the probe (needs ptrace rights)."""
    exe = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    try:
        done = subprocess.run([exe, "dump", "--pid", str(pid), "--json"], capture_output=True,
                              text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"error": f"py-spy dump failed: {e}"}
    if done.returncode != 0:
        return {"error": f"py-spy dump exited {done.returncode}: {done.stderr.strip()[:300]}"}
    try:
        return {"threads": json.loads(done.stdout)}
    except ValueError:
        return {"text": done.stdout[:200_000]}


def _attach_off_thread(finding_id: str, fetch: Callable[[], dict[str, Any] | None],
                       attach: Attach, name: str) -> None:
    """`fetch` on a thread of its own, what it took attached to the finding. Nobody joins it:
    it ends when the fetch does (every fetch has a timeout), and a daemon thread never holds
    up the sidecar's exit."""
    def run() -> None:
        stacks = fetch()
        if stacks is not None and not attach(finding_id, stacks):
            log.warning("could not store stacks for %s", finding_id)

    threading.Thread(target=run, name=name, daemon=True).start()


class StackTaker:
    """Takes the trainer's stacks off the poller's thread and keeps the loop-dump verdicts.

    `trainer_pid`: `--trainer-pid`, the process py-spy may dump (None: probes' /stacks only).
    The fetcher and dumper are the I/O; tests hand their own.
    """

    def __init__(self, trainer_pid: int | None = None, fetcher: StackFetcher = fetch_stacks,
                 dumper: StackDumper = py_spy_dump, gap_s: float = DUMP_GAP_S,
                 ray: RayStacks | None = None):
        self.trainer_pid = trainer_pid
        self._ray = ray
        self._fetch = fetcher
        self._dump = dumper
        self._gap_s = gap_s
        # (target, table) -> the two-dump verdict and its dumps; written by the dump thread.
        self._verdicts: dict[tuple[str, str], tuple[StackVerdict, dict[str, Any]]] = {}
        self._lock = threading.Lock()

    def capture(self, finding_id: str, probe_urls: list[str], attach: Attach) -> None:
        """The trainer's stacks, from its probes and py-spy, attached once fetched."""
        if self.will_capture(probe_urls):
            _attach_off_thread(finding_id, lambda: self._fetch(probe_urls, self.trainer_pid),
                               attach, "replaywatch-stacks")

    def capture_ray(self, finding_id: str, target: str,
                    workers: Sequence[tuple[int, str | None]], attach: Attach) -> None:
        """An RLlib job's workers' stacks, by its dashboard's py-spy, attached once taken."""
        ray = self._ray
        if ray is not None and workers:
            _attach_off_thread(finding_id, lambda: ray(target, workers), attach,
                               "replaywatch-ray-stacks")

    def will_capture_ray(self, workers: Sequence[tuple[int, str | None]]) -> bool:
        return self._ray is not None and bool(workers)

    def will_capture(self, probe_urls: Sequence[str]) -> bool:
        """Whether `capture` has anywhere to take stacks from."""
        return bool(probe_urls) or self.trainer_pid is not None

    def can_dump_loop(self) -> bool:
        return self.trainer_pid is not None

    def dump_loop(self, target: str, table: str, finding_id: str, requested_at: float,
                  attach: Attach | None) -> None:
        """Two dumps `gap_s` apart; their verdict is kept for (target, table)."""
        pid = self.trainer_pid
        assert pid is not None

        def dump_twice() -> None:
            first = self._dump(pid)
            time.sleep(self._gap_s)
            second = self._dump(pid)
            verdict = stack_verdict(first, second, requested_at)
            dumps = {f"py-spy:{pid}": first, f"py-spy:{pid} +{self._gap_s:g}s": second}
            with self._lock:
                self._verdicts[(target, table)] = (verdict, dumps)
            log.info("%s %s: loop %s in two dumps", target, table,
                     "inside next()" if verdict.in_next else "not inside next()")
            if attach is not None and not attach(finding_id, dumps):
                log.warning("could not store stacks for %s", finding_id)

        threading.Thread(target=dump_twice, name="replaywatch-loop-stacks", daemon=True).start()

    def verdicts(self, target: str) -> dict[str, StackVerdict]:
        """By table, the loop-dump verdicts of one target."""
        with self._lock:
            return {table: v for (tgt, table), (v, _) in self._verdicts.items() if tgt == target}

    def dumps(self, target: str, table: str) -> dict[str, Any] | None:
        """The two dumps behind a verdict, if one is kept."""
        with self._lock:
            kept = self._verdicts.get((target, table))
        return kept[1] if kept is not None else None

    def keep_only(self, stalled: set[tuple[str, str]]) -> None:
        """A verdict lasts while its stall does: forget the others."""
        with self._lock:
            for key in [k for k in self._verdicts if k not in stalled]:
                del self._verdicts[key]
