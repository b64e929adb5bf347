"""HttpProbeSource reads both probe roles over real HTTP from real, in-process probes.

No Reverb: the ActorProbe is stdlib only, its writer calls are driven through a
stand-in writer object (the probe wraps anything with append/create_item/flush),
and a tiny stdlib HTTP server plays an old or broken probe.
"""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from replaywatch.diagnosis.window import actor_since_last_restart
from replaywatch.history import History
from replaywatch.model import WRITER_CALLS, PollOutcome
from replaywatch.probe import ActorProbe, TrainerProbe
from replaywatch.sources.probe_http import HttpProbeSource
from tests.builders import actor_snapshot, probe_snapshot

pytestmark = pytest.mark.timeout(30)


class GateWriter:
    """A writer whose flush() blocks until the test opens the gate."""

    def __init__(self) -> None:
        self.gate = threading.Event()

    def append(self, step: Any) -> None:
        pass

    def create_item(self, table: str, num_timesteps: int, priority: float) -> None:
        pass

    def flush(self, block_until_num_items: int = 0, timeout_ms: int | None = None) -> None:
        assert self.gate.wait(10)


@pytest.fixture
def actor() -> Iterator[ActorProbe]:
    probe = ActorProbe(table="replay", name="actor-0", listen="127.0.0.1:0")
    probe.start()
    yield probe
    probe.stop()


def poll(url: str) -> PollOutcome:
    return HttpProbeSource(url, timeout_s=5).poll()


def test_an_actor_probe_reads_as_an_actor_snapshot(actor: ActorProbe) -> None:
    writer = actor.wrap_writer(GateWriter())
    writer.gate.set()
    for _ in range(5):
        actor.step()
        writer.append({"x": 1})
    writer.create_item("replay", 2, 1.0)
    writer.create_item("replay", 2, 1.0)
    assert actor.url is not None
    out = poll(actor.url)
    assert out.ok, out.error
    assert out.probe is None and out.actor is not None
    a = out.actor
    assert (a.probe, a.name, a.table) == (actor.url, "actor-0", "replay")
    assert (a.steps_total, a.appends_total, a.items_created_total, a.pending_items) == (5, 5, 2, 2)
    assert a.in_call is None and a.blocked_for_s == 0.0 and not a.waiting
    assert a.seconds_since_last_step is not None and 0 <= a.seconds_since_last_step < 5
    assert a.thread_count >= 2 and a.writers_wrapped == 1
    assert [c.call for c in a.calls] == list(WRITER_CALLS)
    assert {c.call: c.count for c in a.calls}["create_item"] == 2
    writer.flush()
    assert poll(actor.url).actor.pending_items == 0  # type: ignore[union-attr]


def test_a_blocked_flush_and_a_wait_show_with_their_durations(actor: ActorProbe) -> None:
    writer = actor.wrap_writer(GateWriter())
    writer.create_item("replay", 1, 1.0)
    flusher = threading.Thread(target=writer.flush, daemon=True)
    flusher.start()
    try:
        assert actor.url is not None
        for _ in range(200):
            a = poll(actor.url).actor
            assert a is not None
            if a.in_call == "flush" and a.blocked_for_s > 0.2:
                break
            threading.Event().wait(0.02)
        assert a.in_call == "flush" and a.in_call_since is not None
        assert a.blocked_for_s > 0.2
        assert a.pending_items == 1
    finally:
        writer.gate.set()
        flusher.join(5)
    with actor.waiting("learner"):
        threading.Event().wait(0.1)
        a = poll(actor.url).actor
        assert a is not None and a.waiting and a.waiting_on == "learner"
        assert a.waiting_for_s >= 0.1 and a.waiting_since is not None
    a = poll(actor.url).actor
    assert a is not None and a.waiting_on is None and a.waits_total == 1
    assert a.waiting_seconds_total >= 0.1 and a.in_call is None


def test_a_trainer_probe_still_reads_as_a_trainer_with_its_thread_counts() -> None:
    trainer = TrainerProbe(batch_size=8, num_parallel_calls=2, table="replay", listen="127.0.0.1:0")
    trainer.start()
    try:
        assert trainer.url is not None
        out = poll(trainer.url)
    finally:
        trainer.stop()
    assert out.ok and out.actor is None and out.probe is not None
    assert out.probe.pipeline.batch_size == 8 and out.probe.table == "replay"
    assert out.probe.os_threads is None or out.probe.os_threads >= out.probe.thread_count


