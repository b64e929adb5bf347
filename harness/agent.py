"""`python -m agents.run` as a child, its JSON event lines read as they arrive.

    with AgentProcess(["--mode", "sync", "--steps", "400"]) as agent:
        start = agent.start_line(timeout_s=90)      # the startup JSON line
        doc = agent.probe()                          # GET {probe}/probe
        agent.wait_for(lambda r: r["event"] == "done", timeout_s=60)

`records` holds the driver's stdout events, in order. `event()` also searches stderr, where
Ray forwards its workers' lines behind a "(ActorProcess pid=...)" prefix, and says when each
line arrived: the benchmarks time a fault's onset by it. The child runs in its own session;
leaving the block kills it and every process below it, Ray's included, so a hung agent
never outlives its caller.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from harness.procs import PYTHON, Proc, get_json

Record = dict[str, Any]


def _json_in(line: str) -> Record | None:
    start = line.find("{")
    if start < 0:
        return None
    try:
        record = json.JSONDecoder().raw_decode(line[start:])[0]
    except ValueError:
        return None
    return record if isinstance(record, dict) and "event" in record else None


class AgentProcess:
    def __init__(self, flags: list[str], env: dict[str, str] | None = None,
                 log: Path | None = None, death_signal: int | None = None):
        """`death_signal`: sent to the agent when the thread that spawns it dies (Proc)."""
        self._argv = [PYTHON, "-u", "-m", "agents.run", *flags]
        self._death_signal = death_signal
        self._env = env
        self._log_path = log
        self._records: queue.Queue[Record] = queue.Queue()
        self.records: list[Record] = []
        self.stderr_tail: list[str] = []
        self._timed: list[tuple[float, Record]] = []  # both streams, with arrival times
        self._lock = threading.Lock()
        self._log: IO[str] | None = None
        self._proc: Proc | None = None
        self._start: Record | None = None

    def __enter__(self) -> AgentProcess:
        return self.spawn()

    def __exit__(self, *exc: object) -> None:
        self.kill()

    def spawn(self) -> AgentProcess:
        self._log = open(self._log_path, "w") if self._log_path else None
        self._proc = Proc(self._argv, env=self._env, pipes=True,
                          death_signal=self._death_signal)
        popen = self._proc.popen
        threading.Thread(target=self._read, args=(popen.stdout, True), daemon=True).start()
        threading.Thread(target=self._read, args=(popen.stderr, False), daemon=True).start()
        return self

    def _read(self, stream: IO[str], is_stdout: bool) -> None:
        for line in stream:
            at = time.time()
            record = _json_in(line)
            with self._lock:
                if self._log is not None:
                    self._log.write(line)
                    self._log.flush()
                if not is_stdout:
                    self.stderr_tail = (self.stderr_tail + [line.rstrip()])[-40:]
                if record is not None:
                    self._timed.append((at, record))
            # Only whole stdout lines are the driver's own events (Ray's forwarded ones
            # carry a prefix).
            if is_stdout and record is not None and line.startswith("{"):
                self._records.put(record)

    def _drain(self) -> None:
        while True:
            try:
                self.records.append(self._records.get_nowait())
            except queue.Empty:
                return

    def wait_for(self, predicate: Callable[[Record], bool], timeout_s: float) -> Record:
        """The first stdout record (seen so far or arriving) that matches, or AssertionError."""
        deadline = time.monotonic() + timeout_s
        seen = 0
        while True:
            self._drain()
            for record in self.records[seen:]:
                if predicate(record):
                    return record
            seen = len(self.records)
            if self.returncode is not None and self._records.empty():
                time.sleep(0.2)  # let the reader thread hand over the last lines
                self._drain()
                for record in self.records[seen:]:
                    if predicate(record):
                        return record
                raise AssertionError(f"agent exited {self.returncode}: {self.describe()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no matching record in {timeout_s}s: {self.describe()}")
            time.sleep(0.1)

    def event(self, predicate: Callable[[Record], bool]) -> tuple[float, Record] | None:
        """The first event line on either stream that matches, with its arrival (epoch s)."""
        with self._lock:
            timed = list(self._timed)
        return next(((at, r) for at, r in timed if predicate(r)), None)

    def start_line(self, timeout_s: float = 120) -> Record:
        if self._start is None:
            self._start = self.wait_for(lambda r: r["event"] == "start", timeout_s)
        return self._start

    def probe(self, path: str = "/probe", timeout_s: float = 5.0) -> Any:
        status, doc = get_json(self.start_line()["probe"] + path, timeout_s)
        if status != 200:
            raise OSError(f"probe {path} answered {status}: {doc!r}")
        return doc

    @property
    def returncode(self) -> int | None:
        return None if self._proc is None else self._proc.returncode

    def describe(self) -> str:
        self._drain()
        return f"records={self.records[-5:]!r} stderr_tail={self.stderr_tail[-15:]!r}"

    def kill(self) -> None:
        """KILLs the agent and every process below it (Ray's), at once.

        Not TERM first: a distributed agent's ray.shutdown() on SIGTERM took 3 s of every
        test's teardown and left Ray's workers running (Proc.kill finds them).
        """
        if self._proc is None:
            return
        self._proc.kill()
        with self._lock:  # the readers write to the log under the same lock
            if self._log is not None:
                self._log.close()
                self._log = None

