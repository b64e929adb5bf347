"""Concise builders of snapshot histories for rule, engine and API tests.

    hist = table_history([0, 1, 2], inserts=[10, 20, 30], samples=[0, 5, 10], spi=0.5)
    probe = probe_history([0, 1, 2], batches=[0, 1, 2], blocked_for=[0, 0, 12])
    view = target_view(tables=[hist], probes=[probe])

Per-poll values are sequences (one per time) or a scalar held constant. The
defaults describe a healthy, past-warm-up table with a SampleToInsertRatio
limiter (spi 1, min_size 1, min_diff -100, max_diff 100).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from replaywatch.diagnosis import kinds, rules
from replaywatch.diagnosis import window as win
from replaywatch.diagnosis.actors import Actor
from replaywatch.diagnosis.case import TableCase
from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.diagnosis.window import PollRecord, TargetView
from replaywatch.model import (
    FLOAT_MAX,
    WRITER_CALLS,
    ActorSnapshot,
    Finding,
    KeyDistributionOptions,
    PipelineShape,
    ProbeSnapshot,
    RateLimiterInfo,
    TableSnapshot,
    TableWorkerTime,
    WriterCallStats,
)

TARGET = "localhost:8000"
TABLE = "replay"
PROBE = "http://127.0.0.1:9100"
SHAPE_FIELDS = tuple(f.name for f in dataclasses.fields(PipelineShape))

Values = Sequence[Any] | Any


def at(values: Values, i: int) -> Any:
    """The i-th value of a per-poll sequence, or the scalar itself."""
    if isinstance(values, (list, tuple)):
        return values[i]
    return values


def cumulative(rate: float, times: Sequence[float], start: float = 0.0) -> list[int]:
    """A counter growing at `rate` per second over `times` (for worker-time ms)."""
    return [int(start + rate * (t - times[0])) for t in times]


def table_snapshot(
    t: float,
    inserts: int,
    samples: int,
    *,
    name: str = TABLE,
    target: str = TARGET,
    spi: float = 1.0,
    min_diff: float = -100.0,
    max_diff: float = 100.0,
    min_size: int = 1,
    size: int | None = None,
    max_size: int = 1_000_000,
    waiting_for_inserts_ms: int = 0,
    waiting_for_sampling_ms: int = 0,
    item_bytes: int | None = None,
    unique: int | None = None,
    sampler: str = "uniform",
) -> TableSnapshot:
    """One `TableInfo`; size defaults to the inserts (no deletes yet), capped at max_size.
    `item_bytes`: what its signature says of an item's size (None: no signature).
    `unique`: num_unique_samples, by default every sample a new item (up to the inserts)."""
    return TableSnapshot(
        target=target, name=name, observed_at=float(t), max_size=max_size,
        current_size=min(inserts, max_size) if size is None else size,
        max_times_sampled=0, num_episodes=inserts, num_deleted_episodes=0,
        num_unique_samples=min(inserts, samples) if unique is None else unique,
        sampler=KeyDistributionOptions(sampler),
        remover=KeyDistributionOptions("fifo"),
        rate_limiter=RateLimiterInfo(spi, min_diff, max_diff, min_size, inserts, samples),
        worker_time=TableWorkerTime(waiting_for_inserts_ms=waiting_for_inserts_ms,
                                    waiting_for_sampling_ms=waiting_for_sampling_ms),
        has_signature=item_bytes is not None, item_bytes=item_bytes,
    )


def table_history(
    times: Sequence[float],
    inserts: Values,
    samples: Values,
    *,
    size: Values = None,
    waiting_for_inserts_ms: Values = 0,
    waiting_for_sampling_ms: Values = 0,
    unique: Values = None,
    **config: Any,
) -> tuple[TableSnapshot, ...]:
    """One snapshot per time; `config` goes to table_snapshot (spi, min_diff, ...)."""
    return tuple(
        table_snapshot(t, at(inserts, i), at(samples, i), size=at(size, i),
                       unique=at(unique, i),
                       waiting_for_inserts_ms=at(waiting_for_inserts_ms, i),
                       waiting_for_sampling_ms=at(waiting_for_sampling_ms, i), **config)
        for i, t in enumerate(times)
    )


def probe_snapshot(
    t: float,
    batches: int,
    *,
    url: str = PROBE,
    blocked_for: float = 0.0,
    steps: int | None = None,
    batch_size: int | None = 256,
    workers: int | None = 1,
    prefetch: int | None = 4,
    ready: bool | None = None,
    threads: int = 40,
    table: str | None = None,
    started_at: float = 0.0,
    pid: int = 4242,
    name: str = "learner",
    **declared: Any,
) -> ProbeSnapshot:
    """One `/probe` document; blocked_for > 0 means blocked in next() since t - blocked_for.
    Its iterator is wrapped (`wrapped=None`: a probe that holds none yet). The pipeline's
    shape is declared by its fields' names (`max_in_flight=`, `cycle_length=`...), and
    `pipeline=` is the one the probe read from the graph."""
    blocked = blocked_for > 0
    declared.setdefault("wrapped", "iterator")
    shape = {f: declared.pop(f) for f in SHAPE_FIELDS if f in declared}
    return ProbeSnapshot(
        probe=url, observed_at=float(t), pid=pid, name=name,
        declared=PipelineShape(batch_size=batch_size, num_parallel_calls=workers,
                               prefetch_size=prefetch, table=table, **shape),
        read=declared.pop("pipeline", None), batches_retrieved=batches,
        blocked_in_next=blocked, blocked_since=t - blocked_for if blocked else None,
        blocked_for_s=float(blocked_for), blocked_seconds_total=float(blocked_for),
        last_batch_at=None, ready=ready, learner_steps=batches if steps is None else steps,
        last_step_at=None, thread_count=threads, started_at=started_at, table=table,
        **declared,  # iterators_per_worker, layout, items_inserted, inserts_on_next_thread...
    )


def probe_history(
    times: Sequence[float],
    batches: Values,
    *,
    blocked_for: Values = 0.0,
    steps: Values = None,
    ready: Values = None,
    threads: Values = 40,
    pid: Values = 4242,
    **config: Any,
) -> tuple[ProbeSnapshot, ...]:
    """One probe document per time; `config` goes to probe_snapshot."""
    return tuple(
        probe_snapshot(t, at(batches, i), blocked_for=at(blocked_for, i), steps=at(steps, i),
                       ready=at(ready, i), threads=at(threads, i), pid=at(pid, i), **config)
        for i, t in enumerate(times)
    )


def polls(times: Sequence[float], ok: Values = True, error: str = "unreachable"
          ) -> tuple[PollRecord, ...]:
    return tuple(PollRecord(float(t), bool(at(ok, i)), 0.001,
                            None if at(ok, i) else error) for i, t in enumerate(times))


def target_view(
    tables: Sequence[tuple[TableSnapshot, ...]] = (),
    probes: Sequence[tuple[ProbeSnapshot, ...]] = (),
    *,
    target: str = TARGET,
    target_polls: tuple[PollRecord, ...] | None = None,
    probe_polls: dict[str, tuple[PollRecord, ...]] | None = None,
) -> TargetView:
    """A view; by default every table time was a good poll, and so was every probe's."""
    times = sorted({s.observed_at for h in tables for s in h})
    return TargetView(
        target=target,
        polls=polls(times) if target_polls is None else target_polls,
        tables={h[0].name: h for h in tables},
        probes={h[0].probe: h for h in probes},
        probe_polls=probe_polls if probe_polls is not None else {
            h[0].probe: polls([s.observed_at for s in h]) for h in probes},
    )


