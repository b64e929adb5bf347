"""Targets found from the Kubernetes API (`watch --kubernetes SELECTOR`): pods to targets by
their named ports (pure), then a sidecar following real Reverb servers and a real trainer
probe through the API's list and watch, served over real HTTP by tests/support/kube_api.py
(no cluster runs here). A pod added is watched at the next cycle, a deleted one leaves with
nothing paged, a failed one is judged and leaves after its TTL, closed as gone."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import kubernetes_validate
import pytest
import reverb
import yaml
from kubernetes_validate.utils import latest_version

from harness.procs import ROOT, free_port
from replaywatch.cli import build_parser
from replaywatch.config import KubeTarget, PollConfig, WatchConfig
from replaywatch.errors import ConfigError
from replaywatch.fleet import fleet
from replaywatch.kubernetes_sd import KubePods, kube_target, parse_pods, pod_ports
from replaywatch.model import Severity
from replaywatch.probe import TrainerProbe
from replaywatch.targets_file import ParsedTargets
from replaywatch.wiring import build_sidecar
from tests.support.kube_api import TOKEN, KubeApi, pod


def read(*pods: dict, now: float = 0.0, failed_since: float | None = None):  # type: ignore[no-untyped-def]
    ports = [pod_ports(p) for p in pods]
    return parse_pods([(p, failed_since) for p in ports if p is not None], now)


def test_every_pod_of_the_tests_is_a_valid_pod() -> None:
    for p in (pod("a", {"reverb": 8000, "rw-probe": 8001}, owner="pong"),
              pod("b", {"rw-probe": 8001}, annotations={"replaywatch.io/reverb": "a"},
                  phase="Failed")):
        kubernetes_validate.validate(p, latest_version(), strict=True)


def test_a_trainer_that_holds_its_replay_is_one_target_with_its_probe() -> None:
    got = read(pod("learner-0", {"reverb": 8000, "rw-probe": 8001}, ip="10.1.0.7",
                   labels={"app.kubernetes.io/instance": "pong"}))
    [entry] = got.entries
    assert entry.address == "10.1.0.7:8000"
    assert entry.probe_urls == ("http://10.1.0.7:8001",)
    assert dict(entry.labels) == {"job": "pong", "namespace": "training", "pod": "learner-0"}
    assert got.errors == ()


def test_actors_probes_go_to_their_jobs_only_server_and_a_sharded_job_must_name_it() -> None:
    replay = pod("replay-0", {"reverb": 8000}, ip="10.1.0.2", owner="pong")
    actor = pod("actor-3", {"rw-probe": 8002}, ip="10.1.0.9", owner="pong")
    [entry] = read(replay, actor).entries
    assert entry.probe_urls == ("http://10.1.0.9:8002",)
    # Two shards: the job is one (each server labelled with it); a probe without the
    # annotation is said, never attached to a guess.
    shard = pod("replay-1", {"reverb": 8000}, ip="10.1.0.3", owner="pong")
    got = read(replay, shard, actor)
    assert {e.address for e in got.entries} == {"10.1.0.2:8000", "10.1.0.3:8000"}
    assert all(dict(e.labels)["job"] == "pong" for e in got.entries)
    assert all(e.probe_urls == () for e in got.entries)
    [error] = got.errors
    assert "training/actor-3" in error and "2 Reverb servers" in error
    assert "replaywatch.io/reverb" in error
    # Named by the annotation: a pod's name, or a server's HOST:PORT.
    for named in ("replay-1", "10.1.0.3:8000"):
        annotated = pod("actor-3", {"rw-probe": 8002}, ip="10.1.0.9", owner="pong",
                        annotations={"replaywatch.io/reverb": named})
        got = read(replay, shard, annotated)
        assert got.errors == ()
        assert {e.address: e.probe_urls for e in got.entries}["10.1.0.3:8000"] == (
            "http://10.1.0.9:8002",)
    wrong = pod("actor-3", {"rw-probe": 8002}, owner="pong",
                annotations={"replaywatch.io/reverb": "replay-7"})
    assert "'replay-7' is no watched pod" in read(replay, shard, wrong).errors[0]


def test_which_pods_are_watched() -> None:
    pending = pod("p", {"reverb": 8000})
    del pending["status"]["podIP"]
    pending["status"]["phase"] = "Pending"
    deleting = pod("d", {"reverb": 8001})
    deleting["metadata"]["deletionTimestamp"] = "2026-12-06T18:00:00Z"
    done = pod("s", {"reverb": 8002}, phase="Succeeded")
    assert read(pending, deleting, done).entries == ()
    # A failed pod is judged for the TTL from when it was first seen failed, then leaves.
    failed = pod("f", {"reverb": 8003}, phase="Failed")
    assert [e.address for e in read(failed, now=599.0, failed_since=0.0).entries] == [
        "127.0.0.1:8003"]
    assert read(failed, now=601.0, failed_since=0.0).entries == ()
    # IPv6 pod addresses are bracketed; the job falls back to the controller, then the pod.
    v6 = pod("v6", {"reverb": 8000, "rw-probe": 8001}, ip="fd00::5")
    [e] = read(v6).entries
    assert (e.address, e.probe_urls) == ("[fd00::5]:8000", ("http://[fd00::5]:8001",))
    assert dict(e.labels)["job"] == "v6"


def test_the_flags_outside_a_pod_and_inside_one(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not in a pod.*--kube-api"):
        kube_target("app=rl", env={})
    with pytest.raises(ConfigError, match="must be a label selector"):
        kube_target("", api="http://127.0.0.1:8001", env={})
    (tmp_path / "namespace").write_text("training\n")
    t = kube_target("app=rl", env={"KUBERNETES_SERVICE_HOST": "10.96.0.1",
                                   "KUBERNETES_SERVICE_PORT": "443"},
                    service_account=str(tmp_path))
    assert (t.api, t.namespace, t.token_file) == ("https://10.96.0.1:443", "training",
                                                  f"{tmp_path}/token")
    assert t.pods_path == "/api/v1/namespaces/training/pods?labelSelector=app%3Drl"


@pytest.fixture
def servers() -> Iterator[list[reverb.Server]]:
    made = [reverb.Server([reverb.Table("replay", reverb.selectors.Uniform(),
                                        reverb.selectors.Fifo(), 1000,
                                        reverb.rate_limiters.MinSize(1))], port=None)
            for _ in range(3)]
    yield made
    for s in made:
        s.stop()


@pytest.mark.slow  # real Reverb servers and a trainer probe, about 10 s
def test_pods_come_and_go_and_a_deleted_one_is_never_paged(
        servers: list[reverb.Server], tmp_path: Path) -> None:
    probe = TrainerProbe(table="replay", batch_size=8)
    probe.start()
    probe_port = int(str(probe.url).rsplit(":", 1)[1])
    api = KubeApi([pod("learner-0", {"reverb": servers[0].port, "rw-probe": probe_port},
                       labels={"app.kubernetes.io/instance": "pong"}),
                   pod("other", {"reverb": servers[1].port}, labels={"app": "not-ours"})])
    (tmp_path / "token").write_text(TOKEN)
    config = WatchConfig(targets=(), kubernetes=KubeTarget(
        "app=rl", "training", api.url, token_file=str(tmp_path / "token"), ttl_s=3.0),
        poll=PollConfig(interval_s=1.0, history_s=300.0))
    first, second, third = (f"127.0.0.1:{s.port}" for s in servers)
    try:
        with build_sidecar(config, incidents_path=str(tmp_path / "i.db")) as car:
            state = car.poller.tick()
            # The selector's pod only: its server and its probe, labelled with the job.
            assert {s.target for s in state.sources.values()} == {first}
            assert set(state.sources) == {first, str(probe.url)}
            assert dict(state.sources[first].labels) == {
                "job": "pong", "namespace": "training", "pod": "learner-0"}
            deadline = time.monotonic() + 10
            while api.watching() == 0 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert api.watching() == 1, "discovery did not follow the list with a watch"
            # A new pod: watched at the next cycle.
            api.add(pod("replay-1", {"reverb": servers[2].port},
                        labels={"app.kubernetes.io/instance": "pong"}))
            time.sleep(0.3)
            state = car.poller.tick()
            assert {s.target for s in state.sources.values()} == {first, third}
            # The job's two servers are one row of the fleet.
            [row] = fleet(state)
            assert (row.name, row.targets) == ("pong", tuple(sorted((first, third))))
            # Deleted, then its server stopped (the pod's end): it leaves with no page.
            api.delete("replay-1")
            time.sleep(0.3)
            servers[2].stop()
            paged = []
            for _ in range(4):
                state = car.poller.tick()
                paged += [f for f in state.findings if f.severity >= Severity.WARNING]
                time.sleep(1.0)
            assert {s.target for s in state.sources.values()} == {first}
            assert paged == [], [(f.kind, f.target) for f in paged]
            # A pod that fails: its silence is judged (target_down), and it leaves after
            # its TTL with its incident closed as gone.
            api.modify("learner-0", phase="Failed")
            servers[0].stop()
            down = None
            for _ in range(8):
                state = car.poller.tick()
                down = down or next((f for f in state.findings if f.kind == "target_down"),
                                    None)
                if down and not state.sources:
                    break
                time.sleep(1.0)
            assert down is not None and down.target == first
            assert {s.target for s in state.sources.values()} == set(), "the failed pod never left"
            closed = car.incidents.list("all", target=first)
            assert closed and all(r["closed_as"] == "gone" for r in closed), closed
    finally:
        probe.stop()
        api.close()


@pytest.mark.slow  # runs replaywatch as a process
def test_an_api_that_refuses_is_a_one_line_exit_2(tmp_path: Path) -> None:
    api = KubeApi([])
    (tmp_path / "token").write_text("not-the-token")
    try:
        pods = KubePods(KubeTarget("app=rl", "training", api.url,
                                   token_file=str(tmp_path / "token")))
        with pytest.raises(ConfigError, match="403 Forbidden: pods is forbidden"):
            pods.start()
        done = subprocess.run(
            [sys.executable, "-m", "replaywatch", "watch", "--kubernetes", "app=rl",
             "--kube-api", api.url, "--kube-namespace", "training", "--kube-token-file",
             str(tmp_path / "token"), "--listen", f"127.0.0.1:{free_port()}", "--db",
             str(tmp_path / "i.db")], capture_output=True, text=True, timeout=60)
        assert done.returncode == 2, done.stderr
        assert "cannot list resource \"pods\"" in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    finally:
        api.close()


def test_the_discovery_manifests_validate_and_grant_only_what_discovery_reads() -> None:
    folder = ROOT / "deploy" / "kubernetes" / "discovery"
    listed = yaml.safe_load((folder / "kustomization.yaml").read_text())["resources"]
    assert sorted(listed) == sorted(p.name for p in folder.glob("*.yaml")
                                    if p.name != "kustomization.yaml")
    objects = {o["kind"]: o for name in listed
               for o in yaml.safe_load_all((folder / name).read_text())}
    for obj in objects.values():
        kubernetes_validate.validate(obj, latest_version(), strict=True)
    [rule] = objects["Role"]["rules"]
    assert (rule["resources"], sorted(rule["verbs"])) == (["pods"], ["get", "list", "watch"])
    pod_spec = objects["Deployment"]["spec"]["template"]["spec"]
    assert pod_spec["serviceAccountName"] == objects["ServiceAccount"]["metadata"]["name"]
    assert objects["RoleBinding"]["subjects"][0]["name"] == pod_spec["serviceAccountName"]
    [container] = pod_spec["containers"]
    args = build_parser().parse_args(container["args"])  # the flags as the image reads them
    assert args.kubernetes == "replaywatch.io/watch=true"


def test_a_watch_that_ends_is_opened_again_from_the_last_version(tmp_path: Path) -> None:
    api = KubeApi([pod("replay-0", {"reverb": 8000})])
    (tmp_path / "token").write_text(TOKEN)
    pods = KubePods(KubeTarget("app=rl", "training", api.url, token_file=str(tmp_path / "token")))
    try:
        pods.start()
        assert [e.address for e in (pods.targets() or read()).entries] == ["127.0.0.1:8000"]

        def until(done: Callable[[], bool]) -> None:
            deadline = time.monotonic() + 10
            while not (met := done()) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert met

        until(lambda: api.watching() == 1)
        api.end_watches()
        until(lambda: api.watching() == 1 and sum("watch=1" in r for r in api.requests) == 2)
        watches = [r for r in api.requests if "watch=1" in r]
        assert f"resourceVersion={api.version}" in watches[-1]  # from where it was
        assert sum("watch=1" not in r for r in api.requests) == 1  # not listed again
        api.add(pod("replay-1", {"reverb": 8001}, ip="127.0.0.2"))
        seen: list[ParsedTargets] = []

        def changed() -> bool:
            fresh = pods.targets()
            seen.extend([fresh] if fresh is not None else [])
            return fresh is not None

        until(changed)
        assert {e.address for e in seen[-1].entries} == {"127.0.0.1:8000", "127.0.0.2:8001"}
        assert pods.errors() == ()
    finally:
        pods.stop()
        api.close()


def test_a_watch_silent_past_its_deadline_is_listed_again_and_followed(tmp_path: Path) -> None:
    """The stub API never ends its watch: past 1.5 x the watch's timeout the read itself
    times out. Discovery says so, lists again and follows the pods that come after."""
    api = KubeApi([pod("replay-0", {"reverb": 8000})])
    (tmp_path / "token").write_text(TOKEN)
    pods = KubePods(KubeTarget("app=rl", "training", api.url, token_file=str(tmp_path / "token")),
                    watch_s=1.0)
    said: list[str] = []
    try:
        pods.start()
        pods.targets()
        deadline = time.monotonic() + 15
        while sum("watch=1" not in r for r in api.requests) < 2 and time.monotonic() < deadline:
            said += [e for e in pods.errors() if e not in said]
            time.sleep(0.05)
        assert sum("watch=1" not in r for r in api.requests) >= 2, api.requests
        assert any("watch:" in e and "listing again" in e for e in said), said
        while api.watching() == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        api.add(pod("replay-1", {"reverb": 8001}, ip="127.0.0.2"))
        while (fresh := pods.targets()) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert fresh is not None
        assert {e.address for e in fresh.entries} == {"127.0.0.1:8000", "127.0.0.2:8001"}
    finally:
        pods.stop()
        api.close()
