"""The poller's tick and loop, with fake sources behind the Source protocol.

No process, no network: sources are ours (tests.fakes-style classes below), the
diagnoser records what it was asked, the clocks are injected.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator

import pytest

from replaywatch.history import History
from replaywatch.model import PollOutcome
from replaywatch.poller import CycleFindings, Poller, SourceBinding, targets_of
from replaywatch.state import Published, SourceStatus, StateStore
from tests.builders import table_snapshot


class FakeClock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


class FakeSource:
    """A source whose answer the test sets: a table, an error, an exception or a hang."""

    def __init__(self, name: str, clock: FakeClock, kind: str = "reverb"):
        self.name, self.kind, self._clock = name, kind, clock
        self.error: str | None = None
        self.raises: Exception | None = None
        self.gate = threading.Event()  # cleared: poll() hangs until set
        self.gate.set()
        self.polls = 0
        self.closed = False

    def poll(self) -> PollOutcome:
        t0 = time.perf_counter()
        self.gate.wait(10)
        self.polls += 1
        if self.raises is not None:
            raise self.raises
        at, took = self._clock(), time.perf_counter() - t0  # as long as it hung
        if self.error is not None:
            return PollOutcome(self.name, self.kind, at, took, error=self.error)
        if self.kind == "probe":
            return PollOutcome(self.name, self.kind, at, took)
        snap = table_snapshot(at, 10 * self.polls, 10 * self.polls, target=self.name)
        return PollOutcome(self.name, self.kind, at, took, tables=(snap,))

    def close(self) -> None:
        self.closed = True


def _polled(source: FakeSource, n: int, timeout_s: float = 5.0) -> None:
    """Waits until `source` has answered `n` polls (a hung one, let go, finishes on its
    thread), or the timeout."""
    deadline = time.monotonic() + timeout_s
    while source.polls < n and time.monotonic() < deadline:
        time.sleep(0.01)


class RecordingDiagnoser:
    def __init__(self) -> None:
        self.calls: list[tuple[dict[str, SourceStatus], float]] = []

    def diagnose_cycle(self, history: History, sources: dict[str, SourceStatus], now: float
                       ) -> CycleFindings:
        self.calls.append((sources, now))
        return CycleFindings(insufficient=(f"cycle {len(self.calls)}",))


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def made() -> Iterator[list[Poller]]:
    pollers: list[Poller] = []
    yield pollers
    for p in pollers:
        p.close()


def poller_of(made: list[Poller], *sources: FakeSource, timeout_s: float = 1.0,
              clock: FakeClock | None = None, diagnoser: object = None,
              interval_s: float = 1.0, **kw: object) -> tuple[Poller, StateStore]:
    store = StateStore()
    bindings = [SourceBinding(s, s.name) for s in sources]
    poller = Poller(bindings, History(), store, diagnoser or RecordingDiagnoser(),  # type: ignore[arg-type]
                    interval_s=interval_s,
                    timeout_s=timeout_s, clock=clock or FakeClock(), **kw)  # type: ignore[arg-type]
    made.append(poller)
    return poller, store


def test_a_tick_publishes_statuses_tables_and_the_diagnosers_answer(
        made: list[Poller], clock: FakeClock) -> None:
    a = FakeSource("a:1", clock)
    poller, store = poller_of(made, a, clock=clock)
    state = poller.tick()
    assert store.current() is state
    assert (state.cycle, state.at) == (1, 1000.0)
    assert state.sources["a:1"].up and state.sources["a:1"].polls_total == 1
    assert state.tables[("a:1", "replay")].rate_limiter.inserts == 10
    assert state.insufficient == ("cycle 1",)  # what the diagnoser answered


def test_a_failing_source_is_data_and_the_others_are_unaffected(
        made: list[Poller], clock: FakeClock) -> None:
    ok, down, broken = FakeSource("ok:1", clock), FakeSource("down:1", clock), \
        FakeSource("broken:1", clock)
    down.error = "down:1: unreachable (connection refused)"
    broken.raises = RuntimeError("boom")
    poller, _ = poller_of(made, ok, down, broken, clock=clock)
    poller.tick()
    clock.now += 1
    state = poller.tick()
    assert state.sources["ok:1"].up and state.sources["ok:1"].polls_total == 2
    assert ("ok:1", "replay") in state.tables
    d = state.sources["down:1"]
    assert (d.up, d.last_error, d.consecutive_failures, d.failures_total, d.last_ok_at) == (
        False, "down:1: unreachable (connection refused)", 2, 2, None)
    b = state.sources["broken:1"]
    assert not b.up and b.last_error == "internal error: RuntimeError: boom"
    # The diagnoser saw all three, down ones included.
    assert set(poller._diagnoser.calls[-1][0]) == {"ok:1", "down:1", "broken:1"}  # type: ignore[attr-defined]
    down.error = None
    clock.now += 1
    back = poller.tick().sources["down:1"]
    assert (back.up, back.consecutive_failures, back.failures_total, back.last_ok_at) == (
        True, 0, 2, clock.now)


def test_a_late_source_is_skipped_and_counted_without_delaying_the_others(
        made: list[Poller], clock: FakeClock) -> None:
    fast, slow = FakeSource("fast:1", clock), FakeSource("slow:1", clock)
    poller, _ = poller_of(made, fast, slow, timeout_s=0.05, clock=clock)
    try:
        poller.tick()
        slow.gate.clear()  # its next poll hangs
        t0 = time.perf_counter()
        clock.now += 1
        state = poller.tick()
        assert time.perf_counter() - t0 < 2.0  # the timeout and its margin, not the hang
        clock.now += 1
        state = poller.tick()  # its poll is still running: not started again
        s = state.sources["slow:1"]
        assert (s.late_polls_total, s.polls_total, s.up) == (2, 1, True)
        assert state.sources["fast:1"].polls_total == 3
        assert slow.polls == 1  # one poll in flight, no pile-up of threads
    finally:
        slow.gate.set()
    _polled(slow, 2)
    clock.now += 1
    state = poller.tick()
    s = state.sources["slow:1"]
    # The poll that hung, finished since, is recorded, then the cycle's own: none dropped.
    assert (s.polls_total, s.late_polls_total) == (3, 2)
    assert len(poller._history.table("slow:1", "replay")) == 3  # type: ignore[attr-defined]


def test_a_source_that_ran_into_its_deadline_is_polled_but_not_waited_on_until_it_answers(
        made: list[Poller], clock: FakeClock) -> None:
    # interval 2 s, deadline 1 s: a cycle waits at most 1 + 0.5 s for its polls. A cycle
    # that waited on the hung source would take that 1.5 s; one that did not, a few ms: the
    # bound between them leaves loaded cores most of a second.
    fast, held = FakeSource("fast:1", clock), FakeSource("held:1", clock)
    poller, _ = poller_of(made, fast, held, timeout_s=1.0, interval_s=2.0, clock=clock)
    try:
        poller.tick()
        held.gate.clear()  # held by a checkpoint: its polls hang
        t0 = time.perf_counter()
        poller.tick()  # it answered last time: waited on, up to the deadline and margin
        waited = time.perf_counter() - t0
        held.gate.set()  # the hung poll finishes; the next one hangs again
        _polled(held, 2)
        held.gate.clear()
        t0 = time.perf_counter()
        state = poller.tick()  # its late answer recorded, a new poll started, not waited on
        assert time.perf_counter() - t0 < 0.75, "a cycle waited on a source that hangs"
        assert waited >= 1.0
        s = state.sources["held:1"]
        assert (s.polls_total, s.late_polls_total) == (2, 2)
        assert state.sources["fast:1"].polls_total == 3
    finally:
        held.gate.set()
    _polled(held, 3)
    poller.tick()  # the hung one recorded (slow still), a quick one started
    time.sleep(0.05)
    poller.tick()  # the quick one recorded: waited on again from this cycle's poll on
    held.gate.clear()
    t0 = time.perf_counter()
    poller.tick()
    assert time.perf_counter() - t0 >= 1.0
    held.gate.set()


class SlowDiagnoser(RecordingDiagnoser):
    """A diagnosis that takes `took_s`, as a fleet's does; it notes when each began."""

    def __init__(self, took_s: float) -> None:
        super().__init__()
        self.took_s = took_s
        self.began: list[float] = []

    def diagnose_cycle(self, history: History, sources: dict[str, SourceStatus], now: float
                       ) -> CycleFindings:
        self.began.append(time.perf_counter())
        time.sleep(self.took_s)
        return super().diagnose_cycle(history, sources, now)


