"""The actor side of a table (diagnosis/actors.py) and whole-view verdicts that depend on it;
then the rules of diagnosis/rules_actors.py (worker_starvation, writer_stalled), one table row
per case, each with why.

Times are 1 s polls from t=1000 (T20 = 1000 .. 1019); the stall window is the default 10 s.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from replaywatch.diagnosis import actors as act
from replaywatch.diagnosis import rules_actors, rules_stalls
from replaywatch.diagnosis import window as win
from replaywatch.diagnosis.actors import Actor
from replaywatch.diagnosis.case import TableCase
from replaywatch.diagnosis.engine import diagnose
from replaywatch.diagnosis.window import TargetView
from replaywatch.model import ActorSnapshot, TableSnapshot
from tests.builders import (
    ACTOR,
    DEFAULT,
    SEED_BATCHES,
    SEED_BLOCKING_LIMITER,
    SEED_FROZEN_INSERTS,
    SEED_FROZEN_SAMPLES,
    SEED_LIMITER,
    T20,
    actor,
    actor_snapshot,
    assert_as_declared,
    async_hung_table,
    case,
    dead_actor,
    in_writer,
    polls,
    probe_history,
    seed_healthy,
    seed_hung_probe,
    seed_hung_table,
    silent_actor,
    table_history,
    target_view,
    waiting,
)


def stepping_actor() -> Actor:
    return Actor(ACTOR, tuple(actor_snapshot(t, int(t) - 900) for t in T20), polls(T20))


def short_waits_actor() -> Actor:
    """Waits on the learner in 0.1 s waits (a loop that re-checks the learner's step): at each
    poll it is inside one, 0.05 s old, and has waited 0.95 s of every second."""
    history = tuple(dataclasses.replace(
        actor_snapshot(t, 500, waiting_on="learner", waiting_for=0.05), waits_total=int(t),
        waiting_seconds_total=0.95 * (t - 1000) + 0.05) for t in T20)
    return Actor(ACTOR, history, polls(T20))


def blocked_in_flush() -> Actor:
    return Actor(ACTOR, in_writer("flush", 1004.0), polls(T20))


STATE_CASES = [
    ("down_when_its_probe_stopped_answering", dead_actor(), act.DOWN),
    ("down_when_it_never_answered_in_the_window", Actor(ACTOR, (), polls(T20, ok=False)),
     act.DOWN),
    ("waiting_inside_one_long_wait", actor(waiting_on="learner"), act.WAITING),
    ("waiting_in_many_short_waits", short_waits_actor(), act.WAITING),
    ("in_writer_call_for_the_window", blocked_in_flush(), act.IN_WRITER_CALL),
    ("silent_without_step_item_or_wait", silent_actor(), act.SILENT),
    ("stepping_while_it_takes_steps", stepping_actor(), act.STEPPING),
]


@pytest.mark.parametrize("name,subject,expected", STATE_CASES, ids=[c[0] for c in STATE_CASES])
def test_actor_state(name: str, subject: Actor, expected: str) -> None:
    assert act.state(subject, DEFAULT, 1019.0) == expected


def test_a_jittering_started_at_is_not_a_restart() -> None:
    # The actor probe derives started_at from its monotonic clock on every read (~1e-7 s
    # apart): seen live, every poll looked like a restart and no wait ever lasted a window.
    history = tuple(dataclasses.replace(actor_snapshot(t, 500), started_at=1e-7 * (i % 3))
                    for i, t in enumerate(T20))
    assert len(win.actor_since_last_restart(history)) == 20
    restarted = history[:10] + tuple(dataclasses.replace(s, started_at=1010.0)
                                     for s in history[10:])
    assert len(win.actor_since_last_restart(restarted)) == 10


def view_with(table: tuple[TableSnapshot, ...], actors: dict[str, Actor],
              probes: tuple[Any, ...] = ()) -> TargetView:
    view = target_view([table], list(probes))
    return dataclasses.replace(view, actors={u: a.history for u, a in actors.items()},
                               probe_polls={**view.probe_polls,
                                            **{u: a.polls for u, a in actors.items()}})


def kinds(view: TargetView) -> list[str]:
    return [f.kind for f in diagnose(view, DEFAULT, 1019.0).findings]


def test_the_reported_case_dead_async_actors_and_a_probe_are_sample_blocked() -> None:
    # Asynchronous, 4 workers, 1536 stranded, the only actor dead: restart the actors.
    found = kinds(view_with(async_hung_table(), {ACTOR: dead_actor()},
                            (seed_hung_probe(workers=4),)))
    assert "sample_blocked" in found and "worker_starvation" not in found


def test_async_actors_waiting_on_the_learner_make_the_engine_name_starvation() -> None:
    found = kinds(view_with(async_hung_table(), {ACTOR: actor(waiting_on="learner")},
                            (seed_hung_probe(workers=4),)))
    assert found[0] == "worker_starvation" and "sample_blocked" not in found


def test_a_stuck_writer_replaces_sample_blocked_on_its_table() -> None:
    found = kinds(view_with(async_hung_table(), {ACTOR: blocked_in_flush()}))
    assert "writer_stalled" in found and "sample_blocked" not in found


def test_an_actor_naming_no_table_writes_to_the_only_table() -> None:
    anonymous = Actor(ACTOR, tuple(dataclasses.replace(s, table=None)
                                   for s in actor(waiting_on="learner").history), polls(T20))
    found = kinds(view_with(async_hung_table(), {ACTOR: anonymous},
                            (seed_hung_probe(workers=4),)))
    assert found[0] == "worker_starvation"


def test_evidence_lists_each_actor_state_and_what_they_wait_on() -> None:
    evidence = act.evidence([actor(waiting_on="learner"), dead_actor(url="http://a1")],
                            DEFAULT, 1019.0)
    # Both are named actor-0: a repeated name is keyed by the probe URL instead.
    assert evidence["actors"] == {ACTOR: "waiting", "http://a1": "down"}
    assert evidence["actors_waiting_on"] == ["learner"]


def test_sample_blocked_summary_stays_the_same_while_actor_states_change() -> None:
    # The summary holds stable facts only; who is down or silent is in the evidence.

    findings = [rules_stalls.is_sample_blocked(case(async_hung_table(), seed_hung_probe(workers=4),
                                             actors=(a,)), DEFAULT)
                for a in (dead_actor(), silent_actor())]
    assert findings[0] is not None and findings[1] is not None
    assert findings[0].summary == findings[1].summary
    assert [f.evidence["actors"] for f in findings] == [{"actor-0": "down"},
                                                        {"actor-0": "silent"}]


# -- rules_actors.py: worker_starvation and writer_stalled --------------------------------------

# -- worker_starvation: a proven circular wait --------------------------------------------------

StarvationScenario = Callable[[], TableCase]

STARVATION_CASES: list[tuple[str, StarvationScenario, str | None]] = [
    # The seed hang: synchronous, 12 workers, blocked 20 s, no samples, headroom 0, 1536 stranded.
    ("worker_starvation_when_12_workers_strand_a_batch",
     lambda: case(seed_hung_table(), seed_hung_probe()), "worker_starvation"),
    # One worker: at most 255 stranded, so fewer than a batch can be missing... here 0.
    ("no_worker_starvation_when_nothing_is_stranded",
     lambda: case(seed_hung_table(), seed_hung_probe(workers=1, batches=5100)), None),
    # Blocked only 9 s: shorter than the stall window.
    ("no_worker_starvation_before_the_stall_window",
     lambda: case(seed_hung_table(), probe_history(T20, SEED_BATCHES, blocked_for=9.0,
                                                   workers=12)), None),
    # The learner waits briefly in a healthy loop; samples keep flowing.
    ("no_worker_starvation_in_a_healthy_synchronous_loop",
     lambda: case(*seed_healthy(workers=12)), None),
    # 103,936 samples undelivered behind 12 workers of 256 (3072 in partial batches): more
    # than the requested workers hold. Acme's interleave runs ~3 iterators per worker and
    # each has a sampler queue (~32,000 on the seed's job): any number is evidence.
    ("worker_starvation_whatever_the_number_stranded",
     lambda: case(seed_hung_table(), seed_hung_probe(batches=SEED_BATCHES - 400)),
     "worker_starvation"),
    # The limiter allows samples (headroom 5000) and nobody waits for inserts.
    ("no_worker_starvation_when_the_limiter_allows_samples",
     lambda: case(table_history(T20, SEED_FROZEN_INSERTS,
                                [s - 5000 for s in SEED_FROZEN_SAMPLES], **SEED_LIMITER),
                  seed_hung_probe(batches=SEED_BATCHES - 20)), None),
    # Asynchronous, 4 workers, 1536 stranded, every actor alive and waiting on the learner
    # (a policy-lag bound) for the whole window: the asynchronous circular wait.
    ("worker_starvation_when_async_actors_all_wait_on_the_learner",
     lambda: case(async_hung_table(), seed_hung_probe(workers=4),
                  actors=(actor(waiting_on="learner"),
                          actor(url="http://a1", waiting_on="learner", name="actor-1"))),
     "worker_starvation"),
    # The reported wrong verdict: asynchronous, 4 workers, the actors died holding partial
    # batches. Dead actors are sample_blocked's (restart them), never num_parallel_calls=1.
    ("no_worker_starvation_when_async_actors_are_dead",
     lambda: case(async_hung_table(), seed_hung_probe(workers=4), actors=(dead_actor(),)),
     None),
    # Alive but silent: no step, no wait on the learner.
    ("no_worker_starvation_when_async_actors_are_silent",
     lambda: case(async_hung_table(), seed_hung_probe(workers=4), actors=(silent_actor(),)),
     None),
    # One waits on the learner, another is dead: not every actor is in the circle.
    ("no_worker_starvation_when_one_async_actor_is_dead",
     lambda: case(async_hung_table(), seed_hung_probe(workers=4),
                  actors=(actor(waiting_on="learner"), dead_actor(url="http://a1"))), None),
    # No actor information in an asynchronous layout: the cause is not proven.
    ("no_worker_starvation_when_async_without_actor_probes",
     lambda: case(async_hung_table(), seed_hung_probe(workers=4)), None),
    # Actors wait on the learner, but nothing is stranded: no batch split across workers.
    ("no_worker_starvation_when_async_actors_wait_but_nothing_is_stranded",
     lambda: case(async_hung_table(), seed_hung_probe(workers=4, batches=5100),
                  actors=(actor(waiting_on="learner"),)), None),
]


@pytest.mark.parametrize("name,scenario,expected", STARVATION_CASES,
                         ids=[c[0] for c in STARVATION_CASES])
def test_worker_starvation(name: str, scenario: StarvationScenario, expected: str | None
                           ) -> None:
    finding = rules_actors.is_worker_starvation(scenario(), DEFAULT)
    assert (finding.kind if finding else None) == expected
    assert_as_declared(finding, rules_actors.is_worker_starvation)


def test_worker_starvation_evidence_says_how_many_iterators_can_sample() -> None:
    finding = rules_actors.is_worker_starvation(
        case(seed_hung_table(), seed_hung_probe(batches=SEED_BATCHES - 400)), DEFAULT)
    assert finding is not None
    assert finding.evidence["stranded_samples"] == 1536 + 400 * 256
    assert finding.evidence["stranded_beyond_requested_workers"] is True
    assert finding.evidence["sampling_iterators_up_to"] == 36
    # No signature: the items may be frames, so the one fix that holds either way.
    assert [(f["knob"], f["value"]) for f in finding.evidence["fixes"]] == [
        ("num_parallel_calls", 1)]
    # Small items by the signature: the declared dataset (one iterator per worker) cannot
    # strand this much, so the fixes are judged with Acme's three, in multiples of 16:
    # 7 x 240 + 14 x 1520 = 22960 < 25600; error_buffer 39900 and every value above it: 39900
    # (g = 4) against at most 12 x 252 + 24 x 1532 = 39792, from 39901 on more than the 39900
    # that g = 1 leaves. Not 39892, though safe itself (g = 4): 39893 is not (g = 1).
    finding = rules_actors.is_worker_starvation(
        case(seed_hung_table(item_bytes=16), seed_hung_probe(batches=SEED_BATCHES - 400)),
        DEFAULT)
    assert finding is not None
    assert "num_parallel_calls=7" in finding.fix and "error_buffer=39900" in finding.fix
    assert {f["knob"] for f in finding.evidence["fixes"]} >= {"num_parallel_calls",
                                                               "error_buffer"}


def test_worker_starvation_evidence_shows_the_stranded_arithmetic() -> None:
    # drawn 1,305,600 - 5094 batches * 256 = 1536 stranded; the probe is blocked so 0 prefetched.
    finding = rules_actors.is_worker_starvation(case(seed_hung_table(), seed_hung_probe()), DEFAULT)
    assert finding is not None
    assert finding.evidence["stranded_samples"] == 1536
    assert finding.evidence["prefetched"] == 0
    assert finding.evidence["workers"] == 12 and finding.evidence["batch_size"] == 256
    assert "num_parallel_calls=1" in finding.fix and "now 12" in finding.fix
    assert finding.since == 1000.0


def test_worker_starvation_after_the_interleave_names_the_datasets_not_batching_workers(
) -> None:
    # TF-Agents' as_dataset: no worker batches on its own; the datasets no thread reads hold
    # the samples, and Acme's repeat-interleave is no part of it.
    probe = seed_hung_probe(batch_after_interleave=True, cycle_length=32)
    finding = rules_actors.is_worker_starvation(case(seed_hung_table(), probe), DEFAULT)
    assert finding is not None
    assert "32 Reverb datasets read by 12 interleave thread(s)" in finding.summary
    assert "Acme" not in finding.summary and "batching workers" not in finding.summary


def test_worker_starvation_counts_from_the_iterator_start_when_history_reaches_it() -> None:
    # The probe started at t=1005; the table had drawn 1,300,000 by then. Since then 5600
    # were drawn and the (new) learner got 20 batches = 5120: 480 stranded.
    samples = [1_300_000] * 5 + [1_305_600] * 15  # then the cursor reaches min_diff
    table = table_history(T20, 12_000, samples, waiting_for_inserts_ms=waiting(), **SEED_LIMITER)
    probe = probe_history(T20[5:], 20, blocked_for=[12.0 + i for i in range(15)], workers=12,
                          started_at=1004.5)
    finding = rules_actors.is_worker_starvation(case(table, probe), DEFAULT)
    assert finding is not None
    assert finding.evidence["stranded_basis"] == "since_iterator_start"
    assert finding.evidence["stranded_samples"] == 480


# -- writer_stalled: an actor stuck inside its writer, not throttled -----------------------------

def writer_view(table: tuple[TableSnapshot, ...], *actors: tuple[ActorSnapshot, ...],
                target_ok: list[bool] | None = None, error: str = "unreachable") -> TargetView:
    view = target_view([table], target_polls=polls(T20, ok=target_ok or True, error=error))
    return dataclasses.replace(view, actors={h[0].probe: h for h in actors},
                               probe_polls={h[0].probe: polls([a.observed_at for a in h])
                                            for h in actors})


# The seed's blocking limiter with the cursor at min_diff: inserts would pass (max_diff 281600).
INSERTS_WOULD_PASS = table_history(T20, SEED_FROZEN_INSERTS, SEED_FROZEN_SAMPLES,
                                   waiting_for_inserts_ms=waiting(), **SEED_BLOCKING_LIMITER)
# cursor 100 = max_diff: the limiter holds inserts back, so a blocked flush is by design.
INSERTS_HELD = table_history(T20, 200, 100, waiting_for_sampling_ms=waiting())

WRITER_CASES: list[tuple[str, TargetView, str | None]] = [
    # In flush() for 15 s while the limiter would have let every insert in (reverb#4's hang).
    ("writer_stalled_in_flush_while_the_limiter_accepts_inserts",
     writer_view(INSERTS_WOULD_PASS, in_writer("flush", 1004.0)), "writer_stalled"),
    # end_episode() hanging silently (reverb#144).
    ("writer_stalled_in_end_episode", writer_view(INSERTS_WOULD_PASS,
                                                   in_writer("end_episode", 1002.0)),
     "writer_stalled"),
    # The server went away at t=1005 (target down), an actor sits in create_item since.
    ("writer_stalled_when_the_server_is_down",
     writer_view(INSERTS_WOULD_PASS[:6], in_writer("create_item", 1006.0),
                 target_ok=[True] * 6 + [False] * 14), "writer_stalled"),
    # The server answers no poll in time (and refuses none) for 14 s: paused, as by a
    # checkpoint, which holds every writer by design (checkpointing, within its grace).
    ("no_writer_stalled_while_the_server_is_paused",
     writer_view(INSERTS_WOULD_PASS[:6], in_writer("create_item", 1002.0),
                 target_ok=[True] * 6 + [False] * 14,
                 error="127.0.0.1:1: ServerInfo did not answer within 0.8s"), None),
    # In flush() since the limiter held inserts (a 10-minute first compile), then the
    # server went away: the limiter holds it, not the outage.
    ("no_writer_stalled_when_the_limiter_held_it_before_the_server_went",
     writer_view(INSERTS_HELD[:6], in_writer("flush", 1002.0),
                 target_ok=[True] * 6 + [False] * 14), None),
    # Held at max_diff: actors waiting for the learner to sample are insert_blocked's.
    ("no_writer_stalled_when_the_limiter_holds_inserts",
     writer_view(INSERTS_HELD, in_writer("flush", 1004.0)), None),
    # Only 6 s inside flush: shorter than the stall window.
    ("no_writer_stalled_before_the_stall_window",
     writer_view(INSERTS_WOULD_PASS, in_writer("flush", 1013.0)), None),
    # A healthy actor: steps, no writer call in progress.
    ("no_writer_stalled_for_a_stepping_actor",
     writer_view(INSERTS_WOULD_PASS, tuple(actor_snapshot(t, int(t)) for t in T20)), None),
    # The actor's probe stopped answering at t=1005: nothing fresh says where it is now.
    ("no_writer_stalled_from_a_stale_actor_probe",
     writer_view(INSERTS_WOULD_PASS, in_writer("flush", 1000.0, times=T20[:6])), None),
]


@pytest.mark.parametrize("name,view,expected", WRITER_CASES, ids=[c[0] for c in WRITER_CASES])
def test_writer_stalled(name: str, view: TargetView, expected: str | None) -> None:
    finding = rules_actors.is_writer_stalled(view, DEFAULT, 1019.0)
    assert (finding.kind if finding else None) == expected
    assert_as_declared(finding, rules_actors.is_writer_stalled)


def test_writer_stalled_evidence_names_the_call_its_duration_and_pending_items() -> None:
    finding = rules_actors.is_writer_stalled(
        writer_view(INSERTS_WOULD_PASS, in_writer("flush", 1004.0)), DEFAULT, 1019.0)
    assert finding is not None and finding.table == "replay"
    assert (finding.evidence["call"], finding.evidence["blocked_for_s"],
            finding.evidence["pending_items"], finding.evidence["server_down"]) == (
                "flush", 15.0, 3, False)
    assert finding.evidence["actors"][0]["name"] == "actor-0"
    assert finding.since == 1004.0
    assert "reverb#4" in finding.fix and "timeout_ms" in finding.fix


def test_async_starvation_under_a_lag_bound_is_fixed_by_the_lag_not_the_configured_values(
) -> None:
    # A grid cell whose old fix did not hold: 4 workers of 16, spi 4, error_buffer 32,
    # actors held at a lag of 3.
    # Each learner step frees 12 < 16 samples, so neither error_buffer 32 nor 4 workers (the
    # values configured, once suggested) is a fix; the model proves a longer lag or a
    # smaller batch. 1000 inserts x 4 = 4000 credit, min_diff 3968: 32 + 12 x k released.
    # The actor inserted 1003 items (4012 credit); the workers drew 4012 - 3968 = 44, the
    # learner got 1 batch: 28 held by 4 workers of 16, none complete.
    table = table_history(T20, 1003, 44, spi=4.0, min_diff=3968.0, max_diff=4032.0,
                          min_size=1000, waiting_for_inserts_ms=waiting())
    probe = probe_history(T20, 1, blocked_for=[1.0 + i for i in range(20)], workers=4,
                          batch_size=16)
    waited = actor(waiting_on="learner")
    lagged = Actor(waited.url, tuple(dataclasses.replace(s, max_policy_lag=3, waits_total=5)
                                     for s in waited.history), waited.polls)
    finding = rules_actors.is_worker_starvation(case(table, probe, actors=(lagged,)), DEFAULT)
    assert finding is not None
    knobs = {f["knob"]: f["value"] for f in finding.evidence["fixes"]}
    assert "error_buffer" not in knobs and "num_parallel_calls" not in knobs
    assert knobs["max_policy_lag"] == 16 and "max_policy_lag=16 (now 3" in finding.fix
