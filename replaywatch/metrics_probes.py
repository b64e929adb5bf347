"""Metric families of the probes: trainers and actors.

metrics.py renders sources, tables and findings and calls these rows in between. The
same conventions: built fresh from one `Published` per scrape, bounded labels
only. `call` takes its values from the fixed WRITER_CALLS; what an actor waits
on is free text from the user's code, so only whether it waits (and for how
long) becomes a metric; the API shows on what.
"""

from __future__ import annotations

from replaywatch.metric_families import Group, Row, counter, gauge
from replaywatch.model import WRITER_CALLS, MemorySnapshot
from replaywatch.state import Published


def role_of(state: Published, url: str) -> str:
    """A probe's role as its latest document said; "unknown" before any answered."""
    if url in state.actors:
        return "actor"
    if url in state.probes:
        return "trainer"
    return "replay" if replay_probe(state, url) is not None else "unknown"


def replay_probe(state: Published, url: str) -> MemorySnapshot | None:
    """The memory reading a replay probe at `url` served last, if that is what it is."""
    return next((m for m in state.memory.values() if m.found_by == f"replay probe {url}"),
                None)


LABELS = ("target", "probe")
ROLE = (*LABELS, "role")
CALL = (*LABELS, "call")

BATCHES = counter("probe_batches", "Batches the learner took from its iterator.", LABELS)
STEPS = counter("probe_learner_steps", "Learner steps reported by the probe.", LABELS)
BLOCKED_TOTAL = counter("probe_next_blocked_seconds", "Time the learner spent blocked in next().",
                        LABELS)
BLOCKED = gauge("probe_blocked_in_next", "1 while the learner is blocked in next().", LABELS)
BLOCKED_FOR = gauge("probe_blocked_duration_seconds",
                    "How long the current next() has been blocked.", LABELS)
READY = gauge("probe_iterator_ready", "1 if the iterator reports ready().", LABELS)
THREADS = gauge("probe_threads", "Threads in the trainer process.", LABELS)
BATCH = gauge("probe_batch_size", "The learner's batch size.", LABELS)
WORKERS = gauge("probe_num_parallel_calls", "Parallel sampling workers.", LABELS)

OS_THREADS = gauge("probe_os_threads",
                   "Operating-system threads in the probed process (Linux only).", ROLE)
TABLE = (*LABELS, "table")
P_CALLS = counter("probe_priority_update_calls", "mutate_priorities calls the learner made "
                  "through its wrapped client, by table.", TABLE)
P_KEYS = counter("probe_priority_update_keys", "Keys those calls sent.", TABLE)
P_ERRORS = counter("probe_priority_update_errors", "mutate_priorities calls that raised: Reverb "
                   "refused them (a NaN or negative priority) or could not be reached.", TABLE)
P_SECONDS = counter("probe_priority_update_seconds", "Time the learner spent in "
                    "mutate_priorities.", TABLE)
ESS = gauge("probe_batch_effective_sample_size", "Items the sampler effectively draws from, "
            "by the learner's recent batches (1 / mean probability).", LABELS)
BATCH_TABLE = gauge("probe_batch_table_size", "The table's size as the learner's newest batch "
                    "saw it.", LABELS)
REPEATED = counter("probe_batches_repeated", "Batches whose keys are exactly those of one of "
                   "the learner's recent batches.", LABELS)
A_STEPS = counter("actor_steps", "Environment steps the actor reported (step()).", LABELS)
SINCE_STEP = gauge("actor_seconds_since_last_step",
                   "Seconds since the actor's last step(); absent before its first.", LABELS)
ITEMS = counter("actor_items_created",
                "Items the actor's writers created (create_item calls that returned).", LABELS)
APPENDS = counter("actor_appends", "append() calls of the actor's writers that returned.",
                  LABELS)
PENDING = gauge("actor_pending_items", "Items created but not yet proven written (an upper bound).",
                LABELS)
IN_CALL = gauge("actor_in_writer_call", "1 while the actor is inside this writer call.", CALL)
CALL_BLOCKED = gauge("actor_writer_call_blocked_seconds",
                     "How long the actor has been inside its current writer call; 0 outside.",
                     LABELS)
CALLS = counter("actor_writer_calls", "Writer calls that returned or raised.", CALL)
ERRORS = counter("actor_writer_call_errors", "Writer calls that raised.", CALL)
CALL_SECONDS = counter("actor_writer_call_seconds",
                       "Time spent inside writer calls, the current one included.", CALL)
WAITING = gauge("actor_waiting", "1 while the actor waits outside Reverb (probe.waiting(on)).",
                LABELS)
WAITING_FOR = gauge("actor_waiting_duration_seconds",
                    "How long the actor's current wait has lasted; 0 when not waiting.", LABELS)
