"""The incident bundle: one self-describing file with everything one verdict was made from.

When a job hangs at 3 a.m. the person who debugs it is often not the one who was paged, and
by then the job has been restarted. A bundle keeps the evidence: the diagnosis's own inputs
for one target at one cycle (the view of every table's and probe's snapshots, an RLlib job's
snapshots, the clock, the thresholds, the declared layout, the loop-dump verdicts, the findings
open before the cycle) and what the sidecar said from them, with the stacks, the incidents'
transitions, and a list of anything missing or dropped with the reason, so a gap is never
silent.

    inputs = Inputs(view, now, thresholds, layout, stacks, active_before, held)
    doc = build(inputs, live_findings, about)        # plain data; pure
    text = fit(doc, MAX_BYTES)                       # JSON, trimmed (and saying so) if over
    bundle = parse(text, "file.json")               # back: Inputs and the live verdict
    findings = verdict(bundle.inputs)                # the same verdict, offline

`verdict` replays the cycle: the pure diagnosis over the view, then the same reconcile the
findings keeper ran against the findings open before it, so since/last_seen come out as the
sidecar had them. Writing the file is bundle_store's business.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from replaywatch import codec
from replaywatch.diagnosis.cycle import Inputs, judge_cycle
from replaywatch.diagnosis.stacks import StackVerdict
from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.diagnosis.window import TargetView
from replaywatch.errors import ConfigError
from replaywatch.model import Finding, Name, Severity
from replaywatch.ray_model import RaySnapshot

FORMAT = "replaywatch-bundle"
FORMAT_VERSION = 1
MAX_BYTES = 5_000_000
# A thread's identity, not its stack: two threads parked in the same frames are one entry.
_THREAD_IDENTITY = ("ident", "name", "daemon", "thread_id", "thread_name", "os_thread_id",
                    "active", "owns_gil", "idle")


class BundleError(ConfigError):
    """A file that is not a bundle this replaywatch can read (one line, exit 2)."""


@dataclasses.dataclass(frozen=True)
class Bundle:
    doc: dict[str, Any]  # the file as written
    inputs: Inputs
    live: dict[str, Any]  # the verdict the sidecar gave (verdict_document)

    @property
    def trimmed(self) -> bool:
        return bool(self.doc.get("dropped"))


def verdict(inputs: Inputs, thresholds: Thresholds | None = None) -> tuple[Finding, ...]:
    """The cycle replayed: the findings the sidecar had for the target after it, worst
    first; under `thresholds` instead of the bundle's, what it would have had."""
    return judged(inputs, thresholds)[0]


def judged(inputs: Inputs, thresholds: Thresholds | None = None
           ) -> tuple[tuple[Finding, ...], tuple[str, ...]]:
    """`verdict`, and the rules that raised while replaying it (their findings missing): the
    cycle judged by `judge_cycle`, as the live sidecar judged it."""
    target = inputs.view.target
    v = judge_cycle({target: inputs}, {f.key: f for f in inputs.active_before}, inputs.now,
                    thresholds)
    return v.of(target), tuple(e.removeprefix(f"{target}: ") for e in v.rule_errors)


def verdict_document(target: str, now: float, findings: Iterable[Finding]) -> dict[str, Any]:
    """The verdict as `analyze --json` prints it and the bundle keeps it."""
    return codec.encode({"target": target, "at": now,
                         "findings": [f.to_document() for f in findings]})


def dumps_verdict(doc: Mapping[str, Any]) -> str:
    """The one text of a verdict: equal verdicts are equal bytes."""
    return json.dumps(codec.encode(doc), indent=2, sort_keys=True) + "\n"


def finding_from_document(doc: Mapping[str, Any]) -> Finding:
    try:
        return Finding(kind=Name(str(doc["kind"])), severity=Severity[str(doc["severity"]).upper()],
                       target=str(doc["target"]), table=str(doc["table"]),
                       summary=str(doc["summary"]), evidence=dict(doc["evidence"]),
                       fix=str(doc["fix"]), since=float(doc["since"]),
                       last_seen=float(doc["last_seen"]),
                       resolved_at=(None if doc.get("resolved_at") is None
                                    else float(doc["resolved_at"])))
    except (KeyError, TypeError, ValueError) as e:
        raise codec.DecodeError(f"a finding without its {e}") from None


# -- building ---------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class About:
    """Who wrote the bundle, when and why, and with what settings: data, not I/O."""

    reason: str  # "opened critical <finding id>" or "on demand"
    written_at: float  # wall clock
    host: str
    sidecar_pid: int
    replaywatch_version: str
    config: dict[str, Any]  # the sidecar's poll settings, trainer pid, layout
    incident: dict[str, Any] | None = None  # the incident with its transitions, if one
    stacks: dict[str, Any] | None = None  # where -> the document taken there
    missing: tuple[dict[str, Any], ...] = ()  # {"what", "why"}: evidence that is not here


