"""`replaywatch watch` against real Reverb servers, over real HTTP."""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
import urllib.error
from collections.abc import Callable
from pathlib import Path

import pytest

from harness.procs import Proc, free_port, get_json, get_text, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.long]  # starts processes (see tests/conftest.py)

INTERVAL = 0.5


def _target(base: str, name: str) -> dict:
    return next(t for t in get_json(f"{base}/api/v1/targets")[1]["targets"] if t["name"] == name)


def _inserts(base: str, target: str) -> int:
    tables = get_json(f"{base}/api/v1/tables?target={target}")[1]["tables"]
    return sum(t["rate_limiter"]["inserts"] for t in tables)


def test_live_tables_and_metrics_change_between_polls(
    reverb_workload: Callable[..., tuple[Proc, str]], sidecar: Callable[..., tuple[Proc, str]],
    tmp_path: Path,
) -> None:
    _, address = reverb_workload("--tables", "2", "--insert-hz", "40")
    _, base = sidecar("--reverb", address, "--interval", str(INTERVAL), "--db",
                      str(tmp_path / "i.db"))
    first = wait_until(lambda: _inserts(base, address), timeout_s=15)
    later = wait_until(lambda: (n := _inserts(base, address)) > first and n, timeout_s=15)
    assert later > first
    tables = get_json(f"{base}/api/v1/tables")[1]["tables"]
    assert {t["name"] for t in tables} == {"table_0", "table_1"}
    derived = tables[0]["derived"]
    assert derived["cursor"] == pytest.approx(
        tables[0]["rate_limiter"]["inserts"] * tables[0]["rate_limiter"]["samples_per_insert"]
        - tables[0]["rate_limiter"]["samples"])
    assert wait_until(lambda: get_json(f"{base}/api/v1/tables")[1]["tables"][0]["derived"]
                      ["insert_rate"], timeout_s=10) > 0
    status, text = get_text(f"{base}/metrics")
    assert status == 200
    assert f'replaywatch_target_up{{target="{address}"}} 1.0' in text
    assert 'replaywatch_table_inserts_total{table="table_0"' in text
    assert 'state="waiting_for_inserts"' in text
    history = get_json(f"{base}/api/v1/tables/{address}/table_0/history?seconds=30")[1]
    assert len(history["points"]) >= 2
    stamps = [p["observed_at"] for p in history["points"]]
    assert stamps == sorted(stamps)


@pytest.mark.skipif(shutil.which("promtool") is None, reason="make test installs promtool")
def test_metrics_pass_promtool_check_metrics(
    reverb_workload: Callable[..., tuple[Proc, str]], sidecar: Callable[..., tuple[Proc, str]],
    tmp_path: Path,
) -> None:
    _, address = reverb_workload("--tables", "2")
    _, base = sidecar("--reverb", address, "--reverb", "127.0.0.1:9", "--interval",
                      str(INTERVAL), "--db", str(tmp_path / "i.db"))
    down = 'replaywatch_target_up{target="127.0.0.1:9"}'
    # Both targets' first polls done (the dead one's may finish a cycle after the live one's).
    text = wait_until(lambda: (t := get_text(f"{base}/metrics")[1])
                      and "replaywatch_table_inserts_total" in t and down in t and t, 15)
    assert f"{down} 0.0" in text  # down still answers
    done = subprocess.run(["promtool", "check", "metrics"], input=text, text=True,
                          capture_output=True, timeout=30)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.long(seconds=35)
def test_a_stopped_server_goes_down_within_two_intervals_and_comes_back(
    reverb_workload: Callable[..., tuple[Proc, str]], sidecar: Callable[..., tuple[Proc, str]],
    tmp_path: Path,
) -> None:
    port = free_port()
    victim, victim_addr = reverb_workload(port=port)
    _, other_addr = reverb_workload()
    _, base = sidecar("--reverb", victim_addr, "--reverb", other_addr, "--interval",
                      str(INTERVAL), "--db", str(tmp_path / "i.db"))
    wait_until(lambda: _target(base, victim_addr)["up"] and _target(base, other_addr)["up"], 20)
    other_before = _inserts(base, other_addr)
    victim.kill()
    killed_at = time.time()
    down = wait_until(lambda: (t := _target(base, victim_addr))["up"] is False and t, 10)
    # The first poll that failed started within two intervals of the kill on an idle machine;
    # this estimate assumes the cadence held, and beside make test's agent lanes a cycle can
    # start a second late (counted in late_polls_total), so the test allows six.
    failed_polls_at = down["last_poll_at"] - (down["consecutive_failures"] - 1) * INTERVAL
    assert failed_polls_at - killed_at <= 6 * INTERVAL
    # A killed process keeps its sockets until the kernel has torn down its memory, which
    # under load outlasts a poll's timeout: the first failure may read "connected, no
    # answer". Once the process is gone the port refuses, and the target says so.
    assert "did not answer" in down["last_error"] or "unreachable" in down["last_error"]
    wait_until(lambda: "unreachable" in _target(base, victim_addr)["last_error"], 10)
    # The other target kept its cadence and its numbers kept moving.
    wait_until(lambda: _inserts(base, other_addr) > other_before, 10)
    assert time.time() - _target(base, other_addr)["last_poll_at"] < 3 * INTERVAL
    # Restarted on the same port, it comes back up.
    reverb_workload(port=port)
    wait_until(lambda: _target(base, victim_addr)["up"], 20)


def test_sigterm_stops_the_sidecar_cleanly(
    sidecar: Callable[..., tuple[Proc, str]], tmp_path: Path
) -> None:
    proc, base = sidecar("--reverb", "127.0.0.1:9", "--db", str(tmp_path / "i.db"))
    proc.signal(signal.SIGTERM)
    assert proc.popen.wait(timeout=15) == 0


def test_metrics_from_their_own_port_match_the_apis_and_end_with_the_sidecar(
    sidecar: Callable[..., tuple[Proc, str]], tmp_path: Path
) -> None:
    mport = free_port()
    proc, base = sidecar("--reverb", "127.0.0.1:9", "--interval", str(INTERVAL), "--db",
                         str(tmp_path / "i.db"), "--metrics-listen", f"127.0.0.1:{mport}",
                         "--protect-metrics", env={"REPLAYWATCH_TOKEN": "s3cret"})
    url, auth = f"http://127.0.0.1:{mport}/metrics", {"Authorization": "Bearer s3cret"}
    # Once target_down has opened (after down_polls failed polls) the series stay the same
    # from cycle to cycle; before it, the two renders may fall either side of its opening.
    down = ('replaywatch_target_up{target="127.0.0.1:9"} 0.0',
            'replaywatch_finding_active{kind="target_down"')
    text = wait_until(lambda: (r := get_text(url, 2, auth))[0] == 200
                      and all(d in r[1] for d in down) and r[1], 20)
    api = get_text(f"{base}/metrics", 2, auth)[1]
    # Both are the poller's render of a cycle: the same series, whichever cycle each caught.
    assert _series(text) == _series(api)
    assert get_text(url, 2)[0] == 401  # --protect-metrics holds on this port too
    proc.popen.send_signal(signal.SIGKILL)
    proc.popen.wait(timeout=10)
    # The child holds the socket alone now; the pipe's end stops it and the port refuses.
    wait_until(lambda: _refused(url), 10)


def _series(exposition: str) -> set[str]:
    return {line.rsplit(" ", 1)[0] for line in exposition.splitlines()
            if line and not line.startswith("#")}


def _refused(url: str) -> bool:
    try:
        get_text(url, 1)
    except urllib.error.URLError as e:
        return isinstance(e.reason, ConnectionRefusedError)
    return False
