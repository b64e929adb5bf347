"""The bundle without a job: its codec, its limits, its store, analyze and report on the seed's
hang as the engine tests build it (a table and a probe frozen for 20 s).

The real reproductions check every finding kind's bundle against the live verdict
(tests/support/repro.py's assert_replays, tests/test_bundle_kinds.py); a sidecar killed with
a critical open keeps its bundle (tests/test_bundle_sidecar.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import time
from pathlib import Path
from typing import Any

import markdown_it
import pytest

from replaywatch import bundle as bd
from replaywatch import codec
from replaywatch.bundle_store import BundleMaker, BundleStore
from replaywatch.cli import main
from replaywatch.diagnosis.engine import diagnose
from replaywatch.diagnosis.kinds import worst_first
from replaywatch.diagnosis.lifecycle import reconcile
from replaywatch.diagnosis.stacks import InNext, StackVerdict
from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.diagnosis.window import TargetView
from replaywatch.model import ActorSnapshot, Finding, ProbeSnapshot, TableSnapshot
from tests.builders import (
    DEFAULT,
    TARGET,
    actor_snapshot,
    seed_hung_probe,
    seed_hung_table,
    target_view,
)

NOW = 1019.0


def seed_inputs(th: Thresholds = DEFAULT) -> tuple[bd.Inputs, tuple[Finding, ...]]:
    """The seed's hang diagnosed once, as the keeper would have it after the cycle."""
    view = target_view([seed_hung_table()], [seed_hung_probe(iterators_per_worker=3)])
    inputs = bd.Inputs(view, NOW, th)
    found = diagnose(view, th, NOW).findings
    live = worst_first(reconcile({}, found, {TARGET}, NOW).active.values())
    return inputs, live


def about(**kw: Any) -> bd.About:
    return bd.About(**{"reason": "on demand", "written_at": 1.8e9, "host": "h", "sidecar_pid": 7,
                       "replaywatch_version": "0.1.0", "config": {"interval_s": 1.0}, **kw})


def seed_bundle(tmp_path: Path, **kw: Any) -> Path:
    inputs, live = seed_inputs()
    path = tmp_path / "seed.bundle.json"
    path.write_text(bd.fit(bd.build(inputs, live, about(**kw))))
    return path


def run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(list(argv), environ={})
    return code, out.getvalue()


# -- the codec --------------------------------------------------------------------------------

@pytest.mark.parametrize("value,tp", [
    (seed_hung_table()[3], TableSnapshot),
    (seed_hung_probe()[5], ProbeSnapshot),
    (actor_snapshot(3.0, 7), ActorSnapshot),
    (StackVerdict(2.0, InNext("MainThread", "tf.data", ("a (f:1)",)), None, "x"), StackVerdict),
    (DEFAULT, Thresholds),
], ids=["table", "probe", "actor", "stack_verdict", "thresholds"])
def test_every_input_survives_json_exactly(value: Any, tp: Any) -> None:
    assert codec.decode(tp, json.loads(json.dumps(codec.encode(value)))) == value


def test_a_view_survives_json_exactly() -> None:
    view = dataclasses.replace(seed_inputs()[0].view,
                               actors={"http://a:1": (actor_snapshot(1.0, 2),)})
    assert codec.decode(TargetView, json.loads(json.dumps(codec.encode(view)))) == view


def test_a_bundle_from_before_the_declared_pipeline_was_one_shape_reads_the_same(
        tmp_path: Path) -> None:
    # Such a bundle carried a probe's declared pipeline flattened beside the read one.
    path = seed_bundle(tmp_path)
    doc = json.loads(path.read_text())
    for snaps in doc["inputs"]["view"]["probes"].values():
        for snap in snaps:
            declared = snap.pop("declared")
            del declared["table"], declared["num_parallel_calls_autotune"]
            snap.update(declared, pipeline=snap.pop("read"))
    assert "batch_size" in json.dumps(doc["inputs"]["view"]["probes"])
    old = bd.parse(json.dumps(doc), "old.bundle.json")
    assert old.inputs.view == bd.read(str(path)).inputs.view
    assert bd.verdict(old.inputs) == bd.verdict(bd.read(str(path)).inputs)


