"""Where bundles are written: a directory next to the incident log, the newest N kept.

When a critical finding opens, the findings keeper hands the cycle's inputs here
(`on_critical`). The trainer's stacks are still being taken at that moment (a probe's
/stacks, py-spy), so the bundle waits for them (`stacks_taken`) or for `stack_wait_s`,
whichever comes first, and is written from a daemon thread: the poll cadence never waits
on the disk. A bundle written without its stacks says why in `missing`.

Writes are atomic (a temporary file in the same directory, fsynced, then renamed), so a
sidecar killed mid-write leaves the previous bundles whole and no half file. The newest
`keep` bundles are kept; none is written when it would leave less than `min_free_bytes`
free on the disk. Failures never raise: they are counted (`failed`, `last_error`) for
/metrics, as the incident log's are.
"""

from __future__ import annotations

import dataclasses
import glob
import logging
import os
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from replaywatch import __version__
from replaywatch import bundle as bd
from replaywatch.incidents import IncidentLog
from replaywatch.model import Finding

log = logging.getLogger("replaywatch.bundles")

KEEP = 20
# Stacks are fetched with a 5 s timeout per place, loop dumps are two a second apart.
STACK_WAIT_S = 12.0
MIN_FREE_BYTES = 100 * 1024 * 1024
SUFFIX = ".bundle.json"


@dataclasses.dataclass
class _Pending:
    finding: Finding
    inputs: bd.Inputs
    live: tuple[Finding, ...]
    timer: threading.Timer | None = None


class BundleStore:
    """Builds bundles (always) and writes them (when it has a directory)."""

    def __init__(self, directory: str | None, config: dict[str, Any],
                 incidents: IncidentLog | None, keep: int = KEEP,
                 stack_wait_s: float = STACK_WAIT_S, max_bytes: int = bd.MAX_BYTES,
                 min_free_bytes: int = MIN_FREE_BYTES,
                 clock: Callable[[], float] = time.time):
        self.directory = directory if keep > 0 else None
        self.keep = keep
        self.written = 0
        self.failed = 0
        self.last_error: str | None = None
        self._config = config
        self._incidents = incidents
        self._stack_wait_s = stack_wait_s
        self._max_bytes = max_bytes
        self._min_free_bytes = min_free_bytes
        self._clock = clock
        self._pending: dict[str, _Pending] = {}
        self._lock = threading.Lock()

    # -- building ---------------------------------------------------------------------------
    def document(self, inputs: bd.Inputs, live: Sequence[Finding], reason: str,
                 finding_id: str | None = None, stacks: dict[str, Any] | None = None,
                 missing: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
        """A bundle of one cycle; `finding_id`: the incident whose transitions it carries
        (and whose stored stacks it takes when none are handed)."""
        incident = self._incident(finding_id) if finding_id else None
        if stacks is None and incident is not None:
            stacks = incident.get("stacks")
        if incident is not None:
            incident = {k: v for k, v in incident.items() if k != "stacks"}
        about = bd.About(reason=reason, written_at=self._clock(), host=socket.gethostname(),
                         sidecar_pid=os.getpid(), replaywatch_version=__version__,
                         config=self._config, incident=incident, stacks=stacks,
                         missing=tuple(missing))
        return bd.build(inputs, live, about)

    def _incident(self, finding_id: str) -> dict[str, Any] | None:
        if self._incidents is None:
            return None
        incident_id = self._incidents.open_incident_ids().get(finding_id)
        if incident_id is None:
            found = [r for r in self._incidents.list("all", limit=50)
                     if r["finding_id"] == finding_id]
            incident_id = found[0]["id"] if found else None
        return self._incidents.get(incident_id) if incident_id is not None else None

    # -- when a critical opens ---------------------------------------------------------------
    def on_critical(self, finding: Finding, inputs: bd.Inputs, live: Sequence[Finding],
                    expect_stacks: bool) -> None:
        """Writes this cycle's bundle once the stacks are taken (or at once, with none
        coming); never blocks the caller."""
        if self.directory is None:
            return
        pending = _Pending(finding, inputs, tuple(live))
        if not expect_stacks:
            self._spawn(pending, None, [])
            return
        with self._lock:
            self._pending[finding.finding_id] = pending
        pending.timer = threading.Timer(self._stack_wait_s, self._stacks_late,
                                        args=(finding.finding_id,))
        pending.timer.daemon = True
        pending.timer.start()

    def stacks_taken(self, finding_id: str, stacks: dict[str, Any]) -> None:
        """The stacks a bundle waits for; written with them now."""
        with self._lock:
            pending = self._pending.pop(finding_id, None)
        if pending is None:
            return
        if pending.timer is not None:
            pending.timer.cancel()
        self._spawn(pending, stacks, [])

    def _stacks_late(self, finding_id: str) -> None:
        with self._lock:
            pending = self._pending.pop(finding_id, None)
        if pending is not None:
            self._write_pending(pending, None, [{
                "what": "stacks", "why": f"not taken within {self._stack_wait_s:g} s of the "
                "finding opening (a probe that did not answer, or py-spy that could not "
                "attach: the incident log says which once they arrive)"}])

    def _spawn(self, pending: _Pending, stacks: dict[str, Any] | None,
               missing: list[dict[str, Any]]) -> None:
        threading.Thread(target=self._write_pending, args=(pending, stacks, missing),
                         name="replaywatch-bundle", daemon=True).start()

    def _write_pending(self, pending: _Pending, stacks: dict[str, Any] | None,
                       missing: list[dict[str, Any]]) -> None:
        f = pending.finding
        try:
            doc = self.document(pending.inputs, pending.live, f"opened critical {f.finding_id}",
                                finding_id=f.finding_id, stacks=stacks, missing=missing)
            incident_id = (doc.get("incident") or {}).get("id")
            self.write(doc, f"incident-{incident_id if incident_id else 'none'}-{f.kind}")
        except Exception as e:  # a bundle must never take the sidecar down
            self._failed(f"{type(e).__name__}: {e}")

    # -- the directory ----------------------------------------------------------------------
    def write(self, doc: dict[str, Any], name: str) -> str | None:
        """Writes `doc` atomically as `<utc time>-<name>.bundle.json`; its path, or None
        (and `last_error`) when it could not."""
        if self.directory is None:
            return None
        try:
            text = bd.fit(doc, self._max_bytes).encode()
            os.makedirs(self.directory, exist_ok=True)
            free = shutil.disk_usage(self.directory).free
            if free - len(text) < self._min_free_bytes:
                self._failed(f"not written: {free // 2**20} MiB free on the disk of "
                             f"{self.directory}, and bundles leave "
                             f"{self._min_free_bytes // 2**20} MiB")
                return None
            stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(self._clock()))
            path = os.path.join(self.directory, f"{stamp}-{name}{SUFFIX}")
            fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".bundle-", suffix=".tmp")
            try:
                with os.fdopen(fd, "wb") as out:
                    out.write(text)
                    out.flush()
                    os.fsync(out.fileno())
                os.replace(tmp, path)
            except BaseException:
                os.unlink(tmp)
                raise
        except (OSError, ValueError) as e:
            self._failed(f"{type(e).__name__}: {e}")
            return None
        self.written += 1
        self.last_error = None
        log.info("bundle written: %s (%d bytes)", path, len(text))
        self._prune()
        return path

    def _failed(self, why: str) -> None:
        self.failed += 1
        self.last_error = why
        log.warning("bundle: %s", why)

    def _prune(self) -> None:
        for old in self.paths()[self.keep:]:
            try:
                os.unlink(old)
            except OSError:
                continue

    def paths(self) -> list[str]:
        """The bundles kept, newest first."""
        if self.directory is None:
            return []
        return sorted(glob.glob(os.path.join(glob.escape(self.directory), f"*{SUFFIX}")),
                      reverse=True)

    def path_for_incident(self, incident_id: int) -> str | None:
        """The newest bundle kept for an incident."""
        mine = [p for p in self.paths() if f"-incident-{incident_id}-" in os.path.basename(p)]
        return mine[0] if mine else None


