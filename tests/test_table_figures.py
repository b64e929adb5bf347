"""One record per table, from the cycle to the page: a new per-table figure is a change to the
record, its producer and its consumers, and nothing else (diagnosis/figures.py).

Real history, findings keeper, poller, API and collector; a fake source and clock behind the
Source protocol, no process and no sleep.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from replaywatch import metrics
from replaywatch.api.app import create_app
from replaywatch.api.schemas import TableOut
from replaywatch.config import RATE_WINDOW_S
from replaywatch.diagnosis import figures
from replaywatch.diagnosis.figures import Table, TableFigures
from replaywatch.diagnosis.ratelimiter import derive
from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.findings import FindingsKeeper
from replaywatch.history import History
from replaywatch.metric_families import gauge
from replaywatch.metrics import make_registry
from replaywatch.model import PollOutcome
from replaywatch.poller import Poller, SourceBinding
from replaywatch.state import Published, StateStore
from tests.builders import table_snapshot

T = "127.0.0.1:1"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Server:
    """A Reverb target whose table gains 10 inserts and 8 samples a poll."""

    kind = "reverb"

    def __init__(self, clock: Clock):
        self.name, self._clock, self.polls = T, clock, 0

    def poll(self) -> PollOutcome:
        self.polls += 1
        at = self._clock()
        snap = table_snapshot(at, 10 * self.polls, 8 * self.polls, target=T)
        return PollOutcome(T, "reverb", at, 0.001, tables=(snap,))

    def close(self) -> None:
        pass


@pytest.fixture
def sidecar() -> Iterator[tuple[Poller, History, StateStore, Clock]]:
    clock, history, store = Clock(), History(), StateStore()
    keeper = FindingsKeeper(lambda: {T: []}, Thresholds(), 1.0, None)
    poller = Poller([SourceBinding(Server(clock), T)], history, store, keeper, interval_s=1.0,
                    timeout_s=1.0, clock=clock)
    yield poller, history, store, clock
    poller.close()


def ticks(poller: Poller, clock: Clock, n: int) -> Published:
    state = poller.tick()
    for _ in range(n - 1):
        clock.now += 1.0
        state = poller.tick()
    return state


def test_each_table_has_one_record_made_by_the_diagnosis_over_the_rate_window(
        sidecar: tuple[Poller, History, StateStore, Clock]) -> None:
    poller, history, _, clock = sidecar
    state = ticks(poller, clock, 15)
    record = state.figures[(T, "replay")]
    assert type(record) is TableFigures and record.key == (T, "replay")
    # The limiter's figures over the last RATE_WINDOW_S, as the poller once derived them.
    assert record.derived == derive(history.table(T, "replay", start=state.at - RATE_WINDOW_S))
    assert record.derived is not None and record.derived.insert_rate == 10.0


def test_every_field_of_the_record_has_its_producer_and_the_document_mirrors_the_record() -> None:
    named = {f.name for f in dataclasses.fields(TableFigures)} - {"target", "table"}
    assert set(figures.PRODUCER.makers) == named
    assert set(TableFigures.DOCUMENTED) <= set(TableOut.model_fields)


# -- the acceptance: a figure added in the test alone reaches the page --------------------------

@dataclasses.dataclass(frozen=True)
class Wider(TableFigures):
    """The record, one figure wider: the items still to come before max_size."""

    DOCUMENTED = (*TableFigures.DOCUMENTED, "items_to_max")

    items_to_max: int | None = None


def _items_to_max(t: Table) -> int | None:
    """The new figure's producer: a pure function of what a producer reads."""
    if not t.rate_window:
        return None
    newest = t.rate_window[-1]
    return newest.max_size - newest.current_size


ITEMS_TO_MAX = gauge("table_items_to_max", "Items still to come before max_size.",
                     metrics.TABLE)


def test_a_new_figure_is_the_record_its_producer_and_its_consumers(
        sidecar: tuple[Poller, History, StateStore, Clock],
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The record and its producer (diagnosis/figures.py) ...
    monkeypatch.setattr(figures, "PRODUCER", dataclasses.replace(
        figures.PRODUCER, record=Wider,
        makers={**figures.PRODUCER.makers, "items_to_max": _items_to_max}))
    # ... and its /metrics family (metrics.py); the API's table document takes the record's
    # DOCUMENTED fields as they come. Nothing else changes.
    monkeypatch.setattr(metrics, "TABLE_FIGURE_FAMILIES", [
        *metrics.TABLE_FIGURE_FAMILIES,
        (ITEMS_TO_MAX, lambda f: [((), float(f.items_to_max))]
         if isinstance(f, Wider) and f.items_to_max is not None else [])])
    poller, history, store, clock = sidecar
    state = ticks(poller, clock, 3)
    newest = state.tables[(T, "replay")]
    expected = newest.max_size - newest.current_size

    record = state.figures[(T, "replay")]  # Published
    assert isinstance(record, Wider) and record.items_to_max == expected
    assert record.derived is not None  # the others are still made

    client = TestClient(create_app(store, make_registry(store.current), history, None))
    (table,) = client.get("/api/v1/tables").json()["tables"]  # the API's table document
    assert table["items_to_max"] == expected
    assert table["derived"]["cursor"] == record.derived.cursor
    body = client.get("/metrics").text  # /metrics
    assert f'replaywatch_table_items_to_max{{table="replay",target="{T}"}} {float(expected)}' \
        in body
