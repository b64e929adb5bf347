"""The poller: the only writer. Each cycle polls every source concurrently,
records the outcomes into the history, asks the diagnoser (the findings keeper)
for this cycle's findings and publishes one immutable picture.

Every source is polled on its own worker thread with its own deadline, so a
dead or frozen target costs at most its timeout on that thread and never delays
the others. A source whose previous poll is still running is skipped for this
cycle and counted as late rather than stacking up threads.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from replaywatch.diagnosis.figures import TableFigures
from replaywatch.history import History
from replaywatch.model import Finding, PollOutcome, SourceKind
from replaywatch.shards import ShardCounts
from replaywatch.sources import Source
from replaywatch.state import Published, SourceStatus, StateStore

log = logging.getLogger("replaywatch.poller")
# Polls wait on sockets; what they compute (decoding the answers) holds the GIL. With 544
# sources (32 servers, 512 probes) 32 threads polled every cycle in 371 ms at 0.39 of a core
# and /metrics answered in 43 ms p99; 64 or 128 threads took 402 ms, 0.42 of a core and 62 to
# 72 ms p99 (bench/fleet.py): more runnable threads, longer GIL queues. 16 threads brought
# /metrics to 37 ms p99 (42 with a server stopped) but the cycles to 528 ms p50 (774 with the
# server stopped, 4 of 60 late). A poll that hangs holds its thread to its deadline, so up to
# about 30 hung targets at once leave the others on time.
POLL_THREADS_MAX = 32
# A poll that took this share of its deadline ran into it: the source is not waited on next.
SLOW_SHARE = 0.9
# The publishes (the diagnosis and its renders) a cycle's wait leaves time for: the longest
# of the last PUBLISH_KEPT. The wait never shrinks below MIN_WAIT_SHARE of the deadline.
PUBLISH_KEPT = 10
MIN_WAIT_SHARE = 0.5


@dataclasses.dataclass(frozen=True)
class CycleFindings:
    """What the diagnoser hands the poller for one cycle's picture."""

    findings: tuple[Finding, ...] = ()
    insufficient: tuple[str, ...] = ()
    incident_ids: dict[str, int] = dataclasses.field(default_factory=dict)
    incident_log_error: str | None = None
    incident_log_dropped: int = 0
    bundles_written: int = 0
    bundle_failures: int = 0
    # "target: rule: error" for each rule that raised this cycle (its finding was skipped)
    rule_errors: tuple[str, ...] = ()
    # (target, table) -> its figures, made by the pure diagnosis (diagnosis/figures.py)
    figures: dict[tuple[str, str], TableFigures] = dataclasses.field(default_factory=dict)


class Diagnoser(Protocol):
    """Turns the history into this cycle's findings (replaywatch.findings.FindingsKeeper)."""

    def diagnose_cycle(
        self, history: History, sources: dict[str, SourceStatus], now: float
    ) -> CycleFindings: ...


@dataclasses.dataclass(frozen=True)
class SourceBinding:
    source: Source
    target: str  # the Reverb target a probe belongs to; a target's own name
    labels: tuple[tuple[str, str], ...] = ()  # from a targets file


def targets_of(bindings: Sequence[SourceBinding]) -> dict[str, list[str]]:
    """Each Reverb target and the probe URLs that belong to it; each Ray target (no probes)."""
    out: dict[str, list[str]] = {b.source.name: [] for b in bindings
                                 if b.source.kind in (SourceKind.REVERB, SourceKind.RAY)}
    for b in bindings:
        if b.source.kind == SourceKind.PROBE and b.target in out:
            out[b.target].append(b.source.name)
    return out


def _next_status(prev: SourceStatus | None, binding: SourceBinding, out: PollOutcome
                 ) -> SourceStatus:
    failures = 0 if out.ok else (prev.consecutive_failures if prev else 0) + 1
    return SourceStatus(
        name=binding.source.name,
        kind=binding.source.kind,
        target=binding.target,
        up=out.ok,
        last_poll_at=out.started_at,
        last_ok_at=out.started_at if out.ok else (prev.last_ok_at if prev else None),
        last_error=out.error,
        last_duration_s=out.duration_s,
        consecutive_failures=failures,
        polls_total=(prev.polls_total if prev else 0) + 1,
        failures_total=(prev.failures_total if prev else 0) + (0 if out.ok else 1),
        late_polls_total=prev.late_polls_total if prev else 0,
        labels=binding.labels,
    )


def _phase_words(phases: dict[str, float]) -> str:
    return ", ".join(f"{k} {1000 * v:.0f} ms" for k, v in phases.items())