def build(inputs: Inputs, live: Sequence[Finding], about: About) -> dict[str, Any]:
    """The bundle document (plain data)."""
    view = inputs.view
    stacks, stack_missing = dedupe_stacks(about.stacks)
    return codec.encode({
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "replaywatch_version": about.replaywatch_version,
        "reason": about.reason,
        "written_at": about.written_at,
        "host": about.host,
        "sidecar_pid": about.sidecar_pid,
        "target": view.target,
        "probes": sorted({*view.probe_polls, *view.probes, *view.actors}),
        "pids": pids(view),
        "config": about.config,
        "thresholds": inputs.thresholds,
        "inputs": {
            "now": inputs.now,
            "layout": inputs.layout,
            "view": view,
            "stacks": inputs.stacks,
            "active_before": [f.to_document() for f in inputs.active_before],
            "held": [f.to_document() for f in inputs.held],
            # An RLlib job's snapshots over the look-back: what its rules judged
            "ray": inputs.ray,
        },
        "verdict": verdict_document(view.target, inputs.now, live),
        "incident": about.incident,
        "stacks": stacks,
        "missing": [*about.missing, *stack_missing, *missing_sources(view)],
        "dropped": {},
    })


def pids(view: TargetView) -> dict[str, int]:
    """Each probe's process, from its newest document."""
    out = {url: h[-1].pid for url, h in view.probes.items() if h}
    out.update({url: h[-1].pid for url, h in view.actors.items() if h})
    return out


def missing_sources(view: TargetView) -> list[dict[str, Any]]:
    """Sources whose last poll failed: their data stops where their outage began."""
    out = []
    for what, polls in [(f"reverb {view.target}", view.polls),
                        *((f"probe {url}", p) for url, p in sorted(view.probe_polls.items()))]:
        failed = 0
        for poll in reversed(polls):
            if poll.ok:
                break
            failed += 1
        if failed:
            out.append({"what": what, "why": polls[-1].error or "failed",
                        "failed_polls": failed, "since": polls[-failed].at})
    return out


def dedupe_stacks(taken: Mapping[str, Any] | None
                  ) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """Each place's threads grouped by identical stacks, with their count and names; a
    failed dump becomes a `missing` entry with its error."""
    if taken is None:
        return None, [{"what": "stacks", "why": "none taken: no trainer probe to ask and no "
                       "--trainer-pid to dump, or the finding is not critical"}]
    out: dict[str, Any] = {}
    missing = []
    for where, doc in sorted(taken.items()):
        if not isinstance(doc, dict):
            missing.append({"what": f"stacks from {where}", "why": f"not a document: {doc!r}"})
            continue
        if "error" in doc:
            missing.append({"what": f"stacks from {where}", "why": str(doc["error"])})
            continue
        threads = doc.get("threads")
        if not isinstance(threads, list):
            out[where] = doc  # py-spy's text fallback: kept as it came
            continue
        groups: dict[str, dict[str, Any]] = {}
        for thread in threads:
            if not isinstance(thread, dict):
                continue
            stack = {k: v for k, v in thread.items() if k not in _THREAD_IDENTITY}
            key = json.dumps(codec.encode(stack), sort_keys=True)
            group = groups.setdefault(key, {**stack, "threads": [], "count": 0})
            group["threads"].append(str(thread.get("name", thread.get("thread_name", "?"))))
            group["count"] += 1
        out[where] = {**{k: v for k, v in doc.items() if k != "threads"},
                      "thread_count": len(threads),
                      "stacks": sorted(groups.values(), key=lambda g: -g["count"])}
    return out, missing


