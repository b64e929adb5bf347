"""TrainerProbe: what only the trainer process knows.

Reverb can tell how many samples left the table, but not whether the learner
got them: the seed incident (12 tf.data workers each batching on their own)
shows a table that "can sample" while `next()` blocks forever. The probe wraps
the learner's iterator and counts batches and the time spent blocked in
`next()`; `serving.ProbeServer` answers from a daemon thread while the
trainer's own thread is stuck.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from replaywatch.probe.batch_stats import BatchStats
from replaywatch.probe.clients import ProbedClient, wrapped_by
from replaywatch.probe.learner import wrap_builder as _wrap_builder
from replaywatch.probe.learner import wrap_learner as _wrap_learner
from replaywatch.probe.pipeline import read as read_pipeline
from replaywatch.probe.pipeline import shape as pipeline_shape
from replaywatch.probe.protocol import Doc, Gate, Layout, Priorities, Role, Shape, Strides, Trainer
from replaywatch.probe.sections import Sections
from replaywatch.probe.serving import ProbeServer, Served, thread_counts


class _ProbedIterator:
    """Passes items through and tells the probe when `next()` starts and ends."""

    def __init__(self, inner: Any, probe: TrainerProbe):
        self._inner = inner
        self._probe = probe

    def __iter__(self) -> _ProbedIterator:
        return self

    def __next__(self) -> Any:
        # Inlined rather than calling probe methods: this runs once per batch on
        # the learner's thread, and each Python call costs ~0.3 us here.
        probe = self._probe
        probe._next_thread = threading.get_ident()
        # The loop's inserts between next() calls tell its gate (TrainerProbe.snapshot).
        inserts, strides = probe._inserts[0], probe._strides
        if strides is None:
            probe._strides = (inserts, inserts, 0, 0, 0)
        else:
            first, last, n, lo, hi = strides
            d = inserts - last
            probe._strides = (first, inserts, n + 1, d if n == 0 or d < lo else lo,
                              d if n == 0 or d > hi else hi)
        since = probe._blocked_since = probe._clock()
        try:
            item = next(self._inner)
        except BaseException:
            probe._leave_next(got_batch=False)
            raise
        now = probe._clock()
        probe._blocked_since = None
        batches, total, _ = probe._batch_state
        probe._batch_state = (batches + 1, total + (now - since), now)
        if probe._batch_stats is not None:
            probe._batch_stats.offer(item)
        return item

    def ready(self) -> bool:
        """Acme's prefetching iterators answer whether `next()` would not block."""
        return bool(self._inner.ready())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _LoopWriter:
    """A Reverb writer proxy for a loop that inserts itself: counts its items and remembers
    the thread that inserts, so the probe can say whether it is the thread in next()."""

    def __init__(self, inner: Any, probe: TrainerProbe):
        self._inner = inner
        self._probe = probe

    def create_item(self, *args: Any, **kwargs: Any) -> Any:
        result = self._inner.create_item(*args, **kwargs)
        self._probe._inserted()
        return result

    def __enter__(self) -> _LoopWriter:
        self._inner.__enter__()
        return self

    def __exit__(self, *exc: Any) -> Any:
        return self._inner.__exit__(*exc)

    def __getattr__(self, name: str) -> Any:
        if name == "_inner":
            raise AttributeError(name)
        return getattr(self._inner, name)


