"""The Ray/RLlib source reads documents recorded from real Ray 2.60 jobs, and a cluster's
dashboard and metrics served over real local HTTP.

The fixtures in tests/fixtures/ray/ were recorded from harness/rllib_job.py on one cluster of
our own (`ray start --head`, token authentication on): a DQN job (job 01000000: 2 EnvRunners,
1 Learner actor) ran 4 iterations and ended, then an APPO job (job 02000000: 2 EnvRunners, 1
Learner actor, 1 aggregator) ran while the documents were read. So the actors list holds
the DQN job's dead actors beside APPO's live ones, and APPO's metrics page still exports the
series of DQN's dead workers, as a real cluster does. The metrics pages are trimmed to the
families the source keeps and the result rows' config to the keys it reads. workers.json and
actors_with_learner.json were read together off a later cluster of ours (a DQN job 01000000,
one EnvRunner and one Learner actor, neither in a call at that instant). jobs.json is Ray's
job API (`/api/jobs/`) as a driver of ours on a Ray 2.60 cluster read it, its one row edited
into the two jobs above (their ids, their drivers' pids as the result rows name them, their
starts and ends).
"""

from __future__ import annotations

import concurrent.futures
import json
import math
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from replaywatch.ray_model import ActorRole, RaySnapshot, role_of_class
from replaywatch.sources.ray_cluster import (
    SD_FILE,
    RayClusterSource,
    driver_worker_id,
    find_token,
    join_counters,
    kept_text,
    newest_rllib_job,
    parse_actors,
    parse_metrics,
    parse_tasks,
    parse_workers,
)
from replaywatch.sources.ray_results import ResultTail, parse_result_row
from replaywatch.sources.ray_shared import ClusterReads
from tests.support.ray_dashboard import FIXTURES, TOKEN, Cluster

pytestmark = pytest.mark.timeout(60)

DQN_JOB, APPO_JOB = "01000000", "02000000"


