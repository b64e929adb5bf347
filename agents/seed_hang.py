"""The seed incident's hang on demand: its flags, and how to tell from the probe that it came.

The hang is a race, as it was for the seed's user ("sometimes it happens sooner and
sometimes later"). When the table reaches `min_replay_size` the rate limiter releases
`error_buffer` = 4000 x 128 x 0.002 = 1024 samples at once. Reverb's table worker hands them
to the waiting sample requests, 128 (one `samples_per_insert`) at a time, in arrival order.
If the loop's `table.can_sample(256)` runs before the worker has handed all of them out, the
learner calls `next()`; the 1024 samples then land 128 apiece in 8 of the 12 workers'
batches, none reaches 256, and the insert that would complete one would come from the
blocked thread. If the worker wins, `can_sample` never sees a batch's worth of credit again
(each insert's 128 samples go straight to a waiting request) and the run learns normally.

On our 2-core machine the learner won 9 of 9 idle starts and 9 of 10 beside two CPU-bound
processes; one CI run lost. So whoever needs the hang starts the agent, watches the probe until the
outcome is known (a few seconds after the start line) and starts it again if the workers
were not stranded: `warmup_outcome` says which, `until_stranded` does the retries.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

# min_replay_size 4000 (not 1000 x 0.008, the same 1024 samples) gives a sidecar attached at
# the start line a few seconds of inserts to see before the loop stops inserting for good.
FLAGS = (
    "--mode", "sync", "--num-parallel-calls", "12", "--batch-size", "256",
    "--samples-per-insert", "128", "--min-replay-size", "4000", "--tolerance", "0.002",
)  # fmt: skip

# The asynchronous form: a distributed job whose one actor waits on the learner
# after every 2 environment steps it takes without seeing the learner step (--max-policy-lag
# 2, a parameter hand-off). 2 inserts release 256 samples, one batch per learner step: with one
# worker they complete it and the job learns (~485 steps in 45 s here), until an episode's
# first 2 steps, which insert nothing (n_step 3), leave the learner short of a batch while the
# actor waits on it: a hang with nothing stranded (bench/healthy.py, measured after 25
# episodes, 62 s; a lag of 8 never hangs so); with 12 they
# spread over 12 partial batches, and once no worker can complete one the learner blocks in
# next() (here after ~100 steps, ~20 s after the start line) while the actor, alive, waits on
# the learner, for good. Dead actors leave the same picture in Reverb; only the actor probe
# tells them apart.
ASYNC_FLAGS = (
    "--mode", "distributed", "--num-actors", "1", "--max-policy-lag", "2",
    *FLAGS[2:],
)  # fmt: skip

# Blocked in next() this long before any batch: the workers are stranded. Before warm-up the
# loop never calls next() (the iterator is not ready and the table cannot sample), and a
# batch that is merely slow arrives within milliseconds of the samples that complete it.
STRANDED_AFTER_S = 3.0
ATTEMPTS = 6  # ~10-15 s each when fed; at CI's observed 2 of 3, 6 misses in a row is ~0.1%
OUTCOME_TIMEOUT_S = 90.0  # start line to outcome; warm-up takes ~4 s of env steps here

Handle = TypeVar("Handle")


def warmup_outcome(probe: Mapping[str, Any]) -> str | None:
    """'stranded', 'passed' (a batch was delivered: the race went the healthy way) or None."""
    if probe.get("batches_retrieved", 0) > 0:
        return "passed"
    if probe.get("blocked_in_next") and probe.get("blocked_for_s", 0.0) >= STRANDED_AFTER_S:
        return "stranded"
    return None


def until_stranded(
    start: Callable[[int], Handle],
    read_probe: Callable[[Handle], Mapping[str, Any]],
    stop: Callable[[Handle], None],
    attempts: int = ATTEMPTS,
    timeout_s: float = OUTCOME_TIMEOUT_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[Handle, int]:
    """Starts the agent (`start(attempt)`, which returns once its probe answers) until a start
    strands its workers; returns that agent and the attempt number (1-based).

    Raises TimeoutError if one start decides nothing in `timeout_s`, RuntimeError if every
    attempt passed warm-up with the workers fed.
    """
    outcomes = []
    for attempt in range(1, attempts + 1):
        handle = start(attempt)
        deadline = clock() + timeout_s
        outcome = None
        while outcome is None:
            if clock() > deadline:
                stop(handle)
                raise TimeoutError(f"attempt {attempt}: no warm-up outcome in {timeout_s}s")
            sleep(0.25)
            outcome = warmup_outcome(read_probe(handle))
        if outcome == "stranded":
            return handle, attempt
        outcomes.append(outcome)
        stop(handle)
    raise RuntimeError(f"the workers were fed in all {attempts} starts: {outcomes}")
