"""/metrics from a process of its own: the child's answers, the pipe's frames, and the
child itself started, fed, killed and started again by MetricsPort."""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import urllib.error

import pytest

from harness.procs import get_text, wait_until
from replaywatch.config import ServeConfig
from replaywatch.metrics_port import HEADER, MAX_BODY, MetricsApp, MetricsPort, frames

BODY = b"# TYPE x gauge\nx 1.0\n"


def _app(body: bytes | None = BODY, token: str | None = None, protect: bool = False
         ) -> MetricsApp:
    return MetricsApp(lambda: body, token, protect)


def test_the_newest_body_is_served_with_the_exposition_type() -> None:
    status, body, headers = _app().answer("GET", "/metrics", "")
    assert (status, body) == (200, BODY)
    assert dict(headers)["Content-Type"].startswith("text/plain")


def test_before_the_first_render_it_is_503_with_a_json_error() -> None:
    status, body, _ = _app(body=None).answer("GET", "/metrics", "")
    assert status == 503
    assert "no poll cycle" in json.loads(body)["error"]


def test_any_other_path_is_404_and_another_method_405() -> None:
    status, body, _ = _app().answer("GET", "/api/v1/tables", "")
    assert status == 404 and "serves /metrics only" in json.loads(body)["error"]
    status, _, headers = _app().answer("POST", "/metrics", "")
    assert status == 405 and dict(headers)["Allow"] == "GET, HEAD"


def test_the_token_is_asked_only_when_metrics_are_protected() -> None:
    assert _app(token="s3cret", protect=False).answer("GET", "/metrics", "")[0] == 200
    guarded = _app(token="s3cret", protect=True)
    status, _, headers = guarded.answer("GET", "/metrics", "Bearer wrong")
    assert status == 401 and "WWW-Authenticate" in dict(headers)
    assert guarded.answer("GET", "/metrics", "")[0] == 401
    assert guarded.answer("GET", "/metrics", "Bearer s3cret") == (200, BODY, [
        ("Content-Type", guarded.answer("GET", "/metrics", "bearer s3cret")[2][0][1])])


def _framed(*bodies: bytes) -> bytes:
    return b"".join(HEADER.pack(len(b)) + b for b in bodies)


def test_frames_are_read_until_the_pipe_ends() -> None:
    assert list(frames(io.BytesIO(_framed(b"one", b"", b"three")))) == [b"one", b"", b"three"]


def test_a_frame_cut_short_or_too_long_ends_the_stream() -> None:
    assert list(frames(io.BytesIO(_framed(b"one") + HEADER.pack(10) + b"short"))) == [b"one"]
    assert list(frames(io.BytesIO(_framed(b"one")[:5]))) == []
    assert list(frames(io.BytesIO(HEADER.pack(MAX_BODY + 1) + b"x" * 64))) == []


def _listening() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    return sock


@pytest.mark.slow  # starts the child process
def test_the_child_serves_each_body_offered_and_is_started_again_when_it_dies() -> None:
    port = MetricsPort(_listening(), ServeConfig(token="t0k", protect_metrics=True),
                       respawn_after_s=0.2)
    url = f"http://127.0.0.1:{port.address[1]}/metrics"
    auth = {"Authorization": "Bearer t0k"}
    port.start()
    try:
        assert wait_until(lambda: _get(url, auth)[0] == 503, 15)  # nothing rendered yet
        port.offer(b"a 1\n")
        assert wait_until(lambda: _get(url, auth) == (200, "a 1\n"), 5)
        assert _get(url)[0] == 401
        port.offer(b"a 2\n")
        assert wait_until(lambda: _get(url, auth) == (200, "a 2\n"), 5)
        first = port.pid
        assert first is not None
        os.kill(first, signal.SIGKILL)
        # A render finds the pipe broken (one written before the child was gone is lost);
        # another child serves the next on the same socket. Each cycle's render is a new
        # object, as the poller's are: the same object is never handed over twice.
        wait_until(lambda: (port.offer(bytes(bytearray(b"a 3\n"))),
                            _get(url, auth) == (200, "a 3\n"))[1], 15)
        assert port.spawns == 2 and port.pid != first
    finally:
        child = port.pid
        port.close()
    assert child is not None
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)  # closing the pipe ended it, and close() reaped it


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    try:
        return get_text(url, 2.0, headers)
    except (urllib.error.URLError, ConnectionError):
        return 0, ""


def test_closed_before_it_started_it_only_closes_its_socket() -> None:
    sock = _listening()
    MetricsPort(sock, ServeConfig()).close()  # the sidecar failed to start: no child, no error
    assert sock.fileno() == -1
