"""The Acme hook: one `wrap_builder` sees the learner's own iterator and its steps.

The fakes stand for a user's Acme objects (shaped as the seed's code: a
builder whose `make_learner` gets the prefetched dataset, a learner that keeps
it in `_iterator` and calls `next(self._iterator)` in `step()`, and
`_LearningActor`, which holds the same iterator and asks `ready()` before
stepping). Real Acme is exercised elsewhere.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from harness.procs import get_json, wait_until
from replaywatch.probe import TrainerProbe

pytestmark = pytest.mark.timeout(30)


class Prefetch:
    """Like acme.jax.utils.prefetch: a queue filled elsewhere, with `ready()`."""

    def __init__(self) -> None:
        self.queue: queue.Queue[int] = queue.Queue()

    def __iter__(self) -> Iterator[int]:
        return self

    def __next__(self) -> int:
        return self.queue.get(timeout=20)

    def ready(self) -> bool:
        return not self.queue.empty()

    def retrieved_elements(self) -> int:
        return 7


class Learner:
    def __init__(self, iterator: Iterator[int], attr: str = "_iterator"):
        setattr(self, attr, iterator)
        self._attr = attr
        self.updates = 0

    def step(self) -> None:
        next(getattr(self, self._attr))
        self.updates += 1


class Builder:
    def make_dataset_iterator(self, replay_client: Any) -> Iterator[int]:
        return iter(())

    def make_learner(self, random_key: Any, networks: Any, dataset: Iterator[int],
                     **kwargs: Any) -> Learner:
        return Learner(dataset)


class LearningActor:
    """The seed's `_LearningActor._maybe_train`: step while the iterator is ready."""

    def __init__(self, learner: Learner, iterator: Prefetch):
        self._learner = learner
        self._iterator = iterator

    def update(self) -> int:
        steps = 0
        while self._iterator.ready():
            self._learner.step()
            steps += 1
        return steps


@pytest.fixture
def probe() -> Iterator[TrainerProbe]:
    p = TrainerProbe(batch_size=256, num_parallel_calls=12)
    p.start()
    yield p
    p.stop()


def doc(probe: TrainerProbe) -> dict[str, Any]:
    return get_json(f"{probe.url}/probe", timeout_s=5)[1]


def test_wrap_builder_makes_learners_whose_own_next_and_steps_are_counted(
        probe: TrainerProbe) -> None:
    builder = Builder()
    assert probe.wrap_builder(builder) is builder  # Acme keeps the builder's type
    dataset = Prefetch()
    learner = builder.make_learner(None, None, dataset)
    actor = LearningActor(learner, dataset)
    assert doc(probe)["ready"] is False
    for n in range(3):
        dataset.queue.put(n)
    assert doc(probe)["ready"] is True
    assert actor.update() == 3
    after = doc(probe)
    assert (after["learner_steps"], after["batches_retrieved"], learner.updates) == (3, 3, 3)
    assert after["wrapped"] == "learner._iterator" and after["ready"] is False
    assert learner._iterator.retrieved_elements() == 7  # type: ignore[attr-defined]


def test_a_learner_step_blocked_in_next_shows_in_the_document(probe: TrainerProbe) -> None:
    dataset = Prefetch()
    learner = probe.wrap_learner(Learner(dataset))
    loop = threading.Thread(target=learner.step, name="learner-loop", daemon=True)
    loop.start()
    blocked = wait_until(lambda: (d := doc(probe))["blocked_in_next"] and d, timeout_s=5)
    assert blocked["learner_steps"] == 0 and blocked["ready"] is False
    stacks = get_json(f"{probe.url}/stacks", timeout_s=5)[1]
    frames = next(t for t in stacks["threads"] if t["name"] == "learner-loop")["frames"]
    assert "step" in [f["function"] for f in frames]
    dataset.queue.put(1)
    loop.join(timeout=5)
    after = doc(probe)
    assert after["blocked_in_next"] is False and after["learner_steps"] == 1


def test_the_generic_sgd_learners_data_iterator_is_found(probe: TrainerProbe) -> None:
    dataset = Prefetch()
    learner = probe.wrap_learner(Learner(dataset, attr="_data_iterator"))
    dataset.queue.put(1)
    learner.step()
    assert doc(probe)["wrapped"] == "learner._data_iterator"
    assert doc(probe)["batches_retrieved"] == 1


def test_wrapping_twice_counts_each_step_once(probe: TrainerProbe) -> None:
    dataset = Prefetch()
    learner = probe.wrap_learner(probe.wrap_learner(Learner(dataset)))
    builder = probe.wrap_builder(probe.wrap_builder(Builder()))
    other = builder.make_learner(None, None, Prefetch())
    dataset.queue.put(1)
    learner.step()
    got = doc(probe)
    assert (got["learner_steps"], got["batches_retrieved"]) == (1, 1)
    assert other._iterator._inner.__class__ is Prefetch  # type: ignore[attr-defined]


def test_a_step_that_raises_is_not_counted(probe: TrainerProbe) -> None:
    learner = probe.wrap_learner(Learner(iter([])))
    with pytest.raises(StopIteration):
        learner.step()
    assert doc(probe)["learner_steps"] == 0


def test_a_learner_without_an_iterator_is_a_one_line_error(probe: TrainerProbe) -> None:
    class Bare:
        def step(self) -> None:
            pass

    with pytest.raises(ValueError, match="iterator_attr="):
        probe.wrap_learner(Bare())
    with pytest.raises(ValueError, match="not an iterator"):
        probe.wrap_learner(Bare(), iterator_attr="step")


def test_the_plain_loop_wrap_still_reports_ready_and_role(probe: TrainerProbe) -> None:
    dataset = Prefetch()
    iterator = probe.wrap(dataset)
    dataset.queue.put(1)
    got = doc(probe)
    assert (got["role"], got["wrapped"], got["ready"]) == ("trainer", "iterator", True)
    assert next(iterator) == 1
