"""One small named rule per finding kind, in Reverb's and Acme's words; this is their index.

Each rule answers for one table (and, where it needs one, one trainer probe) or for a whole
target, and returns a Finding or None. A rule is a predicate in the domain's words, then its
explanation (summary, evidence, fix); the kind's severity comes from its declaration in
`kinds`. The rules live by family:

    rules_stalls    sample_blocked, insert_blocked, spi_drift, warmup   (Reverb alone)
    rules_learner   learner_stalled                                      (need the probe)
    rules_actors    worker_starvation, writer_stalled   (a proven circular wait; actor probes)
    rules_config    batch_exceeds_headroom, deadlock_risk                (settings that hang)
    rules_liveness  target_down, probe_down, too_many_threads            (whole target)
    rules_lifecycle warmup_impossible, learner_starting, server_restarted, stale_data

Adding a kind: declare it in `kinds`, write its rule in its family, map it in `BY_KIND` and
run it from the engine's rule tuples; tests/test_rules.py and test_engine.py check all four
agree.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from replaywatch.diagnosis import kinds
from replaywatch.diagnosis.case import Probe, TableCase
from replaywatch.diagnosis.kinds import Kind
from replaywatch.diagnosis.rules_actors import is_worker_starvation, is_writer_stalled
from replaywatch.diagnosis.rules_config import is_batch_exceeds_headroom, is_deadlock_risk
from replaywatch.diagnosis.rules_learner import is_learner_stalled
from replaywatch.diagnosis.rules_lifecycle import (
    is_learner_starting,
    is_server_restarted,
    is_stale_data,
    is_warmup_impossible,
    with_restore_evidence,
)
from replaywatch.diagnosis.rules_liveness import (
    is_probe_down,
    is_target_down,
    is_too_many_threads,
)
from replaywatch.diagnosis.rules_stalls import (
    is_insert_blocked,
    is_sample_blocked,
    is_spi_drift,
    is_warmup,
)

__all__ = [
    "BY_KIND", "Probe", "TableCase", "is_batch_exceeds_headroom", "is_deadlock_risk",
    "is_insert_blocked", "is_learner_stalled", "is_probe_down", "is_sample_blocked",
    "is_spi_drift", "is_target_down", "is_too_many_threads", "is_warmup",
    "is_worker_starvation", "is_writer_stalled", "is_warmup_impossible", "is_learner_starting",
    "is_server_restarted", "is_stale_data", "with_restore_evidence",
]

# The declared kind -> the rule that produces it (the declaration test checks both ways).
BY_KIND: dict[Kind, Callable[..., Any]] = {
    kinds.WORKER_STARVATION: is_worker_starvation,
    kinds.LEARNER_STALLED: is_learner_stalled,
    kinds.WRITER_STALLED: is_writer_stalled,
    kinds.SAMPLE_BLOCKED: is_sample_blocked,
    kinds.INSERT_BLOCKED: is_insert_blocked,
    kinds.BATCH_EXCEEDS_HEADROOM: is_batch_exceeds_headroom,
    kinds.TARGET_DOWN: is_target_down,
    kinds.PROBE_DOWN: is_probe_down,
    kinds.DEADLOCK_RISK: is_deadlock_risk,
    kinds.SPI_DRIFT: is_spi_drift,
    kinds.TOO_MANY_THREADS: is_too_many_threads,
    kinds.WARMUP: is_warmup,
    kinds.WARMUP_IMPOSSIBLE: is_warmup_impossible,
    kinds.LEARNER_STARTING: is_learner_starting,
    kinds.SERVER_RESTARTED: is_server_restarted,
    kinds.STALE_DATA: is_stale_data,
}
