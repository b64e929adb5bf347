"""Faults the sidecar must live through, each with real processes."""

from __future__ import annotations

import os
import resource
import signal
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from harness.procs import PYTHON, Proc, free_port, get_json, get_text, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.long]  # starts processes (see tests/conftest.py)

INTERVAL = 0.5
FAST = ("--interval", str(INTERVAL), "--stall-window-s", "3", "--min-history-s", "1")


def _targets(base: str) -> dict[str, dict]:
    doc = get_json(f"{base}/api/v1/targets")[1]
    return {t["name"]: t for t in doc["targets"] + doc["probes"]}


def _findings(base: str) -> list[dict]:
    return get_json(f"{base}/api/v1/findings")[1]["findings"]


@pytest.mark.long(seconds=23)
def test_a_frozen_server_times_out_while_others_keep_their_cadence(
    reverb_workload: Callable[..., tuple[Proc, str]], sidecar: Callable[..., tuple[Proc, str]],
    tmp_path: Path,
) -> None:
    frozen, frozen_addr = reverb_workload()
    _, other_addr = reverb_workload()
    _, base = sidecar("--reverb", frozen_addr, "--reverb", other_addr, "--timeout", "0.3",
                      *FAST, "--db", str(tmp_path / "i.db"))
    wait_until(lambda: all(t["up"] for t in _targets(base).values()), 20)
    frozen.signal(signal.SIGSTOP)  # ServerInfo will never answer
    try:
        down = wait_until(lambda: (t := _targets(base)[frozen_addr])["up"] is False and t, 10)
        assert "did not answer within 0.3s" in down["last_error"]
        # Over the next 3 s the healthy target is polled on time and the API answers fast.
        before = _targets(base)[other_addr]["polls_total"]
        slowest = 0.0
        for _ in range(15):
            t0 = time.perf_counter()
            get_json(f"{base}/api/v1/tables")
            slowest = max(slowest, time.perf_counter() - t0)
            time.sleep(0.2)
        polled = _targets(base)[other_addr]["polls_total"] - before
        assert polled >= 4, polled  # ~6 expected in 3 s at 0.5 s
        assert slowest < 1.0
        assert _targets(base)[other_addr]["up"] is True
    finally:
        frozen.signal(signal.SIGCONT)
    wait_until(lambda: _targets(base)[frozen_addr]["up"], 15)


def test_a_restarted_server_resets_counters_without_negative_rates_or_false_findings(
    reverb_workload: Callable[..., tuple[Proc, str]], sidecar: Callable[..., tuple[Proc, str]],
    tmp_path: Path,
) -> None:
    port = free_port()
    server, address = reverb_workload("--insert-hz", "40", port=port)
    _, base = sidecar("--reverb", address, *FAST, "--db", str(tmp_path / "i.db"))
    wait_until(lambda: get_json(f"{base}/api/v1/tables")[1]["tables"][0]["rate_limiter"]
               ["inserts"] > 100, 20)
    server.kill()
    wait_until(lambda: any(f["kind"] == "target_down" for f in _findings(base)), 15)
    reverb_workload("--insert-hz", "40", port=port)
    wait_until(lambda: _targets(base)[address]["up"], 20)
    wait_until(lambda: not any(f["kind"] == "target_down" for f in _findings(base)), 15)
    for _ in range(10):  # five seconds after the reset
        for table in get_json(f"{base}/api/v1/tables")[1]["tables"]:
            d = table["derived"]
            for rate in (d["insert_rate"], d["sample_rate"]):
                assert rate is None or rate >= 0, d
        assert not [f for f in _findings(base) if f["severity"] in ("critical", "warning")]
        time.sleep(0.5)
    resolved = get_json(f"{base}/api/v1/incidents?state=resolved")[1]["incidents"]
    assert [i["kind"] for i in resolved] == ["target_down"]


def test_a_killed_probe_goes_down_and_the_watch_goes_on(
    spawn: Callable[..., Proc], reverb_workload: Callable[..., tuple[Proc, str]],
    sidecar: Callable[..., tuple[Proc, str]], tmp_path: Path,
) -> None:
    _, address = reverb_workload()
    trainer = spawn([PYTHON, "tests/support/idle_trainer.py"], name="trainer")
    url = trainer.announce()["probe"]
    _, base = sidecar("--reverb", address, "--probe", url, *FAST, "--db", str(tmp_path / "i.db"))
    wait_until(lambda: _targets(base)[url]["up"], 15)
    trainer.kill()
    found = wait_until(lambda: [f for f in _findings(base) if f["kind"] == "probe_down"], 15)
    assert found[0]["target"] == address
    assert _targets(base)[address]["up"] is True
    assert get_text(f"{base}/metrics")[0] == 200


