"""One record per table: every figure published about a (target, table), made once per cycle.

    figures = table_figures(view, th, now, probes, rates)   # {table: TableFigures}
    published.figures[(target, table)].derived.cursor      # the API, /metrics, check, page

The pure diagnosis makes a `TableFigures` for each table of a target's view (engine.py) and it
travels whole: `Diagnosis.figures`, the cycle's `Verdict.figures`, `CycleFindings.figures`,
`Published.figures`. Nothing between joins per-table maps by key again.

A new per-table figure is one change in each of these places, and nowhere else:

    the record      a field on `TableFigures` (here); named in `DOCUMENTED` if the API's table
                    document shows it (api/schemas.py's `TableOut` mirrors those fields)
    its producer    its entry in `PRODUCER.makers` (here), a pure function of `Table`, the
                    producer's inputs, usually kept in the module that knows its arithmetic
    /metrics        its families in `TABLE_FIGURE_FAMILIES` (metrics.py): rows of a record

`PRODUCER` is data, read at call time: tests/test_table_figures.py adds a figure by
`dataclasses.replace(PRODUCER, record=Wider, makers={...})` and sees it reach the page.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

from replaywatch.diagnosis import rules_throughput
from replaywatch.diagnosis.baseline import Baseline
from replaywatch.diagnosis.case import Probe
from replaywatch.diagnosis.consumption import Consumption, consumption
from replaywatch.diagnosis.memory import TableMemory
from replaywatch.diagnosis.ratelimiter import TableDerived, derive
from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.diagnosis.window import TargetView, since_last_reset
from replaywatch.model import TableSnapshot


@dataclasses.dataclass(frozen=True)
class TableFigures:
    """What the sidecar works out about one table at one cycle (each None until known)."""

    # The fields the API's table document (/api/v1/tables) shows beside the snapshot.
    DOCUMENTED: ClassVar[tuple[str, ...]] = ("derived", "consumption")

    target: str
    table: str
    # The limiter's arithmetic over the rate window (diagnosis/ratelimiter.py)
    derived: TableDerived | None = None
    # series ("inserts", "samples") -> its throughput baseline now (rules_throughput.py)
    baselines: dict[str, Baseline] = dataclasses.field(default_factory=dict)
    # An item's bytes and the process at max_size (diagnosis/memory.py)
    memory: TableMemory | None = None
    # What the learner consumed per insert, and what is drawn and not yet taken
    consumption: Consumption | None = None

    @property
    def key(self) -> tuple[str, str]:
        return self.target, self.table

    def document(self) -> dict[str, Any]:
        """The figures the API's table document shows, by field name."""
        return {name: getattr(self, name) for name in type(self).DOCUMENTED}


@dataclasses.dataclass(frozen=True)
class Table:
    """What a figure's producer reads for one table."""

    view: TargetView
    name: str
    thresholds: Thresholds
    now: float
    rate_window: tuple[TableSnapshot, ...]  # since now - RATE_WINDOW_S, or the newest one
    fresh: tuple[TableSnapshot, ...]  # since its last reset, if seen within the stall window
    probes: tuple[Probe, ...]  # the fresh trainer probes whose iterator reads it


def _derived(t: Table) -> TableDerived | None:
    return derive(t.rate_window) if t.rate_window else None


def _consumption(t: Table) -> Consumption | None:
    if not t.fresh:
        return None
    return consumption(t.fresh, t.probes, t.now, t.thresholds.spi_window_s)


@dataclasses.dataclass(frozen=True)
class Producer:
    """The record's type and, by field, the function that makes each figure."""

    record: type[TableFigures]
    makers: Mapping[str, Callable[[Table], Any]]

    def __call__(self, t: Table) -> TableFigures:
        return self.record(t.view.target, t.name, **{f: make(t) for f, make in self.makers.items()})


PRODUCER = Producer(TableFigures, {
    "derived": _derived,
    "baselines": lambda t: rules_throughput.baselines_of(t.view, t.name, t.thresholds, t.now),
    "memory": lambda t: t.view.table_memories.get(t.name),
    "consumption": _consumption,
})


def table_figures(view: TargetView, th: Thresholds, now: float,
                  probes: Mapping[str, Sequence[Probe]],
                  rates: Mapping[str, Sequence[TableSnapshot]]) -> dict[str, TableFigures]:
    """Each table's record: every table of the view, its coarse copy or its rate windows.

    `rates`: by table, its snapshots over the rate window (the newest one where none is that
    recent), which the limiter's figures are derived over.
    """
    out = {}
    for name in sorted({*view.tables, *view.coarse_tables, *rates}):
        fresh = since_last_reset(view.tables.get(name, ()))
        if fresh and now - fresh[-1].observed_at > th.stall_window_s:
            fresh = ()
        out[name] = PRODUCER(Table(view, name, th, now, tuple(rates.get(name, ())), fresh,
                                   tuple(probes.get(name, ()))))
    return out
