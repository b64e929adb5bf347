"""The RLlib probe (replaywatch/probe/rllib.py) and its reader (`--ray-results URL`,
sources/ray_results.py `ResultProbe`), over real HTTP.

The rows are real RLlib 2.60 results (tests/fixtures/ray/result_dqn.jsonl) handed to the
probe's `on_train_result` as RLlib hands them; the documents with a buffer and a learner
queue were served by the probe inside real jobs (`harness/rllib_job.py --probe-listen
127.0.0.1:0 --no-rows`, DQN and APPO, one EnvRunner, the learner in the driver, 36 s in) and
are served here by the probe's own HTTP server. A real job with the probe attached runs in
`make test-ray` (tests/test_rllib_tier.py).
"""

from __future__ import annotations

import copy
import json
import pickle
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.procs import free_port
from replaywatch.probe import RLlibProbe, TrainerProbe
from replaywatch.probe.serving import ProbeServer
from replaywatch.sources.ray_cluster import RayClusterSource
from replaywatch.sources.ray_results import ResultProbe, parse_result_row
from tests.support.ray_dashboard import FIXTURES, TOKEN, Cluster

ROOT = Path(__file__).resolve().parents[1]


def results(name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (FIXTURES / name).read_text().splitlines()]


def recorded(name: str) -> dict[str, Any]:
    return dict(json.loads((FIXTURES / name).read_text()))


@pytest.fixture
def probe() -> Iterator[RLlibProbe]:
    p = RLlibProbe(listen="127.0.0.1:0")
    p.start()
    yield p
    p.stop()


def serving(doc: dict[str, Any]) -> ProbeServer:
    server = ProbeServer("127.0.0.1:0", lambda: doc, lambda: {})
    server.start()
    return server


def test_a_real_result_served_by_the_probe_is_read_as_the_same_row(probe: RLlibProbe) -> None:
    first, second = results("result_dqn.jsonl")[:2]
    assert probe.url is not None
    reader = ResultProbe(probe.url)
    rows, where, said = reader.read()
    assert rows == () and where == probe.url and said == ()  # served before any train()
    assert reader.live is not None and reader.live.env_steps_stored is None
    probe.on_train_result(result=first)
    assert reader.read()[0] == (parse_result_row(first),)
    assert len(reader.read()[0]) == 1  # the same iteration polled again: one row
    probe.on_train_result(result=second)
    rows = reader.read()[0]
    # Every field the rules read, the config's too, as result.json's nested row gives it.
    assert rows == (parse_result_row(first), parse_result_row(second))
    assert rows[-1].replay_capacity and rows[-1].train_batch_size_per_learner


def test_a_dqn_drivers_document_gives_its_buffer_now_and_its_rows() -> None:
    server = serving(recorded("probe_dqn.json"))
    try:
        assert server.url is not None
        reader = ResultProbe(server.url)
        rows, _, said = reader.read()
    finally:
        server.stop()
    live = reader.live
    assert said == () and live is not None
    assert (live.algorithm, live.buffer_kind, live.capacity) == (
        "DQN", "PrioritizedEpisodeReplayBuffer", 50_000)
    # The buffer now, not the iteration's mean the row carries.
    assert live.env_steps_stored == 914 and live.env_steps_added == 914
    assert live.max_priority is not None and live.max_priority > 0
    assert live.learner_thread_alive is None  # DQN trains in the driver's loop: no thread
    assert rows[-1].iteration == 9 and rows[-1].num_steps_sampled_before_learning_starts == 100
    assert rows[-1].replay_env_steps_stored is not None
    assert rows[-1].replay_env_steps_stored != live.env_steps_stored


def test_an_appo_drivers_document_gives_its_learner_thread_and_queue() -> None:
    server = serving(recorded("probe_appo.json"))
    try:
        assert server.url is not None
        reader = ResultProbe(server.url)
        reader.read()
    finally:
        server.stop()
    live = reader.live
    assert live is not None and live.buffer_kind is None  # APPO keeps no replay buffer
    assert live.learner_thread_alive is True and live.learner_waiting is True
    assert live.queue_depth == 0
    assert live.learner_waited_s is not None and live.learner_watched_s is not None
    assert 0 < live.learner_waited_s < live.learner_watched_s


