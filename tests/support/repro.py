"""What the real-Reverb reproductions share: a sidecar core ticked by hand every 0.2 s with a
1.5 s stall window, daemon loops standing in for actors and learners, and a plain table.

A kind must appear within the stall window plus two polls of its cause (`DEADLINE_S`); the
slack is scheduling jitter on a 2-core machine shared by several test runs.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable

import numpy as np
import reverb

from replaywatch.config import PollConfig, ProbeTarget, WatchConfig
from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.model import Severity
from replaywatch.state import Published
from replaywatch.wiring import Sidecar, build_sidecar

POLL_S = 0.2
WINDOW_S = 1.5
DEADLINE_S = WINDOW_S + 2 * POLL_S  # the acceptance bound: the stall window plus two polls
SLACK_S = 0.6  # a 2-core machine shared by several test runs: scheduling jitter


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def sidecar_for(port: int, probe: str | None = None, **thresholds: float) -> Sidecar:
    th = Thresholds(stall_window_s=WINDOW_S, min_history_s=0.5, **thresholds)
    probes = () if probe is None else (ProbeTarget(probe, None),)
    config = WatchConfig(targets=(f"127.0.0.1:{port}",), probes=probes,
                         poll=PollConfig(interval_s=POLL_S, history_s=300.0), thresholds=th)
    return build_sidecar(config, incidents_path=":memory:")


def kinds(state: Published) -> set[str]:
    return {f.kind for f in state.findings}


def alarms(state: Published) -> set[str]:
    return {f.kind for f in state.findings if f.severity >= Severity.WARNING}


def tick_until(sidecar: Sidecar, done: Callable[[Published], bool], timeout_s: float,
               seen: list[Published] | None = None) -> float | None:
    """Ticks every POLL_S until `done(state)`; seconds it took, or None at the timeout."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        t0 = time.monotonic()
        state = sidecar.poller.tick()
        if seen is not None:
            seen.append(state)
        if done(state):
            return time.monotonic() - start
        time.sleep(max(0.0, POLL_S - (time.monotonic() - t0)))
    return None


class Loop(threading.Thread):
    """A daemon thread repeating `step` until stopped (or its client fails on shutdown)."""

    def __init__(self, step: Callable[[], None], pause_s: float = 0.005) -> None:
        super().__init__(daemon=True)
        self.step, self.pause_s, self.halt = step, pause_s, threading.Event()

    def run(self) -> None:
        try:
            while not self.halt.is_set():
                self.step()
                time.sleep(self.pause_s)
        except Exception:  # the server went away under a blocked call: the test is over
            pass

    def stop(self) -> None:
        self.halt.set()
        self.join(timeout=2)


def actor(client: reverb.Client, table: str = "replay") -> Loop:
    return Loop(lambda: client.insert([np.zeros(2, np.float32)], {table: 1.0}))


def learner(client: reverb.Client, table: str = "replay") -> Loop:
    return Loop(lambda: [None for _ in client.sample(table, num_samples=4)])


def table(limiter: reverb.rate_limiters.RateLimiter, max_size: int = 1000) -> reverb.Table:
    return reverb.Table("replay", reverb.selectors.Uniform(), reverb.selectors.Fifo(),
                        max_size=max_size, rate_limiter=limiter)
