"""`make bench` rewrites bench/RESULTS.md: its own sections, then the record it keeps."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow  # bench.run_all imports the agent benchmarks (TensorFlow)


def test_a_run_replaces_its_sections_and_keeps_the_earlier_record() -> None:
    from bench.run_all import heading, kept_sections, time_section

    old = ("# Benchmark results\n\nMachine: old.\n\n"
           "## Detection latency (5 runs per scenario, 9.2 min)\n\nold latencies\n\n"
           "## Load: 20 targets x 5 tables at 1 Hz, 100 concurrent clients, 60 s\n\nold load\n\n"
           "## After the fixes (same machine)\n\nkept text\n\n"
           "## Second session (2026-11-29): memory\n\nkept too\n")
    new = ["## Detection latency (2 runs per scenario, 6.0 min)\n\nnew",
           "## Load: 20 targets x 5 tables at 1 Hz, 100 concurrent clients, 60 s\n\nnew load",
           time_section([("healthy runs", 330.0), ("detection", 360.0)], 11.5)]
    kept = kept_sections(old, new)
    assert [heading(k) for k in kept] == ["## After the fixes", "## Second session"]
    assert "kept text" in kept[0] and "old latencies" not in "".join(kept)
    assert "| healthy runs | 5.5 |" in new[-1] and "11.5 min in all, goal 20" in new[-1]
