"""What the real-Reverb reproductions share: a sidecar core ticked by hand every 0.2 s with a
1.5 s stall window, daemon loops standing in for actors and learners, and a plain table.

A kind must appear within the stall window plus two polls of its cause (`DEADLINE_S`); the
slack is scheduling jitter on a 2-core machine shared by several test runs.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Callable

import numpy as np
import reverb

from replaywatch import bundle as bd
from replaywatch.config import PollConfig, ProbeTarget, WatchConfig
from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.model import Severity
from replaywatch.poller import targets_of
from replaywatch.state import Published
from replaywatch.wiring import Sidecar, build_sidecar

POLL_S = 0.2
WINDOW_S = 1.5
DEADLINE_S = WINDOW_S + 2 * POLL_S  # the acceptance bound: the stall window plus two polls
# A 2-core machine running make test's four lanes: scheduling jitter of a tick or more. How
# fast each kind is named is bench.detection's to measure; these tests hold the kind and a bound.
SLACK_S = 1.5


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def sidecar_for(port: int, probe: str | None = None, **thresholds: float | bool) -> Sidecar:
    # A stall window given is pinned, as `--stall-window` pins it for a user
    # (config.thresholds_from): a window learned from a loaded host's uneven ticks grew to
    # 4 s here, and the bounds below are the configured window's.
    th = Thresholds(**{"stall_window_s": WINDOW_S, "min_history_s": 0.5,
                       "learned_windows": False, **thresholds})
    probes = () if probe is None else (ProbeTarget(probe, None),)
    config = WatchConfig(targets=(f"127.0.0.1:{port}",), probes=probes,
                         poll=PollConfig(interval_s=POLL_S, history_s=300.0), thresholds=th)
    return build_sidecar(config, incidents_path=":memory:")


def kinds(state: Published) -> set[str]:
    return {f.kind for f in state.findings}


def alarms(state: Published) -> set[str]:
    return {f.kind for f in state.findings if f.severity >= Severity.WARNING}


def tick_until(sidecar: Sidecar, done: Callable[[Published], bool], timeout_s: float,
               seen: list[Published] | None = None, replay_each: bool = True) -> float | None:
    """Ticks every POLL_S until `done(state)`; seconds it took, or None at the timeout.

    Each verdict the run meets must be given the same offline (assert_replays): each
    reproduction checks `replaywatch analyze` on every finding it meets, replaying the cycle
    at which the findings changed and the last one (a replay each tick cost a core beside
    make test's other lanes, and said nothing new between changes). `replay_each=False`
    replays the last cycle only, for runs whose actors are threads of this process and whose
    rates are measured: a replay holds the GIL they insert with.
    """
    start = time.monotonic()
    replayed: frozenset[tuple[str, str, str | None, int]] | None = None
    while time.monotonic() - start < timeout_s:
        t0 = time.monotonic()
        state = sidecar.poller.tick()
        took = time.monotonic() - start
        named = frozenset((f.kind, f.target, f.table, int(f.severity)) for f in state.findings)
        if replay_each and named != replayed:
            assert_replays(sidecar, state)
            replayed = named
        if seen is not None:
            seen.append(state)
        if done(state):
            if not replay_each or replayed is not named:
                assert_replays(sidecar, state)
            return took
        time.sleep(max(0.0, POLL_S - (time.monotonic() - t0)))
    return None


def assert_replays(sidecar: Sidecar, state: Published) -> list[bd.Bundle]:
    """Each target's bundle of this cycle, through JSON, gives the verdict the sidecar
    published, byte for byte, and fits the bundle's size limit."""
    out = []
    # Targets named by flags, else those a targets file (or discovery) bound
    for target in sidecar.config.targets or sorted(targets_of(sidecar.poller.bindings)):
        text = bd.fit(sidecar.bundles.now(target))
        assert len(text.encode()) <= bd.MAX_BYTES
        b = bd.parse(text, f"bundle of {target}")
        published = bd.verdict_document(target, b.inputs.now,
                                        [f for f in state.findings if f.target == target])
        assert bd.dumps_verdict(b.live) == bd.dumps_verdict(published)
        offline = bd.verdict_document(target, b.inputs.now, bd.verdict(b.inputs))
        assert bd.dumps_verdict(offline) == bd.dumps_verdict(b.live), target
        out.append(b)
        if os.environ.get("REPLAYS_LOG"):  # which kinds the reproductions replayed, and sizes
            with open(os.environ["REPLAYS_LOG"], "a") as f:
                f.write(json.dumps({"bytes": len(text.encode()), "kinds": [
                    x["kind"] for x in b.live["findings"]]}) + "\n")
    return out


def wait_for_bundles(sidecar: Sidecar, n: int, timeout_s: float = 20.0) -> list[str]:
    """The bundle files the sidecar wrote, oldest first, once there are `n`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        paths = sidecar.bundles.store.paths()
        if len(paths) >= n:
            return sorted(paths)
        time.sleep(0.1)
    raise AssertionError(f"{len(sidecar.bundles.store.paths())} bundles written in "
                         f"{timeout_s:g} s, expected {n}")


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
