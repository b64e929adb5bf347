"""Configuration that can hang: batch_exceeds_headroom (certain), deadlock_risk (possible).

Both read one thing, the budget model (`replaywatch.diagnosis.budget`): the limiter from
Reverb, the dataset from the trainer probe, the layout as `layout.resolve` knows it. One
snapshot proves them, so they are named on the first poll, before any next() blocks.

    will_hang, layout known      batch_exceeds_headroom (critical): no batch will complete
    can_hang, layout known       deadlock_risk (warning), with the released and strandable
                                 samples, the terms that keep it from safe (`conservative`)
                                 and the fixes the model proves
    will_hang, a loop's gate     deadlock_risk (warning) when only the scheduled reading
    unknown                      hangs: the loop's own next() calls settle the gate, and a
                                 loop that waits on can_sample is not paged meanwhile
    layout unknown, insert       deadlock_risk when the synchronous reading is not safe, with
    blocking disabled            the asynchronous reading beside it and what settles it:
                                 inserts that never block are what Acme's LocalLayout sets
    layout unknown, finite       nothing: an asynchronous job (actors whose probes are not
    max_diff                     attached, waits without a declared bound) cannot be told
                                 from a synchronous loop, and a warning on every healthy
                                 asynchronous job would teach users to ignore it
"""

from __future__ import annotations

import dataclasses
from typing import Any

from replaywatch.diagnosis import budget, budget_fixes, budget_terms, budget_words, kinds
from replaywatch.diagnosis import layout as lay
from replaywatch.diagnosis import ratelimiter as lim
from replaywatch.diagnosis.budget import Batching, JobLayout
from replaywatch.diagnosis.budget_reasons import Verdict
from replaywatch.diagnosis.case import Probe, TableCase, limiter_evidence
from replaywatch.diagnosis.registry import Rule, Shape
from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.model import Finding, ProbeSnapshot, TableSnapshot
from replaywatch.probe.protocol import Gate
from replaywatch.probe.protocol import Layout as Kind


def limiter_of(t: TableSnapshot) -> budget.Limiter:
    rl = t.rate_limiter
    return budget.Limiter(rl.samples_per_insert, rl.min_size_to_sample, rl.min_diff,
                          rl.max_diff)


def shape_pending(p: ProbeSnapshot) -> bool:
    """The probe holds no iterator yet, so it has read no graph, and was told no shape: a
    batch per worker (Acme) or one after the interleave (TF-Agents) would be a guess, and a
    wrong guess prints a fix that hangs the job (judged as Acme's, a TF-Agents pipeline is
    told to use one sampling worker). Judged once the graph is read."""
    d = p.declared
    return (p.wrapped is None and p.read is None and p.pipeline_read is None
            and not d.batch_after_interleave and d.iterators_per_worker is None
            and d.max_in_flight is None and d.cycle_length is None)


def dataset_of(p: ProbeSnapshot, t: TableSnapshot | None = None) -> budget.Dataset | None:
    """The dataset the probe's `pipeline` chooses (as read from the tf.data graph, the
    declared values where the graph left one unknown); its items' size read from the
    table's signature where neither says it; None without a batch size or worker count, or
    while its shape is pending (`shape_pending`)."""
    r = p.pipeline
    if not r.batch_size or not r.num_parallel_calls or shape_pending(p):
        return None
    item_bytes = r.item_bytes or (t.item_bytes if t is not None else None)
    return budget.Dataset(
        r.num_parallel_calls, r.batch_size, r.max_in_flight, r.prefetch_size or 0,
        r.iterators_per_worker or 1, item_bytes,
        Batching.AFTER_INTERLEAVE if r.batch_after_interleave else Batching.PER_WORKER,
        r.cycle_length, r.workers_per_iterator or 1)


