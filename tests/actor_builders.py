"""Actor probe snapshots for tests that need one without running an ActorProbe."""

from __future__ import annotations

from replaywatch.model import WRITER_CALLS, ActorSnapshot, WriterCallStats

ACTOR = "http://127.0.0.1:9"


def actor_snapshot(
    t: float,
    steps: int,
    *,
    url: str = ACTOR,
    items: int | None = None,
    in_call: str | None = None,
    blocked_for: float = 0.0,
    waiting_on: str | None = None,
    waiting_for: float = 0.0,
    pending: int = 0,
    pid: int = 5151,
    started_at: float = 0.0,
    name: str = "actor-0",
    table: str | None = "replay",
) -> ActorSnapshot:
    """One actor `/probe` document at `t`; its last step was a second ago (if it took one)."""
    calls = tuple(WriterCallStats(c, steps if c == "append" else 0, 0, 0.5, None)
                  for c in WRITER_CALLS)
    return ActorSnapshot(
        probe=url, observed_at=float(t), pid=pid, name=name, table=table,
        started_at=started_at, steps_total=steps,
        last_step_at=t - 1.0 if steps else None,
        seconds_since_last_step=1.0 if steps else None,
        in_call=in_call, in_call_since=t - blocked_for if in_call else None,
        blocked_for_s=blocked_for, items_created_total=steps if items is None else items,
        appends_total=steps, pending_items=pending, waiting_on=waiting_on,
        waiting_since=t - waiting_for if waiting_on else None, waiting_for_s=waiting_for,
        waits_total=0, waiting_seconds_total=waiting_for, thread_count=3, os_threads=7,
        writers_wrapped=1, calls=calls,
    )
