"""throughput_drop: a rate against its own baseline (diagnosis/baseline.py), one table row per
case with why, then the numbers it shows and what it blames.

The rule reads the view's coarse snapshots: here one every 10 s; "100/s for 30 min" is 180
such buckets. Default thresholds: a 30 min look-back, a 3 min minimum baseline, 300 s below
half (60 s below a fifth).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from replaywatch.diagnosis import baseline as bl
from replaywatch.diagnosis import rhythm as rh
from replaywatch.diagnosis import rules_throughput
from replaywatch.diagnosis.engine import diagnose
from replaywatch.diagnosis.lifecycle import Transition
from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.diagnosis.window import TargetView
from replaywatch.findings import FindingsKeeper
from replaywatch.history import History
from replaywatch.incidents import IncidentLog
from replaywatch.model import (
    ActorSnapshot,
    Finding,
    PollOutcome,
    Severity,
    SourceKind,
    TableSnapshot,
)
from tests.builders import DEFAULT, TARGET, actor_snapshot, assert_as_declared, table_snapshot

STEP = 10.0


def rates(*spans: tuple[float, float]) -> list[float]:
    """Per-bucket rates: (rate per second, seconds) spans, one value per 10 s bucket."""
    return [r for rate, secs in spans for r in [rate] * int(secs / STEP)]


def coarse_table(per_bucket: Sequence[float], ms_per_insert: Sequence[float] | float = 0.05,
                 start: float = 0.0) -> tuple[TableSnapshot, ...]:
    """A table seen every 10 s whose inserts (and samples: spi 1) follow `per_bucket`; the
    table worker spends `ms_per_insert` inserting each."""
    out, n, ms = [], 0.0, 0.0
    cost = list(ms_per_insert) if isinstance(ms_per_insert, Sequence) else None
    for i, rate in enumerate([0.0, *per_bucket]):
        n += rate * STEP
        ms += rate * STEP * (cost[i - 1] if cost and i else ms_per_insert if not cost else 0)
        s = table_snapshot(start + STEP * i, int(n), int(n), min_diff=-1e9, max_diff=1e9)
        out.append(dataclasses.replace(s, worker_time=dataclasses.replace(
            s.worker_time, inserting_ms=int(ms), sleeping_ms=int(1000 * STEP * i))))
    return tuple(out)


def coarse_actor(per_bucket: Sequence[float], writer_share: float = 0.1
                 ) -> tuple[ActorSnapshot, ...]:
    out, n = [], 0.0
    for i, rate in enumerate([0.0, *per_bucket]):
        n += rate * STEP
        a = actor_snapshot(STEP * i, int(n))
        calls = tuple(dataclasses.replace(c, seconds_total=writer_share * STEP * i / len(a.calls))
                      for c in a.calls)
        out.append(dataclasses.replace(a, calls=calls))
    return tuple(out)


def view(table: tuple[TableSnapshot, ...], actors: dict[str, tuple] | None = None
         ) -> TargetView:
    return TargetView(TARGET, polls=(), tables={}, probes={}, probe_polls={},
                      coarse_tables={"replay": table}, coarse_actors=actors or {})


def now_of(table: tuple[TableSnapshot, ...]) -> float:
    return table[-1].observed_at


HEALTHY = rates((100, 1800))
THROUGHPUT_CASES: list[tuple[str, Callable[..., Any], Callable[[], Any], str | None]] = [
    # 100/s for 35 min: its own baseline.
    ("no_throughput_drop_on_a_steady_job", rules_throughput.is_throughput_drop,
     lambda: view(coarse_table(rates((100, 2100)))), None),
    # 30 min at 100/s, then 10/s for 70 s: below a fifth for more than 60 s.
    ("throughput_drop_below_a_fifth_for_a_minute", rules_throughput.is_throughput_drop,
     lambda: view(coarse_table(HEALTHY + rates((10, 70)))), "throughput_drop"),
    # ... for 50 s only: not yet.
    ("no_throughput_drop_below_a_fifth_for_less_than_a_minute",
     rules_throughput.is_throughput_drop,
     lambda: view(coarse_table(HEALTHY + rates((10, 50)))), None),
    # 40/s for 310 s: below half for more than 300 s.
    ("throughput_drop_below_half_for_five_minutes", rules_throughput.is_throughput_drop,
     lambda: view(coarse_table(HEALTHY + rates((40, 310)))), "throughput_drop"),
    # 40/s for 200 s: below half, not for long enough, and not below a fifth.
    ("no_throughput_drop_below_half_for_less_than_five_minutes",
     rules_throughput.is_throughput_drop,
     lambda: view(coarse_table(HEALTHY + rates((40, 200)))), None),
    # A noisy drop to just under half: 40/s and 56/s by turns (48/s, half the buckets above
    # the half line) for 310 s. The span's median bucket is under the line: a drop.
    ("throughput_drop_just_under_half_with_noise", rules_throughput.is_throughput_drop,
     lambda: view(coarse_table(HEALTHY + rates((40, 10), (56, 10)) * 16)), "throughput_drop"),
    # Slow for the first half of the span, then back to 100/s: the median bucket and the
    # span's rate are above half. Recovered, not a drop.
    ("no_throughput_drop_when_half_the_span_is_back_to_normal",
     rules_throughput.is_throughput_drop,
     lambda: view(coarse_table(HEALTHY + rates((20, 160), (100, 150)))), None),
    # 60/s for 10 min: slower, inside the band (+-50 % at least).
    ("no_throughput_drop_inside_the_band", rules_throughput.is_throughput_drop,
     lambda: view(coarse_table(HEALTHY + rates((60, 600)))), None),
    # An evaluation pause every minute (10 s of nothing inserted in every 60 s): the
    # baseline leaves still buckets out, and a span of mostly healthy buckets is no drop.
    ("no_throughput_drop_with_an_evaluation_pause_every_minute",
     rules_throughput.is_throughput_drop,
     lambda: view(coarse_table(rates((100, 50), (0, 10)) * 40)), None),
    # Nothing moved for 70 s: a stop is the stall rules', not a slower rate.
    ("no_throughput_drop_when_everything_stopped", rules_throughput.is_throughput_drop,
     lambda: view(coarse_table(HEALTHY + rates((0, 70)))), None),
    # Two minutes of history, then a drop: no baseline yet (start-up).
    ("no_throughput_drop_without_three_minutes_of_baseline",
     rules_throughput.is_throughput_drop,
     lambda: view(coarse_table(rates((100, 120), (10, 70)))), None),
    # 30 min of 100/s, an actor whose steps fell to 5/s for 70 s while the table (other
    # actors) keeps its rate: that actor's drop.
    ("throughput_drop_of_one_actor", rules_throughput.is_throughput_drop,
     lambda: view(coarse_table(rates((100, 1870))),
                  {"http://actor:1": coarse_actor(rates((50, 1800), (5, 70)))}),
     "throughput_drop"),
]


@pytest.mark.parametrize("name,rule,scenario,expected", THROUGHPUT_CASES,
                         ids=[c[0] for c in THROUGHPUT_CASES])
def test_throughput_rule(name: str, rule: Callable[..., Any], scenario: Callable[[], Any],
                         expected: str | None) -> None:
    v = scenario()
    finding = rule(v, DEFAULT, now_of(v.coarse_tables["replay"]))
    assert (finding.kind if finding else None) == expected
    assert_as_declared(finding, rule)


def drop_of(table: tuple[TableSnapshot, ...], **kw: Any) -> Finding:
    finding = rules_throughput.is_throughput_drop(view(table, **kw), DEFAULT, now_of(table))
    assert finding is not None
    return finding


def test_a_drop_shows_the_rate_the_baseline_and_the_band() -> None:
    finding = drop_of(coarse_table(HEALTHY + rates((10, 70))))
    assert finding.severity is Severity.WARNING and finding.table == "replay"
    inserts = finding.evidence["series"]["inserts"]
    assert inserts["rate_per_s"] == pytest.approx(10.0)
    assert inserts["baseline_per_s"] == 100.0 and inserts["band_low_per_s"] == 50.0
    assert inserts["below_a_fifth"] is True and inserts["ratio"] == pytest.approx(0.1)
    assert set(finding.evidence["series"]) == {"inserts", "samples"}
    assert "below a fifth of its own baseline" in finding.summary
    assert finding.since == now_of(coarse_table(HEALTHY + rates((10, 70)))) - 60.0


def test_a_drop_blames_the_server_when_its_time_per_insert_grew() -> None:
    cost = [0.05] * 180 + [5.0] * 7  # 100x per insert: the worker busy 5 % of the time
    slow = drop_of(coarse_table(HEALTHY + rates((10, 70)), ms_per_insert=cost))
    assert slow.evidence["attribution"] == "server"
    assert slow.fix.startswith("The Reverb server is slower")
    clients = drop_of(coarse_table(HEALTHY + rates((10, 70))))
    assert clients.evidence["attribution"] == "clients"
    assert "the clients are slower" in clients.fix


def test_a_drop_names_the_actor_and_its_writer_share() -> None:
    finding = drop_of(coarse_table(rates((100, 1870))),
                      actors={"http://actor:1": coarse_actor(rates((50, 1800), (5, 70)))})
    assert list(finding.evidence["series"]) == ["actor actor-0 steps"]
    assert finding.evidence["actors"]["actor-0"]["writer_share_before"] == pytest.approx(0.1)


def test_the_baseline_is_the_median_with_a_band_of_at_least_half() -> None:
    steady = bl.Baseline.of([bl.Bucket(0, 10, r) for r in [100.0] * 20])
    assert (steady.median, steady.mad, steady.low) == (100.0, 0.0, 50.0)
    noisy = bl.Baseline.of([bl.Bucket(0, 10, r) for r in [50.0, 150.0] * 10])
    assert noisy.median == 100.0 and noisy.mad == 50.0 and noisy.low == 0.0


def test_a_drop_needs_the_engine_to_hand_the_coarse_history() -> None:
    table = coarse_table(HEALTHY + rates((10, 70)))
    found = diagnose(view(table), DEFAULT, now_of(table)).findings
    assert [f.kind for f in found] == ["throughput_drop"]


def test_history_keeps_one_snapshot_per_bucket_for_the_look_back_and_baselines_follow() -> None:
    # 1 Hz polls for 40 min into a history that keeps 60 s of every poll: the coarse copy
    # holds one snapshot per 10 s over its 35 min, enough for the baseline the metrics show.
    history = History(max_age_s=60.0, max_points=100, coarse_every_s=10.0,
                      coarse_age_s=DEFAULT.throughput_lookback_s + 10.0)
    for t in range(2400):
        snap = table_snapshot(float(t), 100 * t, 100 * t, target=TARGET,
                              min_diff=-1e9, max_diff=1e9)
        history.record(PollOutcome(TARGET, SourceKind.REVERB, float(t), 0.001, (snap,)))
    view_ = history.view(TARGET, [], start=2340.0,
                         coarse_start=2399.0 - DEFAULT.throughput_lookback_s)
    assert len(view_.tables["replay"]) == 60
    coarse = view_.coarse_tables["replay"]
    assert 200 <= len(coarse) <= 211
    assert {b.observed_at - a.observed_at for a, b in zip(coarse, coarse[1:])} == {10.0}
    found = rules_throughput.table_baselines(view_, DEFAULT, 2399.0)
    assert found["replay"]["inserts"].median == pytest.approx(100.0)
    assert found["replay"]["inserts"].low == pytest.approx(50.0)
    assert history.view(TARGET, [], start=2340.0).coarse_tables == {}


def test_an_open_drop_is_judged_against_the_baseline_it_opened_with() -> None:
    # Two hours 10x slower after 30 min at 100/s: by then the look-back holds slow rates only
    # and is its own median. The open finding's baseline keeps it named until the rate is
    # back above half of 100/s.
    opened = drop_of(coarse_table(HEALTHY + rates((10, 70))))
    held = rules_throughput.held_baselines(opened.evidence)
    assert held["inserts"].median == 100.0 and held["inserts"].low == 50.0
    night = coarse_table(HEALTHY + rates((10, 7200)))
    assert rules_throughput.is_throughput_drop(view(night), DEFAULT, now_of(night)) is None
    kept = dataclasses.replace(view(night), held_baselines={"replay": held})
    still = rules_throughput.is_throughput_drop(kept, DEFAULT, now_of(night))
    assert still is not None and still.evidence["series"]["inserts"]["baseline_per_s"] == 100.0
    back = coarse_table(HEALTHY + rates((10, 7200), (100, 300)))
    again = dataclasses.replace(view(back), held_baselines={"replay": held})
    assert rules_throughput.is_throughput_drop(again, DEFAULT, now_of(back)) is None
    # The dashboard's band stays at the held baseline while the drop is open.
    band = rules_throughput.table_baselines(kept, DEFAULT, now_of(night))
    assert band["replay"]["inserts"].median == 100.0


def test_an_open_drop_just_under_half_stays_open_through_its_noise_and_resolves_above() -> None:
    # Opened at 48/s against 100/s. A span whose median bucket is 52/s is above the half line,
    # but an open drop is held until its span is back above 60/s (HOLD_MARGIN): one noisy span
    # does not resolve it and open it again.
    opened = drop_of(coarse_table(HEALTHY + rates((40, 10), (56, 10)) * 16))
    held = {"replay": rules_throughput.held_baselines(opened.evidence)}
    noisy = coarse_table(HEALTHY + rates((40, 10), (56, 10)) * 16 + rates((48, 10), (56, 10)) * 16)
    assert rules_throughput.is_throughput_drop(view(noisy), DEFAULT, now_of(noisy)) is None
    kept = dataclasses.replace(view(noisy), held_baselines=held)
    assert rules_throughput.is_throughput_drop(kept, DEFAULT, now_of(noisy)) is not None
    back = coarse_table(HEALTHY + rates((40, 10), (56, 10)) * 16 + rates((70, 310)))
    again = dataclasses.replace(view(back), held_baselines=held)
    assert rules_throughput.is_throughput_drop(again, DEFAULT, now_of(back)) is None


def test_evidence_without_baselines_holds_nothing() -> None:
    assert rules_throughput.held_baselines({}) == {}
    assert rules_throughput.held_baselines({"series": {"inserts": {"ratio": 0.1}}}) == {}


def test_the_keeper_keeps_a_drop_open_past_half_the_look_back() -> None:
    # Polls every 10 s through the findings keeper, a 10 min look-back: 10 min at 100/s,
    # then 30 min at 10/s. Judged against the look-back alone the drop resolved about 5 min
    # after it began.
    th = Thresholds(throughput_baseline_s=600.0, throughput_min_baseline_s=60.0,
                    throughput_drop_for_s=100.0)
    history = History(max_age_s=60.0, max_points=100, coarse_every_s=10.0,
                      coarse_age_s=th.throughput_lookback_s + 10.0)
    keeper = FindingsKeeper(lambda: {TARGET: []}, th, 10.0, None)
    n, open_at = 0, []
    for i in range(240):
        t = 10.0 * i
        n += 100 * 10 if t <= 600 else 10 * 10
        snap = table_snapshot(t, n, n, target=TARGET, min_diff=-1e9, max_diff=1e9)
        history.record(PollOutcome(TARGET, SourceKind.REVERB, t, 0.001, (snap,)))
        found = keeper.diagnose_cycle(history, {}, t).findings
        if any(f.kind == "throughput_drop" for f in found):
            open_at.append(t)
    assert open_at and open_at[0] <= 600 + 40 and open_at[-1] == 2390.0
    assert len(open_at) == (2390 - open_at[0]) / 10 + 1  # never resolved in between


def test_a_restarted_sidecar_keeps_judging_an_open_drop_by_its_logged_baseline(
        tmp_path: Path) -> None:
    # The drop opened against 100/s and the sidecar restarted two hours into it: its own
    # history holds slow rates only. The baseline comes back with the incident's evidence.
    log = IncidentLog(str(tmp_path / "i.db"))
    opened = drop_of(coarse_table(HEALTHY + rates((10, 70))))
    assert log.connect()
    log.apply([Transition("opened", dataclasses.replace(opened, target=TARGET))], {})
    log.close()
    history = History(max_age_s=60.0, max_points=100, coarse_every_s=10.0,
                      coarse_age_s=DEFAULT.throughput_lookback_s + 10.0)
    keeper = FindingsKeeper(lambda: {TARGET: []}, DEFAULT, 10.0,
                            IncidentLog(str(tmp_path / "i.db")))
    n, kept = 0, []
    for i in range(120):  # 20 min at 10/s, far past the minute a resumed incident is held
        t = 10_000.0 + 10.0 * i
        n += 10 * 10
        snap = table_snapshot(t, n, n, target=TARGET, min_diff=-1e9, max_diff=1e9)
        history.record(PollOutcome(TARGET, SourceKind.REVERB, t, 0.001, (snap,)))
        found = keeper.diagnose_cycle(history, {}, t).findings
        kept.append(any(f.kind == "throughput_drop" for f in found))
    assert all(kept)


def test_inserts_that_come_in_bursts_are_judged_over_their_rhythm_not_as_a_drop() -> None:
    # 30 min of a burst every 40 s (400 items in one 10 s bucket of four): no drop, and with
    # the rhythm learned (a gap of 40 s) the rates are of whole cycles, 10/s, as the job runs.
    table = coarse_table([40.0, 0.0, 0.0, 0.0] * 60)
    r = rh.Rhythm(0.0, 0.0, gaps=(40.0,) * 20)
    rhythms = {"inserts replay": r, "samples replay": r}
    for v in (view(table), dataclasses.replace(view(table), rhythms=rhythms)):
        assert rules_throughput.is_throughput_drop(v, DEFAULT, now_of(table)) is None
    # Bursts of a quarter the size: a drop, its baseline the job's real 10/s.
    slow = coarse_table([40.0, 0.0, 0.0, 0.0] * 60 + [10.0, 0.0, 0.0, 0.0] * 12)
    slowed = dataclasses.replace(view(slow), rhythms=rhythms)
    found = rules_throughput.is_throughput_drop(slowed, DEFAULT, now_of(slow))
    assert found is not None
    assert found.evidence["series"]["inserts"]["baseline_per_s"] == 10.0


def test_merged_buckets_keep_the_rate_of_what_moved() -> None:
    out = bl.merged([bl.Bucket(0, 10, 40.0), bl.Bucket(10, 20, 0.0), bl.Bucket(20, 30, 0.0),
                     bl.Bucket(30, 40, 0.0), bl.Bucket(40, 50, 40.0)], 40.0)
    assert [(b.start, b.end, b.rate) for b in out] == [(0, 40, 10.0), (40, 50, 40.0)]
