"""The actor side of a table (diagnosis/actors.py) and whole-view verdicts that depend on it.

Times are 1 s polls from t=1000 (T20 = 1000 .. 1019); the stall window is the default 10 s.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from replaywatch.diagnosis import actors as act
from replaywatch.diagnosis import rules_stalls
from replaywatch.diagnosis import window as win
from replaywatch.diagnosis.actors import Actor
from replaywatch.diagnosis.engine import diagnose
from replaywatch.diagnosis.window import TargetView
from replaywatch.model import TableSnapshot
from tests.builders import (
    ACTOR,
    DEFAULT,
    T20,
    actor,
    actor_snapshot,
    async_hung_table,
    case,
    dead_actor,
    in_writer,
    polls,
    seed_hung_probe,
    silent_actor,
    target_view,
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
