"""The findings keeper across a restart: a real SQLite log in tmp_path, a real History.

A sidecar that restarts knows nothing for a while (target_down needs several
failed polls, a stall a whole window). An incident left open in the log must be
resumed and held open meanwhile: not resolved and re-opened, never duplicated.
"""

from __future__ import annotations

from pathlib import Path

from replaywatch.diagnosis.lifecycle import Transition
from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.findings import FindingsKeeper
from replaywatch.history import History
from replaywatch.incidents import IncidentLog
from replaywatch.model import Finding, PollOutcome, Severity
from tests.builders import table_snapshot

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
    assert log.open()
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
