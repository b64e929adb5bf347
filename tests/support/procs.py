"""Real processes for tests: spawn, read the announce line, always clean up."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PYTHON = sys.executable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Proc:
    """A child in its own session, so the whole group can be signalled."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None,
                 stdout_path: Path | None = None):
        self.args = args
        self.log_path = stdout_path
        out = open(stdout_path, "wb") if stdout_path else subprocess.PIPE
        self.popen = subprocess.Popen(
            args, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT if stdout_path else
            subprocess.DEVNULL, start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "TF_CPP_MIN_LOG_LEVEL": "2",
                 **(env or {})},
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def announce(self, timeout_s: float = 60.0) -> dict[str, Any]:
        """The first JSON object line the child prints on stdout."""
        deadline = time.monotonic() + timeout_s
        assert self.log_path is not None
        while time.monotonic() < deadline:
            for line in self.log_path.read_text(errors="replace").splitlines():
                if line.startswith("{"):
                    try:
                        # raw_decode: a child's C++ threads log to the same file and may
                        # append to the line before its newline lands.
                        return json.JSONDecoder().raw_decode(line)[0]
                    except ValueError:
                        pass
            if self.popen.poll() is not None:
                raise RuntimeError(f"{self.args} exited {self.popen.returncode}: "
                                   f"{self.log_path.read_text(errors='replace')[-2000:]}")
            time.sleep(0.1)
        raise TimeoutError(f"{self.args} printed no JSON line in {timeout_s}s")

    def signal(self, sig: int) -> None:
        try:
            os.killpg(self.popen.pid, sig)
        except ProcessLookupError:
            pass

    def kill(self) -> None:
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGKILL)
        try:
            self.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass

    def terminate(self, timeout_s: float = 10.0) -> int | None:
        self.signal(signal.SIGTERM)
        try:
            return self.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            return None


def get_json(url: str, timeout_s: float = 5.0, headers: dict[str, str] | None = None
             ) -> tuple[int, Any]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        body = e.read()
        try:
            return e.code, json.loads(body)
        except ValueError:
            return e.code, body.decode(errors="replace")


def get_text(url: str, timeout_s: float = 5.0, headers: dict[str, str] | None = None
             ) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}),
                                    timeout=timeout_s) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def wait_until(predicate: Any, timeout_s: float, interval_s: float = 0.1) -> Any:
    """Polls `predicate` until it returns a truthy value; returns it or raises."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
        except Exception as e:  # the thing may not be up yet
            last = e
        if last and not isinstance(last, Exception):
            return last
        time.sleep(interval_s)
    raise TimeoutError(f"condition not met in {timeout_s}s (last: {last!r})")
