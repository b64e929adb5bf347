"""Test support: run `python -m agents.run` as a child and read what it says.

    with AgentProcess(["--mode", "sync", "--steps", "400"]) as agent:
        start = agent.start_line(timeout_s=90)      # the startup JSON line
        doc = agent.probe()                          # GET {probe}/probe
        agent.wait_for(lambda r: r["event"] == "done", timeout_s=60)

The child runs in its own session; leaving the block kills its whole process
group (TERM, then KILL), so a hung agent never outlives its test.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


class AgentProcess:
    def __init__(self, flags: list[str], env: dict[str, str] | None = None):
        self._argv = [sys.executable, "-u", "-m", "agents.run", *flags]
        self._env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", **(env or {})}
        self._records: queue.Queue[dict[str, Any]] = queue.Queue()
        self.records: list[dict[str, Any]] = []
        self.stderr_tail: list[str] = []
        self._proc: subprocess.Popen[str] | None = None
        self._start: dict[str, Any] | None = None

    def __enter__(self) -> AgentProcess:
        self._proc = subprocess.Popen(
            self._argv, cwd=ROOT, env=self._env, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, start_new_session=True,
        )  # fmt: skip
        threading.Thread(target=self._read_stdout, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()

    def _read_stdout(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            try:
                record = json.loads(line)
            except ValueError:
                continue  # Ray's forwarded worker lines and the like
            if isinstance(record, dict) and "event" in record:
                self._records.put(record)

    def _read_stderr(self) -> None:
        assert self._proc is not None and self._proc.stderr is not None
        for line in self._proc.stderr:
            self.stderr_tail = (self.stderr_tail + [line.rstrip()])[-40:]

    def _drain(self) -> None:
        while True:
            try:
                self.records.append(self._records.get_nowait())
            except queue.Empty:
                return

    def wait_for(
        self, predicate: Callable[[dict[str, Any]], bool], timeout_s: float
    ) -> dict[str, Any]:
        """The first record (seen so far or arriving) that matches, or AssertionError."""
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

    def start_line(self, timeout_s: float = 120) -> dict[str, Any]:
        if self._start is None:
            self._start = self.wait_for(lambda r: r["event"] == "start", timeout_s)
        return self._start

    def probe(self, path: str = "/probe", timeout_s: float = 5.0) -> dict[str, Any]:
        url = self.start_line()["probe"] + path
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return json.loads(response.read())

    @property
    def returncode(self) -> int | None:
        return None if self._proc is None else self._proc.poll()

    def describe(self) -> str:
        self._drain()
        return f"records={self.records[-5:]!r} stderr_tail={self.stderr_tail[-15:]!r}"

    def kill(self, grace_s: float = 10.0) -> None:
        """TERM the process group, then KILL it; waits for the child with a timeout."""
        if self._proc is None:
            return
        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(self._proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self._proc.wait(timeout=wait_s)
                break
            except subprocess.TimeoutExpired:
                continue
        try:  # the group may outlive its leader (Ray's workers): make sure it is gone
            os.killpg(self._proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def wait_until(condition: Callable[[], bool], timeout_s: float, every_s: float = 0.5) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(every_s)
    return condition()
