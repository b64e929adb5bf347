"""The learner rule of diagnosis/rules_learner.py (it needs the trainer probe):
learner_stalled, one table row per case, each with why.

Times are 1 s polls from t=1000 (T20 = 1000 .. 1019); the stall window is the default 10 s.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from replaywatch.diagnosis import rules_learner
from replaywatch.model import FLOAT_MAX
from tests.builders import (
    DEFAULT,
    T20,
    ProbeScenario,
    assert_as_declared,
    probe_history,
    seed_hung_table,
    table_history,
    with_probe,
)

# -- rules that need the probe --------------------------------------------------------------------

STALLED_READY = probe_history(T20, 300, ready=True)
CAN_SAMPLE_A_BATCH = table_history(T20, 1000, 100, min_diff=0.0, max_diff=FLOAT_MAX)

PROBE_CASES: list[tuple[str, Callable, ProbeScenario, str | None]] = [
    # No batch or step for 19 s while the iterator says ready(): the update step hangs.
    ("learner_stalled_when_ready_but_no_step", rules_learner.is_learner_stalled,
     lambda: with_probe(CAN_SAMPLE_A_BATCH, STALLED_READY), "learner_stalled"),
    # ready() unknown, but the table can sample a batch of 256 (headroom 900).
    ("learner_stalled_when_the_table_can_sample_a_batch", rules_learner.is_learner_stalled,
     lambda: with_probe(CAN_SAMPLE_A_BATCH, probe_history(T20, 300)), "learner_stalled"),
    # No data anywhere: the learner waits for data, which is another rule's business.
    ("no_learner_stalled_without_data", rules_learner.is_learner_stalled,
     lambda: with_probe(seed_hung_table(), probe_history(T20, 300, ready=False)), None),
    # Blocked in next(): it is not stuck in its update step.
    ("no_learner_stalled_while_blocked_in_next", rules_learner.is_learner_stalled,
     lambda: with_probe(CAN_SAMPLE_A_BATCH, probe_history(T20, 300, ready=True,
                                                          blocked_for=15.0)), None),
    # Steps advance even though no batch was taken in the window (multi-step updates).
    ("no_learner_stalled_while_steps_advance", rules_learner.is_learner_stalled,
     lambda: with_probe(CAN_SAMPLE_A_BATCH, probe_history(T20, 300, ready=True,
                                                          steps=list(range(20)))), None),
]


@pytest.mark.parametrize("name,rule,scenario,expected", PROBE_CASES,
                         ids=[c[0] for c in PROBE_CASES])
def test_probe_rule(name: str, rule: Callable, scenario: ProbeScenario,
                    expected: str | None) -> None:
    table_case, probe = scenario()
    finding = rule(table_case, probe, DEFAULT)
    assert (finding.kind if finding else None) == expected
    assert_as_declared(finding, rule)