def declared_differs(p: ProbeSnapshot) -> dict[str, dict[str, object]]:
    """Each value the probe declares that the read pipeline contradicts (the read one is
    used): a wrong declaration is a wrong verdict, so it is shown beside the truth."""
    r, d = p.read, p.declared
    if r is None:
        return {}
    pairs = {"batch_size": (d.batch_size, r.batch_size),
             "num_parallel_calls": (d.num_parallel_calls, r.num_parallel_calls),
             "max_in_flight": (d.max_in_flight, r.max_in_flight),
             "iterators_per_worker": (d.iterators_per_worker, r.iterators_per_worker),
             "batch_after_interleave": (d.batch_after_interleave or None,
                                        r.batch_after_interleave),
             # TF-Agents opens min(B, max_cycle_length) datasets: a declared cycle is a most
             # (its recipe says max_cycle_length; a batch of 8 reads 8 of 32)
             "cycle_length": (min(d.cycle_length, r.batch_size or d.cycle_length)
                              if d.cycle_length else None, r.cycle_length)}
    return {name: {"declared": said, "read": read} for name, (said, read) in pairs.items()
            if said is not None and read is not None and said != read}


def known_layout(case: TableCase) -> lay.KnownLayout:
    return lay.resolve(case.latest, tuple(p[-1] for p in case.probes), case.actors,
                       case.declared_layout)


def synchronous_model(case: TableCase) -> JobLayout:
    """A synchronous loop's model where the layout is unknown: the gate the probes know."""
    reading = lay.synchronous_reading(case.latest, tuple(p[-1] for p in case.probes),
                                      case.declared_layout)
    return dataclasses.replace(reading, basis="reading").model() or JobLayout(Kind.SYNC)


def loop_is_synchronous(case: TableCase) -> bool:
    """The loop that inserts is the learner: a known synchronous layout, or, the layout
    unknown, inserts that never block (Acme's LocalLayout rewrite of max_diff)."""
    known = known_layout(case)
    return known.synchronous or (not known.known and lim.is_insert_blocking_disabled(case.latest))


def judged(case: TableCase, probe: Probe) -> tuple[budget.Budget, lay.KnownLayout,
                                                   JobLayout] | None:
    """The model's budget for this table and probe, under the known (or, unknown, the
    synchronous) reading; None when the probe does not declare the dataset."""
    ds = dataset_of(probe[-1], case.latest)
    if ds is None or not lim.is_sample_limited(case.latest):
        return None
    known = known_layout(case)
    if not known.known and not lim.is_insert_blocking_disabled(case.latest):
        return None
    model = known.model() or synchronous_model(case)
    return budget.predict(limiter_of(case.latest), ds, model), known, model


def _certain(case: TableCase, probe: Probe,
             got: tuple[budget.Budget, lay.KnownLayout, JobLayout]) -> bool:
    """will_hang under the known layout, and, a loop's gate unknown, under either gate: a
    loop that may wait on can_sample is not paged for what only a schedule would do."""
    b, known, model = got
    if b.verdict != Verdict.WILL_HANG or not known.known:
        return False
    if not model.synchronous or model.loop_gate is not None:
        return True
    ds = dataset_of(probe[-1], case.latest)
    assert ds is not None
    return budget.predict(limiter_of(case.latest), ds,
                          model.gated(Gate.CAN_SAMPLE)).verdict == Verdict.WILL_HANG


def is_batch_exceeds_headroom(case: TableCase, probe: Probe, th: Thresholds) -> Finding | None:
    """The layout (and a loop's gate) known, the model says no batch will complete once
    inserting stops."""
    got = judged(case, probe)
    if got is None or not _certain(case, probe, got):
        return None
    return _finding(kinds.BATCH_EXCEEDS_HEADROOM, case, probe, *got)