def test_sigkill_during_an_open_incident_resumes_the_same_incident(
    spawn: Callable[..., Proc], sidecar: Callable[..., tuple[Proc, str]], tmp_path: Path
) -> None:
    db = tmp_path / "incidents.sqlite3"
    dead = f"127.0.0.1:{free_port()}"
    proc, base = sidecar("--reverb", dead, *FAST, "--db", str(db))
    opened = wait_until(lambda: [f for f in _findings(base) if f["kind"] == "target_down"], 15)
    incident_id = opened[0]["incident_id"]
    assert incident_id is not None
    before = get_json(f"{base}/api/v1/incidents/{incident_id}")[1]
    proc.signal(signal.SIGKILL)
    proc.popen.wait(timeout=10)
    _, base = sidecar("--reverb", dead, *FAST, "--db", str(db))
    wait_until(lambda: get_json(f"{base}/readyz")[0] == 200, 15)
    time.sleep(4 * INTERVAL)
    rows = get_json(f"{base}/api/v1/incidents?state=all")[1]["incidents"]
    assert [r["id"] for r in rows if r["kind"] == "target_down"] == [incident_id]  # no duplicate
    after = get_json(f"{base}/api/v1/incidents/{incident_id}")[1]
    assert after["state"] == "open"
    assert after["since"] == before["since"]
    assert after["evidence"]  # the evidence came through the crash
    assert _findings(base)[0]["incident_id"] == incident_id


def test_an_unwritable_incident_log_is_reported_and_writes_resume(
    sidecar: Callable[..., tuple[Proc, str]], tmp_path: Path
) -> None:
    blocker = tmp_path / "state"
    blocker.write_text("a file where the log's directory should be")
    db = blocker / "incidents.sqlite3"
    _, base = sidecar("--reverb", f"127.0.0.1:{free_port()}", *FAST, "--db", str(db))
    status, ready = wait_until(
        lambda: (r := get_json(f"{base}/readyz"))[0] == 503 and "incident log" in str(r[1])
        and r, 15)
    assert any("incident log" in p for p in ready["problems"])
    # Everything else keeps serving meanwhile.
    assert get_text(f"{base}/metrics")[0] == 200
    assert "replaywatch_incident_log_healthy 0.0" in get_text(f"{base}/metrics")[1]
    wait_until(lambda: _findings(base), 15)  # target_down opened, but not yet written
    blocker.unlink()
    blocker.mkdir()
    wait_until(lambda: get_json(f"{base}/readyz")[0] == 200, 15)
    rows = sqlite3.connect(db).execute("SELECT kind, resolved_at FROM incidents").fetchall()
    assert ("target_down", None) in rows  # the queued transition was not lost


def test_a_full_disk_is_reported_and_writes_resume(
    sidecar: Callable[..., tuple[Proc, str]], tmp_path: Path
) -> None:
    db = tmp_path / "incidents.sqlite3"
    proc, base = sidecar("--reverb", f"127.0.0.1:{free_port()}", *FAST, "--db", str(db))
    wait_until(lambda: get_json(f"{base}/readyz")[0] == 200, 15)
    # No file of the sidecar may grow any more: writes fail with EFBIG, as on a full disk.
    # (CPython ignores SIGXFSZ, so the process lives and sees the error.)
    sizes = [os.path.getsize(p) for p in tmp_path.iterdir() if p.name.startswith(db.name)]
    resource.prlimit(proc.pid, resource.RLIMIT_FSIZE, (max(sizes), resource.RLIM_INFINITY))
    try:
        wait_until(lambda: get_json(f"{base}/readyz")[0] == 503, 20)
        assert get_text(f"{base}/metrics")[0] == 200
        assert get_json(f"{base}/api/v1/findings")[0] == 200
    finally:
        resource.prlimit(proc.pid, resource.RLIMIT_FSIZE,
                         (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    wait_until(lambda: get_json(f"{base}/readyz")[0] == 200, 20)
    rows = sqlite3.connect(db).execute("SELECT kind FROM incidents").fetchall()
    assert ("target_down",) in rows


def test_a_paused_process_holds_its_probe_with_its_server_until_the_grace_ends(
    spawn: Callable[..., Proc], sidecar: Callable[..., tuple[Proc, str]], tmp_path: Path,
) -> None:
    # A sync loop's server and its ActorProbe share a process; while that process is held (a
    # checkpoint, here SIGSTOP) neither answers: `checkpointing`, not probe_down. Past the
    # grace both are down.
    job = spawn([PYTHON, "harness/reverb_workload.py", "--actor-probe", "--insert-hz", "100"],
                name="loop")
    start = job.announce()
    _, base = sidecar("--reverb", start["reverb"], "--probe", start["probe"], *FAST,
                      "--checkpoint-grace-s", "6", "--db", str(tmp_path / "i.db"))
    wait_until(lambda: all(t["up"] for t in _targets(base).values()), 20)
    seen: set[str] = set()
    job.signal(signal.SIGSTOP)
    try:
        began = time.monotonic()
        while time.monotonic() - began < 4.0:  # 8 polls unanswered, within the grace
            seen |= {f["kind"] for f in _findings(base)}
            time.sleep(INTERVAL / 2)
    finally:
        job.signal(signal.SIGCONT)
    assert "checkpointing" in seen and not seen & {"probe_down", "target_down"}, seen
    wait_until(lambda: not _findings(base), 20)
    job.signal(signal.SIGSTOP)
    try:
        down = wait_until(lambda: {"probe_down", "target_down"} <= {
            f["kind"] for f in _findings(base)}, 15)
    finally:
        job.signal(signal.SIGCONT)
    assert down
    incidents = get_json(f"{base}/api/v1/incidents?state=all")[1]["incidents"]
    opened = [i["kind"] for i in incidents]
    assert opened.count("probe_down") == 1 and opened.count("target_down") == 1, opened