def load(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


def rows(name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (FIXTURES / name).read_text().splitlines()]


# A poll's time: ten seconds after the last recorded task started.
NOW = max(r["start_time_ms"] for r in load("tasks.json")["data"]["result"]["result"]) / 1e3 + 10


# --- the state API ---------------------------------------------------------------------------

def test_actors_read_with_their_role_from_the_class_name_and_restarts_as_an_int() -> None:
    actors = parse_actors(load("actors.json"), now=0.0)
    by_role = {a.role for a in actors if a.job_id == APPO_JOB}
    assert by_role == {ActorRole.ENV_RUNNER, ActorRole.LEARNER, ActorRole.AGGREGATOR,
                       ActorRole.OTHER}
    learner = next(a for a in actors if a.job_id == APPO_JOB and a.role == ActorRole.LEARNER)
    assert learner.class_name.endswith("._WrappedExecutable") and "Learner" not in (
        learner.class_name)
    assert all(isinstance(a.num_restarts, int) for a in actors)
    assert all(a.pid for a in actors if a.alive)


def test_the_dead_actors_of_an_ended_job_say_why_in_one_line() -> None:
    dead = [a for a in parse_actors(load("actors.json"), 0.0) if a.job_id == DQN_JOB]
    assert dead and all(a.state == "DEAD" for a in dead)
    assert all(a.death_cause and "\n" not in a.death_cause for a in dead)
    learner = next(a for a in dead if a.role == ActorRole.LEARNER)
    assert learner.death_cause is not None and learner.death_cause.startswith("WORKER_DIED")
    runner = next(a for a in dead if a.role == ActorRole.ENV_RUNNER)
    assert "ray.kill" in (runner.death_cause or "")


def test_the_newest_job_with_a_live_rllib_actor_is_chosen_over_an_ended_one() -> None:
    actors = parse_actors(load("actors.json"), 0.0)
    assert {a.job_id for a in actors} >= {DQN_JOB, APPO_JOB}
    assert newest_rllib_job(actors) == APPO_JOB
    # Once APPO's actors die too, no job has a live one.
    assert newest_rllib_job(a for a in actors if a.job_id == DQN_JOB) is None


@pytest.mark.parametrize(("class_name", "role"), [
    ("SingleAgentEnvRunner", ActorRole.ENV_RUNNER),
    ("MultiAgentEnvRunner", ActorRole.ENV_RUNNER),
    ("create_executable_class.<locals>._WrappedExecutable", ActorRole.LEARNER),
    ("DQNTorchLearner", ActorRole.LEARNER),
    ("AggregatorActor", ActorRole.AGGREGATOR),
    ("EnvRunnerStateServer", ActorRole.OTHER),
    ("DQN", ActorRole.OTHER),
])
def test_a_role_is_told_by_the_class_name(class_name: str, role: ActorRole) -> None:
    assert role_of_class(class_name) is role


def test_running_tasks_are_aged_from_their_start_at_the_observed_time() -> None:
    doc = load("tasks.json")
    started = max(r["start_time_ms"] for r in doc["data"]["result"]["result"])
    tasks = parse_tasks(doc, now=started / 1000 + 42.5)
    assert tasks and all(t.job_id == APPO_JOB and t.worker_pid for t in tasks)
    assert sum(1 for t in tasks if t.worker_id) == 2  # the EnvRunners' apply calls
    # The youngest call started last; the others have run longer.
    assert min(t.running_for_s or 0.0 for t in tasks) == pytest.approx(42.5)
    assert all(t.running_for_s is not None and t.running_for_s >= 42.5 for t in tasks)
    assert {t.role for t in tasks} == {ActorRole.ENV_RUNNER, ActorRole.OTHER}


def test_creation_tasks_name_each_live_actors_pid_but_not_its_worker_id() -> None:
    # Why the join to metric series comes from running tasks only: Ray 2.60 lists an
    # actor's creation task with its worker_pid and no worker_id.
    actors = {a.actor_id: a for a in parse_actors(load("actors.json"), 0.0)
              if a.job_id == APPO_JOB and a.alive}
    made = {t.actor_id: t for t in parse_tasks(load("creation_tasks.json"), 0.0)}
    assert set(actors) <= set(made)
    assert all(made[a].worker_pid == actors[a].pid and made[a].worker_id is None
               for a in actors)


def test_a_failed_state_answer_is_a_protocol_error() -> None:
    from replaywatch.errors import SourceProtocolError

    with pytest.raises(SourceProtocolError, match="not a state API answer: too many"):
        parse_actors({"result": False, "msg": "too many", "data": {}}, 0.0)


# --- the metrics -----------------------------------------------------------------------------

def test_a_dqn_page_reads_each_process_counters_by_its_tag() -> None:
    page = parse_metrics((FIXTURES / "metrics_dqn.txt").read_text())
    assert page.ray_version == "2.60.0"
    runners = [c for c in page.counters if c.rllib == "SingleAgentEnvRunner"]
    assert len(runners) == 2 and all(c.env_steps_sampled and c.env_steps_sampled > 0
                                     for c in runners)
    learner = next(c for c in page.counters if c.rllib == "_WrappedExecutable")
    assert learner.env_steps_trained and learner.env_steps_trained > 0
    assert learner.learner_updates and learner.role == ActorRole.LEARNER
    algo = next(c for c in page.counters if c.rllib == "DQN")
    assert algo.worker_id == driver_worker_id(DQN_JOB)
    assert algo.iterations is not None and algo.iterations >= 2 and algo.missing == ()
    # No circular buffer in DQN: nothing says it, so nothing is made up.
    assert all(c.circular_buffer_dropped is None for c in page.counters)
    assert all(not c.joined for c in page.counters)


def test_appo_counts_its_driver_loop_and_says_nothing_it_has_not_exported() -> None:
    page = parse_metrics((FIXTURES / "metrics_appo.txt").read_text())
    algo = next(c for c in page.counters if c.rllib == "APPO")
    assert algo.worker_id == driver_worker_id(APPO_JOB) and algo.training_steps
    assert algo.zero_input_batches and algo.input_batches is None  # none sent yet
    # Recorded 3 iterations in, on a loaded machine: APPO's EnvRunners, learner thread and
    # circular buffer had exported no series yet (the EnvRunner series are DQN's dead
    # workers'), and nothing stands in for them.
    assert not {"IMPALA/LearnerThread", "CircularBuffer"} & {c.rllib for c in page.counters}
    assert all(c.learner_thread_steps is None and c.circular_buffer_dropped is None
               for c in page.counters)


def test_a_missing_metric_is_none_and_named_never_zero() -> None:
    text = "\n".join(line for line in (FIXTURES / "metrics_dqn.txt").read_text().splitlines()
                     if "num_env_steps_sampled_counter" not in line)
    runners = [c for c in parse_metrics(text).counters if c.rllib == "SingleAgentEnvRunner"]
    assert runners and all(c.env_steps_sampled is None for c in runners)
    assert all(c.missing == ("env_steps_sampled",) for c in runners)


def test_only_the_rllib_and_ray_actors_families_are_kept_without_buckets() -> None:
    page = ("# HELP ray_tasks Tasks\n# TYPE ray_tasks gauge\nray_tasks{State=\"RUNNING\"} 3.0\n"
            "# TYPE ray_actors gauge\nray_actors{JobId=\"02000000\",Name=\"A\",State=\"X\"} 1.0\n"
            "# TYPE ray_actors_extra gauge\nray_actors_extra 1.0\n"
            "# TYPE ray_rllib_t histogram\nray_rllib_t_bucket{le=\"1\",WorkerId=\"w\"} 1.0\n"
            "ray_rllib_t_count{WorkerId=\"w\",rllib=\"DQN\"} 1.0\n")
    kept = kept_text(page)
    assert "ray_tasks" not in kept and "ray_actors_extra" not in kept and "_bucket" not in kept
    assert "ray_actors{" in kept and "ray_rllib_t_count" in kept
    parsed = parse_metrics(page)
    assert [c.samples for c in parsed.counters] == [(("ray_rllib_t_count", 1.0),)]
    assert [(c.job_id, c.count) for c in parsed.actor_counts] == [("02000000", 1.0)]


def test_series_of_workers_not_live_in_the_job_are_dropped_once_every_actor_is_joined() -> None:
    page = parse_metrics((FIXTURES / "metrics_appo.txt").read_text())
    live = {driver_worker_id(APPO_JOB)} | {
        t.worker_id for t in parse_tasks(load("tasks.json"), 0.0) if t.worker_id}
    kept, dropped = join_counters(page.counters, live, complete=True)
    assert dropped > 0  # DQN's dead workers, still exported
    assert kept and all(c.joined for c in kept)
    assert [c.rllib for c in kept] == ["APPO"] and dropped == 5  # DQN: driver x2, 3 workers
    assert not any(c.rllib == "DQN" for c in kept)
    unjoined, none_dropped = join_counters(page.counters, set(), complete=False)
    assert none_dropped == 0 and len(unjoined) == len(page.counters)


# --- the result rows -------------------------------------------------------------------------

def test_a_dqn_row_reads_its_replay_counters_and_config() -> None:
    first, second = (parse_result_row(r) for r in rows("result_dqn.jsonl")[:2])
    assert (first.iteration, second.iteration) == (1, 2)
    assert second.time_this_iter_s and second.time_this_iter_s > 0 and second.pid
    assert second.replay_env_steps_added_lifetime is not None
    assert second.replay_env_steps_added_lifetime >= first.replay_env_steps_added_lifetime
    assert second.env_steps_sampled_lifetime and second.env_steps_sampled
    assert second.env_steps_trained_lifetime is not None
    assert second.replay_capacity == 5000 and second.num_steps_sampled_before_learning_starts == 200
    assert second.num_env_runners == 2 and second.num_learners == 1
    assert second.train_batch_size_per_learner == 64
    assert second.rollout_fragment_length is None and second.rollout_fragment_length_auto
    # The recorded rows keep only the config keys read then; a real row's config has n_step,
    # DQN's "auto" fragment (an int, or a range sampled per episode).
    assert parse_result_row({"config": {"n_step": 3}}).n_step == 3
    assert parse_result_row({"config": {"n_step": [1, 3]}}).n_step is None
    assert second.num_envs_per_env_runner == 1 and second.training_intensity is None
    assert second.num_healthy_workers == 2 and second.num_remote_worker_restarts == 0
    # APPO's learner thread keys are not DQN's: absent, so None.
    assert second.learner_thread_out_queue_size is None


def test_an_appo_row_reads_its_learner_group_and_no_replay() -> None:
    row = parse_result_row(rows("result_appo.jsonl")[-1])
    assert row.iteration == 3 and row.learner_group_ts_dropped_lifetime == 0.0
    assert row.num_healthy_workers == 2 and row.num_env_runners == 2
    # No learner results had come back yet on this loaded machine: absent, so None.
    assert row.learner_thread_out_queue_size is None and row.env_steps_trained is None
    assert row.replay_env_steps_added is None and row.replay_capacity is None


def test_nan_in_a_row_is_read_as_none() -> None:
    # A hung APPO learner's values are NaN; Tune's encoder writes them as NaN.
    line = json.dumps(rows("result_appo.jsonl")[-1])
    hung = line.replace('"learner_group_ts_dropped_lifetime": 0.0',
                        '"learner_group_ts_dropped_lifetime": NaN', 1)
    assert hung != line
    row = parse_result_row(json.loads(hung))
    assert row.learner_group_ts_dropped_lifetime is None and row.iteration == 3


def test_a_row_that_is_not_an_object_is_refused() -> None:
    with pytest.raises(ValueError):
        parse_result_row([1, 2])


def _lines(name: str) -> list[bytes]:
    return [line + b"\n" for line in (FIXTURES / name).read_bytes().splitlines()]


def test_result_json_is_tailed_leaving_a_partial_line_for_the_next_poll(tmp_path: Path) -> None:
    one, two, three = _lines("result_dqn.jsonl")[:3]
    path = tmp_path / "result.json"
    path.write_bytes(one + two[:100])
    tail = ResultTail(path)
    got, file, errors = tail.read()
    assert [r.iteration for r in got] == [1] and file == str(path) and errors == ()
    with path.open("ab") as f:
        f.write(two[100:] + three)
    assert [r.iteration for r in tail.read()[0]] == [1, 2, 3]
    assert [r.iteration for r in tail.read()[0]] == [1, 2, 3]  # nothing new, nothing twice


def test_a_truncated_or_replaced_result_file_is_read_again_from_its_start(
        tmp_path: Path) -> None:
    one, two, three = _lines("result_dqn.jsonl")[:3]
    path = tmp_path / "result.json"
    path.write_bytes(one + two + three)
    tail = ResultTail(path)
    assert len(tail.read()[0]) == 3
    path.write_bytes(one)  # truncated: a new run in the same file
    assert [r.iteration for r in tail.read()[0]] == [1]
    (tmp_path / "new.json").write_bytes(one + two)
    os.replace(tmp_path / "new.json", path)  # another inode
    assert [r.iteration for r in tail.read()[0]] == [1, 2]


def test_a_directory_is_searched_for_its_newest_result_json(tmp_path: Path) -> None:
    old, new = tmp_path / "exp" / "trial_a", tmp_path / "exp" / "trial_b"
    old.mkdir(parents=True), new.mkdir(parents=True)
    (old / "result.json").write_bytes(b"".join(_lines("result_dqn.jsonl")))
    (new / "result.json").write_bytes(b"".join(_lines("result_appo.jsonl")[:1]))
    os.utime(old / "result.json", (1.0, 1.0))
    got, file, errors = ResultTail(tmp_path).read()
    assert file == str(new / "result.json") and len(got) == 1 and errors == ()
    assert got[0].replay_capacity is None and got[0].iteration == 1


def test_no_result_file_and_a_bad_line_are_said(tmp_path: Path) -> None:
    assert ResultTail(tmp_path / "result.json").read()[2] == (
        f"results: no result.json at {tmp_path / 'result.json'}",)
    path = tmp_path / "result.json"
    path.write_bytes(b"not json\n" + _lines("result_dqn.jsonl")[0])
    got, _, errors = ResultTail(path).read()
    assert len(got) == 1 and errors == (f"results: {path}: 1 lines not a JSON object, skipped",)


# --- the token -------------------------------------------------------------------------------

def test_the_token_is_found_in_rays_order(tmp_path: Path) -> None:
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text("from-home\n")
    (tmp_path / "t").write_text(" from-path ")
    env = {"RAY_AUTH_TOKEN": "from-env", "RAY_AUTH_TOKEN_PATH": str(tmp_path / "t")}
    assert find_token("from-flag", env, tmp_path) == ("from-flag", "the flag")
    assert find_token(None, env, tmp_path) == ("from-env", "RAY_AUTH_TOKEN")
    del env["RAY_AUTH_TOKEN"]
    assert find_token(None, env, tmp_path) == ("from-path", str(tmp_path / "t"))
    assert find_token(None, {}, tmp_path)[0] == "from-home"
    token, said = find_token(None, {}, tmp_path / "nobody")
    assert token is None and said.startswith("no token in the flag, RAY_AUTH_TOKEN, ")


# --- the source, over real HTTP --------------------------------------------------------------

@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    served = Cluster(tmp_path, "metrics_appo.txt")
    yield served
    served.close()


def _source(cluster: Cluster, tmp_path: Path, **kwargs: Any) -> RayClusterSource:
    kwargs.setdefault("token", TOKEN)
    return RayClusterSource(cluster.dashboard, temp_dir=cluster.temp_dir, environ={},
                            home=tmp_path / "home", **kwargs)


def _results(tmp_path: Path) -> Path:
    path = tmp_path / "appo" / "result.json"
    path.parent.mkdir()
    path.write_bytes((FIXTURES / "result_appo.jsonl").read_bytes())
    return path


def test_a_poll_reads_the_newest_jobs_actors_calls_live_series_and_rows(
        cluster: Cluster, tmp_path: Path) -> None:
    source = _source(cluster, tmp_path, results=_results(tmp_path))
    snap = source.poll(now=NOW)
    # Only the EnvRunners were in a call: the learner's and the aggregator's WorkerIds
    # stay unknown, so no series can be told dead and none is dropped, and that is said.
    assert snap.errors == ("metrics: 5 RLlib series kept unjoined: the state API named the "
                           "WorkerId of 2 of 4 live actors of job 02000000",)
    assert snap.job_id == APPO_JOB and snap.target == cluster.dashboard
    assert snap.actors and {a.job_id for a in snap.actors} == {APPO_JOB}
    assert {a.role for a in snap.actors if a.worker_id} == {ActorRole.ENV_RUNNER}
    assert snap.tasks and all(t.running_for_s is not None for t in snap.tasks)
    assert [c.rllib for c in snap.counters if c.joined] == ["APPO"]
    assert snap.series_dropped == 0 and len(snap.counters) == 6
    assert {c.job_id for c in snap.actor_counts} == {APPO_JOB}
    assert (snap.metrics_targets, snap.metrics_targets_refused) == (2, 1)
    assert snap.ray_version == "2.60.0"
    assert [r.iteration for r in snap.results] == [1, 2, 3]
    assert snap.driver_pid == snap.results[-1].pid and snap.driver_pid
    state_calls = [(p, a) for p, a in cluster.seen if p.startswith("/api/")]
    assert all(a == f"Bearer {TOKEN}" for _, a in state_calls)
    assert all(f"filter_values={APPO_JOB}" in p for p, _ in state_calls if "tasks" in p)


def test_a_job_named_is_watched_even_when_its_actors_are_dead(
        cluster: Cluster, tmp_path: Path) -> None:
    snap = _source(cluster, tmp_path, job_id=DQN_JOB).poll(now=NOW)
    assert snap.job_id == DQN_JOB and snap.actors and not any(a.alive for a in snap.actors)
    assert {c.worker_id for c in snap.counters} == {driver_worker_id(DQN_JOB)}
    assert all(c.rllib != "APPO" for c in snap.counters)


def test_no_token_is_a_401_line_in_errors_and_the_metrics_still_read(
        cluster: Cluster, tmp_path: Path) -> None:
    snap = _source(cluster, tmp_path, token=None).poll(now=NOW)
    assert snap.job_id is None and snap.actors == () and snap.tasks == ()
    assert snap.errors[0] == (
        f"state API: {cluster.dashboard}/api/v0/actors: HTTP 401 Unauthorized: Missing "
        f"authentication token (no token in the flag, RAY_AUTH_TOKEN, "
        f"{tmp_path / 'home' / '.ray' / 'auth_token'})")
    assert snap.counters and not any(c.joined for c in snap.counters)
    assert any(e.startswith("metrics: ") and e.endswith(
        "kept unjoined: no job's live workers to join them to") for e in snap.errors)
    assert all("\n" not in e for e in snap.errors)


def test_a_wrong_token_is_a_403_line_naming_where_the_token_came_from(
        cluster: Cluster, tmp_path: Path) -> None:
    snap = _source(cluster, tmp_path, token=None).poll(now=NOW)
    env_snap = RayClusterSource(cluster.dashboard, temp_dir=cluster.temp_dir,
                                environ={"RAY_AUTH_TOKEN": "stale"}, home=tmp_path).poll(NOW)
    assert "HTTP 401" in snap.errors[0]
    assert env_snap.errors[0].endswith(
        "HTTP 403 Forbidden: Invalid authentication token (token from RAY_AUTH_TOKEN)")


def test_a_missing_service_discovery_file_is_said_and_the_rest_is_read(
        cluster: Cluster, tmp_path: Path) -> None:
    (cluster.temp_dir / SD_FILE).unlink()
    snap = _source(cluster, tmp_path).poll(now=NOW)
    assert snap.errors == (f"metrics: no service-discovery file at {cluster.temp_dir / SD_FILE}",)
    assert snap.job_id == APPO_JOB and snap.actors and snap.counters == ()


def test_only_refused_targets_are_said_once(cluster: Cluster, tmp_path: Path) -> None:
    (cluster.temp_dir / SD_FILE).write_text(json.dumps([{"targets": [cluster.refused]}]))
    snap = _source(cluster, tmp_path).poll(now=NOW)
    assert (snap.metrics_targets, snap.metrics_targets_refused) == (1, 1)
    assert snap.errors == (f"metrics: every target of {cluster.temp_dir / SD_FILE} refused (1)",)


def test_a_dashboard_that_is_down_and_a_slow_target_are_lines_not_exceptions(
        tmp_path: Path) -> None:
    slow = Cluster(tmp_path, "metrics_dqn.txt", delay_s=2.0)
    try:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            down = f"127.0.0.1:{s.getsockname()[1]}"
        source = RayClusterSource(down, token=TOKEN, temp_dir=tmp_path, timeout_s=0.5,
                                  scrape_timeout_s=0.3, environ={}, home=tmp_path)
        snap = source.poll(now=NOW)
    finally:
        slow.close()
    assert snap.errors[0].startswith(f"state API: http://{down}/api/v0/actors: unreachable")
    assert f"metrics: {slow.address}/metrics: did not answer within 0.3s" in snap.errors
    assert snap.metrics_targets_refused == 1 and snap.counters == ()
    assert isinstance(snap, RaySnapshot) and not math.isnan(snap.observed_at)


def test_a_token_revoked_mid_run_keeps_the_job_and_says_why(
        cluster: Cluster, tmp_path: Path) -> None:
    source = _source(cluster, tmp_path)
    first = source.poll(now=NOW)
    cluster.server.RequestHandlerClass.token = "rotated"  # type: ignore[attr-defined]
    second = source.poll(now=NOW + 5)
    assert any(a.worker_id for a in first.actors)
    # Without the actors no series can be told live: all kept, none joined, and said.
    assert second.job_id == APPO_JOB and second.actors == () and second.series_dropped == 0
    assert len(second.counters) == len(first.counters) and not any(
        c.joined for c in second.counters)
    assert "HTTP 403 Forbidden" in second.errors[0] and "(token from the flag)" in second.errors[0]


def test_the_workers_api_names_the_worker_of_an_actor_never_seen_in_a_call() -> None:
    workers = parse_workers(load("workers.json"))
    actors = parse_actors(load("actors_with_learner.json"), 0.0)
    assert len(workers) == 3 and driver_worker_id("01000000") in workers.values()
    assert all((a.node_id, a.pid) in workers for a in actors if a.alive)
    from replaywatch.errors import SourceProtocolError
    with pytest.raises(SourceProtocolError):
        parse_workers({"data": {"result": {"result": [{"pid": 1}]}}})


def test_a_job_whose_actors_were_never_in_a_call_is_joined_through_the_workers_api(
        cluster: Cluster, tmp_path: Path) -> None:
    # Short calls (a DQN EnvRunner's sample) are rarely caught running: without the workers
    # API no series could be told another job's, and a cluster's jobs were counted as one.
    cluster.serve_actors(load("actors_with_learner.json"))
    source = _source(cluster, tmp_path, job_id="01000000")
    snap = source.poll(now=NOW)
    assert all(a.worker_id for a in snap.actors if a.alive), snap.actors
    assert not any("unjoined" in e for e in snap.errors), snap.errors
    # Only the job's own driver's series stay; the APPO page's other workers are not its own
    assert {c.worker_id for c in snap.counters} == {driver_worker_id("01000000")}
    asked = [p for p, _ in cluster.seen if p.startswith("/api/v0/workers?")]
    source.poll(now=NOW + 1)
    again = [p for p, _ in cluster.seen if p.startswith("/api/v0/workers?")]
    assert len(asked) == 1 and again == asked, "asked again once every WorkerId was known"


def test_the_jobs_of_one_cluster_share_the_reads_that_are_the_same_for_each(
        cluster: Cluster, tmp_path: Path) -> None:
    """Four job sources of one cluster polled together (as a cycle polls them): the actors
    list, the live workers and the metrics page are read once and handed to the other
    three, each job's own running calls are still its own read, and each snapshot is the
    one a source reading alone makes. A dashboard that is down is one failed read for all,
    said by each."""
    shared = ClusterReads(fresh_s=0.5)
    alone = _source(cluster, tmp_path, job_id=APPO_JOB).poll(now=NOW)
    cluster.seen.clear()
    sources = [_source(cluster, tmp_path, job_id=APPO_JOB, shared=shared) for _ in range(4)]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        snaps = list(pool.map(lambda s: s.poll(now=NOW), sources))
    paths = [p for p, _ in cluster.seen]
    assert sum(p.startswith("/api/v0/actors?") for p in paths) == 1
    assert sum(p.startswith("/api/v0/workers?") for p in paths) == 1  # the learner's id
    assert paths.count("/metrics") == 1
    assert sum("filter_values=RUNNING" in p for p in paths) == 4  # each job's own calls
    assert (shared.reads, shared.handed) == (3, 9)
    assert all(s == alone for s in snaps)
    # Half an interval later the next cycle reads afresh.
    time.sleep(0.5)
    sources[0].poll(now=NOW + 1)
    assert shared.reads == 6
    cluster.close()
    down = ClusterReads(fresh_s=5.0)
    sources = [_source(cluster, tmp_path, job_id=APPO_JOB, shared=down, timeout_s=0.5)
               for _ in range(3)]
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        snaps = list(pool.map(lambda s: s.poll(now=NOW), sources))
    assert all(s.errors[0].startswith(f"state API: {cluster.dashboard}/api/v0/actors: "
                                      "unreachable") for s in snaps), snaps[0].errors
    assert down.reads == 2  # the actors list and the metrics, once each
