"""The probe protocol: what a probe serves and the sidecar reads, declared once for both ends.

Standard library only: the probes import it inside the user's processes, the sidecar's
sources and model import it on the other end, so a key or a word of the protocol is
written in one place.
"""

from __future__ import annotations

import enum


class Layout(enum.StrEnum):
    """Who inserts and who waits (replaywatch.diagnosis.budget explains each)."""

    SYNC = "sync"  # one loop inserts and trains, insert blocking disabled (Acme's LocalLayout)
    SYNC_RATIO = "sync-ratio"  # one loop, a finite max_diff that can hold its own insert
    ASYNC = "async"  # free-running actors, the learner apart
    ASYNC_LAG = "async-lag"  # actors held by a policy-lag bound (a finite max_diff)


class Gate(enum.StrEnum):
    """When a synchronous loop calls next()."""

    CAN_SAMPLE = "can_sample"  # only while can_sample(batch) or ready() (Acme's LocalLayout)
    SCHEDULE = "schedule"  # a step every K inserts (TF-Agents' collect/train, Acme's older Agent)
