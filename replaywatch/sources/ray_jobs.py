"""Every RLlib job on one Ray cluster, found from its state API (`--ray-job all`).

Several jobs share a cluster (Tune trials, a team's experiments, a driver started again):
each is watched as a target of its own, named `{dashboard} job {job_id}`, judged by the same
rules as a job named with `--ray-job`. The actors list is read every `every_s` (10 s): a job
appears within one interval of its first RLlib actor (EnvRunner, Learner, aggregator) being
listed, alive or starting. A job whose RLlib actors are all dead is still watched for
`ttl_s` (10 minutes) from the last read that saw one alive, so that its end is judged (dead
runners, a stall) and not lost with it; then it leaves the watch, and its open incidents
close as gone, never as fixed. A job first seen already dead (an earlier run the state API
still lists) is not watched.

`JobBook` is the pure part: what was seen when, and which jobs are kept at `now`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable

from replaywatch.errors import SourceError
from replaywatch.ray_model import ActorRole, RayActor

DISCOVER_EVERY_S = 10.0
JOB_TTL_S = 600.0
# Not yet running, but not dead: a job whose actors are being created is already a job.
_STARTING = frozenset({"DEPENDENCIES_UNREADY", "PENDING_CREATION", "ALIVE", "RESTARTING"})


@dataclasses.dataclass
class JobBook:
    """Each job with an RLlib actor, and when one of them was last seen not dead."""

    ttl_s: float = JOB_TTL_S
    last_live: dict[str, float] = dataclasses.field(default_factory=dict)

    def see(self, actors: Iterable[RayActor], now: float) -> None:
        for a in actors:
            if a.role != ActorRole.OTHER and a.state in _STARTING:
                self.last_live[a.job_id] = now

    def kept(self, now: float) -> list[str]:
        """The jobs watched at `now`, oldest first (Ray's job ids count up)."""
        self.last_live = {j: t for j, t in self.last_live.items() if now - t <= self.ttl_s}
        return sorted(self.last_live, key=_job_order)


def _job_order(job_id: str) -> tuple[int, str]:
    try:
        return int.from_bytes(bytes.fromhex(job_id), "little"), job_id
    except ValueError:
        return -1, job_id


class RayJobs:
    """The jobs to watch on one cluster, asked each cycle; read from the state API at most
    every `every_s`. `read_actors(now)` is the cluster's actors list (raises SourceError);
    `jobs(now)` is the kept list when it changed, else None (nothing to reload). An
    unreadable list keeps what is watched: a dashboard that is down is not every job gone
    (each job's own source says it is unreachable)."""

    def __init__(self, read_actors: Callable[[float], tuple[RayActor, ...]],
                 every_s: float = DISCOVER_EVERY_S, ttl_s: float = JOB_TTL_S,
                 clock: Callable[[], float] = time.monotonic):
        self._read = read_actors
        self._every_s = every_s
        self._clock = clock
        self.book = JobBook(ttl_s)
        self._last_read: float | None = None
        self._watched: list[str] | None = None
        self.last_error: str | None = None

    def jobs(self, now: float) -> list[str] | None:
        mono = self._clock()
        if self._last_read is not None and mono - self._last_read < self._every_s:
            return None
        self._last_read = mono
        try:
            self.book.see(self._read(now), mono)
            self.last_error = None
        except SourceError as e:
            self.last_error = f"Ray job discovery: {e}"
            return None  # nothing learned: no job expires for our own blindness
        kept = self.book.kept(mono)
        if kept == self._watched:
            return None
        self._watched = kept
        return kept
