"""Bundles from a real `replaywatch watch` process: written when a critical opens, readable
after the sidecar is SIGKILLed, served by the API and `replaywatch bundle`, re-derived by
`replaywatch analyze` in another process byte for byte.

The critical is warmup_impossible (a real Reverb table whose max_size is below its
min_size_to_sample, actors inserting): it opens at the first poll and stays open, so the
kill lands while it is open.
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import markdown_it
import pytest

from harness.procs import PYTHON, ROOT, Proc, get_json, get_text, wait_until
from replaywatch import bundle as bd

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

INTERVAL = 0.5
FAST = ("--interval", str(INTERVAL), "--stall-window-s", "3", "--min-history-s", "1")


def cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PYTHON, "-m", "replaywatch", *argv], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)


def critical(base: str) -> dict | None:
    found = get_json(f"{base}/api/v1/findings", 2)[1]["findings"]
    return next((f for f in found if f["kind"] == "warmup_impossible"), None)


def test_a_critical_bundle_outlives_a_sigkill_and_analyze_gives_its_verdict(
        reverb_workload: Callable[..., tuple[Proc, str]],
        sidecar: Callable[..., tuple[Proc, str]], tmp_path: Path) -> None:
    _, address = reverb_workload("--min-size", "1000", "--max-size", "100")
    db = tmp_path / "state" / "incidents.sqlite3"
    proc, base = sidecar("--reverb", address, *FAST, "--db", str(db))
    opened = wait_until(lambda: critical(base), 20)
    incident_id = opened["incident_id"]
    bundles = tmp_path / "state" / "bundles"
    (path,) = wait_until(lambda: sorted(bundles.glob("*.bundle.json")), 20)
    assert f"-incident-{incident_id}-warmup_impossible" in path.name
    written = path.read_bytes()
    assert len(written) <= bd.MAX_BYTES
    proc.signal(signal.SIGKILL)
    proc.popen.wait(timeout=10)

    # Restarted on the same log: the same incident, open, within two polls of its first.
    _, base = sidecar("--reverb", address, *FAST, "--db", str(db))
    resumed = wait_until(lambda: critical(base), 10)
    polls = get_json(f"{base}/api/v1/targets", 2)[1]["targets"][0]["polls_total"]
    # A cycle's findings are published while the next cycle's polls run (poller.py), so
    # the count read after the second cycle's publication may already hold the third poll.
    assert resumed["incident_id"] == incident_id and polls <= 3
    rows = get_json(f"{base}/api/v1/incidents?state=all", 2)[1]["incidents"]
    assert [r["id"] for r in rows if r["kind"] == "warmup_impossible"] == [incident_id]

    # The bundle written before the kill is whole, and another process re-derives its
    # verdict byte for byte.
    assert path.read_bytes() == written
    kept = bd.read(str(path))
    assert kept.doc["reason"] == f"opened critical {opened['id']}"
    assert kept.doc["incident"]["id"] == incident_id
    assert [e["transition"] for e in kept.doc["incident"]["events"]] == ["opened"]
    assert kept.doc["config"]["interval_s"] == INTERVAL
    assert kept.doc["thresholds"]["stall_window_s"] == 3.0
    analyzed = cli("analyze", str(path), "--json")
    assert analyzed.returncode == 1, analyzed.stderr
    assert analyzed.stdout == bd.dumps_verdict(kept.live)
    assert json.loads(analyzed.stdout)["findings"][0]["kind"] == "warmup_impossible"

    # The API serves the kept bundle and its report; the CLI saves one of now.
    status, served = get_json(f"{base}/api/v1/incidents/{incident_id}/bundle", 5)
    assert status == 200 and served == json.loads(written)
    status, text = get_text(f"{base}/api/v1/incidents/{incident_id}/report", 5)
    assert status == 200
    html = markdown_it.MarkdownIt("commonmark").enable("table").render(text)
    assert "<h1>replaywatch: warmup_impossible" in html and "<table>" in html
    out = tmp_path / "now.bundle.json"
    saved = cli("bundle", "--sidecar", base, "--out", str(out))
    assert saved.returncode == 0, saved.stderr
    now = bd.read(str(out))
    assert now.doc["reason"] == "on demand"
    assert now.doc["incident"]["id"] == incident_id  # the open critical's transitions
    assert cli("analyze", str(out), "--json").stdout == bd.dumps_verdict(now.live)
    report = cli("report", str(out))
    assert report.returncode == 0 and " can_sample " in report.stdout


def test_bundle_errors_are_one_line_and_json_over_http(
        sidecar: Callable[..., tuple[Proc, str]], tmp_path: Path) -> None:
    _, base = sidecar("--reverb", "127.0.0.1:9", "--reverb", "127.0.0.1:10", *FAST,
                      "--db", str(tmp_path / "i.db"))
    status, body = get_json(f"{base}/api/v1/bundle", 5)
    assert status == 404 and "watches 2 targets" in body["error"]
    status, body = get_json(f"{base}/api/v1/incidents/99/bundle", 5)
    assert status == 404 and body["error"] == "unknown incident 99"
    done = cli("bundle", "--sidecar", base, "--out", str(tmp_path / "b.json"))
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "HTTP 404: this sidecar watches 2 targets" in done.stderr
    wait_until(lambda: get_json(f"{base}/api/v1/targets", 2)[1]["targets"][0]["polls_total"],
               10)
    done = cli("bundle", "--sidecar", base, "--target", "127.0.0.1:9",
               "--out", str(tmp_path / "b.json"))
    assert done.returncode == 0, done.stderr
    assert bd.read(str(tmp_path / "b.json")).inputs.view.target == "127.0.0.1:9"
    closed = cli("bundle", "--sidecar", "http://127.0.0.1:9", "--out", str(tmp_path / "c.json"),
                 "--timeout", "2")
    assert closed.returncode == 2 and "no answer" in closed.stderr
    assert not (tmp_path / "c.json").exists()
