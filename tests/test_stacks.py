"""The loop-in-next() classifier over py-spy's JSON: one table row per stack shape.

The dumps are py-spy-shaped dicts (`py-spy dump --json`: threads with `thread_name`,
`os_thread_id` and `frames`, innermost first). `PREFETCH` and `TF_DATA` were recorded from real
processes (a Python iterator waiting on a queue; a tf.data Reverb dataset blocked on an empty
table), trimmed to the fields the classifier reads.
"""

from __future__ import annotations

from typing import Any

import pytest

from replaywatch.diagnosis.stacks import loop_in_next, main_thread, stack_verdict


def frame(name: str, file: str, line: int = 1) -> dict[str, Any]:
    return {"name": name, "filename": f"/site-packages/{file}", "short_filename": file,
            "line": line, "locals": None}


def thread(name: str | None, frames: list[dict[str, Any]], os_id: int = 100,
           pid: int = 100) -> dict[str, Any]:
    return {"pid": pid, "thread_id": 1, "thread_name": name, "os_thread_id": os_id,
            "active": False, "owns_gil": False, "frames": frames}


def dump(*threads: dict[str, Any]) -> dict[str, Any]:
    return {"threads": list(threads)}


WORKER = thread("prefetch", [frame("producer", "utils.py"), frame("Thread.run", "threading.py")],
                os_id=101)
# Recorded (Python 3.11, py-spy 0.3): MainThread in a Python iterator's __next__ -> queue.get.
PREFETCH = dump(WORKER, thread("MainThread", [
    frame("Condition.wait", "threading.py", 327), frame("Queue.get", "queue.py", 171),
    frame("It.__next__", "h11_spy.py", 5), frame("<module>", "h11_spy.py", 9)]))
# Recorded (TF 2.15, Reverb 0.14): next() on a TrajectoryDataset of an empty MinSize(10) table.
TF_DATA = dump(WORKER, thread("MainThread", [
    frame("iterator_get_next", "tensorflow/python/ops/gen_dataset_ops.py", 3024),
    frame("OwnedIterator._next_internal", "tensorflow/python/data/ops/iterator_ops.py", 773),
    frame("OwnedIterator.__next__", "tensorflow/python/data/ops/iterator_ops.py", 810),
    frame("train", "h11_tfdump.py", 7), frame("<module>", "h11_tfdump.py", 8)]))
# Python < 3.11 py-spy names carry no class.
TF_DATA_OLD_NAMES = dump(thread("MainThread", [
    frame("_next_internal", "iterator_ops.py", 777), frame("__next__", "iterator_ops.py", 814),
    frame("run", "agent.py", 106)]))
# The loop in its update step: a jitted function, not next().
IN_UPDATE = dump(thread("MainThread", [
    frame("_pjit_call_impl", "pjit.py", 1100), frame("step", "learning.py", 210),
    frame("run", "agent.py", 110)]))
# Only a worker thread is in next(): the loop (main) is elsewhere.
WORKER_IN_NEXT = dump(
    thread("prefetch", [frame("OwnedIterator._next_internal", "iterator_ops.py"),
                        frame("producer", "utils.py")], os_id=101),
    thread("MainThread", [frame("sleep", "time.py"), frame("run", "agent.py")]))
# A queue.get that is not an iterator's next (a work queue in the loop).
PLAIN_QUEUE = dump(thread("MainThread", [frame("Queue.get", "queue.py"),
                                         frame("wait_for_params", "actor.py")]))
# No thread name (py-spy without names): the main thread is the one whose id is the pid.
UNNAMED_MAIN = dump(thread(None, [frame("iterator_get_next", "gen_dataset_ops.py")],
                           os_id=100, pid=100))

CASES = [
    ("tf_data_iterator_get_next", TF_DATA, "tf.data IteratorGetNext"),
    ("tf_data_without_class_names", TF_DATA_OLD_NAMES, "tf.data iterator"),
    ("prefetching_iterator_waiting_on_its_queue", PREFETCH, "prefetch queue.get"),
    ("main_thread_found_by_os_thread_id", UNNAMED_MAIN, "tf.data IteratorGetNext"),
    ("not_in_next_while_in_the_update_step", IN_UPDATE, None),
    ("not_in_next_when_only_a_worker_thread_is", WORKER_IN_NEXT, None),
    ("not_in_next_for_a_queue_outside_an_iterator", PLAIN_QUEUE, None),
    ("not_in_next_for_an_error_document", {"error": "py-spy dump exited 1"}, None),
    ("not_in_next_for_text_output", {"text": "Thread 0x1 (idle)"}, None),
]


@pytest.mark.parametrize("name,document,where", CASES, ids=[c[0] for c in CASES])
def test_loop_in_next(name: str, document: Any, where: str | None) -> None:
    found = loop_in_next(document)
    assert (found.where if found else None) == where


def test_the_bare_list_py_spy_prints_is_read_too() -> None:
    found = loop_in_next(TF_DATA["threads"])
    assert found is not None and found.thread == "MainThread"
    assert found.frames[0] == "iterator_get_next (gen_dataset_ops.py:3024)"


def test_both_dumps_in_next_is_the_verdict() -> None:
    verdict = stack_verdict(TF_DATA, PREFETCH, requested_at=1019.0)
    assert verdict.in_next and verdict.error is None
    evidence = verdict.evidence()
    assert evidence["from_stacks"] is True and evidence["stacks_at"] == 1019.0
    assert evidence["loop_in"] == "prefetch queue.get"
    assert evidence["first_dump"][0].startswith("iterator_get_next")


def test_one_dump_outside_next_is_not_the_verdict() -> None:
    # In next() once, in its update step a second later: a loop that moves, not one stuck.
    assert not stack_verdict(TF_DATA, IN_UPDATE, requested_at=1.0).in_next


def test_a_failed_dump_is_an_error_not_a_verdict() -> None:
    verdict = stack_verdict(TF_DATA, {"error": "py-spy dump failed: timeout"}, requested_at=1.0)
    assert not verdict.in_next and verdict.error == "py-spy dump failed: timeout"
    assert stack_verdict({"threads": []}, TF_DATA, 1.0).error == "no main thread in the dump"
    assert main_thread({"threads": "garbage"}) is None
