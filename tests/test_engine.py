"""diagnose() on whole views: which findings come out, which win, and when it abstains."""

from __future__ import annotations

import pytest

from replaywatch.diagnosis import kinds as kinds_module
from replaywatch.diagnosis import rules
from replaywatch.diagnosis.engine import diagnose
from replaywatch.diagnosis.registry import Rule, Shape
from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.model import FLOAT_MAX, Severity
from tests.builders import (
    DEFAULT,
    SEED_FROZEN_SAMPLES,
    SEED_LIMITER,
    T20,
    cumulative,
    polls,
    probe_history,
    seconds,
    seed_healthy,
    seed_hung_probe,
    seed_hung_table,
    table_history,
    target_view,
    waiting,
)


def kinds(view, now: float = 1019.0, th: Thresholds = DEFAULT) -> list[str]:
    return [f.kind for f in diagnose(view, th, now).findings]


def alarms(view, now: float = 1019.0) -> list[str]:
    """Warning and critical findings only: what a healthy run must not show."""
    return [f.kind for f in diagnose(view, DEFAULT, now).findings
            if f.severity >= Severity.WARNING]


def test_seed_hang_is_worker_starvation_not_sample_blocked() -> None:
    # The more specific cause wins on the same table; the predictive warning stays.
    view = target_view([seed_hung_table()], [seed_hung_probe(iterators_per_worker=3)])
    assert kinds(view) == ["worker_starvation", "deadlock_risk"]


def test_seed_hang_seen_from_reverb_alone_is_sample_blocked_with_a_hint() -> None:
    diagnosis = diagnose(target_view([seed_hung_table()]), DEFAULT, 1019.0)
    assert [f.kind for f in diagnosis.findings] == ["sample_blocked"]
    assert "attach the trainer probe" in diagnosis.findings[0].summary


def test_healthy_synchronous_loop_with_one_worker_gives_no_alarm() -> None:
    # Cursor at min_diff between inserts, waiting_for_inserts at 980 ms/s, next() blocks briefly.
    table, probe = seed_healthy(workers=1)
    assert kinds(target_view([table], [probe])) == []


def test_healthy_synchronous_loop_with_12_workers_and_a_wide_buffer_gives_no_warning() -> None:
    # error_buffer 25600 released against 12 x 255 that one iterator per worker can hold;
    # the signature's items are small, so one answer carries a whole batch.
    table, probe = seed_healthy(workers=12, item_bytes=16)
    assert kinds(target_view([table], [probe])) == []


def test_the_same_loop_on_a_table_without_signature_warns_with_both_readings() -> None:
    # No item size anywhere: frames would answer 17 at a time, thinner than a batch.
    table, probe = seed_healthy(workers=12)
    diagnosis = diagnose(target_view([table], [probe]), DEFAULT, 1019.0)
    assert [(f.kind, f.severity) for f in diagnosis.findings] == [
        ("deadlock_risk", Severity.WARNING)]
    assert "items' size is unknown" in diagnosis.findings[0].summary


def test_healthy_synchronous_loop_on_acme_interleave_only_warns_of_the_risk() -> None:
    table, _ = seed_healthy(workers=12)
    probe = probe_history(T20, [0] * 20, workers=12, iterators_per_worker=3)
    diagnosis = diagnose(target_view([table], [probe]), DEFAULT, 1019.0)
    assert [(f.kind, f.severity) for f in diagnosis.findings] == [
        ("deadlock_risk", Severity.WARNING)]


