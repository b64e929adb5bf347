"""Keeps the cyclic garbage collector's pauses out of the sidecar's answers.

The history holds every table's snapshots for the whole window: at 50 targets x
5 tables and 900 s that is ~700k objects, and every full collection walks all
of them holding the GIL. Measured at 50 x 5 (bench/scale.py's shape): full
collections every ~5 s, each 35-90 ms and growing with the window, the largest
share of /metrics' tail latency. Snapshots never form reference cycles (frozen
dataclasses of numbers and strings), so that walk finds nothing.

So after each poll cycle the survivors are moved to the permanent generation
(`gc.freeze`), which the collector skips; they are still freed by reference
counting when the window drops them. What freezing costs: cyclic garbage that
includes an object alive at a freeze is not collected until the next
`gc.unfreeze`. A young collection right before each freeze leaves no garbage
behind at that moment, and once every `full_every_s` everything is unfrozen and
collected (one full pause an hour), which bounds what could wait that long.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable

log = logging.getLogger("replaywatch.gc")

FULL_EVERY_S = 3600.0


class GcPacing:
    """Freezes each cycle's survivors; a full collection once every `full_every_s`.

    `after_cycle(now)` runs on the poller's thread after each publish; `now` is a
    monotonic time, so tests drive it without waiting.
    """

    def __init__(self, full_every_s: float = FULL_EVERY_S,
                 perf: Callable[[], float] = time.perf_counter):
        if full_every_s <= 0:
            raise ValueError(f"full_every_s must be > 0, got {full_every_s}")
        self._full_every_s = full_every_s
        self._perf = perf
        self._last_full: float | None = None
        self.full_collections = 0
        self.last_pause_s = 0.0  # the last after_cycle's own collection time

    def start(self, now: float) -> None:
        """Freezes what start-up made (imports, the app): never garbage, ~65k objects."""
        gc.collect()
        gc.freeze()
        self._last_full = now

    def after_cycle(self, now: float) -> None:
        t0 = self._perf()
        if self._last_full is None or now - self._last_full >= self._full_every_s:
            gc.unfreeze()
            gc.collect()
            self._last_full = now
            self.full_collections += 1
        else:
            gc.collect()  # only what is not frozen: what this cycle left, a few thousand
        gc.freeze()
        self.last_pause_s = self._perf() - t0
        if self.last_pause_s > 0.05:
            log.info("garbage collection took %.0f ms", 1000 * self.last_pause_s)

    def stop(self) -> None:
        """Hands every object back to the collector (tests run many sidecars in one process)."""
        gc.unfreeze()
