"""Property-based fuzz of the HTTP API from its own OpenAPI schema (schemathesis).

The sidecar runs as a real process watching a real Reverb workload, and every
request goes over real HTTP. No response may be a 5xx or break the schema.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from harness.procs import Proc, get_json, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.long]  # starts processes (see tests/conftest.py)


@pytest.fixture(scope="module")
def api_schema(tmp_path_factory: pytest.TempPathFactory) -> object:
    from harness.procs import PYTHON, free_port

    tmp = tmp_path_factory.mktemp("fuzz")
    workload = Proc([PYTHON, "harness/reverb_workload.py", "--tables", "2"],
                    stdout_path=tmp / "reverb.log")
    port = free_port()
    address = workload.announce()["reverb"]
    sidecar = Proc([PYTHON, "-m", "replaywatch", "watch", "--reverb", address, "--listen",
                    f"127.0.0.1:{port}", "--interval", "0.5", "--db", str(tmp / "i.db")],
                   stdout_path=tmp / "sidecar.log")
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: get_json(f"{base}/api/v1/tables")[1]["tables"], 30)
        yield schemathesis.openapi.from_url(f"{base}/openapi.json")
    finally:
        sidecar.kill()
        workload.kill()


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@pytest.mark.long(seconds=30)
@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.filter_too_much])
def test_no_request_gets_a_server_error_or_breaks_the_schema(case: object) -> None:
    case.call_and_validate()  # type: ignore[attr-defined]


def test_the_schema_lists_every_public_endpoint(tmp_path: Path,
                                               sidecar: Callable[..., tuple[Proc, str]]) -> None:
    _, base = sidecar("--reverb", "127.0.0.1:9", "--db", str(tmp_path / "i.db"))
    paths = set(get_json(f"{base}/openapi.json")[1]["paths"])
    for path in ("/healthz", "/readyz", "/api/v1/targets", "/api/v1/tables",
                 "/api/v1/tables/{target}/{table}/history", "/api/v1/probes",
                 "/api/v1/findings", "/api/v1/incidents", "/api/v1/incidents/{incident_id}"):
        assert path in paths, path
