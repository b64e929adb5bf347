"""GcPacing: each cycle's survivors frozen, garbage of the cycle collected, a full collection
on schedule; the real collector, driven with explicit times."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from replaywatch.gc_pacing import GcPacing


class Node:
    """A reference cycle: only the cyclic collector frees it."""

    def __init__(self) -> None:
        self.me = self


@pytest.fixture
def pacing() -> Iterator[GcPacing]:
    p = GcPacing(full_every_s=60.0)
    p.start(now=0.0)
    try:
        yield p
    finally:
        p.stop()  # the rest of the test session keeps a normal collector


def test_start_freezes_what_start_up_made(pacing: GcPacing) -> None:
    assert gc.get_freeze_count() > 0


def test_a_cycles_garbage_is_collected_before_its_survivors_are_frozen(pacing: GcPacing) -> None:
    garbage = Node()
    gone = weakref.ref(garbage)
    kept = [Node()]
    frozen_before = gc.get_freeze_count()
    del garbage
    pacing.after_cycle(now=1.0)
    assert gone() is None
    assert gc.get_freeze_count() > frozen_before  # `kept` and its node moved out of reach
    assert kept[0].me is kept[0]


def test_a_cycle_dropped_after_its_freeze_waits_for_the_scheduled_full_collection(
    pacing: GcPacing,
) -> None:
    node = Node()
    late = weakref.ref(node)
    pacing.after_cycle(now=1.0)  # node survives this cycle: frozen
    del node
    pacing.after_cycle(now=2.0)
    assert late() is not None, "frozen objects are skipped until the full collection"
    assert pacing.full_collections == 0
    pacing.after_cycle(now=61.0)
    assert late() is None and pacing.full_collections == 1
    assert gc.get_freeze_count() > 0  # frozen again after the full collection


def test_stop_hands_everything_back(pacing: GcPacing) -> None:
    pacing.stop()
    assert gc.get_freeze_count() == 0


def test_a_period_that_is_not_positive_is_refused() -> None:
    with pytest.raises(ValueError, match="full_every_s"):
        GcPacing(full_every_s=0)