def test_a_sync_loop_below_a_batch_on_a_table_without_signature_is_judged_not_crashed() -> None:
    # The starved learner of the status page test: 4 workers of 16, error_buffer 0 and spi 1
    # (below a batch: warm-up only takes ready batches), no signature: it races once trained.
    table = table_history(T20, 50, 40, spi=1.0, min_diff=10.0, max_diff=FLOAT_MAX, min_size=10)
    probe = probe_history(T20, 0, workers=4, batch_size=16, gate="can_sample")
    diagnosis = diagnose(target_view([table], [probe]), DEFAULT, 1019.0)
    risk = next(f for f in diagnosis.findings if f.kind == "deadlock_risk")
    assert risk.evidence["released_samples"] == 16 and "releases 16 samples" in risk.summary
    # Its gate unknown, the scheduled reading asks for 16 of 0 released: it will hang, said
    # as a risk (a warning) until the loop's own calls settle the gate.
    unknown = probe_history(T20, 0, workers=4, batch_size=16)
    risk = next(f for f in diagnose(target_view([table], [unknown]), DEFAULT, 1019.0).findings
                if f.kind == "deadlock_risk")
    assert (risk.evidence["verdict"], risk.evidence["judged_gate"]) == ("will_hang", "schedule")


def test_findings_carry_onset_as_since_and_now_as_last_seen() -> None:
    finding = diagnose(target_view([seed_hung_table()], [seed_hung_probe()]), DEFAULT,
                       1019.5).findings[0]
    assert finding.since == 1000.0 and finding.last_seen == 1019.5


def test_counters_reset_after_a_reverb_restart_give_no_finding() -> None:
    # Healthy to t=1014; the server restarts and counters start again from 0 at t=1015,
    # 2 inserts/s (spi 1, min_size 1). Judged from the reset on: no negative rate, no stall.
    times = seconds(20)
    inserts = [1000 + 2 * i for i in range(15)] + [2 * i for i in range(5)]
    samples = [900 + 2 * i for i in range(15)] + [2 * i for i in range(5)]
    table = table_history(times, inserts, samples, waiting_for_inserts_ms=waiting())
    assert kinds(target_view([table])) == ["server_restarted"]  # info: named, never a stall


def test_just_after_a_reverb_restart_the_table_is_insufficient_data() -> None:
    # Two polls since the reset, 1 s apart: less than min_history_s (3 s).
    times = seconds(20)
    inserts = [1000] * 18 + [0, 0]
    samples = [900] * 18 + [0, 0]
    diagnosis = diagnose(target_view([table_history(times, inserts, samples,
                                                    waiting_for_inserts_ms=waiting())]),
                         DEFAULT, 1019.0)
    assert [f.kind for f in diagnosis.findings] == ["server_restarted"]
    assert diagnosis.insufficient == ("table:replay",)


def test_too_little_history_is_insufficient_data_not_a_guess() -> None:
    # Two polls of a table that looks stuck: not enough to call it a stall.
    table = table_history(seconds(2), 5, 5, waiting_for_inserts_ms=[0, 980], min_size=100)
    diagnosis = diagnose(target_view([table]), DEFAULT, 1001.0)
    assert diagnosis.findings == ()
    assert diagnosis.insufficient == ("table:replay",)


def test_a_probe_with_too_little_history_is_named_insufficient() -> None:
    table, _ = seed_healthy()
    probe = probe_history(seconds(2, start=1017.0), 5000)
    diagnosis = diagnose(target_view([table], [probe]), DEFAULT, 1019.0)
    assert diagnosis.insufficient == ("probe:http://127.0.0.1:9100",)
    assert diagnosis.findings == ()


def test_a_table_added_mid_run_is_insufficient_while_the_old_one_is_judged() -> None:
    # "replay" hangs for 20 s; "eval" appears at t=1018 with 2 polls.
    new = table_history([1018.0, 1019.0], 0, 0, name="eval", min_size=10)
    diagnosis = diagnose(target_view([seed_hung_table(), new]), DEFAULT, 1019.0)
    assert [(f.kind, f.table) for f in diagnosis.findings] == [("sample_blocked", "replay")]
    assert diagnosis.insufficient == ("table:eval",)