def test_what_is_not_an_rllib_probe_is_one_line_and_the_rows_are_kept(probe: RLlibProbe) -> None:
    trainer = TrainerProbe(listen="127.0.0.1:0")
    trainer.start()
    try:
        rows, _, said = ResultProbe(str(trainer.url)).read()
    finally:
        trainer.stop()
    assert rows == () and len(said) == 1
    assert "is not an RLlib probe (role 'trainer')" in said[0]
    reader = ResultProbe(str(probe.url))
    probe.on_train_result(result=results("result_dqn.jsonl")[0])
    assert len(reader.read()[0]) == 1
    probe.stop()
    rows, _, said = reader.read()
    assert len(rows) == 1 and reader.live is None  # kept, and nothing said live
    assert len(said) == 1 and said[0].startswith("results: ") and "unreachable" in said[0]
    nobody = f"http://127.0.0.1:{free_port()}"
    assert "unreachable" in ResultProbe(nobody).read()[2][0]


def test_the_ray_source_takes_a_url_as_the_probe_and_a_path_as_result_json(
        tmp_path: Path, probe: RLlibProbe) -> None:
    probe.on_train_result(result=results("result_dqn.jsonl")[0])
    cluster = Cluster(tmp_path, "metrics_appo.txt")
    try:
        source = RayClusterSource(cluster.dashboard, temp_dir=cluster.temp_dir, environ={},
                                  home=tmp_path / "home", token=TOKEN, results=str(probe.url))
        snap = source.poll(now=1.0)
    finally:
        cluster.close()
    assert snap.result_file == probe.url and [r.iteration for r in snap.results] == [
        results("result_dqn.jsonl")[0]["training_iteration"]]
    assert snap.live is not None and snap.document()["live"] is not None


def test_the_configs_copies_hand_their_hooks_to_the_probe_and_serve_nothing_elsewhere(
        probe: RLlibProbe) -> None:
    # RLlib copies the config (callbacks and all) when it builds the Algorithm: the copy's
    # hooks reach the probe the job holds, whose URL it prints.
    hooks = copy.deepcopy(probe.callbacks())
    hooks["on_train_result"](result=results("result_dqn.jsonl")[0], algorithm=None)
    assert probe.snapshot()["row"] is not None
    # Pickled to an EnvRunner's process: a probe of its own that serves nothing.
    out = subprocess.run(
        [sys.executable, "-c", "import pickle, sys; p = pickle.load(sys.stdin.buffer); "
         "print(p.url, p._origin, p.snapshot()['role'])"],
        input=pickle.dumps(probe), capture_output=True, cwd=ROOT, timeout=60, check=True)
    assert out.stdout.decode().split() == ["None", "None", "rllib"]


def test_a_bad_listen_address_is_refused_when_made() -> None:
    with pytest.raises(ValueError, match="must be HOST:PORT"):
        RLlibProbe(listen="nowhere")


def test_check_prints_what_the_probe_read() -> None:
    from replaywatch.check import _ray_lines
    from replaywatch.ray_model import RaySnapshot
    from replaywatch.sources.ray_results import live_from_probe

    dqn = _ray_lines("t", RaySnapshot("t", 1.0, "01000000", None,
                                      live=live_from_probe(recorded("probe_dqn.json"))))
    assert ("replay buffer (PrioritizedEpisodeReplayBuffer): 914 of 50000 env steps stored"
            in dqn)
    appo = _ray_lines("t", RaySnapshot("t", 1.0, "01000000", None,
                                       live=live_from_probe(recorded("probe_appo.json"))))
    assert "learner thread: waiting for a batch, 0 batch(es) queued, waited 14 of 25 s" in appo
