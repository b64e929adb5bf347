"""Checkpoints and restores as the replay process's probe reports them: restoring,
checkpoint_failed, checkpoint_unrestorable, restore_config_override, one row per case, and
the probe's document read back. Real servers, real checkpoints and real restores:
tests/test_checkpoints.py."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from replaywatch.cli import main as cli_main
from replaywatch.diagnosis import rules_checkpoint, rules_liveness
from replaywatch.diagnosis.engine import diagnose
from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.diagnosis.window import TargetView
from replaywatch.model import (
    NO_ANSWER,
    CheckpointCall,
    DeclaredTable,
    MemorySnapshot,
    Name,
    ReplayCode,
    Restore,
    Severity,
)
from replaywatch.probe.checkpoints import CheckpointLog
from replaywatch.sources.probe_http import memory_from_probe
from tests.builders import TARGET, polls, table_snapshot

TH = Thresholds()
T0 = 1000.0
GIB = 1 << 30
# The probe's clock runs 5 s behind the sidecar's: durations are the probe's, places the
# sidecar's.
SKEW = 5.0
CODE_TABLE = DeclaredTable("replay", max_size=1_000_000, max_times_sampled=0,
                           sampler="uniform", remover="fifo", samples_per_insert=1.0,
                           min_size_to_sample=1, min_diff=-100.0, max_diff=100.0)


def code(at: float, **kw: object) -> ReplayCode:
    base: dict[str, object] = {
        "probe_now": at - SKEW, "tables": (CODE_TABLE,), "checkpointer_path": "/ckpt",
        "every_s": 60.0,
        "restore": Restore(T0 - SKEW, T0 + 1 - SKEW, None, 0, 100)}
    base.update(kw)
    return ReplayCode(**base)  # type: ignore[arg-type]


def view(seconds: int = 30, ok: bool = True, table: dict[str, object] | None = None,
         **kw: object) -> tuple[TargetView, float]:
    """A server polled every second for `seconds`, its replay probe reporting `code`."""
    times = [T0 + i for i in range(seconds + 1)]
    tables = tuple(table_snapshot(t, 10 * i, 10 * i, **(table or {}))  # type: ignore[arg-type]
                   for i, t in enumerate(times)) if ok else ()
    memory = tuple(MemorySnapshot(TARGET, t, 77, GIB, 8 * GIB, "host",
                                  found_by="replay probe http://r:8002", code=code(t, **kw))
                   for t in times)
    return TargetView(TARGET, polls(times, ok), {"replay": tables} if ok else {}, {}, {},
                      memory=memory), times[-1]


def call(start: float, took: float | None, error: str | None = None) -> CheckpointCall:
    end = None if took is None else start + took
    return CheckpointCall(start - SKEW, None if end is None else end - SKEW,
                          None if error or end is None else f"/ckpt/{start}", 4096, error)


def restoring(read: int, of: int = 10 * GIB, for_s: int = 20) -> tuple[TargetView, float]:
    return view(for_s, ok=False,
                restore=Restore(T0 - SKEW, None, "/ckpt/2026-12-05T10:00:00", of, read))


# (what, (view, now), the kind it shows or None)
CHECKPOINT_CASES = [
    ("a server loading a 10 GiB checkpoint, its port refused: restoring, not target_down",
     restoring(2 * GIB), "restoring"),
    ("a restore that ended: nothing", view(), None),
    ("checkpoints every 60 s, the last 20 s ago: nothing",
     view(checkpoints=(call(T0 + 10, 1.0),)), None),
    ("the newest checkpoint call raised: checkpoint_failed",
     view(checkpoints=(call(T0 + 10, 1.0), call(T0 + 20, 0.5, "RuntimeError: read-only"))),
     "checkpoint_failed"),
    ("a checkpoint an earlier process began, never finished: checkpoint_failed",
     view(incomplete=("2026-12-05T09:00:00",)), "checkpoint_failed"),
    ("every 10 s said, none for 25 s after a 2 s write: checkpoint_failed",
     view(every_s=10.0, checkpoints=(call(T0 + 3, 2.0),)), "checkpoint_failed"),
    ("every 10 s said, a write in progress after one that took 12 s: checkpointing, not failed",
     view(every_s=10.0, checkpoints=(call(T0 + 2, 12.0), call(T0 + 24, None))),
     "checkpointing"),
    ("Reverb's temporary checkpointer with an interval: checkpoint_unrestorable",
     view(temporary=True, checkpointer_path="/tmp/tmpab12"), "checkpoint_unrestorable"),
    ("Reverb's temporary checkpointer and no checkpoint, nor an interval: nothing",
     view(temporary=True, every_s=None), None),
    ("a max_size and a limiter other than the code wrote: restore_config_override",
     view(table={"max_size": 2_000_000, "spi": 4.0}), "restore_config_override"),
    ("the code's settings served: nothing", view(), None),
    ("every 10 s said, the first write running for 20 s: checkpointing, not failed",
     view(every_s=10.0, checkpoints=(call(T0 + 10, None),)), "checkpointing"),
    ("a checkpoint being written, the server answering: checkpointing",
     view(checkpoints=(call(T0 + 2, 20.0), call(T0 + 25, None))), "checkpointing"),
]
RULES = {Name.CHECKPOINTING: rules_liveness.is_checkpointing,
         Name.RESTORING: rules_checkpoint.is_restoring,
         Name.CHECKPOINT_FAILED: rules_checkpoint.is_checkpoint_failed,
         Name.CHECKPOINT_UNRESTORABLE: rules_checkpoint.is_checkpoint_unrestorable,
         Name.RESTORE_CONFIG_OVERRIDE: rules_checkpoint.is_restore_config_override}


@pytest.mark.parametrize("what,case,kind", CHECKPOINT_CASES, ids=[c[0] for c in CHECKPOINT_CASES])
def test_each_checkpoint_case_shows_its_kind(what: str, case: tuple[TargetView, float],
                                             kind: str | None) -> None:
    v, now = case
    found = {f.kind for f in diagnose(v, TH, now).findings if f.kind in RULES}
    assert found == ({kind} if kind else set()), what


def test_a_restore_is_read_with_its_rate_and_eta_and_target_down_waits_for_it() -> None:
    v, now = restoring(2 * GIB, for_s=20)
    kinds = [f.kind for f in diagnose(v, TH, now).findings]
    assert Name.RESTORING in kinds and Name.TARGET_DOWN not in kinds, kinds
    f = rules_checkpoint.is_restoring(v, TH, now)
    assert f is not None and f.severity is Severity.INFO
    # 2 GiB in the 20 s the probe's clock says: 8 GiB left at 102 MiB/s, 80 s
    assert f.evidence["read_rate_bytes_per_s"] == round(2 * GIB / 20)
    assert f.evidence["eta_s"] == pytest.approx(80.0)
    assert f.since == T0  # on the sidecar's clock
    assert "20% of its 10,240 MiB read" in f.summary and "about 80 s left" in f.summary


def test_a_server_paused_past_the_grace_during_a_checkpoint_is_held_while_it_writes() -> None:
    # Polls unanswered (no refusal) from T0 + 10 for 90 s; the write began at T0 + 5.
    v, now = view(100, checkpoints=(call(T0 + 5, None),))
    times = [p.at for p in v.polls]
    v = dataclasses.replace(v, polls=polls(times, [t < T0 + 10 for t in times],
                                           error=f"ServerInfo {NO_ANSWER} 1 s"))
    found = {f.kind: f for f in diagnose(v, TH, now).findings}
    assert Name.CHECKPOINTING in found and Name.TARGET_DOWN not in found, sorted(found)
    assert found[Name.CHECKPOINTING].evidence["checkpoint_for_s"] == 95.0
    # Without the probe's word, the grace ends and the server is down.
    bare = dataclasses.replace(v, memory=tuple(dataclasses.replace(m, code=None)
                                               for m in v.memory))
    assert Name.TARGET_DOWN in {f.kind for f in diagnose(bare, TH, now).findings}


def test_a_restore_without_its_probe_is_target_down() -> None:
    v, now = restoring(2 * GIB)
    bare = dataclasses.replace(v, memory=tuple(dataclasses.replace(m, code=None)
                                               for m in v.memory))
    assert Name.TARGET_DOWN in [f.kind for f in diagnose(bare, TH, now).findings]


def test_an_override_names_each_setting_both_ways_and_a_limiter_that_blocks() -> None:
    # The restored limiter: 4 samples per insert, its counters at 300 inserts and 1,300
    # samples, min_diff 0: its cursor is -100, so sampling waits for 26 inserts.
    v, now = view(table={"max_size": 2_000_000, "spi": 4.0, "min_diff": 0.0})
    last = v.tables["replay"][-1]
    tables = (*v.tables["replay"][:-1], dataclasses.replace(
        last, rate_limiter=dataclasses.replace(last.rate_limiter, inserts=300, samples=1_300)))
    v = dataclasses.replace(v, tables={"replay": tables})
    f = rules_checkpoint.is_restore_config_override(v, TH, now)
    assert f is not None and f.table == "replay"
    assert f.evidence["changed"] == ["max_size", "min_diff", "samples_per_insert"]
    assert f.evidence["code"]["max_size"] == 1_000_000
    assert f.evidence["served"]["max_size"] == 2_000_000
    assert f.evidence["inserts_to_sample"] == 26
    assert "max_size 1000000 in the code, 2000000 served" in f.summary
    assert "blocks sampling for 26 more inserts" in f.summary


def test_an_overdue_checkpoint_counts_from_the_last_complete_one() -> None:
    v, now = view(every_s=10.0, checkpoints=(call(T0 + 3, 2.0),))
    f = rules_checkpoint.is_checkpoint_failed(v, TH, now)
    assert f is not None
    # every 10 s, plus the stall window (10 s), longer than twice the last write (4 s)
    assert f.evidence["allowed_s"] == 20.0 and f.evidence["seconds_since_last_complete"] == 25.0
    assert f.since == T0 + 5
    assert rules_checkpoint.is_checkpoint_failed(  # 10 + 16 > 25: still within the window
        v, dataclasses.replace(TH, stall_window_s=16.0), now) is None
    # an 8 s write: twice it (16 s) is allowed past the window, 19 s since it ended
    wrote_long = view(every_s=10.0, checkpoints=(call(T0 + 3, 8.0),))[0]
    assert rules_checkpoint.is_checkpoint_failed(wrote_long, TH, now) is None


def test_a_probe_that_went_quiet_reports_nothing() -> None:
    v, now = view(temporary=True)
    assert rules_checkpoint.is_checkpoint_unrestorable(v, TH, now + TH.stall_window_s + 1) is None


class _Client:
    def __init__(self, path: str | None = None, error: Exception | None = None):
        self.path, self.error = path, error

    def checkpoint(self) -> str:
        if self.error is not None:
            raise self.error
        assert self.path is not None
        return self.path


def test_the_probe_keeps_each_call_and_the_sidecar_reads_them_back(tmp_path: Path) -> None:
    clock = iter(float(t) for t in range(100, 200))
    log = CheckpointLog(lambda: next(clock))
    written = tmp_path / "2026-12-05T10:00:00"
    written.mkdir()
    (written / "chunks.tfrecord").write_bytes(b"x" * 1000)
    assert log.checkpoint(_Client(str(written))) == str(written)
    with pytest.raises(PermissionError):
        log.checkpoint(_Client(error=PermissionError("read-only file system")))
    doc = json.loads(json.dumps({"role": "replay", "pid": 1, "name": "r", "now": 150.0,
                                 "rss_bytes": 1, "limit_bytes": 2, **log.document()}))
    # Not handed the server: no declaration, the calls all the same
    assert doc["declared_tables"] is None and doc["checkpointer"] is None
    doc["checkpointer"] = {"path": str(tmp_path), "temporary": False, "every_s": 60}
    m = memory_from_probe(doc, "http://r:8002", TARGET, 155.0)
    assert m.code is not None and m.code.every_s == 60.0
    first, second = m.code.checkpoints
    assert first.path == str(written) and first.bytes == 1000 and first.error is None
    assert second.error == "PermissionError: read-only file system" and second.path is None
    assert m.code.on_sidecar_clock(first.started_at, m.observed_at) == first.started_at + 5


def test_predict_says_before_the_job_that_the_default_checkpointer_never_restores(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["predict", "--checkpoint-every-s", "600", "--json"]) == 1
    plan = json.loads(capsys.readouterr().out)["checkpoints"]
    assert plan["restorable"] is False and plan["fix"] == rules_checkpoint.UNRESTORABLE_FIX
    assert cli_main(["predict", "--checkpoint-every-s", "600", "--checkpoint-dir",
                     "/data/replay"]) == 0
    assert "restorable: a restart loads the newest" in capsys.readouterr().out
    # Beside the limiter's verdict: a safe limiter with an unrestorable replay still fails.
    seed = ["--samples-per-insert", "1", "--min-size-to-sample", "1", "--error-buffer", "100",
            "--batch-size", "1", "--num-parallel-calls", "1", "--layout", "async"]
    code = cli_main(["predict", *seed, "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and "checkpoints" not in doc, doc["verdict"]
    assert cli_main(["predict", *seed, "--checkpoint-every-s", "60", "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["checkpoints"]["restorable"] is False


@pytest.mark.parametrize("flags,said", [
    (["--checkpoint-dir", "/data"], "--checkpoint-dir goes with --checkpoint-every-s"),
    (["--checkpoint-every-s", "0"], "must be positive"),
])
def test_bad_checkpoint_flags_are_one_line_and_exit_2(
        flags: list[str], said: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["predict", *flags]) == 2
    err = capsys.readouterr().err
    assert said in err and len(err.strip().splitlines()) == 1


MIB = 1 << 20


def writing(limit: int, write_at: int = 150, now_at: int = 170, rate: int = 10,
            took: float | None = 40.0, probe: bool = True) -> tuple[TargetView, float]:
    """A table filled at 10 items/s to its 1,000 items of 1 MiB (the process at 1 GiB plus
    its items), then full, inserts going on at `rate` a second; a checkpoint begins at
    T0 + `write_at` after one that took `took` s, and every item removed since stays alive."""
    times = [T0 + i for i in range(now_at + 1)]
    tables, memory = [], []
    for i, t in enumerate(times):
        inserts = 10 * i if i <= 100 else 1000 + rate * (i - 100)
        size = min(inserts, 1000)
        kept = max(0, inserts - (1000 + rate * (write_at - 100))) if i > write_at else 0
        tables.append(table_snapshot(t, inserts, 0, size=size, max_size=1000))
        checkpoints = ((call(T0 + 100 - took, took),) if took else ()) + (
            (call(T0 + write_at, None),) if i >= write_at else ())
        memory.append(MemorySnapshot(
            TARGET, t, 77, GIB + (size + kept) * MIB, limit, "cgroup v1",
            cgroup_anon_bytes=GIB + (size + kept) * MIB, found_by="replay probe http://r:8002",
            code=code(t, tables=(), every_s=300.0, checkpoints=checkpoints) if probe else None))
    return TargetView(TARGET, polls(times), {"replay": tuple(tables)}, {}, {},
                      memory=tuple(memory)), times[-1]


def test_a_write_that_keeps_removed_items_alive_past_the_limit_is_memory_exhaustion() -> None:
    # 20 s into a write that last took 40 s: 200 items (200 MiB) removed and kept, 10 MiB/s
    # more for 20 s: the process at 1 GiB + 1,400 MiB by the write's end.
    v, now = writing(limit=GIB + 1280 * MIB)
    found = {f.kind: f for f in diagnose(v, TH, now).findings}
    f = found[Name.MEMORY_EXHAUSTION]
    ev = f.evidence
    assert ev["cause"] == "checkpoint" and ev["kept_alive_items"] == 200, ev
    assert ev["kept_alive_bytes"] == pytest.approx(200 * MIB, rel=0.02), ev
    assert ev["kept_alive_bytes_per_item_from"].startswith("measured"), ev
    assert ev["peak_bytes"] == pytest.approx(GIB + 1400 * MIB, rel=0.02), ev
    # Raised to the peak over 0.9, or a max_size whose saving covers what the write keeps
    # 2.37 GiB over 0.9 is 2.63: rounded up, never down past what the write needs
    assert "at least 2.7 GiB" in f.fix and "max_size of 'replay' to" in f.fix, f.fix
    assert 0 < ev["fits_max_size"] < 1000, ev
    assert found[Name.CHECKPOINTING].evidence["kept_alive_items"] == 200
    # With room for it: the write is said with what it keeps, nothing is paged.
    roomy, now = writing(limit=8 * GIB)
    found = {f.kind: f for f in diagnose(roomy, TH, now).findings}
    assert Name.MEMORY_EXHAUSTION not in found, found[Name.MEMORY_EXHAUSTION].summary
    assert "keeps the 200 items removed since it began alive: 200 MiB" in (
        found[Name.CHECKPOINTING].summary), found[Name.CHECKPOINTING].summary
    # The first write: how long it lasts is not known, so no end is forecast.
    first, now = writing(limit=GIB + 1280 * MIB, took=None)
    found = {f.kind: f for f in diagnose(first, TH, now).findings}
    assert Name.MEMORY_EXHAUSTION not in found
    assert found[Name.CHECKPOINTING].evidence["peak_bytes"] is None


def test_growth_during_a_long_write_is_no_leak_but_without_the_probe_it_is() -> None:
    # A ten-minute write at 1 item/s: the process grows 1 MiB/s while the table stays full.
    v, now = writing(limit=16 * GIB, write_at=150, now_at=800, rate=1, took=600.0)
    kinds_found = {f.kind for f in diagnose(v, TH, now).findings}
    assert Name.MEMORY_LEAK not in kinds_found and Name.CHECKPOINTING in kinds_found
    bare, now = writing(limit=16 * GIB, write_at=150, now_at=800, rate=1, took=600.0,
                        probe=False)
    assert Name.MEMORY_LEAK in {f.kind for f in diagnose(bare, TH, now).findings}
