"""RLlibProbe: what only an RLlib driver knows, served over HTTP (`GET /probe`, role "rllib").

From outside (`watch --ray`) the sidecar reads Ray's state API, RLlib's metrics and, where
the job writes them, its result rows. Three things it cannot read there: the replay buffer's
counts now (the rows hold one iteration's means, and a plain `algo.train()` loop writes no
rows at all in Ray 2.60), the learner thread's queue now (APPO and IMPALA with the learner in
the driver), and whether that thread is blocked on the queue (starved by its EnvRunners) or
busy inside an update. The probe serves them, with the newest `train()` result's row, from a
daemon thread, so it answers while the driver is stuck in `train()`.

    from replaywatch.probe.rllib import RLlibProbe
    probe = RLlibProbe(listen="0.0.0.0:8003")
    config = config.callbacks(**probe.callbacks())   # on_algorithm_init, on_train_result
    algo = config.build_algo()                       # the probe serves from here on
    ...
    replaywatch watch --ray HEAD:8265 --ray-results http://DRIVER:8003

Standard library only, like every probe: RLlib's objects are read by their attributes
(Ray 2.60's names), and what a version does not have is served as null, never guessed.
The callbacks are sent to every EnvRunner with the config; a copy there is inert (it
serves nothing: only the Algorithm's own `on_algorithm_init` starts the server).
"""

from __future__ import annotations

import os
import sys
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from replaywatch.probe.process_memory import Cgroup, cgroup_of, limit_of, rss_of
from replaywatch.probe.protocol import (
    BufferKeys,
    ConfigKeys,
    Doc,
    QueueKeys,
    ResultKeys,
    Rllib,
    Role,
)
from replaywatch.probe.serving import ProbeServer, Served, thread_counts

SAMPLE_EVERY_S = 0.1  # how often the learner thread's frame is looked at
_ORIGINS: weakref.WeakValueDictionary[int, RLlibProbe] = weakref.WeakValueDictionary()
# The result keys copied into `row`, and the config's (a row is ~20 KB, most of it config).
_ROW_KEYS = tuple(v for k, v in vars(ResultKeys).items()
                  if k.isupper() and v != ResultKeys.CONFIG)
_CONFIG_KEYS = tuple(v for k, v in vars(ConfigKeys).items() if k.isupper())


