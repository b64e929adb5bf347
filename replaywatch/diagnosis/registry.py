"""How a rule is registered: the kind it produces, the function, and the shape it judges.

Each `rules_*.py` ends with its `RULES`, one `Rule` per kind it produces; `rules.ALL`
gathers them, `rules.BY_KIND` is read from that list, and the engine runs each shape's
rules from it. Precedence is not here: it is the order of `kinds.ALL`.

    RULES = (Rule(kinds.SAMPLE_BLOCKED, is_sample_blocked, Shape.TABLE_STALL), ...)
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable
from typing import Any

from replaywatch.diagnosis.kinds import Kind


class Shape(enum.StrEnum):
    """What a rule is handed, and when the engine asks it."""

    # (view, thresholds, now): one whole target, every poll.
    VIEW = "view"
    # (case, thresholds): one table, once its history covers the stall window.
    TABLE_STALL = "table_stall"
    # (case, probe, thresholds): one table and one trainer probe with that history.
    PROBE_STALL = "probe_stall"
    # (case, thresholds, stalls): one table, after its stall rules, handed what they found
    # and the target-wide findings placed on it; asked every poll, young history included.
    AFTER_STALLS = "after_stalls"
    # (case, thresholds): one table's settings; one snapshot proves it.
    TABLE_SETTINGS = "table_settings"
    # (case, probe, thresholds): settings of a table and one trainer probe.
    PROBE_SETTINGS = "probe_settings"
    # (job, thresholds): one RLlib job on a Ray cluster, its snapshots over the look-back
    # (rules_rllib.RllibJob), every poll. Run by `rules_rllib.judge_rllib`, never by the
    # engine: a Ray target has no tables, and its rules read no probe of ours whatever their
    # kind says (learner_stalled needs one on Reverb, not on Ray).
    RAY_JOB = "ray_job"

    @property
    def reads_a_probe(self) -> bool:
        return self in (Shape.PROBE_STALL, Shape.PROBE_SETTINGS)


@dataclasses.dataclass(frozen=True)
class Rule:
    """One kind, the rule that produces it, and its shape."""

    kind: Kind
    judge: Callable[..., Any]
    shape: Shape

    def __post_init__(self) -> None:
        # A rule handed a trainer probe produces a kind that needs one, and only such a rule
        # among the table rules does: the status page and docs/findings.md say which need it.
        table_rule = self.shape not in (Shape.VIEW, Shape.RAY_JOB)
        if table_rule and self.shape.reads_a_probe != self.kind.needs_probe:
            raise ValueError(f"{self.kind.name}: a {self.shape} rule must be declared "
                             f"needs_probe={self.shape.reads_a_probe}")