def test_the_wait_for_polls_leaves_the_publish_the_time_it_has_lately_taken(
        made: list[Poller], clock: FakeClock) -> None:
    # interval 1 s, deadline 0.8 s, a publish of 0.4 s: waiting out a source that just
    # stopped (0.8 s and its margin) would end the cycle at 1.3 s, late.
    fast, held = FakeSource("fast:1", clock), FakeSource("held:1", clock)
    slow = SlowDiagnoser(0.4)
    poller, _ = poller_of(made, fast, held, timeout_s=0.8, clock=clock, diagnoser=slow)
    try:
        poller.tick()
        held.gate.clear()
        t0 = time.perf_counter()
        state = poller.tick()
        waited = slow.began[-1] - t0
        # 1 - 0.4 (the publish) - 0.05, never under half the deadline; waiting out the
        # deadline and its margin would take 0.8 + 0.1 s and more
        assert 0.4 <= waited < 0.85, waited
        assert state.sources["held:1"].late_polls_total == 1  # counted, not dropped
        assert state.sources["fast:1"].polls_total == 2
    finally:
        held.gate.set()
    _polled(held, 2)
    clock.now += 1
    assert poller.tick().sources["held:1"].polls_total >= 2  # its answer recorded next cycle


def test_a_late_cycle_names_the_polls_its_wait_ended_on(
        made: list[Poller], clock: FakeClock, caplog: pytest.LogCaptureFixture) -> None:
    # A source that stops answering, with a deadline as long as the interval: its first
    # cycle waits for it to the deadline and its margin, and runs late; the line says on whom.
    fast, held = FakeSource("fast:1", clock), FakeSource("held:1", clock)
    held.gate.clear()
    poller, _ = poller_of(made, fast, held, timeout_s=1.0, clock=clock)
    try:
        with caplog.at_level("WARNING", logger="replaywatch.poller"):
            poller.run(threading.Event(), sleep=lambda delay: True)
    finally:
        held.gate.set()
    late = [r.getMessage() for r in caplog.records if "ran late" in r.getMessage()]
    assert len(late) == 1 and "; the wait ended on held:1; " in late[0], late