class TrainerProbe(Served):
    """Counts the learner's batches and blocked time; serves them as JSON."""

    def __init__(
        self,
        batch_size: int | None = None,
        num_parallel_calls: int | None = None,
        listen: str = "127.0.0.1:0",
        name: str = "learner",
        prefetch_size: int | None = None,
        table: str | None = None,
        clock: Callable[[], float] = time.time,
        max_in_flight: int | None = None,
        iterators_per_worker: int | None = None,
        item_bytes: int | None = None,
        layout: str | None = None,
        gate: str | None = None,
        inserts_per_step: float | None = None,
        first_step_at: int | None = None,
        batch_after_interleave: bool = False,
        cycle_length: int | None = None,
        workers_per_iterator: int | None = None,
        batch_stats: bool = True,
    ):
        for label, value in (
            (Shape.BATCH_SIZE, batch_size),
            (Shape.NUM_PARALLEL_CALLS, num_parallel_calls),
            (Shape.PREFETCH_SIZE, prefetch_size),
            (Shape.MAX_IN_FLIGHT, max_in_flight),
            (Shape.ITERATORS_PER_WORKER, iterators_per_worker),
            (Shape.ITEM_BYTES, item_bytes),
            (Trainer.FIRST_STEP_AT, first_step_at),
            (Shape.CYCLE_LENGTH, cycle_length),
            (Shape.WORKERS_PER_ITERATOR, workers_per_iterator),
        ):
            if value is not None and (not isinstance(value, int) or value < 0):
                raise ValueError(f"{label} ({value!r}) must be a non-negative int")
        if layout is not None and layout not in tuple(Layout):
            raise ValueError(f"layout ({layout!r}) must be one of {', '.join(Layout)}")
        if gate is not None and gate not in tuple(Gate):
            raise ValueError(f"gate ({gate!r}) must be one of {', '.join(Gate)}")
        if inserts_per_step is not None and (isinstance(inserts_per_step, bool) or not isinstance(
                inserts_per_step, (int, float)) or not inserts_per_step > 0):
            raise ValueError(f"inserts_per_step ({inserts_per_step!r}) must be a number > 0")
        self._http = ProbeServer(listen, self.snapshot, self.stacks)
        self._clock = clock
        # The declared pipeline sits at the document's top level under Shape's keys (the
        # sidecar reads it with the one it read from the graph); the layout and gate go out
        # as plain strings, whatever str enum the caller passed.
        self._static = {
            Doc.ROLE: str(Role.TRAINER),
            Doc.PID: os.getpid(),
            Doc.NAME: name,
            Shape.BATCH_SIZE: batch_size,
            Shape.NUM_PARALLEL_CALLS: num_parallel_calls,
            Shape.PREFETCH_SIZE: prefetch_size,
            Doc.TABLE: table,
            # The dataset's shape and the items' size, for the budget model (replaywatch
            # predict takes the same numbers): Acme's default in-flight is 2 x batch_size.
            Shape.MAX_IN_FLIGHT: max_in_flight,
            Shape.ITERATORS_PER_WORKER: iterators_per_worker,
            Shape.ITEM_BYTES: item_bytes,
            Trainer.LAYOUT: None if layout is None else str(layout),
            # The loop's gate and schedule, where the job states them (else learned below),
            # and a TF-Agents-shaped pipeline: one batch after an interleave of
            # `cycle_length` Reverb datasets read by `num_parallel_calls` threads.
            Trainer.GATE: None if gate is None else str(gate),
            Trainer.INSERTS_PER_STEP: inserts_per_step,
            Trainer.FIRST_STEP_AT: first_step_at,
            Shape.BATCH_AFTER_INTERLEAVE: bool(batch_after_interleave),
            Shape.CYCLE_LENGTH: cycle_length,
            Shape.WORKERS_PER_ITERATOR: workers_per_iterator,
        }
        self._started_at = clock()
        self._blocked_since: float | None = None
        # (batches retrieved, seconds blocked in next() so far, last batch at)
        self._batch_state: tuple[int, float, float | None] = (0, 0.0, None)
        # (learner steps, last step at)
        self._steps_state: tuple[int, float | None] = (0, None)
        self._iterator: _ProbedIterator | None = None
        self._wrapped: str | None = None
        self._next_thread: int | None = None  # the thread last seen calling next()
        self._inserts: tuple[int, int | None] = (0, None)  # (items inserted, by which thread)
        # The loop's items inserted at its first and latest next(), the strides counted
        # between, and the least and most items inserted between two next() calls.
        self._strides: tuple[int, int, int, int, int] | None = None
        self._writers = 0
        # By table: (mutate_priorities calls, keys, seconds, calls that raised, keys with a NaN
        # or negative priority, keys at +inf, the last error). Replaced whole, never changed in
        # place: the probe's thread reads it while the learner's writes.
        self._priority_stats: dict[str, tuple[int, int, float, int, int, int, str | None]] = {}
        # Each batch's SampleInfo, read off the learner's thread (batch_stats.py); False: none.
        self._batch_stats = BatchStats() if batch_stats else None
        # (what the tf.data graph says, the model's inputs read from it): None until read
        self._pipeline: tuple[dict[str, Any], dict[str, Any] | None] | None = None
        self._sections = Sections()

    # -- the trainer's side -------------------------------------------------
    def section(self, name: str, timeout_s: float | None = None) -> Any:
        """`with probe.section("evaluate"):` a part of the loop that makes no progress on
        purpose (an evaluation, a checkpoint): the sidecar waits for it (`timeout_s`, else
        its learned length) before it names a stall (replaywatch/probe/sections.py)."""
        return self._sections.section(name, timeout_s)

    def wrap(self, iterator: Iterator[Any]) -> Iterator[Any]:
        """Returns an iterator that yields the same items and is counted."""
        if isinstance(iterator, _ProbedIterator) and iterator._probe is self:
            return iterator  # wrapping twice would count every batch twice
        self._iterator = _ProbedIterator(iterator, self)
        self._wrapped = "iterator"
        # The pipeline's graph is read once, on a thread of its own: the learner's next()
        # never waits on it, and it touches TensorFlow only where the trainer imported it.
        threading.Thread(target=self._read_pipeline, args=(iterator,), daemon=True,
                         name="replaywatch-pipeline").start()
        return self._iterator

    def _read_pipeline(self, iterator: Any) -> None:
        doc = read_pipeline(iterator)
        self._pipeline = (doc, pipeline_shape(doc))

    def wrap_learner(self, learner: Any, iterator_attr: str | None = None) -> Any:
        """Wraps the iterator an Acme-style learner consumes and counts its `step()`s.

        Returns the same learner object, so whatever holds it (the actor's
        variable source, checkpointers) keeps working. See `probe.learner`.
        """
        learner, attr = _wrap_learner(self, learner, iterator_attr)
        self._wrapped = f"learner.{attr}"
        return learner

    def wrap_builder(self, builder: Any) -> Any:
        """Makes an Acme builder's `make_learner` return learners wrapped by this probe."""
        return _wrap_builder(self, builder)

    def wrap_writer(self, writer: Any) -> Any:
        """Returns a proxy of the Reverb writer this trainer's own loop inserts with.

        A loop that inserts and calls next() on the same thread is a synchronous layout,
        whatever the limiter's max_diff: when next() blocks, nothing will insert. The
        probe reports it (`inserts_on_next_thread`), so the sidecar knows the layout.
        """
        if isinstance(writer, _LoopWriter) and writer._probe is self:
            return writer
        if not callable(getattr(writer, "create_item", None)):
            raise ValueError(f"{type(writer).__name__} has no create_item(): not a Reverb writer")
        self._writers += 1
        return _LoopWriter(writer, self)

    def wrap_client(self, client: Any, inserts: bool = True) -> Any:
        """Returns a proxy of a reverb.Client whose writers (and `insert`) are counted as
        this loop's: for Acme's adders (`builder.make_adder(probe.wrap_client(client))`).
        Its `mutate_priorities` calls are counted too (`priority_updates`). A learner whose
        client only samples and updates priorities, the actors inserting elsewhere, passes
        `inserts=False`: wrapping it then says nothing of the layout."""
        if wrapped_by(client, self):
            return client
        if inserts:
            self._writers += 1  # the loop inserts through this client: it declares as much
        return ProbedClient(client, self, self.wrap_writer, self._inserted,
                            on_priorities=self._priorities_sent)

    def _priorities_sent(self, table: str, values: Sequence[Any], seconds: float,
                         error: str | None) -> None:
        """One mutate_priorities call: its keys, and those Reverb refuses (NaN, negative: the
        rest of the request is skipped) or accepts to take over sampling (+inf)."""
        rejected = infinite = 0
        for v in values:
            try:
                f = float(v)
            except (TypeError, ValueError):
                rejected += 1
                continue
            if f != f or f < 0:
                rejected += 1
            elif f == math.inf:
                infinite += 1
        calls, keys, total, errors, bad, inf, last = self._priority_stats.get(
            table, (0, 0, 0.0, 0, 0, 0, None))
        self._priority_stats = {**self._priority_stats, table: (
            calls + 1, keys + len(values), total + seconds, errors + (error is not None),
            bad + rejected, inf + infinite, error[:300] if error else last)}

    def _inserted(self) -> None:
        self._inserts = (self._inserts[0] + 1, threading.get_ident())

    def step(self) -> None:
        """Heartbeat for one learner step (call after each update)."""
        self._steps_state = (self._steps_state[0] + 1, self._clock())

    # The hot path takes no lock: only the trainer's thread writes these fields,
    # and each write is one attribute assignment (atomic under the GIL), so the
    # HTTP thread always reads a consistent tuple. A lock here measured ~0.8 us
    # per acquire on our CI machine, a fifth of the whole per-next() cost.
    def _leave_next(self, got_batch: bool) -> None:
        now = self._clock()
        since, self._blocked_since = self._blocked_since, None
        batches, total, last = self._batch_state
        total += 0.0 if since is None else now - since
        self._batch_state = (batches + 1, total, now) if got_batch else (batches, total, last)

    # -- what it serves -----------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """The `GET /probe` document (role "trainer"). Times in wall-clock seconds.

        batches_retrieved, blocked_in_next, blocked_since, blocked_for_s,
        blocked_seconds_total, last_batch_at: the wrapped iterator's `next()`.
        learner_steps, last_step_at: `step()` or a wrapped learner's steps.
        ready: the wrapped iterator's `ready()` (null without one). wrapped:
        "iterator", "learner.<attr>" or null, i.e. where the probe sits.
        writers_wrapped, items_inserted: the loop's own writers and clients
        (`wrap_writer`, `wrap_client`) and the items created through them;
        inserts_on_next_thread: the thread that inserted last is the one that called
        next() last (null until both happened): a synchronous loop.
        next_strides: {"inserts_at_first", "inserts_at_last", "count", "least", "most"}:
        the loop's items inserted when it first and last entered next(), and between two
        next() calls the fewest and most (null before the first next()). A schedule moves
        in strides of floor(K) and ceil(K); a loop that waits on can_sample takes a burst
        with no insert between and later strides far apart.
        pipeline: the wrapped iterator's tf.data graph as read (probe.pipeline), null until
        read; pipeline_shape: the budget model's inputs from it (null where not read), used
        by the sidecar over the declared ones.
        section, sections: the section the loop is inside now ({"name", "for_s",
        "timeout_s"} or null) and each section's past ({name: {"count", "longest_s",
        "last_s"}}): `section()`.
        batch_stats: what the batches' SampleInfo says (probe/batch_stats.py): {"batches",
        "keys", "keys_repeated_in_batch", "batches_repeated", "infinite_priorities",
        "effective_sample_size", "table_size", "max_importance_weight", "times_sampled_mean",
        "times_sampled_max", "dropped"}; null with `batch_stats=False`.
        priority_updates: by table, the wrapped client's `mutate_priorities` calls: {"calls",
        "keys", "seconds_total", "errors", "rejected_keys" (NaN or negative: Reverb refuses
        them and skips the rest of the request), "infinite_keys" (+inf: accepted, and takes
        over sampling), "last_error"}.
        """
        now = self._clock()
        blocked_since = self._blocked_since
        batches, total, last_batch_at = self._batch_state
        steps, last_step_at = self._steps_state
        (inserted, inserter), next_thread = self._inserts, self._next_thread
        blocked_for = 0.0 if blocked_since is None else max(0.0, now - blocked_since)
        doc = dict(self._static)
        doc.update({
            Trainer.BATCHES_RETRIEVED: batches,
            Trainer.BLOCKED_IN_NEXT: blocked_since is not None,
            Trainer.BLOCKED_SINCE: blocked_since,
            Trainer.BLOCKED_FOR_S: blocked_for,
            Trainer.BLOCKED_SECONDS_TOTAL: total + blocked_for,
            Trainer.LAST_BATCH_AT: last_batch_at,
            Trainer.LEARNER_STEPS: steps,
            Trainer.LAST_STEP_AT: last_step_at,
            Trainer.READY: self._ready(),
            Trainer.WRAPPED: self._wrapped,
            Trainer.WRITERS_WRAPPED: self._writers,
            Trainer.ITEMS_INSERTED: inserted,
            Trainer.INSERTS_ON_NEXT_THREAD: (None if inserter is None or next_thread is None
                                             else inserter == next_thread),
            Trainer.PIPELINE: None if self._pipeline is None else self._pipeline[0],
            Trainer.PIPELINE_SHAPE: None if self._pipeline is None else self._pipeline[1],
            Trainer.NEXT_STRIDES: None if self._strides is None else dict(zip(
                Strides.ORDER, self._strides, strict=True)),
            Trainer.BATCH_STATS: None if self._batch_stats is None else self._batch_stats.doc(),
            Trainer.PRIORITY_UPDATES: {t: dict(zip(Priorities.ORDER, s, strict=True))
                                       for t, s in self._priority_stats.items()},
            Doc.STARTED_AT: self._started_at,
            Doc.NOW: now,
        })
        doc.update(self._sections.doc())
        doc.update(thread_counts())
        return doc

    def _ready(self) -> bool | None:
        inner = self._iterator._inner if self._iterator is not None else None
        if inner is None or not callable(getattr(inner, "ready", None)):
            return None
        try:
            return bool(inner.ready())
        except Exception:  # a probe must never break on the trainer's iterator
            return None
