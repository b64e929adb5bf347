"""What a replay process's code does with its Reverb server's checkpoints, kept for its probe.

Reverb says nothing of its checkpoints where the sidecar can read it: ServerInfo has no
checkpointer, a checkpoint's write happens inside one `client.checkpoint()` call, and a
restore runs inside `reverb.Server(...)` before its port serves. So the ReplayProbe is handed
the server's making (`ReplayProbe.server`) and its checkpoint calls (`ReplayProbe.checkpoint`)
and keeps here:

  * the tables as the code wrote them: a restore replaces them with the checkpoint's
    (sampler, remover, max_size, rate limiter and its counters), and only the code's own
    `reverb.Table` objects still say what it asked for;
  * the checkpointer: its directory, whether it is Reverb's default (a fresh temporary
    directory per process start, where no restart ever finds a checkpoint), the interval the
    code checkpoints at, and directories an earlier process began and never finished;
  * each checkpoint call: when it began and ended, what it wrote, or why it failed;
  * the restore: the checkpoint the server loads and what the process has read since it began
    (/proc/self/io), from which the sidecar tells its progress.

Duck-typed: Reverb is imported only by `make_server`, so the probe loads without it.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from replaywatch.probe.protocol import (
    CheckpointerKeys,
    CheckpointKeys,
    Replay,
    RestoreKeys,
    TableKeys,
)

CALLS_KEPT = 16
DONE = "DONE"  # the file Reverb's checkpointer writes last into a complete checkpoint


def table_declaration(table: Any) -> dict[str, Any]:
    """A `reverb.Table` as its code wrote it (its `info`, read before the server exists)."""
    info = table.info
    limiter = info.rate_limiter_info
    sampler = info.sampler_options.WhichOneof("distribution") or "unknown"
    return {
        TableKeys.NAME: str(info.name),
        TableKeys.MAX_SIZE: int(info.max_size),
        TableKeys.MAX_TIMES_SAMPLED: int(info.max_times_sampled),
        TableKeys.SAMPLER: sampler,
        TableKeys.PRIORITY_EXPONENT: (float(info.sampler_options.prioritized.priority_exponent)
                                      if sampler == "prioritized" else None),
        TableKeys.REMOVER: info.remover_options.WhichOneof("distribution") or "unknown",
        TableKeys.SAMPLES_PER_INSERT: float(limiter.samples_per_insert),
        TableKeys.MIN_SIZE_TO_SAMPLE: int(limiter.min_size_to_sample),
        TableKeys.MIN_DIFF: float(limiter.min_diff),
        TableKeys.MAX_DIFF: float(limiter.max_diff),
    }


def dir_bytes(path: Path) -> int | None:
    """The size of a checkpoint's files; None if it cannot be read."""
    try:
        return sum(f.stat().st_size for f in path.iterdir() if f.is_file())
    except OSError:
        return None


def newest_complete(root: Path) -> Path | None:
    """The checkpoint Reverb's checkpointer loads from `root`: its newest directory with DONE
    (the names are timestamps, so the newest sorts last)."""
    try:
        done = sorted(d for d in root.iterdir() if (d / DONE).exists())
    except OSError:
        return None
    return done[-1] if done else None


def incomplete(root: Path, before: float) -> list[str]:
    """Checkpoint directories without DONE last changed before `before`: writes a process
    began and never finished (a crash or a restart during the write)."""
    try:
        return sorted(d.name for d in root.iterdir() if d.is_dir() and not (d / DONE).exists()
                      and d.stat().st_mtime < before)
    except OSError:
        return []


def read_bytes(proc_io: Path = Path("/proc/self/io")) -> int | None:
    """What this process has read so far (`rchar`: every read call, page cache or not)."""
    try:
        for line in proc_io.read_text().splitlines():
            key, _, value = line.partition(":")
            if key == "rchar":
                return int(value)
    except (OSError, ValueError):
        pass
    return None


