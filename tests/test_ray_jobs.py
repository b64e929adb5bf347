"""`--ray-job all`: every RLlib job on a cluster found from its state API, each a target of
its own; a job whose RLlib actors all died leaves the watch after its TTL, its incidents
closed as gone; a job already dead when first seen is never watched.

The bookkeeping on its own (JobBook, RayJobs with a clock of the test's), then the CLI's flag
through the composition root to the poller's targets and the published picture, over real
local HTTP serving the actors list recorded off real Ray 2.60 jobs (two jobs: 01000000 ended,
02000000 an APPO job running), edited where the test needs the cluster to change.
"""

from __future__ import annotations

import copy
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from replaywatch.cli import build_parser, config_from_args
from replaywatch.errors import ConfigError, SourceUnreachable
from replaywatch.ray_model import ActorRole, RayActor
from replaywatch.sources import ray_jobs
from replaywatch.sources.ray_jobs import JobBook, RayJobs
from replaywatch.wiring import build_sidecar
from tests.support.ray_dashboard import FIXTURES, TOKEN, Cluster

pytestmark = pytest.mark.timeout(60)


def actor(job: str, state: str = "ALIVE", role: ActorRole = ActorRole.ENV_RUNNER) -> RayActor:
    return RayActor(f"a-{job}-{state}", "SingleAgentEnvRunner", role, state, 0, None, 7, "n",
                    job)


def test_a_job_is_kept_while_an_rllib_actor_lives_and_for_its_ttl_after() -> None:
    book = JobBook(ttl_s=60.0)
    book.see([actor("01000000", "DEAD"), actor("02000000"),
              actor("03000000", "ALIVE", ActorRole.OTHER),  # not RLlib's: no job to watch
              actor("04000000", "PENDING_CREATION")], now=0.0)
    assert book.kept(0.0) == ["02000000", "04000000"]  # the first seen dead is history
    book.see([actor("02000000", "DEAD"), actor("04000000")], now=30.0)
    # 02000000 seen dead at 30, last seen alive at 0: kept to 0 + 60
    assert book.kept(59.0) == ["02000000", "04000000"]
    assert book.kept(61.0) == ["04000000"]


def test_jobs_are_read_every_interval_said_only_when_they_change_and_kept_when_unreadable(
        ) -> None:
    listed: list[object] = [(actor("02000000"),)]
    clock = [0.0]

    def read(now: float) -> tuple[RayActor, ...]:
        got = listed[0]
        if isinstance(got, Exception):
            raise got
        return got  # type: ignore[return-value]

    jobs = RayJobs(read, every_s=10.0, ttl_s=60.0, clock=lambda: clock[0])
    assert jobs.jobs(0.0) == ["02000000"]
    clock[0] = 5.0
    listed[0] = (actor("02000000"), actor("03000000"))
    assert jobs.jobs(5.0) is None  # not due: a new job waits for the next read
    clock[0] = 10.0
    assert jobs.jobs(10.0) == ["02000000", "03000000"]
    clock[0] = 20.0
    assert jobs.jobs(20.0) is None  # unchanged: nothing to reload
    listed[0] = SourceUnreachable("unreachable (connection refused)")
    clock[0] = 100.0  # the dashboard down past every TTL: still both, and said
    assert jobs.jobs(100.0) is None
    assert jobs.book.kept(100.0 - 60.0) == ["02000000", "03000000"]
    assert jobs.last_error == "Ray job discovery: unreachable (connection refused)"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    served = Cluster(tmp_path, "metrics_appo.txt")
    yield served
    served.close()


def all_jobs(tmp_path: Path, cluster: Cluster, *flags: str):  # type: ignore[no-untyped-def]
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    args = build_parser().parse_args([
        "watch", "--ray", cluster.address, "--ray-job", "all", "--ray-token-file", str(token),
        "--ray-temp-dir", str(cluster.temp_dir), "--interval", "0.5", "--timeout", "3",
        "--db", str(tmp_path / "i.db"), *flags])
    return config_from_args(args, {})


