"""A short version of bench/load.py: many targets and clients, no errors, cadence held."""

from __future__ import annotations

from bench.load import run


def test_five_targets_and_twenty_clients_get_no_errors_and_polls_stay_on_time() -> None:
    result = run(targets=5, tables=5, clients=20, duration=8.0, history=5.0)
    assert result["errors"] == 0, result["error_samples"]
    assert result["requests"] > 100
    assert result["late_pct"] < 5.0, result
    assert result["missed_pct"] < 15.0, result  # ~8 polls per target; one may straddle
    assert result["rss_after_mb"] < result["rss_before_mb"] * 1.5 + 20, result
