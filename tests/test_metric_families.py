"""A metric family is checked where it is declared, as client_python checks a metric."""

from __future__ import annotations

import pytest

from replaywatch import metrics, metrics_probes
from replaywatch.metric_families import Family, counter, gauge


@pytest.mark.parametrize(("make", "error"), [
    (lambda: gauge("bad name", "x"), "is not replaywatch_"),
    (lambda: Family("other_metric", "gauge", "x"), "is not replaywatch_"),
    (lambda: gauge("polls_total", "x"), "is not named _total"),
    (lambda: counter("polls_total", "x"), "is not named _total"),
    (lambda: Family("replaywatch_x", "histogram", "x"), "not gauge or counter"),
    (lambda: gauge("x", ""), "no help text"),
    (lambda: gauge("x", "x", ("waiting_on",)), "not one of the bounded labels"),
    (lambda: gauge("x", "x", ("__name",)), "is not a label name"),
    (lambda: gauge("x", "x", ("target", "target")), "declared twice"),
])
def test_a_bad_family_is_refused_where_it_is_declared(make, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        make()


def test_every_declared_family_passes_and_is_named_once() -> None:
    declared = [v for m in (metrics, metrics_probes) for v in vars(m).values()
                if isinstance(v, Family)]
    declared += [f for f, _ in (*metrics.TABLE_GAUGES, *metrics.TABLE_COUNTERS)]
    names = [f.name for f in declared]
    assert len(names) > 40 and len(set(names)) == len(names)
