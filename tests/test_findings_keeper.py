"""The findings keeper across a restart: a real SQLite log in tmp_path, a real History.

A sidecar that restarts knows nothing for a while (target_down needs several
failed polls, a stall a whole window). An incident left open in the log must be
resumed and held open meanwhile: not resolved and re-opened, never duplicated.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from replaywatch.diagnosis.lifecycle import Transition
from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.findings import FindingsKeeper
from replaywatch.history import History
from replaywatch.incidents import IncidentLog
from replaywatch.model import Finding, PollOutcome, Severity
from replaywatch.stack_taker import StackTaker
from tests.builders import (
    ACTOR,
    PROBE,
    TARGET,
    actor_snapshot,
    seed_hung_probe,
    seed_hung_table,
    table_snapshot,
)

T = "localhost:8000"
TH = Thresholds()  # stall window 10 s, down after 3 failed polls
HOLD_S = TH.stall_window_s + (TH.down_polls + 2) * 1.0  # 14 s at a 1 s interval
START = 1000.0


def down(since: float) -> Finding:
    return Finding("target_down", Severity.WARNING, T, "",
                   f"The Reverb server '{T}' does not answer.", {"failed_polls": 5},
                   "Check that the replay process runs.", since=since, last_seen=since)


def log_left_open(path: Path) -> None:
    """What a sidecar that died with target_down open leaves behind."""
    log = IncidentLog(str(path))
    assert log.connect()
    log.apply([Transition("opened", down(900.0))], {})
    log.close()


def restarted(path: Path) -> tuple[FindingsKeeper, IncidentLog]:
    log = IncidentLog(str(path))
    return FindingsKeeper(lambda: {T: []}, TH, 1.0, log), log


def poll(history: History, t: float, ok: bool) -> None:
    if ok:
        n = int(10 * (t - 900))
        history.record(PollOutcome(T, "reverb", t, 0.001,
                                   tables=(table_snapshot(t, n, n, target=T),)))
    else:
        history.record(PollOutcome(T, "reverb", t, 0.001, error=f"{T}: unreachable"))


def downs(found: tuple[Finding, ...]) -> list[Finding]:
    return [f for f in found if f.kind == "target_down"]


def test_a_resumed_incident_is_held_open_then_resolved_once(tmp_path: Path) -> None:
    path = tmp_path / "incidents.db"
    log_left_open(path)
    keeper, log = restarted(path)
    history = History()
    try:
        t = START
        while t < START + HOLD_S:  # the target answers again, but the hold lasts
            poll(history, t, ok=True)
            out = keeper.diagnose_cycle(history, {}, t)
            (held,) = downs(out.findings)
            assert held.since == 900.0
            assert list(out.incident_ids) == [held.finding_id]
            t += 1.0
        poll(history, t, ok=True)
        out = keeper.diagnose_cycle(history, {}, t)
        assert downs(out.findings) == [] and out.incident_ids == {}
        rows = log.list("all")
        assert [(r["finding_id"], r["state"], r["since"], r["resolved_at"]) for r in rows] == [
            (f"target_down:{T}:", "resolved", 900.0, t)]
    finally:
        log.close()


def test_a_resumed_incident_that_is_still_true_continues_as_the_same_incident(
        tmp_path: Path) -> None:
    path = tmp_path / "incidents.db"
    log_left_open(path)
    keeper, log = restarted(path)
    history = History()
    try:
        for i in range(int(HOLD_S) + 6):  # well past the hold, still down
            t = START + i
            poll(history, t, ok=False)
            (found,) = downs(keeper.diagnose_cycle(history, {}, t).findings)
            assert found.since == 900.0  # the onset before the restart
        rows = log.list("all")
        assert [(r["state"], r["since"]) for r in rows] == [("open", 900.0)]
    finally:
        log.close()


def test_with_no_open_incident_there_is_nothing_to_hold(tmp_path: Path) -> None:
    keeper, log = restarted(tmp_path / "incidents.db")
    history = History()
    try:
        poll(history, START, ok=True)
        out = keeper.diagnose_cycle(history, {}, START)
        assert downs(out.findings) == [] and log.list("all") == []
        assert out.incident_log_error is None and out.incident_log_dropped == 0
    finally:
        log.close()


def test_a_critical_opening_fetches_the_trainers_stacks_off_the_poll_thread(
        tmp_path: Path) -> None:
    """The fetcher runs on its own thread; the test's fetcher signals instead of a join."""
    asked: list[tuple[list[str], int | None]] = []
    called = threading.Event()

    def fetch(urls: Sequence[str], pid: int | None) -> dict[str, Any]:
        asked.append((list(urls), pid))
        called.set()
        return {PROBE: {"threads": [{"name": "learner", "frames": ["next"]}]}}

    log = IncidentLog(str(tmp_path / "incidents.db"))
    keeper = FindingsKeeper(
        lambda: {TARGET: [PROBE]}, TH, 1.0, log, stacks=StackTaker(4242, fetcher=fetch))
    history = History()
    for table, probe in zip(seed_hung_table(), seed_hung_probe(), strict=True):
        history.record(PollOutcome(TARGET, "reverb", table.observed_at, 0.001, tables=(table,)))
        history.record(PollOutcome(PROBE, "probe", probe.observed_at, 0.001, probe=probe))
    try:
        out = keeper.diagnose_cycle(history, {}, 1019.0)
        critical = [f for f in out.findings if f.severity == Severity.CRITICAL]
        assert [f.kind for f in critical] == ["worker_starvation"]
        assert called.wait(5)
        assert asked == [([PROBE], 4242)]
        incident_id = out.incident_ids[critical[0].finding_id]
        # The fetcher has returned; attach_stacks follows on the same thread.
        deadline = time.monotonic() + 5
        while (row := log.get(incident_id)) is not None and not row.get("stacks"):
            assert time.monotonic() < deadline, "stacks never stored"
            time.sleep(0.01)
        assert row is not None and row["stacks"][PROBE]["threads"][0]["name"] == "learner"
    finally:
        log.close()