def test_the_next_cycles_polls_start_while_the_last_diagnosis_runs(
        made: list[Poller], clock: FakeClock) -> None:
    # The diagnosis of cycle 1 holds until cycle 2's poll has started: in a loop that
    # diagnosed before it polled again, the two would wait on each other for good.
    running, release = threading.Event(), threading.Event()
    overlapped: list[bool] = []

    class HeldDiagnoser(RecordingDiagnoser):
        def diagnose_cycle(self, history: History, sources: dict[str, SourceStatus],
                           now: float) -> CycleFindings:
            running.set()
            try:
                if len(self.calls) == 0:
                    assert release.wait(5), "cycle 2's poll never started"
            finally:
                running.clear()
            return super().diagnose_cycle(history, sources, now)

    class Source(FakeSource):
        def poll(self) -> PollOutcome:
            if self.polls == 1:  # cycle 2's poll: diagnosis 1 is still running
                # Diagnosis 1 is handed to its thread just before this poll; on loaded cores
                # that thread may not have entered it yet. A loop that diagnosed before it
                # polled again (or after, on this thread) would never set `running` here.
                overlapped.append(running.wait(5))
                release.set()
            return super().poll()

    source, diagnoser = Source("a:1", clock), HeldDiagnoser()
    poller, store = poller_of(made, source, clock=clock, diagnoser=diagnoser)
    sleeps: list[float] = []
    poller.run(threading.Event(), sleep=lambda delay: sleeps.append(delay) or len(sleeps) == 3)
    assert overlapped == [True]
    # Every cycle diagnosed and published, in order, each after its own polls were recorded:
    # diagnosis 2 saw the answers of polls 1 and 2 (the poller waited for diagnosis 1 first).
    assert [c[0]["a:1"].polls_total for c in diagnoser.calls] == [1, 2, 3]
    assert store.current().cycle == 3