def seconds(n: int, start: float = 1000.0, step: float = 1.0) -> list[float]:
    """n poll times, `step` apart from `start`."""
    return [start + i * step for i in range(n)]


# The seed job: batch 256, samples_per_insert 128, tolerance 0.1, min_replay_size
# 2000, so error_buffer = 2000 * 128 * 0.1 = 25600, min_diff = 256000 - 25600 =
# 230400, and Acme's synchronous layout sets max_diff to float max.
SEED_LIMITER = dict(spi=128.0, min_diff=230_400.0, max_diff=FLOAT_MAX, min_size=2000)
SEED_BLOCKING_LIMITER = dict(spi=128.0, min_diff=230_400.0, max_diff=281_600.0, min_size=2000)

DEFAULT = Thresholds()


# -- actor probe snapshots, for tests that need one without running an ActorProbe --------

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


# -- rule cases ---------------------------------------------------------------------------------

T20 = seconds(20)  # 1000 .. 1019


def case(table: tuple[TableSnapshot, ...], *probes: tuple[ProbeSnapshot, ...],
         now: float | None = None, actors: tuple[Actor, ...] = (),
         came_back: tuple[float, str] | None = None) -> TableCase:
    """What a table rule judges: the table's history since its last reset, with probes;
    `came_back`: when and how the server last came back ("restart" or "outage")."""
    history = win.since_last_reset(table)
    return TableCase(TARGET, history, probes,
                     history[-1].observed_at if now is None else now, actors=actors,
                     came_back_at=came_back and came_back[0],
                     came_back_how=came_back and came_back[1])


def assert_as_declared(finding: Finding | None, rule: Callable) -> None:
    """A rule produces only its own declared kind, at the declared severity."""
    if finding is not None:
        declared = kinds.BY_NAME[finding.kind]
        assert rules.BY_KIND[declared] is rule
        assert finding.severity is declared.severity