@pytest.mark.parametrize("doc,message", [
    ({"observed_at": "soon"}, "$.target: missing"),
    ([1], "expected an object"),
])
def test_a_document_of_the_wrong_shape_names_the_field(doc: Any, message: str) -> None:
    with pytest.raises(codec.DecodeError, match=message.replace("$", r"\$")):
        codec.decode(TableSnapshot, doc)


# -- the verdict, offline ---------------------------------------------------------------------

def test_analyze_gives_the_sidecars_verdict_byte_for_byte(tmp_path: Path) -> None:
    path = seed_bundle(tmp_path)
    b = bd.read(str(path))
    code, out = run("analyze", str(path), "--json")
    assert code == 1  # worker_starvation is critical
    assert out == bd.dumps_verdict(b.live)
    assert [f["kind"] for f in json.loads(out)["findings"]][0] == "worker_starvation"


def test_an_open_finding_keeps_its_first_since_offline_too() -> None:
    inputs, live = seed_inputs()
    earlier = dataclasses.replace(live[0], since=900.0, last_seen=1018.0)
    replayed = bd.verdict(dataclasses.replace(inputs, active_before=(earlier,)))
    assert replayed[0].since == 900.0 and replayed[0].last_seen == NOW


def test_other_thresholds_re_judge_the_same_evidence(tmp_path: Path) -> None:
    path = seed_bundle(tmp_path)
    # The seed's table froze 19 s before the verdict: a 30 s stall window would not have paged.
    code, out = run("analyze", str(path), "--stall-window-s", "30")
    assert code == 0, out
    assert "stall_window_s=30 (the sidecar had 10)" in out
    assert "CRITICAL" not in out
    assert run("analyze", str(path), "--thresholds", "stall_window_s=30")[0] == 0
    assert run("analyze", str(path), "--thresholds", "stall_window_s=10,down_polls=3")[0] == 1
    toml = tmp_path / "th.toml"
    toml.write_text("[thresholds]\nstall_window_s = 30.0\n")
    assert run("analyze", str(path), "--config", str(toml), "--json")[0] == 0


def test_analyze_text_says_the_verdict_is_the_sidecars_and_what_is_missing(
        tmp_path: Path) -> None:
    code, out = run("analyze", str(seed_bundle(tmp_path)))
    assert code == 1
    assert "the same verdict the sidecar gave" in out
    assert "CRITICAL worker_starvation on localhost:8000 replay" in out
    assert "missing: stacks: none taken" in out
    assert "fix: " in out


@pytest.mark.parametrize("content,message", [
    (b"not json", "not JSON"),
    (b'{"a": 1}', "not a replaywatch bundle"),
    (b'{"format": "replaywatch-bundle", "format_version": 9}', "bundle format 9 is newer"),
    (b'{"format": "replaywatch-bundle", "format_version": 1}', "a bundle without 'inputs'"),
    (b'{"format": "replaywatch-bundle", "format_version": 1, "thresholds": {},'
     b' "inputs": {"now": 1, "view": [], "active_before": []}, "verdict": {"findings": []}}',
     "inputs.view: expected an object"),
])
def test_a_bad_bundle_is_one_line_and_exit_2(tmp_path: Path, content: bytes, message: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    for command in ("analyze", "report"):
        assert main([command, str(path)], environ={}) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize("pairs,message", [
    ("stall_window=30", "not NAME=VALUE with a known name"),
    ("stall_window_s", "not NAME=VALUE"),
    ("down_polls=two", "down_polls wants a int"),
    ("stall_window_s=-1", "must be > 0"),
])
def test_bad_thresholds_are_one_line(tmp_path: Path, pairs: str, message: str,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["analyze", str(seed_bundle(tmp_path)), "--thresholds", pairs],
                environ={}) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_a_missing_file_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["analyze", "/nonexistent/b.json"], environ={}) == 2
    assert "cannot read" in capsys.readouterr().err


# -- size, stacks, what is missing --------------------------------------------------------------