# -- item 8: a synchronous loop seen inside next() in two dumps, without any probe ---------------

class FakeDumper:
    """Stands in for `py-spy dump --json` behind the keeper's StackDumper interface."""

    def __init__(self, *documents: dict[str, Any]):
        self.documents = list(documents)
        self.pids: list[int] = []
        self.lock = threading.Lock()

    def __call__(self, pid: int) -> dict[str, Any]:
        with self.lock:
            self.pids.append(pid)
            return self.documents[min(len(self.pids), len(self.documents)) - 1]


def in_next() -> dict[str, Any]:
    from tests.test_stacks import TF_DATA
    return TF_DATA


def in_update() -> dict[str, Any]:
    from tests.test_stacks import IN_UPDATE
    return IN_UPDATE


def frozen_loop(history: History, until: float) -> None:
    """The seed's synchronous table, hung from t=1000 (Reverb alone: no probe), polled once a
    second up to `until`; the table worker keeps waiting for inserts."""
    seed = seed_hung_table()
    recorded = history.table(TARGET, "replay")
    t = recorded[-1].observed_at + 1 if recorded else seed[0].observed_at
    while t <= until:
        last = seed[min(int(t - 1000), len(seed) - 1)]
        waited = last.worker_time.waiting_for_inserts_ms + int(980 * max(0.0, t - 1019))
        snapshot = dataclasses.replace(last, observed_at=t, worker_time=dataclasses.replace(
            last.worker_time, waiting_for_inserts_ms=waited))
        history.record(PollOutcome(TARGET, "reverb", t, 0.001, tables=(snapshot,)))
        t += 1.0


def run_until(keeper: FindingsKeeper, history: History, kind: str, start: float,
              timeout_s: float = 5.0) -> tuple[float, list[Finding]]:
    """Cycles one poll apart until a finding of `kind` shows (the dumps run on their own
    thread), or the timeout passes."""
    deadline = time.monotonic() + timeout_s
    t = start
    while True:
        frozen_loop(history, t)
        found = list(keeper.diagnose_cycle(history, {}, t).findings)
        if any(f.kind == kind for f in found) or time.monotonic() > deadline:
            return t, found
        t += 1.0
        time.sleep(0.02)


def test_a_synchronous_sample_blocked_becomes_starvation_from_two_dumps_in_next(
        tmp_path: Path) -> None:
    dumper = FakeDumper(in_next())
    log = IncidentLog(str(tmp_path / "incidents.db"))
    keeper = FindingsKeeper(
        lambda: {TARGET: []}, TH, 1.0, log, stacks=StackTaker(4242, dumper=dumper, gap_s=0.0))
    history = History()
    try:
        frozen_loop(history, 1019.0)
        first = keeper.diagnose_cycle(history, {}, 1019.0).findings
        assert [f.kind for f in first if f.severity == Severity.CRITICAL] == ["sample_blocked"]
        t, found = run_until(keeper, history, "worker_starvation", 1020.0)
        (starved,) = [f for f in found if f.kind == "worker_starvation"]
        assert starved.evidence["from_stacks"] is True
        assert starved.evidence["loop_in"] == "tf.data IteratorGetNext"
        assert starved.since == 1000.0 and "num_parallel_calls=1" in starved.fix
        assert dumper.pids == [4242, 4242]  # two dumps, once
        # The next cycles keep the verdict while the stall lasts; no more dumps.
        for later in (t + 1, t + 2, t + 3):
            frozen_loop(history, later)
            kinds_now = [f.kind for f in keeper.diagnose_cycle(history, {}, later).findings]
            assert "worker_starvation" in kinds_now and "sample_blocked" not in kinds_now
        assert dumper.pids == [4242, 4242]
        rows = {r["finding_id"]: r for r in log.list("all")}
        stored = log.get(rows[starved.finding_id]["id"])
        assert stored is not None and set(stored["stacks"]) == {"py-spy:4242", "py-spy:4242 +0s"}
    finally:
        log.close()


