"""A job that shards its experience over several servers, each judged against the others:
shard_not_sampled, waits_on_shard, shard_config_differs.

    shard_not_sampled     inserts wait at max_diff here and nothing samples this server,
                          while the job's other servers are sampled: the learner does not
                          read it, or its reader of it stopped
    waits_on_shard        inserts wait at max_diff here and nothing samples any of the job's
                          servers, while one of them lets no sample through and takes no
                          inserts: a learner reading its shards in turn waits on it (or it
                          stopped: Reverb reads the same)
    shard_config_differs  a table of one name is not the same table on every server of the job

Each server's view carries the others' tables of the same name (diagnosis/peers.py). The two
stall readings refine insert_blocked, over the span it proved: a peer's samples are counted
from the moment this table's counters last moved, so every series judged is judged over the
window the learned rhythm set for this one.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from replaywatch.diagnosis import kinds
from replaywatch.diagnosis import peers as pr
from replaywatch.diagnosis import ratelimiter as lim
from replaywatch.diagnosis.case import TableCase, limiter_evidence
from replaywatch.diagnosis.registry import Rule, Shape
from replaywatch.diagnosis.rules_checkpoint import same_setting, settings_of
from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.diagnosis.window import PeerTable
from replaywatch.model import Finding, Name


def _fresh(case: TableCase, th: Thresholds) -> list[PeerTable]:
    """The peers polled within the stall window; an older one is target_down's business."""
    return [p for p in case.peers if case.now - p.latest.observed_at <= th.stall_window_s]


def _rested(case: TableCase, th: Thresholds, stalls: tuple[Finding, ...]
            ) -> tuple[float, float, list[PeerTable]] | None:
    """Where insert_blocked proved this table rests: since when, the moment the peers are
    counted from (pr.cycle_start), and the fresh peers polled before it; None without it."""
    blocked = next((f for f in stalls if f.kind == Name.INSERT_BLOCKED), None)
    if blocked is None:
        return None
    start = pr.cycle_start(case.history, blocked.since)
    return blocked.since, start, [p for p in _fresh(case, th) if pr.covers(p, start)]


def is_shard_not_sampled(case: TableCase, th: Thresholds, stalls: tuple[Finding, ...]
                         ) -> Finding | None:
    """Actors wait at max_diff on this shard and nothing samples it, while the job's learner
    (or learners) samples its other shards over the same span: whatever reads the job's
    replay does not read this server any more, or never did."""
    rested = _rested(case, th, stalls)
    if rested is None:
        return None
    since, start, peers = rested
    drawn = {p.target: pr.samples_in(p, start) for p in peers}
    sampled = {t: n for t, n in drawn.items() if n > 0}
    if not sampled:
        return None
    t, rl = case.latest, case.latest.rate_limiter
    idle = case.now - since
    never = rl.samples == 0
    evidence: dict[str, Any] = {
        **limiter_evidence(t), "job": case.job, "seconds_without_progress": idle,
        "samples_here": rl.samples, "never_sampled": never,
        "peers_sampled": {k: int(v) for k, v in sorted(sampled.items())},
        "peers_not_sampled": sorted(set(drawn) - set(sampled)),
        "samples_needed": lim.samples_to_insert(t)}
    others = ", ".join(f"'{k}' {int(v):,}" for k, v in sorted(sampled.items()))
    if never:
        why = (f"It was never sampled ({rl.inserts:,} inserts, 0 samples since the server "
               "started): the learner's datasets do not read this server.")
        fix = (f"Give the learner a dataset on '{case.target}' beside its others (one "
               "`reverb.TrajectoryDataset` or `ReplayDataset` per server address, "
               "interleaved), or stop the actors writing here: they wait at max_diff.")
    else:
        why = (f"It was sampled before ({rl.samples:,} samples): the learner's reader of "
               "this server (its dataset on this address, or a learner of its own) hangs or "
               "died while its others go on. The stack of the process that read it tells "
               "which.")
        fix = ("Find the reader of this server that stopped: a TrainerProbe's GET /stacks "
               f"(or py-spy dump) on the learner shows what its dataset on '{case.target}' "
               "waits in. Until it reads again the actors writing here wait at max_diff.")
    summary = (f"Inserts into table '{t.name}' wait at max_diff and nothing has sampled it for "
               f"{idle:.0f} s, while job '{case.job}' samples its other server(s) "
               f"({others} sample(s) over the same time). {why}")
    return case.finding(kinds.SHARD_NOT_SAMPLED, summary, evidence, fix, since=since)


