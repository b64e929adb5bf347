"""The whole-target rules of diagnosis/rules_liveness.py, on constructed views:
target_down, checkpointing, probe_down and too_many_threads, one table row per case, each
with why; `now` is 1004.0, the newest of five 1 s polls from t=1000.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from replaywatch.diagnosis import rules_liveness
from replaywatch.diagnosis.engine import diagnose
from replaywatch.diagnosis.thresholds import Thresholds
from tests.builders import (
    ACTOR,
    DEFAULT,
    actor_snapshot,
    assert_as_declared,
    polls,
    probe_history,
    seconds,
    target_view,
)

# -- reachability and threads ---------------------------------------------------------------------

T5 = seconds(5)
T9 = seconds(9, start=996.0)
BUSY = "h:1: ServerInfo did not answer within 0.8s (connected, no answer)"
PROBE_BUSY = "http://p/probe: did not answer within 0.8s"
VIEW_CASES = [
    # Three failed polls in a row: more than down_polls (2).
    ("target_down_after_three_failed_polls", rules_liveness.is_target_down,
     target_view(target_polls=polls(T5, ok=[True, True, False, False, False])), "target_down"),
    # Two failures are not yet "more than 2 polls".
    ("no_target_down_after_two_failed_polls", rules_liveness.is_target_down,
     target_view(target_polls=polls(T5, ok=[True, True, True, False, False])), None),
    # A failure in the past, answering again.
    ("no_target_down_once_it_answers_again", rules_liveness.is_target_down,
     target_view(target_polls=polls(T5, ok=[False, False, False, False, True])), None),
    # Three polls the server took and did not answer (its table lock held): busy, 2 s in.
    ("checkpointing_when_the_server_takes_calls_but_answers_none",
     rules_liveness.is_checkpointing,
     target_view(target_polls=polls(T5, ok=[True, True, False, False, False],
                                    error=BUSY)), "checkpointing"),
    # Refused connections are a server gone, not a busy one.
    ("no_checkpointing_when_the_server_refuses_connections", rules_liveness.is_checkpointing,
     target_view(target_polls=polls(T5, ok=[True, True, False, False, False])), None),
    # A probe whose last three polls failed.
    ("probe_down_after_three_failed_polls", rules_liveness.is_probe_down,
     target_view(probe_polls={"http://p": polls(T5, ok=[True, True, False, False, False])}),
     "probe_down"),
    # The server paused (a checkpoint holds its table lock) and a probe went unanswered with
    # it, never refused: the same pause holds it (a sync loop's probe in the checkpointing
    # process), not a probe down, while the pause is within its grace.
    ("no_probe_down_while_its_server_pauses_with_it", rules_liveness.is_probe_down,
     target_view(target_polls=polls(T5, ok=[True, True, False, False, False], error=BUSY),
                 probe_polls={"http://p": polls(T5, ok=[True, True, False, False, False],
                                                error=PROBE_BUSY)}), None),
    # The pause landed between the two polls of one cycle: the probe failed a cycle before
    # its server (and a little more, as cycles jitter); the same pause holds it.
    ("no_probe_down_when_the_pause_split_a_cycle", rules_liveness.is_probe_down,
     target_view(target_polls=polls(T5, ok=[True, True, False, False, False], error=BUSY),
                 probe_polls={"http://p": polls([t - 0.1 for t in T5],
                                                ok=[True, False, False, False, False],
                                                error=PROBE_BUSY)}), None),
    # ... but a probe that refuses connections is down, pause or not (a dead process).
    ("probe_down_refused_while_its_server_pauses", rules_liveness.is_probe_down,
     target_view(target_polls=polls(T5, ok=[True, True, False, False, False], error=BUSY),
                 probe_polls={"http://p": polls(T5, ok=[True, True, False, False, False])}),
     "probe_down"),
    # ... and so is one that stopped answering well before the server paused.
    ("probe_down_silent_before_its_server_paused", rules_liveness.is_probe_down,
     target_view(target_polls=polls(T5, ok=[True, True, False, False, False], error=BUSY),
                 probe_polls={"http://p": polls(T5, ok=[False] * 5, error=PROBE_BUSY)}),
     "probe_down"),
    # The server answers again; its probe, polled the same cycle, not yet: still the pause.
    ("no_probe_down_the_cycle_its_server_answers_again", rules_liveness.is_probe_down,
     target_view(target_polls=polls(T5, ok=[True, False, False, False, True], error=BUSY),
                 probe_polls={"http://p": polls(T5, ok=[True, False, False, False, False],
                                                error=PROBE_BUSY)}), None),
    # ... but three polls after its server is back, a silent probe is down.
    ("probe_down_three_polls_after_its_server_is_back", rules_liveness.is_probe_down,
     target_view(target_polls=polls(T9, ok=[True, False, False, False] + [True] * 5,
                                    error=BUSY),
                 probe_polls={"http://p": polls(T9, ok=[True] + [False] * 8,
                                                error=PROBE_BUSY)}), "probe_down"),
    ("no_probe_down_while_it_answers", rules_liveness.is_probe_down,
     target_view(probe_polls={"http://p": polls(T5)}), None),
    # 600 threads, like the seed's job (over 500).
    ("too_many_threads_above_the_threshold", rules_liveness.is_too_many_threads,
     target_view(probes=[probe_history(T5, 0, threads=600)]), "too_many_threads"),
    ("no_too_many_threads_below_the_threshold", rules_liveness.is_too_many_threads,
     target_view(probes=[probe_history(T5, 0, threads=120)]), None),
]


@pytest.mark.parametrize("name,rule,view,expected", VIEW_CASES, ids=[c[0] for c in VIEW_CASES])
def test_view_rule(name: str, rule: Callable, view: Any, expected: str | None) -> None:
    finding = rule(view, DEFAULT, 1004.0)
    assert (finding.kind if finding else None) == expected
    assert_as_declared(finding, rule)


def test_a_busy_server_is_checkpointing_then_target_down_after_the_grace() -> None:
    view = target_view(target_polls=polls(T5, ok=[True, True, False, False, False],
                                          error=BUSY))
    found = [f.kind for f in diagnose(view, DEFAULT, 1004.0).findings]
    assert found == ["checkpointing"]  # target_down stands down while the grace lasts
    later = [f.kind for f in diagnose(view, Thresholds(checkpoint_grace_s=1.0), 1004.0).findings]
    assert later == ["target_down"]


def test_target_down_since_is_the_first_failed_poll() -> None:
    view = target_view(target_polls=polls(T5, ok=[True, False, False, False, False]))
    finding = rules_liveness.is_target_down(view, DEFAULT, 1004.0)
    assert finding is not None and finding.since == 1001.0 and finding.last_seen == 1004.0


def test_too_many_threads_since_is_the_start_of_the_run_above_the_threshold() -> None:
    view = target_view(probes=[probe_history(T5, 0, threads=[100, 600, 100, 600, 700])])
    finding = rules_liveness.is_too_many_threads(view, DEFAULT, 1004.0)
    assert finding is not None and finding.since == 1003.0


def test_too_many_threads_counts_the_os_threads_python_cannot_see() -> None:
    # A hung Acme process: 8 Python threads, 600 OS threads (tf.data, Reverb samplers, gRPC).
    history = tuple(dataclasses.replace(s, os_threads=600)
                    for s in probe_history(T5, 0, threads=8))
    finding = rules_liveness.is_too_many_threads(target_view(probes=[history]), DEFAULT, 1004.0)
    assert finding is not None and finding.kind == "too_many_threads"
    url = history[0].probe
    assert finding.evidence["threads"] == {url: 600}
    assert finding.evidence["python_threads"] == {url: 8}
    # Many Python threads but few OS threads cannot be: the OS count is the one judged.
    few = tuple(dataclasses.replace(s, os_threads=120) for s in probe_history(T5, 0, threads=8))
    assert rules_liveness.is_too_many_threads(target_view(probes=[few]), DEFAULT, 1004.0) is None


def test_probe_down_names_the_role_the_url_last_answered_as() -> None:
    actor_polls = polls(T5, ok=[True, True, False, False, False])
    view = dataclasses.replace(
        target_view(probe_polls={ACTOR: actor_polls}),
        actors={ACTOR: tuple(actor_snapshot(t, 10) for t in T5[:2])})
    finding = rules_liveness.is_probe_down(view, DEFAULT, 1004.0)
    assert finding is not None and "1 actor probe(s)" in finding.summary
    assert finding.evidence["roles"] == {ACTOR: "actor"}
    never = target_view(probe_polls={"http://p": polls(T5, ok=[False] * 5)})
    finding = rules_liveness.is_probe_down(never, DEFAULT, 1004.0)
    assert finding is not None and "trainer or actor probe(s)" in finding.summary