class RLlibProbe(Served):
    """Serves an RLlib Algorithm's replay buffer, learner queue and newest result row."""

    def __init__(self, name: str = "rllib", listen: str = "127.0.0.1:0",
                 clock: Callable[[], float] = time.time):
        if not isinstance(name, str) or not name:
            raise ValueError(f"name ({name!r}) must be a non-empty string")
        self._listen = listen
        self._clock = clock
        self._static: dict[str, Any] = {Doc.ROLE: str(Role.RLLIB), Doc.NAME: name,
                                        Doc.TABLE: None}
        self._http = ProbeServer(listen, self.snapshot, self.stacks)
        # Read once: the group a process runs in is the one it is killed in.
        self._group: Cgroup | None = cgroup_of(os.getpid())
        self._init_runtime()

    def _init_runtime(self) -> None:
        _ORIGINS[id(self)] = self
        self._origin: RLlibProbe | None = None
        self._algorithm: Any = None
        self._row: dict[str, Any] | None = None
        self._started = self._clock()
        self._lock = threading.Lock()
        self._waited_s = 0.0
        self._watched_s = 0.0
        self._sampler: threading.Thread | None = None
        self._halt = threading.Event()

    # The config, callbacks included, is copied when the Algorithm is built and pickled to
    # every EnvRunner. A copy in this process hands its hooks to the probe it was copied
    # from (the one the job holds and asks for its URL); a copy in another process (Tune runs
    # the Algorithm in a trial actor) serves there, from its own on_algorithm_init, and one
    # whose hooks never run (an EnvRunner's) serves nothing.
    def __getstate__(self) -> tuple[str, str, int, int]:
        return str(self._static[Doc.NAME]), self._listen, os.getpid(), id(self)

    def __setstate__(self, state: tuple[str, str, int, int]) -> None:
        name, listen, pid, origin = state
        self.__init__(name=name, listen=listen)  # type: ignore[misc]
        if pid == os.getpid():
            self._origin = _ORIGINS.get(origin)

    def callbacks(self) -> dict[str, Callable[..., None]]:
        """The keyword arguments of `AlgorithmConfig.callbacks(...)` that attach the probe."""
        return {"on_algorithm_init": self.on_algorithm_init,
                "on_train_result": self.on_train_result}

    def on_algorithm_init(self, *, algorithm: Any, **_: Any) -> None:
        """RLlib's hook once the Algorithm is built: watch it and start serving."""
        if self._origin is not None:
            self._origin.on_algorithm_init(algorithm=algorithm)
            return
        self.watch(algorithm)
        if self.url is None:
            self.start()

    def on_train_result(self, *, result: Mapping[str, Any], algorithm: Any = None,
                        **_: Any) -> None:
        """RLlib's hook after each `train()`: keep the row's keys replaywatch reads."""
        if self._origin is not None:
            self._origin.on_train_result(result=result, algorithm=algorithm)
            return
        row = _flat(result, _ROW_KEYS)
        config = result.get(ResultKeys.CONFIG)
        if isinstance(config, Mapping):
            row[ResultKeys.CONFIG] = _flat(config, _CONFIG_KEYS)
        with self._lock:
            self._row = row
        if algorithm is not None and self._algorithm is None:
            self.watch(algorithm)

    def watch(self, algorithm: Any) -> None:
        """Reads `algorithm` from now on (the hooks call this; a loop may too)."""
        self._algorithm = algorithm
        if self._sampler is None and _learner_thread(algorithm) is not None:
            self._sampler = threading.Thread(target=self._sample, daemon=True,
                                             name="replaywatch-rllib-probe")
            self._sampler.start()

    def stop(self) -> None:
        self._halt.set()
        super().stop()

    def snapshot(self) -> dict[str, Any]:
        """The `GET /probe` document (role "rllib").

        algorithm: the Algorithm's class name (null before one is watched). row: the newest
        `train()` result as result.json would hold it, only the keys replaywatch reads ("/"
        joined; `config` with its own), null before the first. buffer: the driver's replay
        buffer now, in env steps (capacity, stored, added and sampled since it was made,
        episodes stored and evicted, a prioritized buffer's max priority), null where the
        Algorithm has none. learner_queue: the learner thread's in-queue now (depth, maxsize),
        whether the thread lives and is blocked on the queue's get() now, and the seconds it
        was so blocked out of those sampled; null where no learner thread runs in the driver
        (DQN; learners in Ray actors). rss_bytes, limit_bytes, limit_from, cgroup_usage_bytes:
        the driver's resident memory, where the buffer lives, and what it may use (its
        memory cgroup's limit, usage, anonymous memory and OOM kills, or the host's memory),
        read as a ReplayProbe reads its own.
        """
        algorithm = self._algorithm
        with self._lock:
            row = None if self._row is None else dict(self._row)
            waited, watched = self._waited_s, self._watched_s
        doc = dict(self._static)
        limit = limit_of(self._group)
        doc.update({Doc.PID: os.getpid(), Doc.STARTED_AT: self._started, Doc.NOW: self._clock(),
                    Rllib.ALGORITHM: None if algorithm is None else type(algorithm).__name__,
                    Rllib.ROW: row, Rllib.BUFFER: _buffer(algorithm),
                    Rllib.LEARNER_QUEUE: _queue(algorithm, waited, watched),
                    Rllib.RSS_BYTES: rss_of(os.getpid()), Rllib.LIMIT_BYTES: limit.bytes,
                    Rllib.LIMIT_FROM: limit.source, Rllib.CGROUP_USAGE_BYTES: limit.usage,
                    Rllib.CGROUP_ANON_BYTES: limit.anon, Rllib.OOM_KILLS: limit.oom_kills})
        doc.update(thread_counts())
        return doc

    def _sample(self) -> None:
        """Every SAMPLE_EVERY_S: is the learner thread blocked on its queue? A look at one
        frame, so the driver pays microseconds a second, not a profiler."""
        last = time.monotonic()
        while not self._halt.wait(SAMPLE_EVERY_S):
            now = time.monotonic()
            thread = _learner_thread(self._algorithm)
            if thread is None or not thread.is_alive():
                last = now
                continue
            queue = getattr(_learner(self._algorithm), "_learner_thread_in_queue", None)
            waiting = _blocked_on_queue(thread, queue)
            with self._lock:
                self._watched_s += now - last
                self._waited_s += (now - last) if waiting else 0.0
            last = now


