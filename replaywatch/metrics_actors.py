"""Metric families of the actor probes, and the thread counts of every probe.

Kept apart from metrics.py, which renders tables and trainer probes, so each
stays small. The same conventions: built fresh from one `Published` per scrape,
bounded labels only. `call` takes its values from the fixed WRITER_CALLS; what
an actor waits on is free text from the user's code, so only whether it waits
(and for how long) becomes a metric; the API shows on what.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from replaywatch.model import WRITER_CALLS
from replaywatch.state import Published

LABELS = ["target", "probe"]


def role_of(state: Published, url: str) -> str:
    """A probe's role as its latest document said; "unknown" before any answered."""
    if url in state.actors:
        return "actor"
    return "trainer" if url in state.probes else "unknown"


def _gauge(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"replaywatch_{name}", doc, labels=labels)


def _counter(name: str, doc: str, labels: list[str]) -> CounterMetricFamily:
    return CounterMetricFamily(f"replaywatch_{name}", doc, labels=labels)


def actor_families(state: Published) -> Iterator[Metric]:
    owner = {s.name: s.target for s in state.sources.values()}
    os_threads = _gauge("probe_os_threads",
                        "Operating-system threads in the probed process (Linux only).",
                        LABELS + ["role"])
    for url, p in state.probes.items():
        if p.os_threads is not None:
            os_threads.add_metric([owner.get(url, ""), url, "trainer"], p.os_threads)
    steps = _counter("actor_steps", "Environment steps the actor reported (step()).", LABELS)
    since_step = _gauge("actor_seconds_since_last_step",
                        "Seconds since the actor's last step(); absent before its first.",
                        LABELS)
    items = _counter("actor_items_created",
                     "Items the actor's writers created (create_item calls that returned).",
                     LABELS)
    appends = _counter("actor_appends", "append() calls of the actor's writers that returned.",
                       LABELS)
    pending = _gauge("actor_pending_items",
                     "Items created but not yet proven written (an upper bound).", LABELS)
    in_call = _gauge("actor_in_writer_call", "1 while the actor is inside this writer call.",
                     LABELS + ["call"])
    blocked = _gauge("actor_writer_call_blocked_seconds",
                     "How long the actor has been inside its current writer call; 0 outside.",
                     LABELS)
    calls = _counter("actor_writer_calls", "Writer calls that returned or raised.",
                     LABELS + ["call"])
    errors = _counter("actor_writer_call_errors", "Writer calls that raised.", LABELS + ["call"])
    call_seconds = _counter("actor_writer_call_seconds",
                            "Time spent inside writer calls, the current one included.",
                            LABELS + ["call"])
    waiting = _gauge("actor_waiting",
                     "1 while the actor waits outside Reverb (probe.waiting(on)).", LABELS)
    waiting_for = _gauge("actor_waiting_duration_seconds",
                         "How long the actor's current wait has lasted; 0 when not waiting.",
                         LABELS)
    waited = _counter("actor_waiting_seconds",
                      "Time the actor spent waiting outside Reverb, the current wait included.",
                      LABELS)
    threads = _gauge("actor_threads", "Python threads in the actor process.", LABELS)
    for url, a in state.actors.items():
        labels = [owner.get(url, ""), url]
        steps.add_metric(labels, a.steps_total)
        if a.seconds_since_last_step is not None:
            since_step.add_metric(labels, a.seconds_since_last_step)
        items.add_metric(labels, a.items_created_total)
        appends.add_metric(labels, a.appends_total)
        pending.add_metric(labels, a.pending_items)
        blocked.add_metric(labels, a.blocked_for_s)
        for call in WRITER_CALLS:
            in_call.add_metric(labels + [call], 1.0 if a.in_call == call else 0.0)
        for c in a.calls:
            calls.add_metric(labels + [c.call], c.count)
            errors.add_metric(labels + [c.call], c.errors)
            call_seconds.add_metric(labels + [c.call], c.seconds_total)
        waiting.add_metric(labels, 1.0 if a.waiting else 0.0)
        waiting_for.add_metric(labels, a.waiting_for_s)
        waited.add_metric(labels, a.waiting_seconds_total)
        threads.add_metric(labels, a.thread_count)
        if a.os_threads is not None:
            os_threads.add_metric(labels + ["actor"], a.os_threads)
    yield from (os_threads, steps, since_step, items, appends, pending, in_call, blocked, calls,
                errors, call_seconds, waiting, waiting_for, waited, threads)
