"""Loopback by default, an optional bearer token, read-only, safe headers.

Two sidecars serve the whole module, one guarded by a token and one open: what is checked
of them reads and changes nothing, and each start costs seconds of both cores.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from harness.procs import PYTHON, Proc, free_port, get_json, get_text, wait_until

pytestmark = pytest.mark.slow  # every test here starts or reads a sidecar process

TOKEN = "s3cret-token-for-tests"


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _serve(where: Path, *flags: str) -> Iterator[tuple[Proc, str]]:
    port = free_port()
    proc = Proc([PYTHON, "-m", "replaywatch", "watch", "--listen", f"127.0.0.1:{port}",
                 "--reverb", "127.0.0.1:9", "--db", str(where / "i.db"), *flags],
                stdout_path=where / "sidecar.log")
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: get_json(f"{base}/healthz", 1.0)[0] in (200, 401), timeout_s=30)
        yield proc, base
    finally:
        proc.kill()


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Proc, str]]:
    where = tmp_path_factory.mktemp("guarded")
    (where / "token").write_text(TOKEN + "\n")
    yield from _serve(where, "--token-file", str(where / "token"))




@pytest.mark.parametrize("path", ["/api/v1/targets", "/api/v1/tables", "/api/v1/findings",
                                  "/api/v1/incidents", "/api/v1/probes", "/docs",
                                  "/openapi.json"])
def test_the_api_and_page_need_the_token(guarded: tuple[Proc, str], path: str) -> None:
    _, base = guarded
    assert get_text(base + path)[0] == 401
    assert get_text(base + path, headers=_auth("wrong"))[0] == 401
    assert get_text(base + path, headers={"Authorization": TOKEN})[0] == 401  # no scheme
    assert get_text(base + path, headers=_auth(TOKEN))[0] == 200


def test_the_page_shell_loads_without_the_token_but_holds_no_job_data(
    guarded: tuple[Proc, str]
) -> None:
    _, base = guarded
    status, html = get_text(f"{base}/")
    assert status == 200 and "127.0.0.1:9" not in html  # data comes from /api/* only
    assert get_text(f"{base}/static/status.js")[0] == 200


def test_metrics_and_health_stay_open_unless_protected(guarded: tuple[Proc, str],
                                                       sidecar: Callable[..., tuple[Proc, str]],
                                                       tmp_path: Path) -> None:
    _, base = guarded
    assert get_text(f"{base}/metrics")[0] == 200
    assert get_json(f"{base}/healthz")[0] == 200
    _, strict = sidecar("--reverb", "127.0.0.1:9", "--db", str(tmp_path / "j.db"),
                        "--protect-metrics", "--protect-healthz",
                        env={"REPLAYWATCH_TOKEN": TOKEN})
    assert get_text(f"{strict}/metrics")[0] == 401
    assert get_json(f"{strict}/readyz")[0] == 401
    assert get_text(f"{strict}/metrics", headers=_auth(TOKEN))[0] == 200


def test_the_token_never_reaches_the_log(guarded: tuple[Proc, str]) -> None:
    proc, base = guarded
    get_json(f"{base}/api/v1/targets", headers=_auth("wrong-guess"))
    get_json(f"{base}/api/v1/targets", headers=_auth(TOKEN))
    time.sleep(0.5)
    assert proc.log_path is not None
    log = proc.log_path.read_text()
    assert TOKEN not in log and "wrong-guess" not in log


def test_binds_loopback_by_default_and_warns_when_exposed_without_a_token(tmp_path: Path
                                                                         ) -> None:
    done = subprocess.run([sys.executable, "-m", "replaywatch", "watch", "--help"],
                          capture_output=True, text=True, timeout=30)
    assert "--listen" in done.stdout
    from replaywatch.config import ServeConfig

    assert ServeConfig().listen_host == "127.0.0.1"
    port = free_port()
    proc = Proc([sys.executable, "-m", "replaywatch", "watch", "--reverb", "127.0.0.1:9",
                 "--listen", f"0.0.0.0:{port}", "--db", str(tmp_path / "i.db")],
                stdout_path=tmp_path / "out.log")
    try:
        wait_until(lambda: get_json(f"http://127.0.0.1:{port}/healthz")[0] == 200, 20)
        assert "without a token" in (tmp_path / "out.log").read_text()
    finally:
        proc.kill()


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH"])
def test_no_endpoint_accepts_writes(unguarded_sidecar: tuple[Proc, str], method: str) -> None:
    import urllib.error
    import urllib.request

    _, base = unguarded_sidecar
    for path in ("/api/v1/targets", "/api/v1/findings", "/api/v1/incidents/1", "/metrics"):
        request = urllib.request.Request(base + path, method=method, data=b"{}")
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(request, timeout=5)
        assert e.value.code in (404, 405), (path, e.value.code)


def test_oversized_requests_are_refused(unguarded_sidecar: tuple[Proc, str]) -> None:
    import http.client
    import json

    _, base = unguarded_sidecar
    conn = http.client.HTTPConnection(base.removeprefix("http://"), timeout=10)
    # Announce a 100 MB body and send none: refused before anything is read.
    conn.putrequest("GET", "/api/v1/targets")
    conn.putheader("Content-Length", str(100 * 1024 * 1024))
    conn.endheaders()
    response = conn.getresponse()
    assert response.status == 413
    assert "error" in json.loads(response.read())
    conn.close()


def test_every_response_carries_the_security_headers(unguarded_sidecar: tuple[Proc, str]) -> None:
    import urllib.request

    _, base = unguarded_sidecar
    for path in ("/api/v1/targets", "/nope"):
        try:
            response = urllib.request.urlopen(base + path, timeout=5)
            headers = response.headers
        except urllib.error.HTTPError as e:  # type: ignore[name-defined]
            headers = e.headers
        assert headers["X-Content-Type-Options"] == "nosniff"
        assert headers["X-Frame-Options"] == "DENY"
        csp = headers["Content-Security-Policy"]
        assert "script-src 'self'" in csp and "unsafe-inline" not in csp