def waiting(rate_ms_per_s: float = 980.0, times: list[float] = T20) -> list[int]:
    """A table worker's waiting-for-inserts counter at `rate_ms_per_s`."""
    return cumulative(rate_ms_per_s, times)


# -- scenarios the rule, engine and keeper tests share ------------------------------------

def actor(times: list[float] | None = None, *, url: str = ACTOR,
          waiting_on: str | None = None, **kw: Any) -> Actor:
    """An actor probe answering every poll; `waiting_on` set means inside waiting() since the
    first poll."""
    times = T20 if times is None else times
    history = tuple(actor_snapshot(t, 500, url=url, waiting_on=waiting_on,
                                   waiting_for=t - times[0] + 1.0 if waiting_on else 0.0, **kw)
                    for t in times)
    return Actor(url, history, polls(times))


# -- the seed: a synchronous loop (max_diff = float max), cursor held at min_diff --------------

def seed_counters(inserts: list[int]) -> tuple[list[int], list[int]]:
    """Samples that keep the cursor exactly at min_diff: inserts * 128 - 230400."""
    return inserts, [n * 128 - 230_400 for n in inserts]


SEED_FROZEN_INSERTS, SEED_FROZEN_SAMPLES = seed_counters([12_000] * 20)  # 1,305,600 samples
# 5100 batches' worth were drawn; the learner got 5094, so 6 * 256 = 1536 are stranded.
SEED_BATCHES = 5094


def seed_hung_table(**kw: Any) -> tuple[TableSnapshot, ...]:
    return table_history(T20, SEED_FROZEN_INSERTS, SEED_FROZEN_SAMPLES,
                         waiting_for_inserts_ms=waiting(), **{**SEED_LIMITER, **kw})


def seed_hung_probe(workers: int = 12, batches: int = SEED_BATCHES, **kw: Any
                    ) -> tuple[ProbeSnapshot, ...]:
    return probe_history(T20, batches, blocked_for=[1.0 + i for i in range(20)],
                         workers=workers, **kw)


def seed_healthy(workers: int = 1, item_bytes: int | None = None
                 ) -> tuple[tuple[TableSnapshot, ...], tuple[ProbeSnapshot, ...]]:
    """Two inserts and one batch of 256 per second; next() blocks for short moments."""
    inserts, samples = seed_counters([12_000 + 2 * i for i in range(20)])
    table = table_history(T20, inserts, samples, waiting_for_inserts_ms=waiting(),
                          item_bytes=item_bytes, **SEED_LIMITER)
    probe = probe_history(T20, [s // 256 for s in samples],
                          blocked_for=[0.3 if i % 3 == 0 else 0 for i in range(20)],
                          workers=workers)
    return table, probe


def async_hung_table() -> tuple[TableSnapshot, ...]:
    """The seed hung with a blocking limiter (asynchronous: actors insert in their own
    threads); the cursor sits at min_diff and the table worker waits for inserts."""
    return table_history(T20, SEED_FROZEN_INSERTS, SEED_FROZEN_SAMPLES,
                         waiting_for_inserts_ms=waiting(), **SEED_BLOCKING_LIMITER)


def dead_actor(url: str = ACTOR) -> Actor:
    """Answered until t=1004, then its process (and probe) went away."""
    history = tuple(actor_snapshot(t, 500, url=url) for t in T20[:5])
    return Actor(url, history, polls(T20, ok=[True] * 5 + [False] * 15))


def silent_actor(url: str = ACTOR) -> Actor:
    """Alive (its probe answers) but no step, no item and no wait for 19 s."""
    history = tuple(dataclasses.replace(actor_snapshot(t, 500, url=url),
                                        seconds_since_last_step=t - 999.0) for t in T20)
    return Actor(url, history, polls(T20))


def in_writer(call: str, since: float, times: list[float] | None = None, url: str = ACTOR
              ) -> tuple[ActorSnapshot, ...]:
    """An actor probe that entered writer call `call` at `since` and never left it."""
    times = T20 if times is None else times
    return tuple(actor_snapshot(t, 500, url=url, in_call=call if t >= since else None,
                                blocked_for=t - since if t >= since else 0.0, pending=3)
                 for t in times)


# -- rules handed a table and a trainer probe (learner and config families) ---------------------

ProbeScenario = Callable[[], tuple[TableCase, tuple[ProbeSnapshot, ...]]]


def with_probe(table: tuple[TableSnapshot, ...], probe: tuple[ProbeSnapshot, ...]
               ) -> tuple[TableCase, tuple[ProbeSnapshot, ...]]:
    return case(table, probe), probe