WAITED = counter("actor_waiting_seconds",
                 "Time the actor spent waiting outside Reverb, the current wait included.", LABELS)
A_THREADS = gauge("actor_threads", "Python threads in the actor process.", LABELS)


def owners(state: Published) -> dict[str, str]:
    """Each source's target, by source name (a probe's `target` label)."""
    return {s.name: s.target for s in state.sources.values()}


def trainer_rows(state: Published, owner: dict[str, str]) -> Group:
    batches: list[Row] = []
    steps: list[Row] = []
    blocked_total: list[Row] = []
    blocked: list[Row] = []
    blocked_for: list[Row] = []
    ready: list[Row] = []
    threads: list[Row] = []
    batch: list[Row] = []
    workers: list[Row] = []
    for url, p in state.probes.items():
        labels = (owner.get(url, ""), url)
        batches.append((labels, p.batches_retrieved))
        steps.append((labels, p.learner_steps))
        blocked_total.append((labels, p.blocked_seconds_total))
        blocked.append((labels, 1.0 if p.blocked_in_next else 0.0))
        blocked_for.append((labels, p.blocked_for_s))
        if p.ready is not None:
            ready.append((labels, 1.0 if p.ready else 0.0))
        threads.append((labels, p.thread_count))
        shape = p.pipeline  # what the diagnosis judges: read from the graph over declared
        if shape.batch_size is not None:
            batch.append((labels, shape.batch_size))
        if shape.num_parallel_calls is not None:
            workers.append((labels, shape.num_parallel_calls))
    yield from zip((BATCHES, STEPS, BLOCKED_TOTAL, BLOCKED, BLOCKED_FOR, READY, THREADS, BATCH,
                    WORKERS),
                   (batches, steps, blocked_total, blocked, blocked_for, ready, threads, batch,
                    workers))


def replay_health_rows(state: Published, owner: dict[str, str]) -> Group:
    """What the learner's probe counts of its priority updates and reads of its batches."""
    fams = (P_CALLS, P_KEYS, P_ERRORS, P_SECONDS, ESS, BATCH_TABLE, REPEATED)
    rows: list[list[Row]] = [[] for _ in fams]
    calls, keys, errors, seconds, ess, size, repeated = rows
    for url, p in state.probes.items():
        labels = (owner.get(url, ""), url)
        for u in p.priority_updates:
            by_table = (*labels, u.table)
            calls.append((by_table, u.calls))
            keys.append((by_table, u.keys))
            errors.append((by_table, u.errors))
            seconds.append((by_table, u.seconds_total))
        if (b := p.batch_stats) is not None:
            repeated.append((labels, b.batches_repeated))
            if b.effective_sample_size is not None:
                ess.append((labels, b.effective_sample_size))
            if b.table_size is not None:
                size.append((labels, b.table_size))
    yield from zip(fams, rows)


def actor_rows(state: Published, owner: dict[str, str]) -> Group:
    fams = (OS_THREADS, A_STEPS, SINCE_STEP, ITEMS, APPENDS, PENDING, IN_CALL, CALL_BLOCKED,
            CALLS, ERRORS, CALL_SECONDS, WAITING, WAITING_FOR, WAITED, A_THREADS)
    rows: list[list[Row]] = [[] for _ in fams]
    (os_threads, steps, since_step, items, appends, pending, in_call, blocked, calls, errors,
     call_seconds, waiting, waiting_for, waited, threads) = rows
    for url, p in state.probes.items():
        if p.os_threads is not None:
            os_threads.append(((owner.get(url, ""), url, "trainer"), p.os_threads))
    for url, a in state.actors.items():
        labels = (owner.get(url, ""), url)
        steps.append((labels, a.steps_total))
        if a.seconds_since_last_step is not None:
            since_step.append((labels, a.seconds_since_last_step))
        items.append((labels, a.items_created_total))
        appends.append((labels, a.appends_total))
        pending.append((labels, a.pending_items))
        blocked.append((labels, a.blocked_for_s))
        for call in WRITER_CALLS:
            in_call.append(((*labels, call), 1.0 if a.in_call == call else 0.0))
        for c in a.calls:
            with_call = (*labels, c.call)
            calls.append((with_call, c.count))
            errors.append((with_call, c.errors))
            call_seconds.append((with_call, c.seconds_total))
        waiting.append((labels, 1.0 if a.waiting else 0.0))
        waiting_for.append((labels, a.waiting_for_s))
        waited.append((labels, a.waiting_seconds_total))
        threads.append((labels, a.thread_count))
        if a.os_threads is not None:
            os_threads.append(((*labels, "actor"), a.os_threads))
    yield from zip(fams, rows)
