"""Bad input gets one clear line and exit code 2, or an HTTP 4xx with a JSON body."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from harness.procs import Proc, get_json

pytestmark = pytest.mark.slow  # starts processes (see tests/conftest.py)


def _run(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "replaywatch", *args], capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.parametrize(
    "args, message",
    [
        (["watch", "--reverb", "localhost"], "must be HOST:PORT"),
        (["watch", "--reverb", "localhost:99999"], "1-65535"),
        (["watch", "--reverb", "::1:80"], "brackets"),
        (["watch", "--reverb", "a b:80"], "invalid host"),
        (["watch"], "at least one --reverb"),
        (["watch", "--reverb", "h:1", "--reverb", "h:1"], "given twice"),
        (["watch", "--reverb", "h:1", "--interval", "0"], "positive number"),
        (["watch", "--reverb", "h:1", "--interval", "-1"], "positive number"),
        (["watch", "--reverb", "h:1", "--interval", "nan"], "positive number"),
        (["watch", "--reverb", "h:1", "--bogus"], "unrecognized arguments"),
        (["watch", "--reverb", "h:1", "--probe", "ftp://x"], "http URL"),
        (["watch", "--reverb", "h:1", "--probe", "http://p:1/a b"], "spaces"),
        (["watch", "--reverb", "h:1", "--reverb", "h:2", "--probe", "http://p:1"], "TARGET=URL"),
        (["watch", "--reverb", "h:1", "--probe", "h:3=http://p:1"], "is not a --reverb"),
        (["watch", "--reverb", "h:1", "--listen", "nowhere"], "listen"),
        (["watch", "--reverb", "h:1", "--metrics-listen", "nowhere"], "--metrics-listen"),
        (["watch", "--reverb", "h:1", "--config", "/nonexistent.toml"], "config file"),
        (["watch", "--reverb", "h:1", "--stall-window-s", "-3"], "positive number"),
        (["watch", "--reverb", "h:1", "--token-file", "/nonexistent"], "token file"),
        (["watch", "--reverb", "h:1", "--max-in-flight", "0"], "at least 1"),
        (["watch", "--reverb", "h:1", "--max-in-flight", "many"], "whole number"),
        (["check", "--reverb", "h:1", "--duration", "0"], "positive number"),
        (["frobnicate"], "invalid choice"),
    ],
)
def test_bad_command_lines_get_one_line_and_exit_2(args: list[str], message: str) -> None:
    done = _run(*args)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert message in lines[0]
    assert "Traceback" not in done.stderr


def test_bad_config_file_is_named_in_the_error(tmp_path: Path) -> None:
    bad = tmp_path / "c.toml"
    bad.write_text("[thresholds]\nstall_window_s = 'x'\nnope = 1\n")
    done = _run("watch", "--reverb", "h:1", "--config", str(bad))
    assert done.returncode == 2 and "unknown threshold 'nope'" in done.stderr
    bad.write_text("[thresholds\n")
    done = _run("watch", "--reverb", "h:1", "--config", str(bad))
    assert done.returncode == 2 and "not valid TOML" in done.stderr


def test_a_port_in_use_is_one_line(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        done = _run("watch", "--reverb", "h:1", "--listen", f"127.0.0.1:{port}", "--db",
                    str(tmp_path / "i.db"))
    assert done.returncode == 2 and "cannot listen" in done.stderr
    assert "Traceback" not in done.stderr


def test_check_on_an_unreachable_target_reports_down_without_hanging() -> None:
    done = _run("check", "--reverb", "127.0.0.1:9", "--duration", "1", "--interval", "0.5")
    assert done.returncode == 0, done.stderr
    assert "DOWN" in done.stdout and "unreachable" in done.stdout


@pytest.mark.parametrize(
    "path, status",
    [
        ("/api/v1/tables/127.0.0.1:9/nope/history", 404),
        ("/api/v1/tables/nope/nope/history", 404),
        ("/api/v1/tables/127.0.0.1:9/t/history?seconds=abc", 400),
        ("/api/v1/tables/127.0.0.1:9/t/history?seconds=-5", 400),
        ("/api/v1/tables/127.0.0.1:9/t/history?seconds=1e9", 400),
        ("/api/v1/tables/127.0.0.1:9/t/history?seconds=inf", 400),
        ("/api/v1/tables?target=nope", 404),
        ("/api/v1/findings?severity=fatal", 400),
        ("/api/v1/findings?state=bogus", 400),
        ("/api/v1/incidents/0", 400),
        ("/api/v1/incidents/99999", 404),
        ("/api/v1/incidents/abc", 400),
        ("/api/v1/incidents?limit=100000", 400),
        ("/api/v1/nope", 404),
        ("/api/v1/tables?target=" + "x" * 5000, 400),
    ],
)
def test_bad_http_requests_get_4xx_with_a_json_error(
    unguarded_sidecar: tuple[Proc, str], path: str, status: int
) -> None:
    _, base = unguarded_sidecar
    got, body = get_json(base + path)
    assert got == status, body
    assert isinstance(body, dict) and isinstance(body.get("error"), str), body
