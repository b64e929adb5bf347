"""An actor probe attached as users attach it: `--probe URL` or a targets file entry.

Real parts, in process: a stdlib ActorProbe (no Reverb: the target is a closed
port, whose polls fail at once), the CLI's own parser, the composition root and
the API app driven by fastapi's TestClient; the probe is read over real HTTP.
"""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from replaywatch.api.cache import RenderCache
from replaywatch.check import run_check
from replaywatch.cli import build_parser, config_from_args
from replaywatch.config import WatchConfig
from replaywatch.probe import ActorProbe, TrainerProbe
from replaywatch.targets_file import parse_targets
from replaywatch.watch import build_app
from replaywatch.wiring import bindings_from_file, build_sidecar

pytestmark = pytest.mark.timeout(60)
CLOSED = "127.0.0.1:1"  # nothing listens on port 1


class BlockedWriter:
    """A writer whose flush() waits for the test's gate: an actor stuck in flush."""

    def __init__(self) -> None:
        self.gate = threading.Event()

    def append(self, step: Any) -> None:
        pass

    def create_item(self, *args: Any, **kwargs: Any) -> None:
        pass

    def flush(self, *args: Any, **kwargs: Any) -> None:
        self.gate.wait(30)


@pytest.fixture
def actor() -> Iterator[tuple[ActorProbe, BlockedWriter]]:
    probe = ActorProbe(table="replay", name="actor-0", listen="127.0.0.1:0")
    probe.start()
    inner = BlockedWriter()
    writer = probe.wrap_writer(inner)
    for _ in range(3):
        probe.step()
        writer.append({})
    writer.create_item("replay", 1, 1.0)
    flusher = threading.Thread(target=writer.flush, daemon=True)
    flusher.start()
    yield probe, inner
    inner.gate.set()
    flusher.join(5)
    probe.stop()


def watch_config(tmp_path: Path, *flags: str) -> WatchConfig:
    # The ticks are driven by hand, so the interval only sets the probes' timeout; 80% of 0.2 s
    # was too short for a probe answering from a loaded machine.
    args = build_parser().parse_args(["watch", "--reverb", CLOSED, "--interval", "0.2",
                                      "--timeout", "3",
                                      "--db", str(tmp_path / "i.db"), *flags])
    return config_from_args(args, {})


def test_an_actor_probe_from_the_probe_flag_reaches_the_api_and_metrics(
        tmp_path: Path, actor: tuple[ActorProbe, BlockedWriter]) -> None:
    probe, _ = actor
    trainer = TrainerProbe(batch_size=4, table="replay", name="learner", listen="127.0.0.1:0")
    trainer.start()
    url, trainer_url = str(probe.url), str(trainer.url)
    try:
        config = watch_config(tmp_path, "--probe", url, "--probe", trainer_url)
        with build_sidecar(config, incidents_path=":memory:") as sidecar:
            sidecar.poller.tick()
            state = sidecar.poller.tick()
            client = TestClient(build_app(sidecar, RenderCache()))
            probes = {p["probe"]: p for p in client.get("/api/v1/probes").json()["probes"]}
            metrics = client.get("/metrics").text
            view = sidecar.history.view(CLOSED, [url, trainer_url], 0.0)
    finally:
        trainer.stop()
    assert set(state.actors) == {url} and set(state.probes) == {trainer_url}
    a = probes[url]
    assert (a["role"], a["up"], a["target"]) == ("actor", True, CLOSED)
    assert a["snapshot"]["name"] == "actor-0" and a["snapshot"]["in_call"] == "flush"
    assert a["snapshot"]["steps_total"] == 3 and a["snapshot"]["pending_items"] == 1
    assert probes[trainer_url]["role"] == "trainer"
    assert probes[trainer_url]["snapshot"]["pipeline"]["batch_size"] == 4
    who = f'probe="{url}",target="{CLOSED}"'
    assert f"replaywatch_actor_steps_total{{{who}}} 3.0" in metrics
    assert f'replaywatch_actor_in_writer_call{{call="flush",{who}}} 1.0' in metrics
    assert f'replaywatch_probe_up{{probe="{url}",role="actor",target="{CLOSED}"}} 1.0' in metrics
    assert f'replaywatch_probe_up{{probe="{trainer_url}",role="trainer",target="{CLOSED}"}} 1.0' \
        in metrics
    # The diagnosis sees the actor's history beside the trainer's.
    assert [s.steps_total for s in view.actors[url]] == [3, 3]
    assert list(view.probes) == [trainer_url]


def test_check_lists_actors_in_text_and_json(
        tmp_path: Path, actor: tuple[ActorProbe, BlockedWriter]) -> None:
    probe, _ = actor
    config = watch_config(tmp_path, "--probe", str(probe.url))
    text = io.StringIO()
    run_check(config, 0.3, as_json=False, out=text)
    line = next(x for x in text.getvalue().splitlines() if x.startswith("actor "))
    assert f"actor {probe.url} (actor-0, pid " in line
    assert "3 steps" in line and "in flush() for" in line and "1 pending" in line
    out = io.StringIO()
    run_check(config, 0.3, as_json=True, out=out)
    doc = json.loads(out.getvalue())
    assert doc["actors"][probe.url]["in_call"] == "flush"
    (entry,) = doc["probes"]
    assert entry["name"] == probe.url and entry["snapshot"] is None  # trainers' shape kept


def test_a_targets_file_entry_lists_several_probes(tmp_path: Path) -> None:
    doc = [{"targets": ["r:1"], "labels": {"__probe_url__": "http://l:1, http://a0:2,http://a1:3"}},
           {"targets": ["s:1"], "labels": {"__probe_url__": "http://s:1,http://s:1"}},
           {"targets": ["t:1"], "labels": {"__probe_url__": "http://a0:2"}},
           {"targets": ["u:1"], "labels": {"__probe_url__": "http://u:1,nope"}}]
    parsed = parse_targets(json.dumps(doc), "t.json")
    assert [(e.address, e.probe_urls) for e in parsed.entries] == [
        ("r:1", ("http://l:1", "http://a0:2", "http://a1:3"))]
    assert [e.split(": ", 1)[1] for e in parsed.errors] == [
        "probe http://s:1 is listed twice", "probe http://a0:2 is listed twice",
        "probe ('nope') must be an http URL, e.g. http://127.0.0.1:8001"]
    bindings = bindings_from_file(parsed, timeout=1.0)
    assert [(b.source.kind, b.source.name, b.target) for b in bindings] == [
        ("reverb", "r:1", "r:1"), ("probe", "http://l:1", "r:1"), ("probe", "http://a0:2", "r:1"),
        ("probe", "http://a1:3", "r:1")]