def default_directory(db_path: str) -> str | None:
    """Next to the incident log: `<its directory>/bundles`; none for an in-memory log."""
    if db_path == ":memory:":
        return None
    return os.path.join(os.path.dirname(os.path.abspath(db_path)), "bundles")


class BundleMaker:
    """Bundles on demand (the API, `replaywatch bundle`): the last cycle's, or the one kept
    for an incident. Errors are LookupError with a message for a 404."""

    def __init__(self, store: BundleStore,
                 last_cycle: Callable[[str], tuple[bd.Inputs, tuple[Finding, ...]] | None],
                 targets: Callable[[], Sequence[str]]):
        self.store = store
        self._last_cycle = last_cycle
        self._targets = targets

    def now(self, target: str | None) -> dict[str, Any]:
        """The last cycle of `target` (or of the only target watched) as a bundle."""
        watched = sorted(self._targets())
        if target is None:
            if len(watched) != 1:
                raise LookupError(f"this sidecar watches {len(watched)} targets; name one "
                                  f"with target= ({', '.join(watched[:10]) or 'none yet'})")
            target = watched[0]
        last = self._last_cycle(target)
        if last is None:
            raise LookupError(f"no cycle diagnosed for target {target!r} yet"
                              if target in watched else f"unknown target {target!r}")
        inputs, live = last
        open_ids = [f.finding_id for f in live if f.severity.label == "critical"]
        return self.store.document(inputs, live, "on demand",
                                   finding_id=open_ids[0] if open_ids else None)

    def for_incident(self, incident_id: int, incident: dict[str, Any] | None
                     ) -> dict[str, Any]:
        """The bundle written when the incident opened, if kept; for an incident still open
        without one, the last cycle of its target."""
        path = self.store.path_for_incident(incident_id)
        if path is not None:
            try:
                return bd.read(path).doc
            except bd.BundleError as e:
                raise LookupError(f"the bundle kept for incident {incident_id} is unreadable: "
                                  f"{e}") from None
        if incident is None:
            raise LookupError(f"unknown incident {incident_id}")
        if incident.get("resolved_at") is None:
            last = self._last_cycle(incident["target"])
            if last is not None:
                return self.store.document(last[0], last[1], f"on demand, incident "
                                           f"{incident_id}", finding_id=incident["finding_id"])
        raise LookupError(f"no bundle kept for incident {incident_id} (bundles are written "
                          f"when a critical finding opens; the newest {self.store.keep} are "
                          "kept)")