def test_a_loop_outside_next_stays_sample_blocked_and_is_dumped_once(tmp_path: Path) -> None:
    dumper = FakeDumper(in_next(), in_update())  # in next(), then in its update step
    taker = StackTaker(4242, dumper=dumper, gap_s=0.0)
    keeper = FindingsKeeper(lambda: {TARGET: []}, TH, 1.0, None, stacks=taker)
    history = History()
    frozen_loop(history, 1019.0)
    keeper.diagnose_cycle(history, {}, 1019.0)
    deadline = time.monotonic() + 5
    while taker.verdicts(TARGET) == {}:
        assert time.monotonic() < deadline, "the dumps never finished"
        time.sleep(0.01)
    for t in (1020.0, 1021.0, 1022.0):
        frozen_loop(history, t)
        kinds_now = [f.kind for f in keeper.diagnose_cycle(history, {}, t).findings]
        assert "sample_blocked" in kinds_now and "worker_starvation" not in kinds_now
    assert dumper.pids == [4242, 4242]


def test_nothing_is_dumped_while_the_job_is_healthy_or_a_probe_reads_the_table(
        tmp_path: Path) -> None:
    dumper = FakeDumper(in_next())
    healthy = FindingsKeeper(
        lambda: {T: []}, TH, 1.0, None, stacks=StackTaker(4242, dumper=dumper, gap_s=0.0))
    history = History()
    for i in range(30):
        poll(history, START + i, ok=True)
        assert healthy.diagnose_cycle(history, {}, START + i).findings == ()
    # The seed hang with the trainer probe attached: the probe decides, no dumps.
    probed = FindingsKeeper(
        lambda: {TARGET: [PROBE]}, TH, 1.0, None, stacks=StackTaker(4242, dumper=dumper, gap_s=0.0,
                                              fetcher=lambda urls, pid: None))
    hung = History()
    for table, probe in zip(seed_hung_table(), seed_hung_probe(), strict=True):
        hung.record(PollOutcome(TARGET, "reverb", table.observed_at, 0.001, tables=(table,)))
        hung.record(PollOutcome(PROBE, "probe", probe.observed_at, 0.001, probe=probe))
    assert "worker_starvation" in [f.kind for f in probed.diagnose_cycle(hung, {}, 1019.0)
                                   .findings]
    time.sleep(0.1)
    assert dumper.pids == []


def test_an_incident_keeps_the_actor_snapshots_around_its_opening(tmp_path: Path) -> None:
    """An actor probe's URL has actor snapshots, not trainer ones: they are stored too."""
    log = IncidentLog(str(tmp_path / "incidents.db"))
    keeper = FindingsKeeper(lambda: {T: [ACTOR]}, TH, 1.0, log)
    history = History()
    try:
        for i in range(3):
            t = START + i
            poll(history, t, ok=False)
            history.record(PollOutcome(ACTOR, "probe", t, 0.001, actor=actor_snapshot(t, 10 + i)))
            keeper.diagnose_cycle(history, {}, t)
        keeper.diagnose_cycle(history, {}, START + 3)
        poll(history, START + 3, ok=False)
        out = keeper.diagnose_cycle(history, {}, START + 4)
        (finding,) = downs(out.findings)
        incident = log.get(out.incident_ids[finding.finding_id])
        assert incident is not None
        context = incident["events"][0]["context"]
        assert [s["steps_total"] for s in context["probes"][ACTOR]] == [10, 11, 12]
    finally:
        log.close()


def test_a_rule_that_raises_on_every_table_is_one_error_per_target(
        monkeypatch: Any) -> None:
    from replaywatch.diagnosis import kinds, rules
    from replaywatch.diagnosis.registry import Rule, Shape

    def broken(case, th):
        raise ValueError("no limiter")

    monkeypatch.setattr(rules, "ALL", (*rules.ALL, Rule(kinds.SPI_DRIFT, broken,
                                                         Shape.TABLE_SETTINGS)))
    keeper, history = FindingsKeeper(lambda: {T: []}, TH, 1.0, None), History()
    for i in range(12):
        t = START + i
        history.record(PollOutcome(T, "reverb", t, 0.001, tables=tuple(
            table_snapshot(t, 10 * i, 10 * i, target=T, name=name) for name in ("a", "b"))))
    found = keeper.diagnose_cycle(history, {}, START + 11)
    assert found.rule_errors == (
        f"{T}: test_a_rule_that_raises_on_every_table_is_one_error_per_target.<locals>."
        "broken: ValueError: no limiter",)