class _Fixed(http.server.BaseHTTPRequestHandler):
    body = b"{}"

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def serve() -> Iterator[Any]:
    servers = []

    def start(doc: dict[str, Any]) -> str:
        handler = type("H", (_Fixed,), {"body": json.dumps(doc).encode()})
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for s in servers:
        s.shutdown()
        s.server_close()


OLD_TRAINER = {"pid": 7, "name": "learner", "batches_retrieved": 3, "blocked_in_next": False}


def test_a_document_without_a_role_is_an_old_trainer_probe(serve: Any) -> None:
    out = poll(serve(OLD_TRAINER))
    assert out.ok and out.probe is not None and out.probe.batches_retrieved == 3
    assert out.probe.os_threads is None and out.probe.wrapped is None


@pytest.mark.parametrize(("doc", "says"), [
    ({**OLD_TRAINER, "role": "critic"},
     "unknown probe role 'critic' (known: actor, replay, trainer)"),
    ({"role": "actor", "pid": 1, "items_created_total": 0}, "steps_total"),
    ({"role": "actor", "pid": 1, "steps_total": 1, "items_created_total": 0,
      "in_call": "sample"}, "'sample' is not a writer call"),
    ({"role": "actor", "pid": "x", "steps_total": 1, "items_created_total": 0}, "ValueError"),
    ({"role": "trainer", "pid": 1}, "batches_retrieved"),
])
def test_a_wrong_document_is_a_failed_poll_with_a_one_line_error(
        serve: Any, doc: dict[str, Any], says: str) -> None:
    out = poll(serve(doc))
    assert not out.ok and out.probe is None and out.actor is None
    assert out.error is not None and says in out.error and "\n" not in out.error


def test_free_text_from_the_actor_is_bounded(serve: Any) -> None:
    out = poll(serve({"role": "actor", "pid": 1, "steps_total": 0, "items_created_total": 0,
                      "name": "n" * 5000, "waiting": True, "waiting_on": "w" * 5000,
                      "last_error": {"call": "flush", "type": "RuntimeError",
                                     "message": "line one\nline two" + "x" * 5000}}))
    assert out.actor is not None
    assert len(out.actor.name) <= 200 and len(out.actor.waiting_on or "") <= 200
    assert out.actor.last_error is not None and len(out.actor.last_error) <= 200
    assert out.actor.last_error.startswith("flush: RuntimeError: line one line two")


def test_history_keeps_actors_beside_trainer_probes_and_a_url_has_one_role() -> None:
    h = History(max_age_s=100, max_points=10)
    url = "http://a:1"
    for t in range(12):
        h.record(PollOutcome(url, "probe", float(t), 0.001, actor=actor_snapshot(t, t, url=url)))
    assert [a.steps_total for a in h.actor(url)] == list(range(2, 12))  # bounded like probes
    view = h.view("r:1", [url, "http://never:2"], start=5.0)
    assert [a.observed_at for a in view.actors[url]] == [5.0 + i for i in range(7)]
    assert url not in view.probes and view.probes == {"http://never:2": ()}
    assert len(view.probe_polls[url]) == 7
    assert h.latest_actors([url, "r:1"])[url].steps_total == 11


def test_an_actor_restart_is_a_new_pid_or_counters_that_dropped() -> None:
    run = [actor_snapshot(t, 10 * t) for t in range(1, 4)]
    assert actor_since_last_restart(run) == tuple(run)
    restarted = [*run, actor_snapshot(4, 2), actor_snapshot(5, 12)]
    assert actor_since_last_restart(restarted) == tuple(restarted[3:])
    new_pid = [*run, actor_snapshot(4, 40, pid=1)]
    assert actor_since_last_restart(new_pid) == (new_pid[-1],)
    assert actor_since_last_restart([]) == ()


def test_a_url_whose_process_changed_role_keeps_only_the_new_roles_history() -> None:
    h = History(max_age_s=100, max_points=10)
    url = "http://reused:1"
    h.record(PollOutcome(url, "probe", 1.0, 0.001, probe=probe_snapshot(1.0, 5, url=url)))
    h.record(PollOutcome(url, "probe", 2.0, 0.001, actor=actor_snapshot(2.0, 3, url=url)))
    assert h.probe(url) == [] and len(h.actor(url)) == 1
    h.record(PollOutcome(url, "probe", 3.0, 0.001, probe=probe_snapshot(3.0, 6, url=url)))
    assert h.actor(url) == [] and h.latest_actors([url]) == {}
    view = h.view("r:1", [url], start=0.0)
    assert view.actors == {} and [p.batches_retrieved for p in view.probes[url]] == [6]
