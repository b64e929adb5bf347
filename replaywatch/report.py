"""`replaywatch report BUNDLE`: a self-contained Markdown summary to paste into a tracker.

The verdict and its fix first, then the numbers the seed thread's users printed by hand
around `table.info` (min_diff, the cursor, max_diff, can_sample, inserts, samples), a small
table of each stalled table's counters over the bundle's span, the probes, the blocked
thread's stack, what is missing from the evidence, and versions. Pure: a bundle in, text out.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from typing import IO, Any

from replaywatch import bundle as bd
from replaywatch.diagnosis import ratelimiter as rl
from replaywatch.errors import ConfigError
from replaywatch.model import Finding, TableSnapshot
from replaywatch.ray_model import RaySnapshot

ROWS = 12  # counters over time: at most this many rows per table
# Where a stuck learner or actor sits: an iterator's next() (tf.data's), a writer's call.
_IN_NEXT = frozenset({"__next__", "iterator_get_next", "get_next", "GetNext", "_next_internal"})
_WRITER_CALLS = frozenset({"flush", "create_item", "append", "end_episode"})


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("bundle", metavar="BUNDLE", help="a bundle file")
    p.add_argument("--out", metavar="FILE", help="write here instead of stdout")


def run_report(args: argparse.Namespace, out: IO[str]) -> int:
    text = render(bd.read(args.bundle))
    if args.out:
        try:
            with open(args.out, "w", encoding="utf-8") as f:
                f.write(text)
        except OSError as e:
            raise ConfigError(f"{args.out}: cannot write ({e.strerror or e})") from None
    else:
        out.write(text)
    return 0


def render(b: bd.Bundle) -> str:
    """The Markdown report of one bundle, from its live verdict (what the sidecar said)."""
    findings = [bd.finding_from_document(f) for f in b.live.get("findings", [])]
    view = b.inputs.view
    d = b.doc
    top = findings[0] if findings else None
    title = (f"{top.kind} on {' '.join(x for x in (top.target, top.table) if x)}"
             if top else f"no findings on {view.target}")
    lines = [f"# replaywatch: {_md(title)}", "",
             f"Judged at {_utc(b.inputs.now)} by replaywatch {_md(d.get('replaywatch_version'))}"
             f" on `{_md(d.get('host'))}` ({_md(d.get('reason'))}). "
             f"Re-derive it with `replaywatch analyze <this bundle>`.", ""]
    lines += _verdict(findings)
    if b.inputs.ray:  # an RLlib job: its actors, calls and counters, not a Reverb table's
        lines += _ray(b.inputs.ray)
    else:
        lines += _limiter(view.tables)
        for name in sorted({f.table for f in findings if f.table} & set(view.tables)):
            lines += _counters(name, view.tables[name], b.inputs.now)
        lines += _probes(b)
    lines += _stack(d.get("stacks"))
    lines += _missing(d)
    lines += ["## Versions", "",
              f"- replaywatch {_md(d.get('replaywatch_version'))}, bundle format "
              f"{_md(d.get('format_version'))}",
              f"- sidecar: Python {_md((d.get('config') or {}).get('python', '?'))}, pid "
              f"{_md(d.get('sidecar_pid'))}, host `{_md(d.get('host'))}`",
              f"- poll interval {_md((d.get('config') or {}).get('interval_s', '?'))} s, stall "
              f"window {b.inputs.thresholds.stall_window_s:g} s, layout "
              f"{_md(b.inputs.layout or 'from the probes')}", ""]
    return "\n".join(lines)


def _verdict(findings: Sequence[Finding]) -> list[str]:
    if not findings:
        return ["## Verdict", "", "No findings: nothing was wrong at this cycle.", ""]
    out = ["## Verdict", "", "| severity | kind | table | since | summary |",
           "| --- | --- | --- | --- | --- |"]
    for f in findings:
        out.append(f"| {f.severity.label} | `{f.kind}` | {_md(f.table or '-')} | "
                   f"{_utc(f.since)} | {_md(f.summary)} |")
    out += ["", "## Fix", ""]
    out += [f"- **{f.kind}**: {_md(f.fix)}" for f in findings]
    return [*out, ""]


def _limiter(tables: dict[str, tuple[TableSnapshot, ...]]) -> list[str]:
    out = ["## The rate limiter, last poll", "",
           "| table | size / max | min size to sample | samples per insert | min_diff | "
           "cursor | max_diff | can_sample | can_insert | inserts | samples |",
           "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- | ---: | ---: |"]
    for name, points in sorted(tables.items()):
        if not points:
            continue
        s = points[-1]
        r = s.rate_limiter
        out.append(f"| {_md(name)} | {s.current_size:,} / {s.max_size:,} | "
                   f"{r.min_size_to_sample:,} | {_num(r.samples_per_insert)} | "
                   f"{_num(r.min_diff)} | {_num(rl.cursor(s))} | {_num(r.max_diff)} | "
                   f"{_yes(rl.can_sample(s))} | {_yes(rl.can_insert(s))} | {r.inserts:,} | "
                   f"{r.samples:,} |")
    if len(out) == 4:
        out.append("| (no table answered) | | | | | | | | | | |")
    return [*out, ""]


def _counters(name: str, points: Sequence[TableSnapshot], now: float) -> list[str]:
    step = max(1, -(-len(points) // ROWS))
    picked = list(points[::step])
    if picked[-1] is not points[-1]:
        picked.append(points[-1])
    out = [f"## `{_md(name)}` over time", "",
           "| s before the verdict | size | inserts | samples | cursor | inserts/s | "
           "samples/s |", "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    prev: TableSnapshot | None = None
    for s in picked:
        r = s.rate_limiter
        rates = ["", ""]
        if prev is not None and s.observed_at > prev.observed_at:
            dt = s.observed_at - prev.observed_at
            rates = [f"{(r.inserts - prev.rate_limiter.inserts) / dt:,.1f}",
                     f"{(r.samples - prev.rate_limiter.samples) / dt:,.1f}"]
        out.append(f"| {now - s.observed_at:.1f} | {s.current_size:,} | {r.inserts:,} | "
                   f"{r.samples:,} | {_num(rl.cursor(s))} | {rates[0]} | {rates[1]} |")
        prev = s
    return [*out, ""]


def _ray(history: Sequence[RaySnapshot]) -> list[str]:
    """The RLlib job at the last poll: its actors, the calls running, the counters, and the
    newest result row; every part the poll could not read, said."""
    last = history[-1]
    out = [f"## RLlib job {_md(last.job_id or '(none found)')}, last poll", "",
           f"{len(history)} snapshots in this bundle, from {_utc(history[0].observed_at)}; Ray "
           f"{_md(last.ray_version or '?')}, driver pid {_md(last.driver_pid or '?')}.", "",
           "| actor | role | state | restarts | pid | death cause |",
           "| --- | --- | --- | ---: | ---: | --- |"]
    out += [f"| {_md(a.class_name)} | {a.role} | {a.state} | {a.num_restarts} | "
            f"{_md(a.pid or '-')} | {_md(a.death_cause or '')} |" for a in last.actors]
    out += ["", "| call running | pid | for s |", "| --- | ---: | ---: |"]
    out += [f"| {_md(t.name)} | {_md(t.worker_pid or '-')} | "
            f"{'-' if t.running_for_s is None else _num(t.running_for_s)} |"
            for t in last.tasks] or ["| (none) | | |"]
    out += ["", "| counters of | role | env steps sampled | env steps trained | dropped |",
            "| --- | --- | ---: | ---: | ---: |"]
    out += [f"| {_md(c.rllib)} | {c.role} | {_opt(c.env_steps_sampled)} | "
            f"{_opt(c.env_steps_trained)} | {_opt(c.env_steps_dropped)} |"
            for c in last.counters if c.joined]
    if last.results:
        row = last.results[-1]
        out += ["", f"Newest result row: iteration {_md(row.iteration)}, "
                f"{_md(last.result_file or '?')}."]
    if last.errors:
        out += ["", "Not read at the last poll:", "", *[f"- {_md(e)}" for e in last.errors]]
    return [*out, ""]


def _opt(value: float | None) -> str:
    return "-" if value is None else _num(value)


def _probes(b: bd.Bundle) -> list[str]:
    view = b.inputs.view
    rows = []
    for url, history in sorted(view.probes.items()):
        if history:
            p = history[-1]
            state = (f"blocked in next() for {p.blocked_for_s:.1f} s" if p.blocked_in_next
                     else "not in next()")
            rows.append(f"| {_md(url)} | trainer | {p.pid} | {_md(p.name)} | {state} | "
                        f"{p.batches_retrieved:,} batches, {p.learner_steps:,} steps |")
    for url, actor_history in sorted(view.actors.items()):
        if actor_history:
            a = actor_history[-1]
            state = (f"in {a.in_call}() for {a.blocked_for_s:.1f} s" if a.in_call
                     else f"waiting on the {a.waiting_on} for {a.waiting_for_s:.1f} s"
                     if a.waiting_on else "stepping")
            rows.append(f"| {_md(url)} | actor | {a.pid} | {_md(a.name)} | {state} | "
                        f"{a.steps_total:,} steps |")
    if not rows:
        return ["## Probes", "", "None: the verdict is from the Reverb server alone.", ""]
    return ["## Probes", "", "| probe | role | pid | name | state | progress |",
            "| --- | --- | ---: | --- | --- | --- |", *rows, ""]


def blocked_stack(stacks: dict[str, Any] | None) -> tuple[str, dict[str, Any]] | None:
    """The place and the stack group most likely blocked: a thread inside an iterator's
    next(), else one inside a writer call, else the main thread; never a probe's own server
    thread (it is there in every dump, waiting for the next request)."""
    best: tuple[int, str, dict[str, Any]] | None = None
    for where, doc in sorted((stacks or {}).items()):
        for group in (doc or {}).get("stacks") or []:
            names = group.get("threads") or []
            if names and all(str(n).startswith("replaywatch-") for n in names):
                continue
            score = _blocked_score(group.get("frames") or [], names)
            if best is None or score > best[0]:
                best = (score, where, group)
    return (best[1], best[2]) if best is not None else None


def _blocked_score(frames: Sequence[dict[str, Any]], threads: Sequence[str]) -> int:
    functions = {str(f.get("function") or f.get("name") or "") for f in frames}
    if functions & _IN_NEXT:
        return 3
    if functions & _WRITER_CALLS:
        return 2
    return 1 if "MainThread" in threads else 0


TEXT_LINES = 60  # of each worker's py-spy text: its threads' innermost frames come first


def _stack(stacks: dict[str, Any] | None) -> list[str]:
    picked = blocked_stack(stacks)
    texts = [(where, str(doc["text"])) for where, doc in sorted((stacks or {}).items())
             if isinstance(doc, dict) and isinstance(doc.get("text"), str)]
    if picked is None and texts:  # py-spy's text (an RLlib worker's, by its dashboard)
        out = ["## The blocked thread", ""]
        for where, said in texts:
            lines = said.strip().splitlines()
            out += [f"From `{_md(where)}` (py-spy's text, {len(lines)} lines):", "", "```text",
                    *lines[:TEXT_LINES], *(["..."] if len(lines) > TEXT_LINES else []),
                    "```", ""]
        return out
    if picked is None:
        return ["## The blocked thread", "", "No stacks in this bundle (see Missing).", ""]
    where, group = picked
    frames = group.get("frames") or []
    text = [f"{f.get('file') or f.get('filename')}:{f.get('line')} "
            f"in {f.get('function') or f.get('name')}" for f in frames]
    names = ", ".join(group.get("threads") or [])
    return ["## The blocked thread", "",
            f"From `{_md(where)}`: {group.get('count', 1)} thread(s) with this stack "
            f"({_md(names)}), innermost frame last.", "", "```text", *text, "```", ""]


def _missing(d: dict[str, Any]) -> list[str]:
    missing = d.get("missing") or []
    dropped = d.get("dropped") or {}
    if not missing and not dropped:
        return ["## Missing from the evidence", "", "Nothing.", ""]
    out = ["## Missing from the evidence", ""]
    out += [f"- {_md(m.get('what'))}: {_md(m.get('why'))}" for m in missing]
    if dropped:
        out.append(f"- dropped to fit the bundle: {_md(dropped)}")
    return [*out, ""]


def _num(value: float) -> str:
    if abs(value) >= 1e300:
        return "inf" if value > 0 else "-inf"
    if value == int(value) and abs(value) < 1e15:
        return f"{int(value):,}"
    return f"{value:,.4g}"


def _yes(flag: bool) -> str:
    return "yes" if flag else "**no**"


def _md(value: Any) -> str:
    """Text safe in a Markdown table cell: pipes escaped, one line."""
    return str(value).replace("|", "\\|").replace("\n", " ")


def _utc(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at))