def test_an_oversized_bundle_drops_its_oldest_coarse_history_and_says_so() -> None:
    inputs, live = seed_inputs()
    table = seed_hung_table()
    coarse = tuple(dataclasses.replace(table[0], observed_at=float(i)) for i in range(3000))
    view = dataclasses.replace(inputs.view, coarse_tables={"replay": coarse})
    doc = bd.build(dataclasses.replace(inputs, view=view), live, about())
    full = len(bd.fit(doc, 10**9))
    text = bd.fit(doc, full // 3)
    assert len(text.encode()) <= full // 3
    b = bd.parse(text, "trimmed")
    assert b.trimmed and b.doc["dropped"]["coarse_tables"] > 1500
    assert "over" in b.doc["dropped"]["reason"]
    kept = b.inputs.view.coarse_tables["replay"]
    assert kept[-1].observed_at == 2999.0  # the newest are kept
    assert bd.dumps_verdict(b.live) == bd.dumps_verdict(
        bd.verdict_document(TARGET, NOW, live))


def test_stacks_are_grouped_by_identical_frames_and_a_failed_dump_says_why() -> None:
    frames = [{"file": "loop.py", "line": 3, "function": "__next__", "code": "next(it)"}]
    taken = {
        "http://p:1": {"pid": 5, "threads": [
            {"ident": 1, "name": "MainThread", "frames": frames},
            {"ident": 2, "name": "worker-1", "frames": frames},
            {"ident": 3, "name": "serve", "frames": [{"file": "s.py", "line": 9,
                                                       "function": "select"}]}]},
        "py-spy:5": {"error": "py-spy dump exited 1: Permission denied"},
    }
    stacks, missing = bd.dedupe_stacks(taken)
    assert stacks is not None
    groups = stacks["http://p:1"]["stacks"]
    assert [g["count"] for g in groups] == [2, 1]
    assert groups[0]["threads"] == ["MainThread", "worker-1"]
    assert stacks["http://p:1"]["thread_count"] == 3
    assert missing == [{"what": "stacks from py-spy:5",
                        "why": "py-spy dump exited 1: Permission denied"}]


def test_a_probe_that_was_down_is_listed_as_missing() -> None:
    view = target_view([seed_hung_table()], [seed_hung_probe()])
    url = next(iter(view.probe_polls))
    polls = view.probe_polls[url]
    down = tuple(dataclasses.replace(p, ok=False, error="no answer within 0.8s")
                 for p in polls[-3:])
    view = dataclasses.replace(view, probe_polls={url: polls[:-3] + down})
    (entry,) = bd.missing_sources(view)
    assert entry["what"] == f"probe {url}" and entry["failed_polls"] == 3
    assert entry["why"] == "no answer within 0.8s"


# -- the store --------------------------------------------------------------------------------

def store(tmp_path: Path, **kw: Any) -> BundleStore:
    return BundleStore(str(tmp_path / "bundles"), {"interval_s": 1.0}, None, **kw)


def test_the_store_keeps_the_newest_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    inputs, live = seed_inputs()
    clock = iter(range(1_800_000_000, 1_800_000_100, 10))
    s = store(tmp_path, keep=3, clock=lambda: float(next(clock)))
    paths = [s.write(s.document(inputs, live, "on demand"), f"incident-{i}-x")
             for i in range(5)]
    assert all(paths) and s.written == 5
    assert s.paths() == sorted(paths[2:], reverse=True)  # type: ignore[type-var]
    assert sorted(os.listdir(tmp_path / "bundles")) == sorted(
        os.path.basename(p) for p in paths[2:] if p)
    assert s.path_for_incident(4) == paths[4] and s.path_for_incident(0) is None


def test_the_store_writes_nothing_when_the_disk_is_nearly_full(tmp_path: Path) -> None:
    inputs, live = seed_inputs()
    s = store(tmp_path, min_free_bytes=2**62)
    assert s.write(s.document(inputs, live, "on demand"), "incident-1-x") is None
    assert s.failed == 1 and "MiB free" in (s.last_error or "")
    assert s.paths() == []


def test_a_critical_bundle_waits_for_its_stacks_or_says_they_were_late(tmp_path: Path) -> None:
    inputs, live = seed_inputs()
    s = store(tmp_path, stack_wait_s=0.2)
    s.on_critical(live[0], inputs, live, expect_stacks=True)
    s.stacks_taken(live[0].finding_id, {"http://p:1": {"threads": []}})
    late = store(tmp_path / "late", stack_wait_s=0.2)
    late.on_critical(live[0], inputs, live, expect_stacks=True)
    for which, want in ((s, "http://p:1"), (late, None)):
        deadline = 50
        while not which.paths() and deadline:
            time.sleep(0.05)
            deadline -= 1
        (path,) = which.paths()
        b = bd.read(path)
        assert b.doc["reason"] == f"opened critical {live[0].finding_id}"
        if want:
            assert want in b.doc["stacks"]
        else:
            assert b.doc["stacks"] is None
            assert any("not taken within 0.2 s" in m["why"] for m in b.doc["missing"])


def test_on_demand_needs_a_target_when_several_are_watched(tmp_path: Path) -> None:
    inputs, live = seed_inputs()
    maker = BundleMaker(store(tmp_path), {TARGET: (inputs, live)}.get, lambda: [TARGET, "b:1"])
    with pytest.raises(LookupError, match="watches 2 targets"):
        maker.now(None)
    with pytest.raises(LookupError, match="unknown target"):
        maker.now("c:1")
    assert maker.now(TARGET)["target"] == TARGET
    with pytest.raises(LookupError, match="no bundle kept for incident 3"):
        maker.for_incident(3, {"target": TARGET, "resolved_at": 5.0, "finding_id": "x"})


# -- the report -------------------------------------------------------------------------------

def test_the_report_renders_as_markdown_with_the_numbers_users_printed(tmp_path: Path) -> None:
    code, text = run("report", str(seed_bundle(tmp_path)))
    assert code == 0
    html = markdown_it.MarkdownIt("commonmark").enable("table").render(text)
    assert html.startswith("<h1>replaywatch: worker_starvation on localhost:8000 replay</h1>")
    assert html.count("<table>") >= 3  # the verdict, the limiter, the counters over time
    for header in ("min_diff", "cursor", "max_diff", "can_sample", "inserts", "samples"):
        assert f">{header}</th>" in html, header
    table = seed_hung_table()[-1]
    assert f"{table.rate_limiter.inserts:,}" in text and "230,400" in text
    assert "<h2>Fix</h2>" in html and "num_parallel_calls" in text
    assert "replaywatch 0.1.0, bundle format 1" in text


def test_the_report_shows_the_blocked_thread_from_the_stacks(tmp_path: Path) -> None:
    frames = [{"file": "train.py", "line": 10, "function": "step"},
              {"file": "tf.py", "line": 99, "function": "__next__"}]
    path = seed_bundle(tmp_path, stacks={"http://p:1": {"threads": [
        {"name": "serve", "frames": [{"file": "s.py", "line": 1, "function": "run"}]},
        {"name": "MainThread", "frames": frames}]}})
    text = run("report", str(path))[1]
    assert "```text\ntrain.py:10 in step\ntf.py:99 in __next__\n```" in text
    assert "1 thread(s) with this stack (MainThread)" in text


def test_a_rule_that_raises_offline_is_said_not_read_as_no_finding(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from replaywatch.diagnosis import kinds, rules
    from replaywatch.diagnosis.registry import Rule, Shape

    def broken(view, th, now):
        raise KeyError("evidence")

    path = seed_bundle(tmp_path)
    monkeypatch.setattr(rules, "ALL", (*rules.ALL, Rule(kinds.SPI_DRIFT, broken, Shape.VIEW)))
    code, out = run("analyze", str(path))
    assert code == 1 and "CRITICAL worker_starvation" in out
    assert "rule error, its finding is missing (a replaywatch bug): " in out
    assert "broken: KeyError: 'evidence'" in out
    code, out = run("analyze", str(path), "--json")
    assert json.loads(out)["rule_errors"] == [
        "test_a_rule_that_raises_offline_is_said_not_read_as_no_finding.<locals>.broken: "
        "KeyError: 'evidence'"]