def test_two_learners_sampling_one_table_are_healthy_together() -> None:
    # Each takes one batch of 256 per second; the table draws 512/s and gets 4 inserts/s.
    inserts = [12_000 + 4 * i for i in range(20)]
    samples = [n * 128 - 230_400 for n in inserts]
    table = table_history(T20, inserts, samples, waiting_for_inserts_ms=waiting(), **SEED_LIMITER)
    a = probe_history(T20, list(range(2550, 2570)), url="http://a", table="replay")
    b = probe_history(T20, list(range(2550, 2570)), url="http://b", table="replay")
    assert kinds(target_view([table], [a, b])) == []


def test_two_learners_one_hung_in_its_update_is_learner_stalled_once() -> None:
    # The table can still sample a batch; learner b takes none for 19 s, a keeps going.
    table = table_history(T20, list(range(1000, 1020)), list(range(100, 120)), min_diff=0.0,
                          max_diff=1e308)  # actors keep inserting (else: stale_data)
    a = probe_history(T20, list(range(20)), url="http://a", ready=True, gate="can_sample")
    b = probe_history(T20, 7, url="http://b", ready=True, gate="can_sample")
    diagnosis = diagnose(target_view([table], [a, b]), DEFAULT, 1019.0)
    assert [f.kind for f in diagnosis.findings] == ["learner_stalled"]
    assert diagnosis.findings[0].evidence["probe"] == "http://b"


def test_two_learners_both_starved_count_the_stranded_samples_of_both() -> None:
    # 1,305,600 drawn; a got 2547 and b 2547 batches: 1,305,600 - 5094 * 256 = 1536.
    a = seed_hung_probe(batches=2547, url="http://a")
    b = seed_hung_probe(batches=2547, url="http://b")
    diagnosis = diagnose(target_view([seed_hung_table()], [a, b]), DEFAULT, 1019.0)
    starvation = [f for f in diagnosis.findings if f.kind == "worker_starvation"]
    assert len(starvation) == 1 and starvation[0].evidence["stranded_samples"] == 1536


def test_irregular_poll_spacing_still_proves_a_stall_from_its_onset() -> None:
    # Polls 0.3 s to 7 s apart; nothing moved since t=1000.5, last poll at t=1019.
    times = [1000.0, 1000.5, 1003.0, 1004.0, 1011.0, 1012.2, 1019.0]
    inserts = [11_999, 12_000, 12_000, 12_000, 12_000, 12_000, 12_000]
    samples = [1_305_472] + [SEED_FROZEN_SAMPLES[0]] * 6
    table = table_history(times, inserts, samples,
                          waiting_for_inserts_ms=cumulative(980, times), **SEED_LIMITER)
    findings = diagnose(target_view([table]), DEFAULT, 1019.0).findings
    assert [(f.kind, f.since) for f in findings] == [("sample_blocked", 1000.5)]


def test_irregular_poll_spacing_in_a_healthy_run_gives_no_alarm() -> None:
    times = [1000.0, 1000.5, 1003.0, 1004.0, 1011.0, 1012.2, 1019.0]
    inserts = [int(12_000 + 2 * (t - 1000)) for t in times]
    samples = [n * 128 - 230_400 for n in inserts]
    table = table_history(times, inserts, samples,
                          waiting_for_inserts_ms=cumulative(980, times), **SEED_LIMITER)
    assert alarms(target_view([table])) == []


def test_a_down_target_is_target_down_and_its_stale_tables_are_not_judged() -> None:
    # Last good poll at t=1005 (the table then looked stuck); 14 failed polls since.
    table = seed_hung_table()[:6]
    view = target_view([table], target_polls=polls(T20, ok=[True] * 6 + [False] * 14))
    assert kinds(view) == ["target_down"]


def test_a_probe_without_a_table_reads_the_only_table() -> None:
    probe = seed_hung_probe(table=None)
    assert "worker_starvation" in kinds(target_view([seed_hung_table()], [probe]))


def test_a_probe_without_a_table_is_not_guessed_onto_one_of_two() -> None:
    other = table_history(T20, list(range(100, 120)), list(range(20)), name="other")
    probe = seed_hung_probe(table=None)
    assert kinds(target_view([seed_hung_table(), other], [probe])) == ["sample_blocked"]