def test_every_live_job_of_the_cluster_is_a_target_and_a_job_gone_past_its_ttl_leaves(
        tmp_path: Path, cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ray_jobs, "DISCOVER_EVERY_S", 0.0)  # read each cycle, not each 10 s
    config = all_jobs(tmp_path, cluster, "--ray-job-ttl", "0.5")
    running = f"{cluster.dashboard} job 02000000"
    with build_sidecar(config, incidents_path=str(tmp_path / "i.db")) as car:
        first = car.poller.tick()
        # the running APPO job, with its actors and its counters; the ended job is not watched
        assert sorted(first.ray) == [running]
        assert first.ray[running].job_id == "02000000"
        assert {a.job_id for a in first.ray[running].actors} == {"02000000"}
        assert first.ray[running].counters
        # A second job starts: a copy of the running one's actors under a newer job id.
        doc = json.loads((FIXTURES / "actors.json").read_text())
        rows = doc["data"]["result"]["result"]
        rows += [dict(copy.deepcopy(r), job_id="03000000", actor_id=r["actor_id"] + "3")
                 for r in rows if r["job_id"] == "02000000"]
        cluster.serve_actors(doc)
        later = _tick_until(car, lambda s: len(s.ray) == 2)
        assert sorted(later.ray) == [running, f"{cluster.dashboard} job 03000000"]
        # The first job ends as algo.stop() ends one (recorded: the ended job's causes, its
        # runners by ray.kill, its Learner exiting). Past its TTL it leaves, never paged.
        ended = {r["class_name"]: r["death_cause"] for r in rows
                 if r["job_id"] == "01000000" and r["state"] == "DEAD"}
        killed = next(c for c in ended.values() if "ray.kill" in json.dumps(c))
        for r in rows:
            if r["job_id"] == "02000000":
                r["state"], r["death_cause"] = "DEAD", ended.get(r["class_name"], killed)
        cluster.serve_actors(doc)
        seen = [_tick_until(car, lambda s: running not in s.ray)]
        assert sorted(seen[-1].ray) == [f"{cluster.dashboard} job 03000000"]
    assert not [f for f in seen[-1].findings if f.target == running]
    # What the recorded job showed while it ran (its calls running long) closed as gone, not
    # as fixed; its end opened nothing.
    closed = car.incidents.list("all", target=running)
    assert all(r["closed_as"] == "gone" for r in closed), closed
    assert "rllib_actor_down" not in {r["kind"] for r in closed}


def _tick_until(car, done, ticks: int = 40):  # type: ignore[no-untyped-def]
    for _ in range(ticks):
        state = car.poller.tick()
        if done(state):
            return state
        time.sleep(0.1)
    raise AssertionError(f"not within {ticks} ticks: {sorted(state.ray)}")


def test_results_with_every_job_are_a_directory_else_one_line(tmp_path: Path,
                                                               cluster: Cluster) -> None:
    one = tmp_path / "result.json"
    one.write_text("")
    for given in (str(one), "http://127.0.0.1:8003", str(tmp_path / "nowhere")):
        with pytest.raises(ConfigError, match="with --ray-job all it is the directory"):
            all_jobs(tmp_path, cluster, "--ray-results", given)


def _rows_of(pid: int) -> str:
    rows = [json.loads(line) for line in (FIXTURES / "result_appo.jsonl").read_text().splitlines()]
    return "".join(json.dumps(dict(r, pid=pid)) + "\n" for r in rows)


def test_every_job_reads_its_own_result_json_of_a_shared_directory(
        tmp_path: Path, cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    # Two jobs write their rows under one ~/ray_results: each is told by its first row's pid
    # (Trainable's), its driver's as Ray's job API lists it, and written since the job began.
    monkeypatch.setattr(ray_jobs, "DISCOVER_EVERY_S", 0.0)
    doc = json.loads((FIXTURES / "actors.json").read_text())
    rows = doc["data"]["result"]["result"]
    rows += [dict(copy.deepcopy(r), job_id="03000000", actor_id=r["actor_id"] + "3",
                  pid=r["pid"] + 10000) for r in rows if r["job_id"] == "02000000"]
    cluster.serve_actors(doc)
    jobs = json.loads((FIXTURES / "jobs.json").read_text())
    third = dict(copy.deepcopy(jobs[-1]), job_id="03000000")
    third["driver_info"] = dict(third["driver_info"], id="03000000", pid="4600")
    cluster.serve_jobs([*jobs, third])
    results = tmp_path / "ray_results"
    for name, pid in (("stale", 4500), ("b", 4600)):
        (results / name).mkdir(parents=True)
        (results / name / "result.json").write_text(_rows_of(pid))
    # An earlier run of a driver that had job 02000000's pid, before 02000000 started
    started = jobs[-1]["start_time"] / 1000.0
    os.utime(results / "stale" / "result.json", (started - 600, started - 600))
    config = all_jobs(tmp_path, cluster, "--ray-results", str(results))
    a, b = (f"{cluster.dashboard} job {j}" for j in ("02000000", "03000000"))
    with build_sidecar(config, incidents_path=str(tmp_path / "i.db")) as car:
        state = _tick_until(car, lambda s: len(s.ray) == 2)
        assert state.ray[b].result_file == str(results / "b" / "result.json")
        assert {r.pid for r in state.ray[b].results} == {4600}
        assert state.ray[a].results == () and state.ray[a].result_file is None
        assert any("no result.json of job 02000000 (pids " in e and "4500" in e
                   for e in state.ray[a].errors), state.ray[a].errors
        (results / "a").mkdir()
        (results / "a" / "result.json").write_text(_rows_of(4500))
        state = car.poller.tick()
        assert state.ray[a].result_file == str(results / "a" / "result.json")
        assert {r.pid for r in state.ray[a].results} == {4500}
        assert state.ray[b].result_file == str(results / "b" / "result.json")
        asked = sum(1 for path, _ in cluster.seen if path == "/api/jobs/")
        car.poller.tick()
        # Each job's driver is read until Ray lists it, then kept: no read more a cycle
        assert sum(1 for path, _ in cluster.seen if path == "/api/jobs/") == asked