def _error(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"[:300]


class CheckpointLog:
    """The replay's declaration, checkpoint calls and restore; its document under `Replay`."""

    def __init__(self, clock: Callable[[], float] = time.time,
                 started: float | None = None):
        self._clock = clock
        self._started = clock() if started is None else started
        self._lock = threading.Lock()
        self._tables: list[dict[str, Any]] | None = None
        self._checkpointer: dict[str, Any] | None = None
        self._root: Path | None = None
        self._calls: collections.deque[dict[str, Any]] = collections.deque(maxlen=CALLS_KEPT)
        self._restore: dict[str, Any] | None = None
        self._read_at_restore: int | None = None

    def declare(self, tables: Iterable[Any], checkpointer: Any,
                checkpoint_every_s: float | None) -> None:
        """The code's tables and its checkpointer (a `DefaultCheckpointer` or a subclass)."""
        if checkpoint_every_s is not None and not checkpoint_every_s > 0:
            raise ValueError(f"checkpoint_every_s ({checkpoint_every_s!r}) must be positive")
        declared = [table_declaration(t) for t in tables]
        path = getattr(checkpointer, "path", None)
        # Reverb's default makes a fresh temporary directory each time a process starts it.
        temporary = any(c.__name__ == "TempDirCheckpointer" for c in type(checkpointer).__mro__)
        root = Path(path) if path else None
        # Read once: only a process before this one leaves a write unfinished here.
        cut = incomplete(root, self._started) if root is not None else []
        with self._lock:
            self._tables = declared
            self._root = root
            self._checkpointer = {CheckpointerKeys.PATH: str(path) if path else None,
                                  CheckpointerKeys.TEMPORARY: temporary,
                                  CheckpointerKeys.EVERY_S: checkpoint_every_s,
                                  CheckpointerKeys.INCOMPLETE: cut}

    def restoring(self, fallback: str | None) -> None:
        """The server is about to load what its checkpointer finds (or start empty)."""
        found = newest_complete(self._root) if self._root is not None else None
        if found is None and fallback:
            found = Path(fallback)
        with self._lock:
            self._read_at_restore = read_bytes()
            self._restore = {RestoreKeys.STARTED_AT: self._clock(), RestoreKeys.ENDED_AT: None,
                             RestoreKeys.PATH: str(found) if found else None,
                             RestoreKeys.BYTES: dir_bytes(found) if found else 0,
                             RestoreKeys.READ_BYTES: 0}

    def load_begins(self) -> None:
        """The load's own start: its time and the process's reads so far."""
        with self._lock:
            self._read_at_restore = read_bytes()
            if self._restore is not None:
                self._restore[RestoreKeys.STARTED_AT] = self._clock()

    @property
    def read_at_restore(self) -> int | None:
        """The process's reads (rchar) when the load began."""
        return self._read_at_restore

    def restored(self) -> None:
        with self._lock:
            if self._restore is not None:
                self._restore[RestoreKeys.READ_BYTES] = self._read_since_restore()
                self._restore[RestoreKeys.ENDED_AT] = self._clock()

    def _read_since_restore(self) -> int | None:
        now = read_bytes()
        return None if now is None or self._read_at_restore is None else \
            now - self._read_at_restore

    def checkpoint(self, client: Any) -> str:
        """`client.checkpoint()`, its start, end and result kept; its errors raised as ever."""
        call: dict[str, Any] = {CheckpointKeys.STARTED_AT: self._clock(),
                                CheckpointKeys.ENDED_AT: None, CheckpointKeys.PATH: None,
                                CheckpointKeys.BYTES: None, CheckpointKeys.ERROR: None}
        with self._lock:
            self._calls.append(call)
        try:
            path = str(client.checkpoint())
        except BaseException as e:
            with self._lock:
                call.update({CheckpointKeys.ENDED_AT: self._clock(),
                             CheckpointKeys.ERROR: _error(e)})
            raise
        written = dir_bytes(Path(path))
        with self._lock:
            call.update({CheckpointKeys.ENDED_AT: self._clock(), CheckpointKeys.PATH: path,
                         CheckpointKeys.BYTES: written})
            if self._root is None:  # a temporary checkpointer's directory, learned here
                self._root = Path(path).parent
                if self._checkpointer is not None:
                    self._checkpointer[CheckpointerKeys.PATH] = str(self._root)
        return path

    def document(self) -> dict[str, Any]:
        """Its keys of the replay probe's document (null: not handed the server)."""
        with self._lock:
            checkpointer = dict(self._checkpointer) if self._checkpointer else None
            restore = dict(self._restore) if self._restore else None
            if restore is not None and restore[RestoreKeys.ENDED_AT] is None:
                restore[RestoreKeys.READ_BYTES] = self._read_since_restore()
            calls = [dict(c) for c in self._calls]
            tables = list(self._tables) if self._tables is not None else None
        return {Replay.DECLARED_TABLES: tables, Replay.CHECKPOINTER: checkpointer,
                Replay.CHECKPOINTS: calls, Replay.RESTORE: restore}


def make_server(log: CheckpointLog, tables: list[Any], port: int | None, checkpointer: Any,
                checkpoint_every_s: float | None,
                loading: Callable[[], AbstractContextManager[Any]]) -> Any:
    """`reverb.Server(tables, port, checkpointer)` with its declaration and restore logged,
    inside `loading()` (what answers for the probe while the load holds the GIL)."""
    import reverb  # only here: the probe loads where Reverb is not installed

    if checkpointer is None:
        # What reverb.Server does with None, done here so that its directory is known.
        checkpointer = reverb.checkpointers.default_checkpointer()
    log.declare(tables, checkpointer, checkpoint_every_s)
    log.restoring(getattr(checkpointer, "fallback_checkpoint_path", None))
    try:
        with loading():
            log.load_begins()  # timed from here: what answers meanwhile may take a while
            return reverb.Server(tables=tables, port=port, checkpointer=checkpointer)
    finally:
        log.restored()