def test_a_picture_shows_the_targets_its_cycle_polled_though_the_next_reloaded(
        made: list[Poller]) -> None:
    # Cycle 2 drops b:1 (a targets file edited) before diagnosis 1 has begun: picture 1 is
    # cycle 1's, b:1's table in it; picture 2 has it no more.
    release = threading.Event()
    pictures: list[Published] = []

    class HeldClock(FakeClock):
        def __call__(self) -> float:  # a diagnosis' first read of the time
            if threading.current_thread().name.startswith("replaywatch-diagnosis"):
                assert release.wait(5), "cycle 2's poll never started"
            return super().__call__()

    clock = HeldClock()

    class Source(FakeSource):
        def poll(self) -> PollOutcome:
            if self.polls == 1:  # cycle 2's poll, after its reload
                release.set()
            return super().poll()

    a, b = Source("a:1", clock), FakeSource("b:1", clock)
    fresh: list[list[SourceBinding] | None] = [None, [SourceBinding(a, "a:1")]]
    poller, _ = poller_of(made, a, b, clock=clock,
                          reload=lambda: fresh.pop(0) if fresh else None,
                          after_publish=pictures.append)
    sleeps: list[float] = []
    poller.run(threading.Event(), sleep=lambda delay: sleeps.append(delay) or len(sleeps) == 2)
    assert [sorted(t for t, _ in p.tables) for p in pictures] == [["a:1", "b:1"], ["a:1"]]


def test_a_diagnosis_longer_than_the_interval_makes_the_next_cycle_late_and_says_so(
        made: list[Poller], clock: FakeClock, caplog: pytest.LogCaptureFixture) -> None:
    poller, store = poller_of(made, FakeSource("a:1", clock), clock=clock, interval_s=0.2,
                              diagnoser=SlowDiagnoser(0.5))
    sleeps: list[float] = []
    with caplog.at_level("WARNING", logger="replaywatch.poller"):
        poller.run(threading.Event(), sleep=lambda delay: (
            time.sleep(delay), sleeps.append(delay))[1] or len(sleeps) == 2)
    late = [r.getMessage() for r in caplog.records if "ran late" in r.getMessage()]
    # Cycle 2 waited out diagnosis 1 (0.5 s less the 0.2 s interval) before recording.
    assert poller.late_cycles >= 1 and late, late
    waited = re.search(r"waited on the last diagnosis (\d+) ms", late[0])
    took = re.search(r"the last diagnosis took diagnosis (\d+) ms", late[0])
    assert waited and int(waited.group(1)) >= 200, late[0]
    assert took and int(took.group(1)) >= 500, late[0]
    assert store.current().cycle == 2  # the last diagnosis is waited for when the loop stops


