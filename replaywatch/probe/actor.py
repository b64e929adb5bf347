"""ActorProbe: what only the actor process knows.

From Reverb and the learner alone, dead actors and live actors that wait for
the learner (a policy-lag bound, a parameter hand-off) look the same: inserts
stop either way. The actor probe tells them apart, and names the writer call
an actor is stuck in (`create_item`/`flush` after the server went away,
`end_episode()` hanging).

It counts environment steps (`step()`), wraps a Reverb writer to count and
time its calls, and marks waits outside Reverb (`waiting("learner")`). Every
time is taken from a monotonic clock on the actor's thread and turned into
wall-clock times only when the document is built, so a clock jump cannot
make a call look blocked for hours.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from replaywatch.probe.clients import ProbedClient, wrapped_by
from replaywatch.probe.protocol import WRITER_CALLS, Actor, CallKeys, Doc, ErrorKeys, Role
from replaywatch.probe.sections import Sections
from replaywatch.probe.serving import ProbeServer, Served, thread_counts

_MAX_ERROR_CHARS = 300


class _ProbedWriter:
    """A transparent proxy for reverb.TrajectoryWriter / reverb.Writer that times its calls."""

    def __init__(self, inner: Any, probe: ActorProbe):
        self._inner = inner
        self._probe = probe

    def append(self, *args: Any, **kwargs: Any) -> Any:
        # Inlined (no call into the probe): this runs once per environment step.
        probe = self._probe
        start = probe._monotonic()
        probe._call = ("append", start)
        try:
            result = self._inner.append(*args, **kwargs)
        except BaseException as e:
            probe._failed("append", start, e)
            raise
        end = probe._monotonic()
        probe._call = None
        stats = probe._stats
        calls, errors, total, _ = stats["append"]
        stats["append"] = (calls + 1, errors, total + (end - start), end)
        probe._episode += 1
        return result

    def append_sequence(self, *args: Any, **kwargs: Any) -> Any:
        result = self._probe._run("append", self._inner.append_sequence, args, kwargs)
        self._probe._episode += 1
        return result

    def create_item(self, *args: Any, **kwargs: Any) -> Any:
        result = self._probe._run("create_item", self._inner.create_item, args, kwargs)
        self._probe._pending += 1
        return result

    def flush(self, *args: Any, **kwargs: Any) -> Any:
        result = self._probe._run("flush", self._inner.flush, args, kwargs)
        # TrajectoryWriter.flush(block_until_num_items=k) returns once at most k
        # items are unconfirmed; reverb.Writer.flush() takes no argument (k = 0).
        keep = args[0] if args else kwargs.get("block_until_num_items", 0)
        self._probe._pending = min(self._probe._pending, max(0, int(keep)))
        return result

    def end_episode(self, *args: Any, **kwargs: Any) -> Any:
        result = self._probe._run("end_episode", self._inner.end_episode, args, kwargs)
        self._probe._pending = 0  # end_episode flushes every pending item first
        self._probe._episode = 0  # ... and drops the episode's history, its chunks' refs
        return result

    def close(self, *args: Any, **kwargs: Any) -> Any:
        result = self._probe._run("close", self._inner.close, args, kwargs)
        self._probe._episode = 0
        return result

    def __enter__(self) -> _ProbedWriter:
        self._inner.__enter__()
        return self

    def __exit__(self, *exc: Any) -> Any:
        # Both writers flush on a clean exit (reverb.Writer closes too): time it as one.
        result = self._probe._run("flush", self._inner.__exit__, exc, {})
        if exc[0] is None:
            self._probe._pending = 0
        return result

    def __getattr__(self, name: str) -> Any:
        if name == "_inner":  # not set yet (copy, unpickling): no endless recursion
            raise AttributeError(name)
        return getattr(self._inner, name)  # history, episode_steps, configure, ...

    def __repr__(self) -> str:
        return f"ProbedWriter({self._inner!r})"


class _Waiting:
    """`with probe.waiting("learner"):` marks time the actor spends outside Reverb."""

    __slots__ = ("_probe", "_on", "_outer")

    def __init__(self, probe: ActorProbe, on: str):
        self._probe = probe
        self._on = on
        self._outer: tuple[str, float] | None = None

    def __enter__(self) -> None:
        probe = self._probe
        self._outer = probe._waiting
        probe._waiting = (self._on, probe._monotonic())

    def __exit__(self, *exc: Any) -> None:
        probe = self._probe
        current = probe._waiting
        if self._outer is None and current is not None:
            # Only the outermost wait adds to the total: nested waits overlap it.
            count, total = probe._wait_totals
            probe._wait_totals = (count + 1, total + (probe._monotonic() - current[1]))
        probe._waiting = self._outer


class ActorProbe(Served):
    """Counts an actor's steps and writer calls and the time it waits; serves them as JSON.

    One probe per actor: its state is written without locks by the thread that
    drives the actor (each update is one assignment, atomic under the GIL, as in
    TrainerProbe), so two threads sharing one probe could lose counts.
    """

    def __init__(
        self,
        table: str | None = None,
        name: str = "actor",
        listen: str = "127.0.0.1:0",
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        max_policy_lag: int | None = None,
        max_items_ahead: int | None = None,
    ):
        if max_policy_lag is not None and (not isinstance(max_policy_lag, int)
                                           or max_policy_lag < 1):
            raise ValueError(f"max_policy_lag ({max_policy_lag!r}) must be an int >= 1")
        if max_items_ahead is not None and (not isinstance(max_items_ahead, int)
                                            or max_items_ahead < 0):
            raise ValueError(f"max_items_ahead ({max_items_ahead!r}) must be an int >= 0")
        if max_policy_lag is not None and max_items_ahead is not None:
            raise ValueError("declare one bound: max_policy_lag or max_items_ahead")
        if table is not None and (not isinstance(table, str) or not table):
            raise ValueError(f"table ({table!r}) must be a non-empty string or None")
        if not isinstance(name, str) or not name:
            raise ValueError(f"name ({name!r}) must be a non-empty string")
        self._http = ProbeServer(listen, self.snapshot, self.stacks)
        self._clock = clock
        self._monotonic = monotonic
        # The policy-lag bound makes an asynchronous job's prediction possible on the first
        # poll, before any wait is seen. It counts inserts: the fewest items the actor
        # inserts after it sees the learner step and before it waits on it again (an n-step
        # adder inserts nothing on an episode's first n - 1 steps, so a bound of L steps is
        # L - (n - 1) inserts). `max_items_ahead` is the other pacing: the actor waits while
        # the items inserted past min_size exceed N + the samples the learner consumed / spi.
        self._static = {Doc.ROLE: str(Role.ACTOR), Doc.PID: os.getpid(), Doc.NAME: name,
                        Doc.TABLE: table, Actor.MAX_POLICY_LAG: max_policy_lag,
                        Actor.MAX_ITEMS_AHEAD: max_items_ahead}
        self._started = monotonic()
        self._steps: tuple[int, float | None] = (0, None)  # (steps, last step at)
        self._call: tuple[str, float] | None = None  # (writer call, entered at)
        # call -> (calls returned or raised, of which raised, seconds inside, last ended at)
        self._stats: dict[str, tuple[int, int, float, float | None]] = {
            c: (0, 0, 0.0, None) for c in WRITER_CALLS}
        # Items created since the last flush that returned with nothing left
        # unconfirmed (or end_episode). Reverb confirms items asynchronously and
        # does not expose the count, so this is an upper bound: some may already
        # be in the table. It is exact for what matters here: a flush that
        # returns proves them written, one that hangs holds at most this many.
        self._pending = 0
        self._last_error: tuple[str, str, str, float] | None = None
        self._waiting: tuple[str, float] | None = None  # (on what, since)
        self._wait_totals: tuple[int, float] = (0, 0.0)  # (completed waits, seconds)
        self._writers = 0
        # Writer calls since the last end_episode, and the largest keep-alive the writers were
        # made with: a TrajectoryWriter keeps the chunks of its newest `num_keep_alive_refs`
        # steps alive in the server (reverb.Writer: `max_sequence_length`), so an episode
        # that never ends under a large keep-alive grows the server with its table full.
        self._episode = 0
        self._keep_alive: int | None = None
        self._sections = Sections(monotonic)

    # -- the actor's side ---------------------------------------------------
    def section(self, name: str, timeout_s: float | None = None) -> Any:
        """`with probe.section("evaluate"):` a part of the actor's loop that makes no progress
        on purpose: its stall waits for `timeout_s` or the learned length (sections.py)."""
        return self._sections.section(name, timeout_s)

    def wrap_writer(self, writer: Any) -> Any:
        """Returns a proxy of a reverb.TrajectoryWriter or reverb.Writer whose calls are counted."""
        if isinstance(writer, _ProbedWriter) and writer._probe is self:
            return writer
        for method in ("append", "create_item", "flush"):
            if not callable(getattr(writer, method, None)):
                raise ValueError(f"{type(writer).__name__} has no {method}(): not a Reverb writer")
        self._writers += 1
        return _ProbedWriter(writer, self)

    def wrap_client(self, client: Any) -> Any:
        """Returns a proxy of a reverb.Client whose writers come wrapped.

        For code that makes its own writers from a client, such as Acme's
        adders (`builder.make_adder(probe.wrap_client(replay_client), ...)`).
        """
        if wrapped_by(client, self):
            return client
        return ProbedClient(client, self, self.wrap_writer, on_keep_alive=self._kept_alive)

    def _kept_alive(self, refs: int) -> None:
        self._keep_alive = refs if self._keep_alive is None else max(self._keep_alive, refs)

    def waiting(self, on: str) -> _Waiting:
        """Context manager: the actor waits on `on` (e.g. "learner"), outside Reverb."""
        if not isinstance(on, str) or not on:
            raise ValueError(f"waiting on ({on!r}) must be a non-empty string, e.g. 'learner'")
        return _Waiting(self, on)

    def step(self) -> None:
        """Heartbeat for one environment step."""
        self._steps = (self._steps[0] + 1, self._monotonic())

    def _run(self, name: str, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        start = self._monotonic()
        self._call = (name, start)
        try:
            result = fn(*args, **kwargs)
        except BaseException as e:
            self._failed(name, start, e)
            raise
        end = self._monotonic()
        self._call = None
        calls, errors, total, _ = self._stats[name]
        self._stats[name] = (calls + 1, errors, total + (end - start), end)
        return result

    def _failed(self, name: str, start: float, error: BaseException) -> None:
        end = self._monotonic()
        self._call = None
        calls, errors, total, _ = self._stats[name]
        self._stats[name] = (calls + 1, errors + 1, total + (end - start), end)
        self._last_error = (name, type(error).__name__, str(error)[:_MAX_ERROR_CHARS], end)

    # -- what it serves -----------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """The `GET /probe` document (role "actor"). Times in wall-clock seconds.

        steps_total, last_step_at, seconds_since_last_step: the `step()` heartbeat.
        in_call (append/create_item/flush/end_episode/close or null), in_call_since,
        blocked_for_s: the writer call the actor is inside now, and for how long.
        items_created_total, appends_total, pending_items (an upper bound, see
        __init__), calls[call] = {count, errors, seconds_total, last_at}, last_error.
        waiting, waiting_on, waiting_since, waiting_for_s, waits_total,
        waiting_seconds_total: `waiting(on)` blocks, current and past. max_policy_lag: the bound
        declared at construction (null: none declared).
        episode_appends: append calls since the last end_episode (or close); keep_alive_refs:
        the largest num_keep_alive_refs (max_sequence_length) of the writers made through
        `wrap_client` (null: not seen).
        section, sections: the section it is inside now and each one's past (`section()`).
        """
        # Read each field once: the actor's thread may replace it meanwhile.
        wall, now = self._clocks()
        steps, last_step = self._steps
        call, waiting, error = self._call, self._waiting, self._last_error
        stats = dict(self._stats)
        waits, waited = self._wait_totals

        def at(t: float | None) -> float | None:
            return None if t is None else wall - (now - t)

        blocked_for = 0.0 if call is None else max(0.0, now - call[1])
        waiting_for = 0.0 if waiting is None else max(0.0, now - waiting[1])
        calls = {
            c: {CallKeys.COUNT: n, CallKeys.ERRORS: e, CallKeys.LAST_AT: at(last),
                CallKeys.SECONDS_TOTAL: t + (blocked_for if call and call[0] == c else 0.0)}
            for c, (n, e, t, last) in stats.items()
        }
        doc = dict(self._static)
        doc.update({
            Actor.STEPS_TOTAL: steps,
            Actor.LAST_STEP_AT: at(last_step),
            Actor.SECONDS_SINCE_LAST_STEP: (None if last_step is None
                                            else max(0.0, now - last_step)),
            Actor.IN_CALL: None if call is None else call[0],
            Actor.IN_CALL_SINCE: None if call is None else at(call[1]),
            Actor.BLOCKED_FOR_S: blocked_for,
            Actor.ITEMS_CREATED_TOTAL: stats["create_item"][0] - stats["create_item"][1],
            Actor.APPENDS_TOTAL: stats["append"][0] - stats["append"][1],
            Actor.PENDING_ITEMS: self._pending,
            Actor.EPISODE_APPENDS: self._episode,
            Actor.KEEP_ALIVE_REFS: self._keep_alive,
            Actor.CALLS: calls,
            Actor.LAST_ERROR: None if error is None else {
                ErrorKeys.CALL: error[0], ErrorKeys.TYPE: error[1], ErrorKeys.MESSAGE: error[2],
                ErrorKeys.AT: at(error[3])},
            Actor.WAITING: waiting is not None,
            Actor.WAITING_ON: None if waiting is None else waiting[0],
            Actor.WAITING_SINCE: None if waiting is None else at(waiting[1]),
            Actor.WAITING_FOR_S: waiting_for,
            Actor.WAITS_TOTAL: waits,
            Actor.WAITING_SECONDS_TOTAL: waited + waiting_for,
            Actor.WRITERS_WRAPPED: self._writers,
            Doc.STARTED_AT: at(self._started),
            Doc.NOW: wall,
        })
        doc.update(self._sections.doc())
        doc.update(thread_counts())
        return doc

    def _clocks(self) -> tuple[float, float]:
        """(wall, monotonic) read as close together as we can.

        Wall-clock times in the document are monotonic times shifted by
        `wall - monotonic`. A GIL switch between the two reads (5 ms by default)
        would shift every time by that much, so take the tightest of three pairs.
        """
        best: tuple[float, float, float] | None = None
        for _ in range(3):
            before = self._monotonic()
            wall = self._clock()
            after = self._monotonic()
            if best is None or after - before < best[0]:
                best = (after - before, wall, after)
        assert best is not None
        return best[1], best[2]