def is_waits_on_shard(case: TableCase, th: Thresholds, stalls: tuple[Finding, ...]
                      ) -> Finding | None:
    """Actors wait at max_diff here, nothing samples any server of the job, and one of them
    lets no sample through and takes no inserts: a learner that reads its shards in turn
    (zipped or interleaved datasets) waits on that one, and stops sampling this one too."""
    rested = _rested(case, th, stalls)
    if rested is None:
        return None
    since, start, peers = rested
    if not peers or any(pr.samples_in(p, start) > 0 for p in peers):
        return None
    # Peers that let no sample through and took no insert since
    holding = [p for p in peers
               if not lim.can_sample(p.latest, 1) and pr.inserts_in(p, start) == 0]
    if not holding:
        return None
    t = case.latest
    on = holding[0]
    rl = on.latest.rate_limiter
    why = (f"{on.latest.current_size:,} items, below its min_size_to_sample "
           f"{rl.min_size_to_sample:,}" if lim.is_warming_up(on.latest) else
           f"its cursor {lim.cursor(on.latest):,.0f} at min_diff {rl.min_diff:,.0f}")
    last_insert = pr.last_moved(on, 1)
    evidence: dict[str, Any] = {
        **limiter_evidence(t), "job": case.job, "seconds_without_progress": case.now - since,
        "waits_on": [p.target for p in holding],
        "waits_on_size": on.latest.current_size, "waits_on_cursor": lim.cursor(on.latest),
        "waits_on_min_size_to_sample": rl.min_size_to_sample,
        "waits_on_min_diff": rl.min_diff, "waits_on_last_insert_at": last_insert,
        "samples_stopped_at": since}
    timing = ("" if last_insert is None else
              f" Its inserts last moved {since - last_insert:.1f} s before sampling stopped "
              "here." if last_insert <= since else
              f" Its inserts last moved {last_insert - since:.1f} s after sampling stopped "
              "here.")
    summary = (f"Inserts into table '{t.name}' wait at max_diff and nothing has sampled any "
               f"server of job '{case.job}' for {case.now - since:.0f} s, while '{on.target}' "
               f"lets no sample through ({why}) and takes no inserts.{timing} A learner that "
               f"reads its shards in turn waits on '{on.target}'; a learner that stopped reads "
               "the same from Reverb: its stack (a TrainerProbe's GET /stacks) tells them "
               "apart.")
    fix = (f"Look at '{on.target}' first: its own finding says why its inserts stopped (its "
           "actors died, hang, or write elsewhere). This server is sampled again when the "
           "learner is.")
    return case.finding(kinds.WAITS_ON_SHARD, summary, evidence, fix, since=since)


def is_shard_config_differs(case: TableCase, th: Thresholds) -> Finding | None:
    """A table of this name is not the same table on every server of the job: a setting
    differs here from the value most of them serve (or no value is the most served)."""
    if not case.peers:
        return None
    mine = settings_of(case.latest)
    theirs = {p.target: settings_of(p.latest) for p in case.peers}
    differ: dict[str, dict[str, Any]] = {}
    for key, value in mine.items():
        values = [value, *(s[key] for s in theirs.values())]
        if all(same_setting(value, v) for v in values):
            continue
        counts = Counter(_key(v) for v in values)
        top = counts.most_common()
        majority = top[0][1] > top[1][1] if len(top) > 1 else True
        if majority and top[0][0] == _key(value):
            continue  # most servers serve this one's value: the others are named
        differ[key] = {t: s[key] for t, s in sorted(theirs.items())
                       if not same_setting(value, s[key])}
    if not differ:
        return None
    words = "; ".join(
        f"{k} {mine[k]} here, " + ", ".join(f"{v} on '{t}'" for t, v in others.items())
        for k, others in sorted(differ.items()))
    evidence = {"job": case.job, "differ": sorted(differ),
                "here": {k: mine[k] for k in sorted(differ)},
                "peers": {k: differ[k] for k in sorted(differ)},
                "servers": 1 + len(case.peers)}
    summary = (f"Table '{case.name}' is not the same table on the {1 + len(case.peers)} servers "
               f"of job '{case.job}': {words}.")
    fix = ("Start every server of the job from the same `reverb.Table` settings; if this one "
           "was restored from a checkpoint, it serves the checkpoint's (see "
           "restore_config_override).")
    return case.finding(kinds.SHARD_CONFIG_DIFFERS, summary, evidence, fix,
                        since=case.latest.observed_at)


def _key(value: Any) -> Any:
    """A setting as a Counter key: floats rounded as same_setting compares them."""
    return round(value, 6) if isinstance(value, float) else value


RULES = (
    Rule(kinds.SHARD_NOT_SAMPLED, is_shard_not_sampled, Shape.AFTER_STALLS),
    Rule(kinds.WAITS_ON_SHARD, is_waits_on_shard, Shape.AFTER_STALLS),
    Rule(kinds.SHARD_CONFIG_DIFFERS, is_shard_config_differs, Shape.TABLE_SETTINGS),
)