def _flat(obj: Mapping[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    """`keys` ("a/b" for nested dicts) of `obj` that hold a number, a string or null."""
    out: dict[str, Any] = {}
    for key in keys:
        node: Any = obj
        for part in key.split("/"):
            node = node.get(part) if isinstance(node, Mapping) else None
        if node is None or isinstance(node, (bool, int, float, str)):
            out[key] = node
        elif hasattr(node, "item"):  # a numpy or torch scalar
            try:
                out[key] = node.item()
            except (TypeError, ValueError):
                out[key] = None
    return out


def _call(obj: Any, name: str) -> Any:
    method = getattr(obj, name, None)
    try:
        return method() if callable(method) else None
    except Exception:  # a buffer mid-mutation on the driver's thread: unknown this time
        return None


def _buffer(algorithm: Any) -> dict[str, Any] | None:
    buffer = getattr(algorithm, "local_replay_buffer", None)
    if buffer is None:
        return None
    priority = getattr(buffer, "_max_priority", None)
    return {BufferKeys.KIND: type(buffer).__name__,
            BufferKeys.CAPACITY: getattr(buffer, "capacity", None),
            BufferKeys.STORED: _call(buffer, "get_num_timesteps"),
            BufferKeys.ADDED: _call(buffer, "get_added_timesteps"),
            BufferKeys.SAMPLED: _call(buffer, "get_sampled_timesteps"),
            BufferKeys.EPISODES_STORED: _call(buffer, "get_num_episodes"),
            BufferKeys.EPISODES_EVICTED: _call(buffer, "get_num_episodes_evicted"),
            BufferKeys.MAX_PRIORITY: float(priority) if isinstance(priority, (int, float))
            else None}


def _learner(algorithm: Any) -> Any:
    """The learner in the driver (`num_learners=0`); None where learners are Ray actors."""
    group = getattr(algorithm, "learner_group", None)
    return getattr(group, "_learner", None)


def _learner_thread(algorithm: Any) -> threading.Thread | None:
    thread = getattr(_learner(algorithm), "_learner_thread", None)
    return thread if isinstance(thread, threading.Thread) else None


def _queue(algorithm: Any, waited_s: float, watched_s: float) -> dict[str, Any] | None:
    learner = _learner(algorithm)
    queue = getattr(learner, "_learner_thread_in_queue", None)
    thread = _learner_thread(algorithm)
    if queue is None or thread is None:
        return None
    maxsize = getattr(queue, "maxsize", None)
    return {QueueKeys.DEPTH: _call(queue, "qsize"),
            QueueKeys.MAXSIZE: maxsize if isinstance(maxsize, int) and maxsize > 0 else None,
            QueueKeys.THREAD_ALIVE: thread.is_alive(),
            QueueKeys.WAITING: thread.is_alive() and _blocked_on_queue(thread, queue),
            QueueKeys.WAITED_S: round(waited_s, 3), QueueKeys.WATCHED_S: round(watched_s, 3)}


def _blocked_on_queue(thread: threading.Thread, queue: Any) -> bool:
    """The thread is inside the queue's own get() (queue.Queue's, or APPO's CircularBuffer's,
    which spins while empty): waiting for a batch. Only the innermost frames are read: a
    get() far up the stack is not what it waits in now."""
    code = getattr(getattr(type(queue), "get", None), "__code__", None)
    frame = sys._current_frames().get(thread.ident or -1)
    for _ in range(6):
        if frame is None or code is None:
            return False
        if frame.f_code is code:
            return True
        frame = frame.f_back
    return False