def fit(doc: dict[str, Any], max_bytes: int = MAX_BYTES) -> str:
    """The document as JSON within `max_bytes`: over it, the oldest coarse snapshots (the
    throughput baselines' look-back), then an RLlib job's oldest snapshots, then the stacks,
    then the oldest incident events are dropped, each counted in `dropped` with the reason;
    the verdict may then differ."""
    text = _dumps(doc)
    if len(text.encode()) <= max_bytes:
        return text
    doc = json.loads(text)
    dropped = doc["dropped"]
    view = doc["inputs"]["view"]
    for field in ("coarse_tables", "coarse_actors"):
        while len(_dumps(doc).encode()) > max_bytes and any(len(s) > 2 for s in
                                                           view[field].values()):
            for name, series in view[field].items():
                cut = len(series) // 2
                view[field][name] = series[cut:]
                dropped[field] = dropped.get(field, 0) + cut
    ray = doc["inputs"].get("ray") or []
    while len(_dumps(doc).encode()) > max_bytes and len(ray) > 2:
        cut = len(ray) // 2  # an RLlib job's oldest snapshots: its rhythm is learned from them
        del ray[:cut]
        dropped["ray"] = dropped.get("ray", 0) + cut
    if len(_dumps(doc).encode()) > max_bytes and doc.get("stacks"):
        dropped["stacks"] = len(doc["stacks"])
        doc["stacks"] = None
    events = (doc.get("incident") or {}).get("events") or []
    while len(_dumps(doc).encode()) > max_bytes and len(events) > 2:
        cut = len(events) // 2
        del events[1:1 + cut]  # the opening event stays, and the newest
        dropped["incident_events"] = dropped.get("incident_events", 0) + cut
    if dropped:
        dropped["reason"] = f"the bundle was over {max_bytes} bytes"
    text = _dumps(doc)
    if len(text.encode()) > max_bytes:
        raise ValueError(f"a bundle of {len(text.encode())} bytes after trimming "
                         f"(limit {max_bytes}): its view alone is too large")
    return text


def _dumps(doc: Mapping[str, Any]) -> str:
    return json.dumps(doc, sort_keys=True, separators=(",", ":")) + "\n"


# -- reading ----------------------------------------------------------------------------------

def parse(text: str | bytes, name: str) -> Bundle:
    """A bundle from its text; BundleError (one line) when it is not one this reads."""
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise BundleError(f"{name}: not JSON ({e})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise BundleError(f"{name}: not a replaywatch bundle (no \"format\": \"{FORMAT}\")")
    version = doc.get("format_version")
    if not isinstance(version, int) or version < 1:
        raise BundleError(f"{name}: format_version {version!r} is not a version")
    if version > FORMAT_VERSION:
        raise BundleError(f"{name}: bundle format {version} is newer than this replaywatch "
                          f"reads ({FORMAT_VERSION}); use replaywatch "
                          f"{doc.get('replaywatch_version', '?')} or later")
    try:
        raw = doc["inputs"]
        inputs = Inputs(
            view=codec.decode(TargetView, _upgraded_view(raw["view"]), "inputs.view"),
            now=float(raw["now"]),
            thresholds=codec.decode(Thresholds, doc["thresholds"], "thresholds"),
            layout=raw.get("layout"),
            stacks=codec.decode(dict[str, StackVerdict], raw.get("stacks") or {},
                                "inputs.stacks"),
            active_before=tuple(finding_from_document(f) for f in raw["active_before"]),
            held=tuple(finding_from_document(f) for f in raw.get("held", [])),
            ray=(None if raw.get("ray") is None else
                 codec.decode(tuple[RaySnapshot, ...], raw["ray"], "inputs.ray")))
        live = doc["verdict"]
        if not isinstance(live, dict) or not isinstance(live.get("findings"), list):
            raise codec.DecodeError("verdict: no findings list")
    except KeyError as e:
        raise BundleError(f"{name}: a bundle without {e}") from None
    except (codec.DecodeError, ConfigError, TypeError, ValueError) as e:
        raise BundleError(f"{name}: {e}") from None
    return Bundle(doc, inputs, live)


# A trainer probe's snapshot once carried its declared pipeline as fields of its own beside the
# read one (`pipeline`); bundles written then are read into today's shape (`declared`, `read`),
# so they replay to the verdict they were written with.
_FLATTENED = ("batch_size", "num_parallel_calls", "prefetch_size", "max_in_flight",
              "iterators_per_worker", "item_bytes", "batch_after_interleave", "cycle_length",
              "workers_per_iterator")


def _upgraded_view(view: Any) -> Any:
    probes = view.get("probes") if isinstance(view, dict) else None
    if not isinstance(probes, dict):
        return view
    return {**view, "probes": {url: [_upgraded_probe(s) for s in snaps]
                               if isinstance(snaps, list) else snaps
                               for url, snaps in probes.items()}}


def _upgraded_probe(snap: Any) -> Any:
    if not isinstance(snap, dict) or "declared" in snap:
        return snap
    old = dict(snap)
    declared = {k: old.pop(k) for k in _FLATTENED if k in old}
    read = old.pop("pipeline", None)
    return {**old, "declared": {**declared, "table": old.get("table")}, "read": read}


def read(path: str) -> Bundle:
    try:
        with open(path, "rb") as f:
            text = f.read()
    except OSError as e:
        raise BundleError(f"{path}: cannot read ({e.strerror or e})") from None
    return parse(text, path)