def test_a_reload_swaps_bindings_and_keeps_the_sources_that_stay(
        made: list[Poller], clock: FakeClock) -> None:
    kept, dropped = FakeSource("kept:1", clock), FakeSource("gone:1", clock)
    added, kept_again = FakeSource("new:1", clock), FakeSource("kept:1", clock)
    probe = FakeSource("http://new:9", clock, kind="probe")
    fresh: list[list[SourceBinding] | None] = [
        None,  # first tick: the file did not change
        [SourceBinding(kept_again, "kept:1"), SourceBinding(added, "new:1"),
         SourceBinding(probe, "new:1")],
    ]
    poller, _ = poller_of(made, kept, dropped, clock=clock, reload=lambda: fresh.pop(0))
    first = poller.tick()
    assert set(first.sources) == {"kept:1", "gone:1"}
    clock.now += 1
    second = poller.tick()
    assert set(second.sources) == {"kept:1", "new:1", "http://new:9"}
    assert dropped.closed and not kept.closed
    # The live source object (and its channel) of a target that stays is kept.
    assert kept.polls == 2 and kept_again.polls == 0
    assert second.sources["kept:1"].polls_total == 2
    assert targets_of(poller.bindings) == {"kept:1": [], "new:1": ["http://new:9"]}


def test_the_loop_counts_cycles_that_overran_the_interval(
        made: list[Poller], caplog: pytest.LogCaptureFixture) -> None:
    perf = FakeClock(0.0)
    durations = [2.5, 2.5, 2.5, 0.25, 0.25]  # three cycles' polls overrun a 1 s interval

    class SlowSource(FakeSource):
        def poll(self) -> PollOutcome:
            perf.now += durations[self.polls]  # the cycle's wait takes this long
            return super().poll()

    poller, store = poller_of(made, SlowSource("a:1", FakeClock()), perf=perf, timeout_s=3.0)
    waits: list[float] = []

    def sleep(delay: float) -> bool:
        waits.append(delay)
        return len(waits) == len(durations)  # True: stop

    with caplog.at_level("WARNING", logger="replaywatch.poller"):
        poller.run(threading.Event(), sleep=sleep)
    assert poller.late_cycles == 3
    # Each late cycle is said with where its time went: here, all of it in the polls.
    late = [r.getMessage() for r in caplog.records if "ran late" in r.getMessage()]
    assert len(late) == 3, late
    assert "1500 ms past its 1 s interval" in late[0], late[0]
    # (the fake clock moves on the poll's thread: before or after the wait began)
    assert re.search(r"(started|waited on) polls 2500 ms", late[0]), late[0]
    assert "waited on the last diagnosis 0 ms" in late[0], late[0]
    assert [m.split(" ran late")[0] for m in late] == [
        "poll cycle 1", "poll cycle 2", "poll cycle 3"]
    # A late cycle is followed at once and the cadence realigns, no burst to catch up.
    assert waits == [0.0, 0.0, 0.0, pytest.approx(0.75), pytest.approx(1.5)]
    # Published with each picture.
    assert (store.current().cycle, store.current().late_cycles) == (5, 3)


def test_hooks_run_around_the_swap_and_a_failing_one_never_costs_the_cycle(
        made: list[Poller], clock: FakeClock) -> None:
    seen: list[tuple[str, int, bool]] = []
    store_box: list[StateStore] = []

    def before(state: Published) -> None:  # the /metrics warm-up: before readers see it
        seen.append(("before", state.cycle, store_box[0].current() is state))

    def after(state: Published) -> None:  # the collector's pacing: once it is published
        seen.append(("after", state.cycle, store_box[0].current() is state))
        raise RuntimeError("a broken hook")

    poller, store = poller_of(made, FakeSource("a:1", clock), clock=clock,
                              before_publish=before, after_publish=after)
    store_box.append(store)
    first, second = poller.tick(), poller.tick()
    assert seen == [("before", 1, False), ("after", 1, True),
                    ("before", 2, False), ("after", 2, True)]
    assert store.current() is second and second.cycle == first.cycle + 1