@dataclasses.dataclass
class _Polled:
    """One cycle's polls, between the wait and the recording."""

    t0: float
    phases: dict[str, float]
    bindings: list[SourceBinding]  # as this cycle polled them
    started: list[tuple[SourceBinding, concurrent.futures.Future[PollOutcome]]] = \
        dataclasses.field(default_factory=list)
    answered: list[tuple[SourceBinding, concurrent.futures.Future[PollOutcome]]] = \
        dataclasses.field(default_factory=list)
    skipped: list[SourceBinding] = dataclasses.field(default_factory=list)
    outran: list[str] = dataclasses.field(default_factory=list)  # waited on, not done in time


def _outran_words(names: Sequence[str]) -> str:
    """The polls a late cycle's wait ended on, for its log line."""
    if not names:
        return ""
    shown = ", ".join(names[:5])
    return f"; the wait ended on {shown}" + (f" and {len(names) - 5} more" if len(names) > 5
                                              else "")


class Poller:
    """Ticks every `interval_s`; `tick()` is one cycle, `run()` the loop."""

    def __init__(
        self,
        bindings: Sequence[SourceBinding],
        history: History,
        store: StateStore,
        diagnoser: Diagnoser,
        interval_s: float,
        timeout_s: float,
        clock: Callable[[], float] = time.time,
        perf: Callable[[], float] = time.perf_counter,
        reload: Callable[[], Sequence[SourceBinding] | None] | None = None,
        config_errors: Callable[[], tuple[str, ...]] = tuple,
        before_publish: Callable[[Published], None] = lambda _: None,
        after_publish: Callable[[Published], None] = lambda _: None,
        shard: Callable[[], ShardCounts] | None = None,
    ):
        self._bindings = list(bindings)
        self._shard = shard
        self._reload = reload
        self._config_errors = config_errors
        self._before_publish = before_publish
        self._after_publish = after_publish
        self._history = history
        self._store = store
        self._diagnoser = diagnoser
        self._interval_s = interval_s
        self._timeout_s = timeout_s
        self._clock = clock
        self._perf = perf
        self._statuses: dict[str, SourceStatus] = {}
        self._in_flight: dict[str, concurrent.futures.Future[PollOutcome]] = {}
        self._slow: set[str] = set()  # sources whose last poll ran into its deadline
        self._publishes: collections.deque[float] = collections.deque(maxlen=PUBLISH_KEPT)
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._cycle = 0
        self._lock = threading.Lock()  # guards _bindings against set_bindings()
        self.late_cycles = 0  # cycles that overran the interval; published with each picture
        # Where the last cycle's time went, said with a late cycle: a cycle is late by its
        # wait, its diagnosis or its renders, and each has another remedy.
        self._phases: dict[str, float] = {}
        self._outran: list[str] = []  # the sources the last cycle's wait ended on

    def set_bindings(self, bindings: Sequence[SourceBinding]) -> None:
        """Replaces the watched sources (a reloaded targets file) between cycles."""
        with self._lock:
            keep = {b.source.name for b in bindings}
            for old in self._bindings:
                if old.source.name not in keep:
                    old.source.close()
                    self._statuses.pop(old.source.name, None)
            self._bindings = list(bindings)

    def _apply_reload(self, fresh: Sequence[SourceBinding]) -> None:
        """Keeps the source objects (and their channels) of targets that stay."""
        current = {b.source.name: b for b in self.bindings}
        merged = []
        for b in fresh:
            old = current.get(b.source.name)
            if old is not None and old.target == b.target:
                b = dataclasses.replace(b, source=old.source)  # keep its live channel
            merged.append(b)
        added = {b.source.name for b in merged} - set(current)
        removed = set(current) - {b.source.name for b in merged}
        if added or removed:
            log.info("targets reloaded: +%s -%s", sorted(added), sorted(removed))
        self.set_bindings(merged)

    @property
    def bindings(self) -> list[SourceBinding]:
        with self._lock:
            return list(self._bindings)

    def _pool(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                # Threads start only as polls need them; where targets come and go (a file,
                # discovery) the first cycle's count says nothing of later ones.
                max_workers=POLL_THREADS_MAX if self._reload is not None else max(
                    4, min(POLL_THREADS_MAX, 2 * len(self._bindings) + 2)),
                thread_name_prefix="replaywatch-poll",
            )
        return self._executor

    def tick(self) -> Published:
        """Polls all sources once (concurrently), diagnoses and publishes."""
        polled = self._poll()
        began = self._perf()
        self._settle(polled)
        phases = polled.phases
        phases["recorded polls"] = self._perf() - began
        published = self._publish(polled.t0, phases)
        self._publishes.append(self._perf() - began)
        self._phases, self._outran = phases, polled.outran
        return published

    def _poll(self) -> _Polled:
        """Reloads the targets, starts this cycle's polls and waits for them, recording
        nothing: the history is written in `_settle`, never while a diagnosis reads it."""
        t0 = self._perf()
        phases: dict[str, float] = {}
        if self._reload is not None:
            fresh = self._reload()
            if fresh is not None:
                self._apply_reload(fresh)
            phases["reload"] = self._perf() - t0
        bindings = self.bindings
        pool = self._pool()
        polled = _Polled(t0, phases, bindings)
        for binding in bindings:
            name = binding.source.name
            pending = self._in_flight.pop(name, None)
            if pending is not None:
                if not pending.done():
                    self._in_flight[name] = pending
                    polled.skipped.append(binding)
                    continue
                # It outran its cycle's wait (counted late then) and has finished since: its
                # answer is recorded this cycle, never dropped for the new poll's.
                polled.answered.append((binding, pending))
            future = pool.submit(binding.source.poll)
            self._in_flight[name] = future
            polled.started.append((binding, future))
        # Each source enforces its own deadline; the margin covers thread start-up, and no
        # more than the interval leaves after the deadline and 0.1 s for the diagnosis: with
        # 0.5 s at 1 Hz, a server that stopped answering made the cycle it stopped in late
        # (1.26 s, bench-fleet). A poll that finishes past the wait is recorded next cycle.
        # A source whose last poll ran into its deadline (or past the wait) is polled but not
        # waited on: a server held by a checkpoint would otherwise hold every cycle its
        # deadline long. Its answer, when it comes, is recorded at the next cycle.
        # The wait also leaves what follows it the time that has lately taken: in `tick` the
        # diagnosis and its renders (a fleet's takes a third of a second and more), in `run`
        # the recording and the hand-off to the diagnosis thread.
        wait_s = self._timeout_s + min(0.5, max(0.05, self._interval_s - self._timeout_s - 0.1))
        if self._publishes:
            room = t0 + self._interval_s - max(self._publishes) - 0.05 - self._perf()
            wait_s = min(wait_s, max(MIN_WAIT_SHARE * self._timeout_s, room))
        waited = self._perf()
        phases["started polls"] = waited - t0 - phases.get("reload", 0.0)
        concurrent.futures.wait([f for b, f in polled.started
                                 if b.source.name not in self._slow], timeout=wait_s)
        phases["waited on polls"] = self._perf() - waited
        for binding, future in polled.started:
            if not future.done():
                polled.skipped.append(binding)
                if binding.source.name not in self._slow:
                    polled.outran.append(binding.source.name)
                self._slow.add(binding.source.name)
            else:
                self._in_flight.pop(binding.source.name, None)
                polled.answered.append((binding, future))
        return polled

    def _settle(self, polled: _Polled) -> None:
        """Records the polls that answered, and counts the ones that did not as late."""
        for binding, future in polled.answered:
            self._record(binding, self._outcome(binding, future))
        for binding in polled.skipped:
            prev = self._statuses.get(binding.source.name)
            if prev is not None:
                self._statuses[binding.source.name] = dataclasses.replace(
                    prev, late_polls_total=prev.late_polls_total + 1
                )

    def _outcome(self, binding: SourceBinding,
                 future: concurrent.futures.Future[PollOutcome]) -> PollOutcome:
        try:
            return future.result()
        except Exception as e:  # a source bug fails that source, not the cycle
            log.exception("polling %s raised", binding.source.name)
            return PollOutcome(binding.source.name, binding.source.kind, self._clock(), 0.0,
                               error=f"internal error: {type(e).__name__}: {e}")

    def _record(self, binding: SourceBinding, outcome: PollOutcome) -> None:
        if outcome.duration_s >= SLOW_SHARE * self._timeout_s:
            self._slow.add(outcome.source)
        else:
            self._slow.discard(outcome.source)
        self._history.record(outcome)
        prev = self._statuses.get(binding.source.name)
        status = _next_status(prev, binding, outcome)
        if prev is None or prev.up != status.up:
            if status.up:
                log.info("%s %s is up", status.kind, status.name)
            else:
                log.warning("%s %s is down: %s", status.kind, status.name, status.last_error)
        self._statuses[binding.source.name] = status

    def _publish(self, t0: float, phases: dict[str, float],
                 statuses: dict[str, SourceStatus] | None = None,
                 bindings: Sequence[SourceBinding] | None = None) -> Published:
        """Diagnoses and publishes one picture. `statuses`, `bindings`: the cycle's, when this
        runs on the diagnosis thread while the poller goes on (`run`) and may reload."""
        now = self._clock()
        began = self._perf()
        statuses = dict(self._statuses) if statuses is None else statuses
        bindings = self.bindings if bindings is None else bindings
        # Only what is watched now: a target a targets file or discovery dropped keeps its
        # history until it ages out, but /metrics and the page must not go on showing its
        # last values as if it were alive.
        watched = {b.target for b in bindings} | {b.source.name for b in bindings}
        tables = {k: s for k, s in self._history.latest_tables().items() if k[0] in watched}
        probes = self._history.latest_probes(
            [b.source.name for b in bindings if b.source.kind == SourceKind.PROBE])
        found = self._diagnoser.diagnose_cycle(self._history, statuses, now)
        diagnosed = self._perf()
        phases["diagnosis"] = diagnosed - began
        self._cycle += 1
        published = Published(
            at=now,
            cycle=self._cycle,
            sources=statuses,
            tables=tables,
            probes=probes,
            actors=self._history.latest_actors([b.source.name for b in bindings]),
            memory={t: m for t, m in self._history.latest_memory().items() if t in watched},
            ray={t: r for t, r in self._history.latest_ray().items() if t in watched},
            findings=found.findings,
            insufficient=found.insufficient,
            incident_ids=found.incident_ids,
            incident_log_error=found.incident_log_error,
            incident_log_dropped=found.incident_log_dropped,
            bundles_written=found.bundles_written,
            bundle_failures=found.bundle_failures,
            rule_errors=found.rule_errors,
            figures=found.figures,
            late_cycles=self.late_cycles,
            config_errors=self._config_errors(),
            shard=self._shard() if self._shard is not None else None,
            cycle_duration_s=self._perf() - t0,
        )
        try:
            # Before the swap, so that readers never see a picture whose derived
            # renders (the /metrics body) are still being made.
            self._before_publish(published)
        except Exception:  # a warm-up hook must never cost a cycle
            log.exception("before_publish hook failed")
        self._store.publish(published)
        handed = self._perf()
        phases["picture and renders"] = handed - diagnosed
        try:
            self._after_publish(published)
        except Exception:
            log.exception("after_publish hook failed")
        phases["after publish"] = self._perf() - handed
        return published

    def run(self, stop: threading.Event, sleep: Callable[[float], bool] | None = None) -> None:
        """Ticks on a fixed cadence until `stop` is set; overruns are counted.

        A cycle's diagnosis runs on a thread of its own while the next cycle's polls start
        on time: a fleet's diagnosis took 0.33 to 0.57 s on this 2-core machine, and after a
        wait for a server that had stopped answering it made 1 or 2 cycles in 60 late
        (bench-fleet), each delaying every target's next poll. The poller waits for the last
        diagnosis only before it records the next polls, so a diagnosis never reads a
        history that changes under it; only a diagnosis longer than about an interval makes
        a cycle late, and it is said so.
        """
        wait = sleep or stop.wait
        diagnosis = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="replaywatch-diagnosis")
        # The diagnosis handed to its thread, and the phases it fills in as it goes
        pending: tuple[concurrent.futures.Future[Published], dict[str, float]] | None = None
        last: dict[str, float] = {}  # the phases of the last diagnosis that ended
        next_at = self._perf()
        begun = 0  # cycles this loop polled (the published count lags by the diagnosis)
        try:
            while not stop.is_set():
                try:
                    polled = self._poll()
                    begun += 1
                    joined = self._perf()
                    if pending is not None:
                        last = self._finish(*pending)
                        pending = None
                    settled = self._perf()
                    polled.phases["waited on the last diagnosis"] = settled - joined
                    self._settle(polled)
                    polled.phases["recorded polls"] = self._perf() - settled
                    phases: dict[str, float] = {}
                    pending = (diagnosis.submit(self._publish, polled.t0, phases,
                                                dict(self._statuses), polled.bindings), phases)
                    self._publishes.append(self._perf() - joined)
                    self._phases, self._outran = polled.phases, polled.outran
                except Exception:  # the watcher must outlive any one bad cycle
                    log.exception("poll cycle failed; continuing")
                next_at += self._interval_s
                delay = next_at - self._perf()
                if delay < 0:
                    self.late_cycles += 1
                    log.warning("poll cycle %d ran late, %.0f ms past its %g s interval: "
                                "%s%s; the last diagnosis took %s", begun,
                                -1000 * delay, self._interval_s, _phase_words(self._phases),
                                _outran_words(self._outran), _phase_words(last) or "none")
                    next_at = self._perf()  # realign instead of bursting to catch up
                    delay = 0.0
                if wait(delay):
                    break
        finally:
            if pending is not None:
                self._finish(*pending)
            diagnosis.shutdown(wait=True)

    @staticmethod
    def _finish(pending: concurrent.futures.Future[Published], phases: dict[str, float]
                ) -> dict[str, float]:
        """Waits for a diagnosis handed to its thread; where its time went."""
        try:
            pending.result()
        except Exception:  # the watcher must outlive any one bad cycle
            log.exception("poll cycle's diagnosis failed; continuing")
        return dict(phases)

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
        for binding in self.bindings:
            binding.source.close()
