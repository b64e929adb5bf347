"""The text renderer equals client_python's exposition of the same families on a big, odd picture.

`render_published` writes /metrics straight from the picture (the fast path); the
collector built from the same declarations is the reference, rendered by
prometheus_client's own `generate_latest`.
"""

from __future__ import annotations

import dataclasses
import math
import shutil
import subprocess

import pytest
from prometheus_client import generate_latest
from prometheus_client.registry import CollectorRegistry

from bench.render_cost import picture
from replaywatch.diagnosis.figures import TableFigures
from replaywatch.diagnosis.ratelimiter import derive
from replaywatch.metrics import ReplaywatchCollector, make_registry, render, render_published
from replaywatch.model import Finding, Severity
from replaywatch.state import Published, SourceStatus
from tests.builders import table_history

# Label values exercising every escape, and characters that need none but look like they might.
WEIRD = ['back\\slash', 'new\nline', 'quo"te', '%s {x="y"} 100%', 'ünïcödé ☃', "", " "]


def _big_weird_picture() -> Published:
    """50 targets x 5 tables, then some tables, sources and findings with weird names and values."""
    state = picture(50, 5)
    tables, figures = dict(state.tables), dict(state.figures)
    sources = dict(state.sources)
    findings = []
    values = [0.0, -0.0, 1e-7, 123456789.0, 1.7976931348623157e308, math.inf, -math.inf,
              math.nan, 2**53 + 1, -5]
    for i, name in enumerate(WEIRD):
        target = f"weird-{name}"
        history = table_history([0.0, 1.0, 2.0], [0, 7, 7 + i], [0, 3, 3], target=target,
                                name=name, spi=values[i % len(values)],
                                max_diff=values[(i + 3) % len(values)],
                                min_diff=values[(i + 5) % len(values)])
        tables[(target, name)] = history[-1]
        figures[(target, name)] = TableFigures(target, name, derive(list(history)))
        sources[target] = SourceStatus(target, "reverb", target, i % 2 == 0, 2.0,
                                       None if i % 3 else 1.5, None, values[i % len(values)],
                                       i, 3, 0, 0)
        findings.append(Finding("worker_starvation", Severity.WARNING, target, name, "s", {},
                                "f", 1.0, values[(i + 1) % len(values)]))
    return dataclasses.replace(state, tables=tables, figures=figures, sources=sources,
                               findings=tuple(findings), late_cycles=2**40,
                               incident_log_error="disk full", cycle_duration_s=math.nan)


def test_big_weird_picture_renders_byte_equal_to_generate_latest() -> None:
    state = _big_weird_picture()
    registry = make_registry(lambda: state)
    expected = generate_latest(registry)
    assert render_published(state) == expected
    assert render(registry) == expected
    text = expected.decode()
    assert 'table="quo\\"te"' in text and 'table="new\\nline"' in text
    assert text.count("replaywatch_table_size_items{") == 250 + len(WEIRD)


def test_a_foreign_registry_is_walked_through_its_families_to_the_same_bytes() -> None:
    state = _big_weird_picture()
    plain = CollectorRegistry(auto_describe=False)
    plain.register(ReplaywatchCollector(lambda: state))  # type: ignore[arg-type]
    assert render(plain) == generate_latest(plain) == render_published(state)


def test_the_renderer_keeps_no_state_between_pictures() -> None:
    # Memo tables live for one render: a value seen in one picture must not leak into the next.
    first = _big_weird_picture()
    second = dataclasses.replace(first, tables={}, figures={}, late_cycles=3)
    render_published(first)
    assert render_published(second) == generate_latest(make_registry(lambda: second))
    assert b"replaywatch_table_size_items{" not in render_published(second)


@pytest.mark.skipif(shutil.which("promtool") is None, reason="make test installs promtool")
def test_promtool_accepts_the_big_weird_exposition() -> None:
    done = subprocess.run(["promtool", "check", "metrics"],
                          input=render_published(_big_weird_picture()).decode(), text=True,
                          capture_output=True, timeout=30)
    assert done.returncode == 0, done.stdout + done.stderr
