"""The driver's view of the distributed actors: start, poll, notice deaths, replace.

Each actor slot keeps its name ("actor-<slot>") and, when it can, its probe's port
across replacements, so a sidecar given the slot's `--probe URL` keeps reading it.
A replacement's probe URL and node are announced in an `actor_probe` line when it has
started (it takes seconds to import), without holding up the driver's loop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import ray

from agents.config import StallInjection

Emit = Callable[[dict[str, Any]], None]
RAY_TIMEOUT_S = 30.0  # every ray.get has one: the driver must never hang with the job
# Start with a slot's index and the probe listen address its predecessor had (None: any).
StartActor = Callable[[int, int, str | None], Any]


def slot_name(slot: int) -> str:
    return f"actor-{slot}"


class ActorSlots:
    def __init__(self, start: StartActor, emit: Emit):
        self._start = start
        self._emit = emit
        self._handles: dict[int, Any] = {}
        self._runs: dict[Any, int] = {}  # run() ref -> slot; it only ends when the actor dies
        self._where: dict[Any, int] = {}  # where() refs of replacements still starting
        self._listen: dict[int, str] = {}  # slot -> its probe's HOST:PORT, for a replacement
        self._steps_of_dead = 0
        self._episodes_of_dead = 0
        self._last_steps: dict[int, int] = {}
        self._last_episodes: dict[int, int] = {}
        self._last_returns: dict[int, float] = {}
        self._replace_at: dict[int, float] = {}
        self._next_index = 0

    def create(self, slots: int, timeout_s: float) -> list[dict[str, Any]]:
        """Starts the first actors and waits until each has started: their `where()`."""
        for slot in range(slots):
            self._create(slot)
        refs = [self._handles[slot].where.remote() for slot in range(slots)]
        try:
            where = ray.get(refs, timeout=timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise RuntimeError(
                f"the actors did not start in {timeout_s:g}s: does a node offer the actor "
                "resource (--actor-resource), with CPU and memory to spare?") from None
        for slot, doc in enumerate(where):
            self._remember(slot, doc)
        return where

    def _create(self, slot: int) -> Any:
        index = self._next_index
        self._next_index += 1
        handle = self._start(slot, index, self._listen.get(slot))
        self._handles[slot] = handle
        self._last_steps[slot] = 0
        self._last_episodes[slot] = 0
        return handle

    def _remember(self, slot: int, where: dict[str, Any]) -> None:
        url = where.get("probe")
        if url:
            self._listen[slot] = url.split("://", 1)[-1]

    def run(self, slot: int, stall: StallInjection | None, started_at: float) -> None:
        self._runs[self._handles[slot].run.remote(stall, started_at)] = slot

    def check_deaths(self, now: float, replace_after_s: float) -> None:
        ready, _ = ray.wait(list(self._runs), num_returns=len(self._runs), timeout=0)
        for ref in ready:
            slot = self._runs.pop(ref)
            try:
                ray.get(ref, timeout=1)
                reason = "returned"
            except Exception as error:  # RayActorError, or whatever the actor raised
                reason = type(error).__name__
            self._steps_of_dead += self._last_steps.pop(slot, 0)
            self._episodes_of_dead += self._last_episodes.pop(slot, 0)
            self._handles.pop(slot, None)
            self._emit({"event": "actor_died", "slot": slot, "name": slot_name(slot),
                        "reason": reason})
            if replace_after_s >= 0:
                self._replace_at[slot] = now + replace_after_s

    def replace_due(self, now: float, started_at: float) -> None:
        for slot, at in list(self._replace_at.items()):
            if now >= at:
                del self._replace_at[slot]
                handle = self._create(slot)
                self.run(slot, None, started_at)
                self._where[handle.where.remote()] = slot
                self._emit({"event": "actor_replaced", "slot": slot, "name": slot_name(slot)})

    def announce_started(self) -> None:
        """An `actor_probe` line for each replacement that has started since the last call."""
        if not self._where:
            return
        ready, _ = ray.wait(list(self._where), num_returns=len(self._where), timeout=0)
        for ref in ready:
            slot = self._where.pop(ref)
            try:
                where = ray.get(ref, timeout=1)
            except Exception:
                continue  # died while starting; check_deaths() says so
            self._remember(slot, where)
            self._emit({"event": "actor_probe", "slot": slot, "name": slot_name(slot),
                        "url": where.get("probe"), "node_id": where.get("node_id")})

    def poll(self) -> None:
        # Not the replacements still starting (or waiting for a node): stats() would
        # queue behind their constructor and hold the driver up.
        starting = set(self._where.values())
        refs = {slot: handle.stats.remote() for slot, handle in self._handles.items()
                if slot not in starting}
        for slot, ref in refs.items():
            try:
                stats = ray.get(ref, timeout=RAY_TIMEOUT_S)
            except Exception:
                continue  # dying, or still starting; check_deaths() accounts for the dead
            self._last_steps[slot] = stats["env_steps"]
            self._last_episodes[slot] = stats["episodes"]
            if stats["train_return"] is not None:
                self._last_returns[slot] = stats["train_return"]

    @property
    def env_steps(self) -> int:
        return self._steps_of_dead + sum(self._last_steps.values())

    @property
    def episodes(self) -> int:
        return self._episodes_of_dead + sum(self._last_episodes.values())

    @property
    def alive(self) -> int:
        """Actors started and not known dead (a replacement counts once it has started)."""
        return len(self._handles) - len(self._where)

    def train_return(self) -> float | None:
        returns = list(self._last_returns.values())
        return float(np.mean(returns)) if returns else None