def test_findings_come_out_worst_first() -> None:
    # A hung learner on a warming table next to a probe with 600 threads.
    probe = seed_hung_probe(threads=600, iterators_per_worker=3)
    severities = [f.severity for f in diagnose(target_view([seed_hung_table()], [probe]),
                                               DEFAULT, 1019.0).findings]
    assert severities == sorted(severities, reverse=True) and len(severities) == 3


def test_a_longer_stall_window_holds_the_verdict_back() -> None:
    view = target_view([seed_hung_table()], [seed_hung_probe(iterators_per_worker=3)])
    assert kinds(view, th=Thresholds(stall_window_s=30.0)) == ["deadlock_risk"]


def test_an_empty_view_is_insufficient_data() -> None:
    diagnosis = diagnose(target_view(target_polls=()), DEFAULT, 1000.0)
    assert diagnosis.findings == () and diagnosis.insufficient == ("target:localhost:8000",)


def test_the_engine_runs_every_registered_rule_once_in_its_shape() -> None:
    run = [rule for shape in Shape for rule in rules.of_shape(shape)]
    assert sorted(map(id, run)) == sorted(map(id, rules.BY_KIND.values()))
    assert len({r.kind for r in rules.ALL}) == len(rules.ALL) == len(kinds_module.ALL)


def test_a_rule_handed_a_probe_must_produce_a_kind_that_needs_one() -> None:
    with pytest.raises(ValueError, match="needs_probe=True"):
        Rule(kinds_module.SAMPLE_BLOCKED, lambda *a: None, Shape.PROBE_STALL)
    with pytest.raises(ValueError, match="needs_probe=False"):
        Rule(kinds_module.LEARNER_STALLED, lambda *a: None, Shape.TABLE_STALL)


def test_a_kind_registered_twice_is_refused() -> None:
    twice = (*rules.ALL, rules.ALL[0])
    with pytest.raises(ValueError, match="registered twice"):
        rules._by_kind(twice)


def test_a_new_kind_is_its_declaration_and_its_registered_rule(monkeypatch) -> None:
    # What CONTRIBUTING.md's recipe asks for, and nothing else: a Kind in kinds.ALL and a
    # Rule in a family's RULES (here patched in); the engine runs it and ranks it.
    new = kinds_module.Kind("table_is_tiny", Severity.WARNING, needs_probe=False,
                            meaning="max_size below 100.", fix="Raise max_size.")

    def is_table_is_tiny(case, th):
        t = case.latest
        return case.finding(new, "tiny", {}, "Raise max_size.", since=t.observed_at) \
            if t.max_size < 100 else None

    monkeypatch.setattr(kinds_module, "ALL", (*kinds_module.ALL, new))
    monkeypatch.setattr(rules, "ALL", (*rules.ALL, Rule(new, is_table_is_tiny,
                                                         Shape.TABLE_SETTINGS)))
    view = target_view([table_history(seconds(20), 100, 50, max_size=50)])
    assert "table_is_tiny" in kinds(view)


def test_a_rule_that_raises_costs_its_own_finding_not_the_others(monkeypatch) -> None:
    def broken(case, th):
        raise ZeroDivisionError("a bug")

    view = target_view([seed_hung_table()], [seed_hung_probe()])
    before = diagnose(view, DEFAULT, 1019.5)
    monkeypatch.setattr(rules, "ALL", (*rules.ALL, Rule(kinds_module.SPI_DRIFT, broken,
                                                         Shape.TABLE_SETTINGS)))
    after = diagnose(view, DEFAULT, 1019.5)
    assert [f.kind for f in after.findings] == [f.kind for f in before.findings] != []
    assert after.rule_errors == (
        "test_a_rule_that_raises_costs_its_own_finding_not_the_others.<locals>.broken: "
        "ZeroDivisionError: a bug",)
    assert before.rule_errors == ()
