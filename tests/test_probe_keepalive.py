"""The probe's lean HTTP/1.1 server and the sidecar's kept-alive connection to it.

Real sockets against a real TrainerProbe: the raw requests below are what a
client can send, and the sidecar's `HttpProbeSource` is the client that matters.
"""

from __future__ import annotations

import http.client
import json
import socket
from collections.abc import Iterator

import pytest

from replaywatch.probe import TrainerProbe
from replaywatch.sources.probe_http import HttpProbeSource


@pytest.fixture
def probe() -> Iterator[TrainerProbe]:
    p = TrainerProbe(batch_size=4, num_parallel_calls=1, listen="127.0.0.1:0")
    p.start()
    yield p
    p.stop()


def _raw(probe: TrainerProbe, request: bytes) -> bytes:
    """Sends `request` on a fresh socket and reads until the probe closes it."""
    port = int(str(probe.url).rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(request)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def _local_port(source: HttpProbeSource) -> int:
    conn = source._conn._conn if source._conn is not None else None  # noqa: SLF001
    assert conn is not None and conn.sock is not None
    return int(conn.sock.getsockname()[1])


def test_the_sidecar_polls_a_probe_over_one_kept_alive_connection(probe: TrainerProbe) -> None:
    source = HttpProbeSource(str(probe.url), timeout_s=2.0)
    try:
        assert source.poll().ok
        port = _local_port(source)
        for _ in range(5):
            assert source.poll().ok
        assert _local_port(source) == port  # no new connection, so no new handler thread
    finally:
        source.close()


def test_a_stopped_probe_ends_kept_alive_connections_and_a_restarted_one_is_reconnected(
        probe: TrainerProbe) -> None:
    source = HttpProbeSource(str(probe.url), timeout_s=2.0)
    listen = str(probe.url).removeprefix("http://")
    try:
        assert source.poll().ok
        probe.stop()
        out = source.poll()
        assert not out.ok and out.error is not None and "unreachable" in out.error
        again = TrainerProbe(batch_size=4, listen=listen)
        again.start()
        try:
            out = source.poll()
            assert out.ok and out.probe is not None and out.probe.pipeline.batch_size == 4
        finally:
            again.stop()
    finally:
        source.close()


def test_two_requests_on_one_http11_connection_both_get_json(probe: TrainerProbe) -> None:
    port = int(str(probe.url).rsplit(":", 1)[1])
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        for path, status in (("/probe", 200), ("/nope", 404), ("/probe?x=1", 200)):
            conn.request("GET", path)
            response = conn.getresponse()
            doc = json.loads(response.read())
            assert response.status == status and not response.will_close
            assert response.getheader("Content-Type") == "application/json"
            assert response.getheader("Cache-Control") == "no-store"
            assert ("batches_retrieved" in doc) == (status == 200)
    finally:
        conn.close()


@pytest.mark.parametrize(("request_bytes", "status"), [
    (b"GET /probe HTTP/1.0\r\n\r\n", b"200"),  # 1.0: answered, then closed
    (b"GET /probe HTTP/1.1\r\nConnection: close\r\n\r\n", b"200"),
    (b"HEAD /probe HTTP/1.1\r\nConnection: close\r\n\r\n", b"501"),
    (b"POST /probe HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc", b"405"),  # body: closed
    (b"GARBAGE\r\n\r\n", b"400"),
    (b"GET /" + b"x" * 9000 + b" HTTP/1.1\r\n\r\n", b"414"),
    (b"GET /probe HTTP/1.1\r\n" + b"X-A: b\r\n" * 101 + b"\r\n", b"431"),
])
def test_each_request_gets_one_json_answer_and_a_closing_one_closes(
        probe: TrainerProbe, request_bytes: bytes, status: bytes) -> None:
    answer = _raw(probe, request_bytes)  # returns only because the probe closed the socket
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.split(b" ", 2)[1] == status
    assert isinstance(json.loads(body), dict)
    assert answer.count(b"HTTP/1.1 ") == 1