def is_deadlock_risk(case: TableCase, probe: Probe, th: Thresholds) -> Finding | None:
    """The model says this configuration can hang (or will, under an unknown layout's
    synchronous reading): predicted, not seen."""
    got = judged(case, probe)
    if got is None or got[0].verdict == Verdict.SAFE:
        return None
    if _certain(case, probe, got):
        return None  # batch_exceeds_headroom names it
    return _finding(kinds.DEADLOCK_RISK, case, probe, *got)


def _finding(kind: kinds.Kind, case: TableCase, probe: Probe, b: budget.Budget,
             known: lay.KnownLayout, model: JobLayout) -> Finding:
    t, p = case.latest, probe[-1]
    ds = dataset_of(p, t)
    assert ds is not None
    # Searched under what the fixed run will show from its first poll (layout.fix_model).
    fixes = budget_fixes.fixes(limiter_of(t), ds, known.fix_model(limiter_of(t))
                               or model.for_fixes(limiter_of(t)))
    # What keeps the verdict from a better one, as predict says it; a layout nobody declared
    # first, since settling it may clear the finding whatever the rest says.
    terms = (() if known.known else (budget_terms.layout_unknown(),)) + budget_terms.explain(
        limiter_of(t), ds, model)
    evidence: dict[str, Any] = {
        **limiter_evidence(t), **budget_words.evidence(b), **known.evidence(),
        "judged_as": model.kind,
        "conservative": [e.term.value for e in terms],
        "conservative_why": {e.term.value: f"{e.why}; settled by {e.settled_by}"
                             for e in terms},
        "error_buffer": limiter_of(t).error_buffer, "workers": ds.workers,
        "batch_size": ds.batch_size, "max_in_flight": ds.in_flight,
        "iterators_per_worker": ds.iterators_per_worker, "item_bytes": ds.item_bytes,
        "item_bytes_from": ("pipeline" if p.read and p.read.item_bytes
                            else "probe" if p.declared.item_bytes else "signature" if ds.item_bytes
                            else None), "probe": p.probe,
        "pipeline": ds.shape, "samplers": ds.samplers,
        "dataset_from": "the tf.data graph" if p.read else "declared",
        "declared_differs": declared_differs(p),
        "fixes": [f.document() for f in fixes]}
    if p.read is not None and p.read.num_parallel_calls_autotune:
        evidence["num_parallel_calls_note"] = ("AUTOTUNE: tf.data may run one interleave "
                                               "thread, judged so")
    summary = budget_words.summary(t.name, b, ds, None if known.known else model.kind)
    fix = budget_words.fix(fixes, layout_known=known.known)
    return case.finding(kind, summary, evidence, fix,
                        since=max(case.history[0].observed_at, probe[0].observed_at))


def is_declared_pipeline_differs(case: TableCase, probe: Probe, th: Thresholds
                                 ) -> Finding | None:
    """The probe's declared dataset is contradicted by the pipeline it read: a user's wrong
    declaration (TF-Agents' num_parallel_calls=3 of 32 datasets) is shown, not used."""
    p = probe[-1]
    differs = declared_differs(p)
    if not differs or (p.table is not None and p.table != case.latest.name):
        return None
    said = ", ".join(f"{name}={d['declared']} (the graph: {d['read']})"
                     for name, d in differs.items())
    return case.finding(
        kinds.DECLARED_PIPELINE_DIFFERS,
        f"The trainer probe '{p.name}' declares {said}; its tf.data graph is what the "
        "verdicts use.",
        {"declared_differs": differs, "probe": p.probe}, kinds.DECLARED_PIPELINE_DIFFERS.fix,
        since=probe[0].observed_at)


RULES = (
    Rule(kinds.BATCH_EXCEEDS_HEADROOM, is_batch_exceeds_headroom, Shape.PROBE_SETTINGS),
    Rule(kinds.DEADLOCK_RISK, is_deadlock_risk, Shape.PROBE_SETTINGS),
    Rule(kinds.DECLARED_PIPELINE_DIFFERS, is_declared_pipeline_differs, Shape.PROBE_SETTINGS),
)
