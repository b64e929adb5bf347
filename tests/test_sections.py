"""Sections a loop marks, read over real HTTP; the learned rhythms kept in the incident log;
a window the user gives pins it."""

from __future__ import annotations

import pytest

from harness.procs import get_json
from replaywatch import config as cfg
from replaywatch.diagnosis import rhythm as rh
from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.diagnosis.window import TargetView
from replaywatch.incidents import IncidentLog
from replaywatch.model import Section, SectionStat
from replaywatch.probe import ActorProbe, TrainerProbe
from replaywatch.probe.sections import Sections
from replaywatch.rhythm_book import RhythmBook
from replaywatch.sources.probe_http import actor_from_probe, snapshot_from_probe
from tests.builders import TARGET, table_history


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_a_section_is_said_while_inside_and_remembered_after() -> None:
    clock = Clock()
    s = Sections(clock)
    assert s.doc() == {"section": None, "sections": {}}
    with s.section("evaluate"):
        clock.t += 40
        assert s.doc()["section"] == {"name": "evaluate", "for_s": 40.0, "timeout_s": None}
    with s.section("checkpoint", timeout_s=600):
        clock.t += 5
        with s.section("evaluate"):  # nested: the innermost is the one said
            clock.t += 20
            assert s.doc()["section"]["name"] == "evaluate"
        assert s.doc()["section"] == {"name": "checkpoint", "for_s": 25.0, "timeout_s": 600.0}
    assert s.doc() == {"section": None, "sections": {
        "checkpoint": {"count": 1, "longest_s": 25.0, "last_s": 25.0},
        "evaluate": {"count": 2, "longest_s": 40.0, "last_s": 20.0}}}


def test_a_section_that_raises_still_ends() -> None:
    s = Sections(Clock())
    with pytest.raises(RuntimeError), s.section("evaluate"):
        raise RuntimeError("the evaluation failed")
    assert s.doc()["section"] is None and s.doc()["sections"]["evaluate"]["count"] == 1


def test_bad_sections_are_refused() -> None:
    s = Sections(Clock())
    for name, timeout in (("", None), ("x" * 65, None), ("evaluate", 0), ("evaluate", -1.0)):
        with pytest.raises(ValueError), s.section(name, timeout):
            pass
    for i in range(32):
        with s.section(f"s{i}"):
            pass
    with pytest.raises(ValueError, match="section names"), s.section("one-too-many"):
        pass


def test_both_probes_serve_their_section_and_the_sidecar_reads_it() -> None:
    trainer, actor = TrainerProbe(), ActorProbe()
    trainer.start()
    port = actor.start()
    try:
        with trainer.section("evaluate", timeout_s=120), actor.section("checkpoint"):
            doc = get_json(f"{trainer.url}/probe", 5)[1]
            adoc = get_json(f"http://127.0.0.1:{port}/probe", 5)[1]
        after = get_json(f"{trainer.url}/probe", 5)[1]
    finally:
        trainer.stop()
        actor.stop()
    snap = snapshot_from_probe(doc, trainer.url, 1.0)
    assert snap.section is not None and snap.section.name == "evaluate"
    assert snap.section.timeout_s == 120.0 and snap.sections == ()
    assert actor_from_probe(adoc, "http://a", 1.0).section.name == "checkpoint"
    done = snapshot_from_probe(after, trainer.url, 2.0)
    assert done.section is None
    assert [(s.name, s.count) for s in done.sections] == [("evaluate", 1)]


def test_a_section_allowance_is_its_timeout_its_learned_length_or_the_grace() -> None:
    th = Thresholds()
    now = Section("evaluate", 10.0, None)
    assert rh.section_allowance(Section("evaluate", 10.0, 30.0), (), th)[0] == 30.0
    assert rh.section_allowance(now, (SectionStat("evaluate", 3, 60.0, 55.0),), th)[0] == 90.0
    assert rh.section_allowance(now, (SectionStat("checkpoint", 3, 5.0, 5.0),), th)[0] == 900.0


def test_the_rhythm_book_keeps_what_it_learned_across_a_restart(tmp_path) -> None:
    log = IncidentLog(str(tmp_path / "i.db"))
    log.connect()
    book = RhythmBook(log)
    times = [float(t) for t in range(0, 200)]
    hist = table_history(times, inserts=[100 + 16 * (int(t) // 12) for t in times],
                         samples=[16 * (int(t) // 12) for t in times])
    view = TargetView(TARGET, polls=(), tables={"replay": hist}, probes={}, probe_polls={})
    learned = book.learn(TARGET, view)
    assert rh.longest_normal(learned["samples replay"].gaps) == 12.0
    book.save(200.0)
    log.close()
    again = IncidentLog(str(tmp_path / "i.db"))
    later = RhythmBook(again)
    later.resume()
    resumed = later.of(TARGET)["samples replay"]
    # Its gaps and pauses are the same; no gap will span the time the sidecar was down.
    assert resumed.gaps == learned["samples replay"].gaps
    assert resumed.last_event_at is None and resumed.seen_at == 0.0
    assert later.reach_s(TARGET, Thresholds()) == 3 * 36.0


def test_a_window_the_user_gives_pins_it() -> None:
    assert cfg.thresholds_from({"stall_window_s": 30.0}).learned_windows is False
    assert cfg.thresholds_from({"stall_window_s": 30.0, "learned_windows": True}
                               ).learned_windows is True
    assert cfg.thresholds_from({"down_polls": 3}).learned_windows is True
    with pytest.raises(cfg.ConfigError):
        cfg.thresholds_from({"window_factor": 0.5})
