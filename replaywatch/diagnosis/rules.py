"""Every rule, gathered from the families' registrations; this is their index.

Each rule answers for one table (and, where it needs one, one trainer probe) or for a whole
target, and returns a Finding or None. A rule is a predicate in the domain's words, then its
explanation (summary, evidence, fix); the kind's severity comes from its declaration in
`kinds`. The rules live by family, each ending with its `RULES` (registry.Rule: kind, rule,
shape):

    rules_stalls     what Reverb alone shows: blocked sampling or inserts, a stale table
    rules_learner    what needs the trainer probe
    rules_actors     causes only the loop or the actor probes prove
    rules_config     settings that will hang (the budget model)
    rules_liveness   a whole target: down, too many threads
    rules_startup    start-up and restarts
    rules_queue      queue tables (on-policy)
    rules_throughput rates against their own baseline
    rules_windows    what the learned stall windows hold back
    rules_memory     the replay process's memory against its limit
    rules_checkpoint checkpoints and restores, as the replay process's probe sees them
    rules_health     what the learner's replay does: its priorities
    rules_shards     a job sharded over several servers, each judged against the others
    rules_rllib      RLlib jobs on a Ray cluster (Shape.RAY_JOB: judge_rllib runs them, the
                     engine never does)

Which kinds each produces is its `RULES`, nowhere else.

Adding a kind: declare it in `kinds` (its place in `ALL` is its precedence) and append its
`Rule` to its family's `RULES`; nothing else in replaywatch/ names it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from replaywatch.diagnosis import (
    rules_actors,
    rules_checkpoint,
    rules_config,
    rules_health,
    rules_learner,
    rules_liveness,
    rules_memory,
    rules_queue,
    rules_rllib,
    rules_shards,
    rules_stalls,
    rules_startup,
    rules_throughput,
    rules_windows,
)
from replaywatch.diagnosis.kinds import Kind
from replaywatch.diagnosis.registry import Rule, Shape

ALL: tuple[Rule, ...] = (*rules_stalls.RULES, *rules_learner.RULES, *rules_actors.RULES,
                         *rules_config.RULES, *rules_liveness.RULES, *rules_startup.RULES,
                         *rules_queue.RULES, *rules_throughput.RULES, *rules_windows.RULES,
                         *rules_memory.RULES, *rules_checkpoint.RULES, *rules_health.RULES,
                         *rules_shards.RULES, *rules_rllib.RULES)


def _by_kind(registered: tuple[Rule, ...]) -> dict[Kind, Callable[..., Any]]:
    out: dict[Kind, Callable[..., Any]] = {}
    for r in registered:
        if r.kind in out:
            raise ValueError(f"{r.kind.name} is registered twice")
        out[r.kind] = r.judge
    return out


# The declared kind -> the rule that produces it (the declaration test checks both ways).
BY_KIND: dict[Kind, Callable[..., Any]] = _by_kind(ALL)


_grouped: tuple[tuple[Rule, ...], dict[Shape, tuple[Callable[..., Any], ...]]] | None = None


def of_shape(shape: Shape) -> tuple[Callable[..., Any], ...]:
    """The rules the engine runs for one shape. The engine asks five times per table per
    cycle, so the grouping is kept, and made again only if `ALL` is replaced."""
    global _grouped
    if _grouped is None or _grouped[0] is not ALL:
        _grouped = (ALL, {s: tuple(r.judge for r in ALL if r.shape is s) for s in Shape})
    return _grouped[1][shape]
