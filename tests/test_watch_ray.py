"""An RLlib job's cluster watched as users attach it: `replaywatch watch --ray HOST:PORT`.

Real parts, in process: the CLI's own parser, the composition root, the poller and the API
app (fastapi's TestClient); the cluster's dashboard and metrics endpoint served over real
local HTTP from documents recorded off real Ray 2.60 jobs (tests/support/ray_dashboard.py).
What the rules conclude from a Ray job's history is tests/test_rules_rllib.py's; here, that
the job reaches the history, the verdict, the API, /metrics and `check`, and that bad flags
are one line.
"""

from __future__ import annotations

import io
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from harness.procs import PYTHON, ROOT
from replaywatch.api.cache import RenderCache
from replaywatch.check import run_check
from replaywatch.cli import build_parser, config_from_args
from replaywatch.config import WatchConfig
from replaywatch.model import SourceKind
from replaywatch.watch import build_app
from replaywatch.wiring import build_sidecar
from tests.support.ray_dashboard import FIXTURES, TOKEN, Cluster

pytestmark = pytest.mark.timeout(60)
APPO_JOB = "02000000"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    served = Cluster(tmp_path, "metrics_appo.txt")
    yield served
    served.close()


def watch_config(tmp_path: Path, cluster: Cluster, *flags: str) -> WatchConfig:
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    results = tmp_path / "appo" / "result.json"
    results.parent.mkdir(exist_ok=True)
    results.write_bytes((FIXTURES / "result_appo.jsonl").read_bytes())
    args = build_parser().parse_args([
        "watch", "--ray", cluster.address, "--ray-token-file", str(token),
        "--ray-temp-dir", str(cluster.temp_dir), "--ray-results", str(results.parent),
        "--interval", "0.5", "--timeout", "3", "--db", str(tmp_path / "i.db"), *flags])
    return config_from_args(args, {})


def test_a_ray_cluster_from_the_flag_reaches_the_history_api_and_metrics(
        tmp_path: Path, cluster: Cluster) -> None:
    config = watch_config(tmp_path, cluster)
    assert config.targets == () and [r.name for r in config.ray] == [cluster.dashboard]
    with build_sidecar(config, incidents_path=":memory:") as sidecar:
        sidecar.poller.tick()
        state = sidecar.poller.tick()
        client = TestClient(build_app(sidecar, RenderCache()))
        targets = client.get("/api/v1/targets").json()
        jobs = client.get("/api/v1/ray").json()["jobs"]
        metrics = client.get("/metrics").text
        findings = client.get("/api/v1/findings")
        held = sidecar.history.ray(cluster.dashboard)
    status = state.sources[cluster.dashboard]
    assert (status.kind, status.up, status.polls_total) == (SourceKind.RAY, True, 2)
    assert [t["name"] for t in targets["ray"]] == [cluster.dashboard] and not targets["targets"]
    assert len(held) == 2 and held[-1].job_id == APPO_JOB
    (job,) = jobs
    assert job["job_id"] == APPO_JOB and job["ray_version"] == "2.60.0"
    assert {a["role"] for a in job["actors"]} >= {"env_runner", "learner"}
    assert job["tasks"] and all(t["running_for_s"] is not None for t in job["tasks"])
    assert [r["iteration"] for r in job["results"]] == [3] and job["driver_pid"]
    assert all("samples" not in c for c in job["counters"])
    assert findings.status_code == 200
    assert not state.rule_errors, state.rule_errors
    assert f'replaywatch_target_up{{target="{cluster.dashboard}"}} 1.0' in metrics
    job_labels = f'table="job:{APPO_JOB}",target="{cluster.dashboard}"'
    assert (f'replaywatch_rllib_actors{{role="env_runner",state="ALIVE",{job_labels}}} 2.0'
            in metrics)
    assert f'replaywatch_probe_up{{probe="{cluster.dashboard}"' not in metrics


def test_a_dashboard_that_is_down_is_a_down_target_with_its_reason(tmp_path: Path,
                                                                   cluster: Cluster) -> None:
    config = watch_config(tmp_path, cluster)
    cluster.close()
    with build_sidecar(config, incidents_path=":memory:") as sidecar:
        state = sidecar.poller.tick()
    status = state.sources[cluster.dashboard]
    assert status.up is False and status.last_error
    assert "state API" in status.last_error and "\n" not in status.last_error


def test_check_lists_the_ray_job(tmp_path: Path, cluster: Cluster) -> None:
    out = io.StringIO()
    run_check(watch_config(tmp_path, cluster), 0.6, as_json=True, out=out)
    doc = json.loads(out.getvalue())
    job = doc["ray"][cluster.dashboard]
    assert job["job_id"] == APPO_JOB and job["up"] is True
    assert job["results"] and len(job["results"]) == 1


@pytest.mark.slow  # a process each
@pytest.mark.parametrize("flags,said", [
    (["--ray", "not an address"], "--ray ('not an address') must be the dashboard's address"),
    (["--ray", "127.0.0.1"], "must be the dashboard's HOST:PORT"),
    (["--ray", "127.0.0.1:8265", "--ray", "http://127.0.0.1:8265"], "given twice"),
    (["--ray", "127.0.0.1:8265", "--ray-token-file", "/nonexistent/token"],
     "--ray-token-file /nonexistent/token: No such file or directory"),
])
def test_bad_ray_flags_are_one_line_and_exit_2(flags: list[str], said: str) -> None:
    done = subprocess.run([PYTHON, "-m", "replaywatch", "check", *flags, "--duration", "0.1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and said in lines[0], done.stderr
