"""CPU cost of rendering /metrics for one 50 targets x 5 tables picture.

The poller renders the body once per cycle while holding the GIL, so every
millisecond here is a millisecond a scrape can wait. Times, in one process and
interleaved (so machine load hits both alike), the median thread CPU time of:

  - before: `render(make_registry(...))` as it was before `render_published`,
    read from git: prometheus_client family objects, a Sample namedtuple and a
    labels dict per sample, walked again to write the text;
  - families: today's `render` of a registry it did not build (the same walk over
    the collector, which is now built from the declarations);
  - after: `render_published`, text written straight from the picture.

    python -m bench.render_cost [--targets 50] [--tables 5] [--runs 20]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client.registry import CollectorRegistry

from bench.from_git import module_at
from replaywatch.diagnosis.figures import TableFigures
from replaywatch.diagnosis.ratelimiter import derive
from replaywatch.metrics import ReplaywatchCollector, render, render_published
from replaywatch.model import ActorSnapshot, ProbeSnapshot, TableSnapshot
from replaywatch.probe import ActorProbe, TrainerProbe
from replaywatch.sources.probe_http import actor_from_probe, snapshot_from_probe
from replaywatch.sources.reverb import snapshots_from_response
from replaywatch.state import Published, SourceStatus

RECORDED_100 = Path(__file__).resolve().parents[1] / "tests/fixtures/server_info_100tables.bin"


def picture(targets: int, tables: int, actors: int = 2) -> Published:
    """Each target: a Reverb server with `tables` tables, one trainer and `actors` actors.

    Made of what the sidecar itself reads, not of hand-filled fields: tables decoded from
    a recorded ServerInfo answer (tables beyond its 100 repeat), the trainer's and actors'
    documents from a real (never started) TrainerProbe and ActorProbe after some steps,
    each parsed as the probe source parses a document.
    """
    recorded = snapshots_from_response(RECORDED_100.read_bytes(), "recorded", 0.0)
    trainer = TrainerProbe(batch_size=256, num_parallel_calls=12)
    for _ in range(3):
        trainer.step()
    actor = ActorProbe(table="replay_0")
    for _ in range(40):
        actor.step()
    sources: dict[str, SourceStatus] = {}
    snaps: dict[tuple[str, str], TableSnapshot] = {}
    probes: dict[str, ProbeSnapshot] = {}
    actor_docs: dict[str, ActorSnapshot] = {}
    for t in range(targets):
        target = f"reverb-{t}.ns.svc:8000"
        sources[target] = SourceStatus(target, "reverb", target, True, 2.0, 2.0, None, 0.003,
                                       0, 3 + t, 0, 0)
        for n in range(tables):
            snap = recorded[(t * tables + n) % len(recorded)]
            snaps[(target, f"replay_{n}")] = dataclasses.replace(
                snap, target=target, name=f"replay_{n}", observed_at=2.0)
        urls = [f"http://learner-{t}:9090"] + [f"http://actor-{t}-{a}:9090" for a in range(actors)]
        for url in urls:
            sources[url] = SourceStatus(url, "probe", target, True, 2.0, 2.0, None, 0.002, 0, 3,
                                        0, 0)
        probes[urls[0]] = snapshot_from_probe(trainer.snapshot(), urls[0], 2.0)
        for url in urls[1:]:
            actor_docs[url] = actor_from_probe(actor.snapshot(), url, 2.0)
    return Published(at=2.0, cycle=3, sources=sources, tables=snaps,
                     figures={k: TableFigures(*k, derive([v])) for k, v in snaps.items()},
                     probes=probes,
                     actors=actor_docs, cycle_duration_s=0.131)


# metrics.py and its probe families' module (then metrics_actors.py) at the commit before the
# families were declared, the baseline this bench compares against.
BEFORE = "cc884f7"


def _old_render() -> Callable[[Any], bytes] | None:
    """The old `render(make_registry(...))`, or None where git or its history is missing."""
    actors = module_at(f"{BEFORE}:replaywatch/metrics_actors.py", "old_metrics_actors")
    if actors is None:
        return None
    current = sys.modules.get("replaywatch.metrics_actors")
    sys.modules["replaywatch.metrics_actors"] = actors  # what the old metrics.py imports
    try:
        old = module_at(f"{BEFORE}:replaywatch/metrics.py", "old_metrics")
    finally:
        if current is None:
            del sys.modules["replaywatch.metrics_actors"]
        else:
            sys.modules["replaywatch.metrics_actors"] = current
    if old is None:
        return None
    return lambda state: old.render(old.make_registry(lambda: state))  # type: ignore[no-any-return]


@dataclasses.dataclass(frozen=True)
class _AsBefore:
    """The picture as the old renderer read it: the limiter's figures as a map of their own
    (`Published.derived`, before diagnosis/figures.py's one record per table)."""

    state: Published

    @functools.cached_property
    def derived(self) -> dict:
        return {k: f.derived for k, f in self.state.figures.items() if f.derived is not None}

    def __getattr__(self, name: str) -> object:
        return getattr(self.state, name)


def cpu_ms(fn: Callable[[], bytes]) -> float:
    start = time.thread_time()
    fn()
    return 1000 * (time.thread_time() - start)


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", type=int, default=50)
    parser.add_argument("--tables", type=int, default=5)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args(argv)
    state = picture(args.targets, args.tables)
    # A plain registry holding our collector: render() walks its family objects.
    families = CollectorRegistry(auto_describe=False)
    families.register(ReplaywatchCollector(lambda: state))  # type: ignore[arg-type]
    old = _old_render()
    before = _AsBefore(state)
    body = render_published(state)
    assert render(families) == body, "the two renderers disagree"
    # The old renderer knows fewer families (throughput baselines and bundle counters came
    # later): every line it writes must be ours, byte for byte.
    assert old is None or set(old(before).splitlines()) <= set(body.splitlines()), \
        "the old renderer disagrees"
    times: dict[str, list[float]] = {"before": [], "families": [], "after": []}
    for _ in range(args.runs):  # interleaved: load on the machine hits all three alike
        if old is not None:
            times["before"].append(cpu_ms(lambda: old(before)))
        times["families"].append(cpu_ms(lambda: render(families)))
        times["after"].append(cpu_ms(lambda: render_published(state)))
    result = {f"{k}_ms": statistics.median(v) for k, v in times.items() if v}
    result["samples"] = float(sum(1 for line in body.splitlines() if not line.startswith(b"#")))
    base = result.get("before_ms", result["families_ms"])
    result["speedup"] = base / result["after_ms"]
    print(f"/metrics render, {args.targets} targets x {args.tables} tables, "
          f"{result['samples']:.0f} samples, {len(body)} bytes; median thread CPU of {args.runs}:")
    if old is None:
        print(f"  before ({BEFORE}): not measured, git or its history is missing here")
    else:
        print(f"  before ({BEFORE}, render(make_registry)): {result['before_ms']:.1f} ms")
    print(f"  family objects (render of a foreign registry): {result['families_ms']:.1f} ms")
    print(f"  after (render_published): {result['after_ms']:.1f} ms "
          f"({result['speedup']:.1f}x faster than {'before' if old else 'family objects'})")
    return result

if __name__ == "__main__":
    main()
