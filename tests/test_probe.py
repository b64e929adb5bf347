"""The trainer probe: counts batches and blocked time, answers while next() blocks."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from harness.procs import get_json, wait_until
from replaywatch.probe import TrainerProbe
from replaywatch.probe.serving import thread_counts


class GatedIterator:
    """Yields one item each time the gate opens; `ready()` says if one is waiting."""

    def __init__(self) -> None:
        self.gate = threading.Semaphore(0)
        self.released = 0

    def __iter__(self) -> Iterator[int]:
        return self

    def __next__(self) -> int:
        self.gate.acquire()
        return 1

    def release(self, n: int = 1) -> None:
        for _ in range(n):
            self.gate.release()

    def ready(self) -> bool:
        return self.gate._value > 0  # type: ignore[attr-defined]


@pytest.fixture
def probe() -> Iterator[TrainerProbe]:
    p = TrainerProbe(batch_size=256, num_parallel_calls=12, name="learner", prefetch_size=2,
                     table="replay")
    p.start()
    yield p
    p.stop()


def test_probe_answers_while_the_trainer_thread_is_blocked_in_next(probe: TrainerProbe) -> None:
    source = GatedIterator()
    iterator = probe.wrap(source)
    source.release(3)
    for _ in range(3):
        next(iterator)
        probe.step()
    trainer = threading.Thread(target=lambda: next(iterator), daemon=True)
    trainer.start()
    doc = wait_until(lambda: (d := get_json(f"{probe.url}/probe")[1])["blocked_in_next"] and d,
                     timeout_s=5)
    time.sleep(0.3)
    status, later = get_json(f"{probe.url}/probe", timeout_s=2)
    assert status == 200
    assert later["blocked_in_next"] is True
    assert later["blocked_for_s"] >= 0.3
    assert later["blocked_since"] == doc["blocked_since"]
    assert later["batches_retrieved"] == 3 and later["learner_steps"] == 3
    assert later["ready"] is False
    for key in ("pid", "name", "batch_size", "num_parallel_calls", "last_batch_at",
                "last_step_at", "thread_count", "started_at"):
        assert key in later, key
    assert (later["batch_size"], later["num_parallel_calls"], later["table"]) == (256, 12,
                                                                                 "replay")
    source.release()
    trainer.join(timeout=5)
    after = get_json(f"{probe.url}/probe")[1]
    assert after["blocked_in_next"] is False and after["batches_retrieved"] == 4
    assert after["blocked_seconds_total"] >= 0.3


def test_ready_passes_through_to_the_wrapped_iterator(probe: TrainerProbe) -> None:
    source = GatedIterator()
    iterator = probe.wrap(source)
    assert iterator.ready() is False  # type: ignore[attr-defined]
    source.release()
    assert iterator.ready() is True  # type: ignore[attr-defined]
    assert get_json(f"{probe.url}/probe")[1]["ready"] is True


def test_ready_is_null_for_an_iterator_without_ready(probe: TrainerProbe) -> None:
    probe.wrap(iter(range(3)))
    assert get_json(f"{probe.url}/probe")[1]["ready"] is None


def test_end_of_iteration_is_passed_on_and_not_counted(probe: TrainerProbe) -> None:
    iterator = probe.wrap(iter([1, 2]))
    assert list(iterator) == [1, 2]
    doc = get_json(f"{probe.url}/probe")[1]
    assert doc["batches_retrieved"] == 2 and doc["blocked_in_next"] is False


def test_stacks_show_the_frame_blocked_in_next(probe: TrainerProbe) -> None:
    source = GatedIterator()
    iterator = probe.wrap(source)
    trainer = threading.Thread(target=lambda: next(iterator), name="learner-loop", daemon=True)
    trainer.start()
    wait_until(lambda: get_json(f"{probe.url}/probe")[1]["blocked_in_next"], timeout_s=5)
    stacks = get_json(f"{probe.url}/stacks")[1]
    learner = next(t for t in stacks["threads"] if t["name"] == "learner-loop")
    functions = [f["function"] for f in learner["frames"]]
    assert "__next__" in functions
    source.release()
    trainer.join(timeout=5)


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE"])
def test_probe_is_read_only(probe: TrainerProbe, method: str) -> None:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(f"{probe.url}/probe", method=method, data=b"x")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(request, timeout=5)
    assert e.value.code == 405


def test_unknown_path_is_a_json_404(probe: TrainerProbe) -> None:
    status, doc = get_json(f"{probe.url}/nope")
    assert status == 404 and "error" in doc


def test_probe_binds_loopback_by_default(probe: TrainerProbe) -> None:
    assert probe.url is not None and probe.url.startswith("http://127.0.0.1:")


@pytest.mark.parametrize("kwargs", [{"batch_size": -1}, {"listen": "nope"},
                                    {"num_parallel_calls": "12"}])
def test_bad_arguments_raise_value_error(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        TrainerProbe(**kwargs)


def test_probe_imports_only_the_standard_library() -> None:
    # Both probes run inside users' trainers and actors: anything beyond the
    # standard library would be a new dependency there (or a 5 s TensorFlow import).
    code = ("import sys; before = set(sys.modules); import replaywatch.probe;"
            "new = {m.split('.')[0] for m in set(sys.modules) - before};"
            "bad = sorted(new - set(sys.stdlib_module_names) - {'replaywatch'});"
            "assert not bad, bad;"
            "from replaywatch.probe import ActorProbe, TrainerProbe")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_document_says_role_trainer_and_counts_os_threads(probe: TrainerProbe) -> None:
    doc = get_json(f"{probe.url}/probe")[1]
    assert doc["role"] == "trainer" and doc["wrapped"] is None
    assert doc["os_threads"] is None or doc["os_threads"] >= doc["thread_count"] >= 2
    if not os.path.isdir("/proc/self/task"):
        assert doc["os_threads"] is None
        return

    def diff_with_three_more_threads() -> tuple[int | None, int]:
        gate = threading.Event()
        before = thread_counts()
        extra = [threading.Thread(target=gate.wait, daemon=True) for _ in range(3)]
        for t in extra:
            t.start()
        during = thread_counts()
        gate.set()
        for t in extra:
            t.join(timeout=5)
        os_before = before["os_threads"]
        os_during = during["os_threads"]
        assert os_before is not None and os_during is not None
        return os_during - os_before, int(during["thread_count"] or 0) - int(
            before["thread_count"] or 0)

    # An HTTP handler thread of an earlier request may exit meanwhile: retry, and a
    # count that does not follow the OS never reaches (3, 3).
    assert wait_until(lambda: diff_with_three_more_threads() == (3, 3), timeout_s=5)
