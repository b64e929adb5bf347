"""make bench-waste: wasted_experience against real runs, and whether its fixes hold.

Each shape (harness/replay_waste.py) runs on a real Reverb table polled every 0.5 s as the
sidecar polls it; the rule judges the whole run (spi_window_s lowered to WINDOW_S, as the
runs last seconds, not minutes). The measured share of items evicted never sampled is set
beside the arithmetic's (diagnosis/waste.py: e^-s, or with the true burst when the shape
has one), the verdict, the fix it printed, and the share when the same shape runs again
with that fix applied as printed. A fix holds when the run with it is under half and is not
named. Families: collect/train loops, free-running actors, actors under a
SampleToInsertRatio limiter, a learner that pauses while actors insert, prioritized tables
(their priorities updated after each sample, as a learner's TD errors would).

    python -m bench.waste [--results bench/RESULTS.md] [--family NAME]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from harness.replay_waste import Run, Shape, run

HEADING = "## Wasted experience"
WINDOW_S = 2.0

S = Shape
SHAPES: tuple[Shape, ...] = (
    # collect/train: a burst of `burst` inserts, then spi x burst samples
    S("collect 400 into 100", "collect/train loops", 100, 1.0, burst=400, inserts=40_000),
    S("collect 1000 into 250, 2 per insert", "collect/train loops", 250, 2.0, burst=1000,
      inserts=40_000),
    S("collect 800 into 200, 0.5 per insert", "collect/train loops", 200, 0.5, burst=800,
      inserts=40_000),
    S("collect 200 into 500, 0.5 per insert", "collect/train loops", 500, 0.5, burst=200,
      inserts=40_000),
    S("collect 50 into 1000, 2 per insert", "collect/train loops", 1000, 2.0, burst=50,
      inserts=40_000),
    # actors at 2000 items/s, a learner sampling batches of 32 at spi x that
    S("actors, learner 0.4 per insert", "free-running actors", 500, 0.4, mode="actors",
      inserts=20_000),
    S("actors, learner 0.4 per insert, 4x the table", "free-running actors", 2000, 0.4,
      mode="actors", inserts=20_000),
    S("actors, learner 1.5 per insert", "free-running actors", 500, 1.5, mode="actors",
      inserts=20_000),
    # a SampleToInsertRatio limiter sets the ratio; actors up to 5000 items/s
    S("limiter at 0.5", "rate-limited actors", 300, 0.5, mode="actors", limiter_spi=0.5,
      insert_rate=5000.0, inserts=20_000),
    S("limiter at 0.5, error buffer 5000", "rate-limited actors", 300, 0.5, mode="actors",
      limiter_spi=0.5, error_buffer=5000.0, insert_rate=5000.0, inserts=20_000),
    S("limiter at 2", "rate-limited actors", 300, 2.0, mode="actors", limiter_spi=2.0,
      insert_rate=5000.0, inserts=20_000),
    # the learner pauses (an evaluation) while the actors go on
    S("pause 1 s of every 2, table 500", "learner pauses", 500, 1.0, mode="actors",
      pause_every_s=1.0, pause_s=1.0, inserts=30_000),
    S("pause 0.5 s of every 3, table 3000", "learner pauses", 3000, 1.0, mode="actors",
      pause_every_s=2.5, pause_s=0.5, inserts=30_000),
    # prioritized, priorities updated after each sample (lognormal TD errors)
    S("prioritized collect, 0.5 per insert", "prioritized tables", 500, 0.5,
      sampler="prioritized", inserts=20_000),
    S("prioritized collect 300 into 100", "prioritized tables", 100, 1.0, burst=300,
      sampler="prioritized", inserts=30_000),
    S("prioritized actors, 2 per insert", "prioritized tables", 500, 2.0, mode="actors",
      sampler="prioritized", inserts=20_000),
)


def judged(r: Run):  # type: ignore[no-untyped-def]
    from replaywatch.diagnosis import rules_health
    from replaywatch.diagnosis.thresholds import Thresholds
    from replaywatch.diagnosis.window import TargetView

    view = TargetView(target=r.snapshots[-1].target, polls=(), tables={"replay": r.snapshots},
                      probes={}, probe_polls={})
    return rules_health.is_wasted_experience(view, Thresholds(spi_window_s=WINDOW_S),
                                             r.snapshots[-1].observed_at)


def true_burst(shape: Shape) -> float:
    if shape.mode == "collect":
        return float(shape.burst)
    return shape.insert_rate * shape.pause_s if shape.pause_s else 1.0


def row(shape: Shape) -> dict:
    from replaywatch.diagnosis import waste as ws

    r = run(shape)
    f = judged(r)
    out = {"shape": shape, "share": r.share, "spi": r.spi,
           "model": ws.uniform_share(r.spi, shape.max_size, true_burst(shape)),
           "finding": f, "fix": None, "after": None}
    if f is not None:
        spi, size = f.evidence["fix_samples_per_insert"], f.evidence["fix_max_size"]
        out["fix"] = ", ".join(x for x in (
            f"max_size {size:,}" if size else "", f"samples_per_insert {spi:g}" if spi else "")
            if x)
        fixed = run(shape.with_fix(spi=spi, max_size=size), seed=1)
        out["after"] = (fixed.share, judged(fixed) is not None)
    return out


def render(rows: list[dict]) -> str:
    out = []
    for family in dict.fromkeys(r["shape"].family for r in rows):
        out.append(f"\n### {family}\n\n| shape | max_size | samples/insert | never sampled "
                   "| arithmetic | verdict | fix printed | never sampled with the fix |\n"
                   "| --- | ---: | ---: | ---: | ---: | --- | --- | --- |\n")
        for r in (r for r in rows if r["shape"].family == family):
            f = r["finding"]
            burst = f and f.evidence["burst"]
            verdict = ("—" if f is None else f"wasted (burst {burst:,})" if burst
                       else "wasted (ratio)")
            after = "" if r["after"] is None else (
                f"{r['after'][0]:.0%} " + ("(named again)" if r["after"][1] or r["after"][0]
                                          > 0.5 else "(holds)"))
            out.append(f"| {r['shape'].name} | {r['shape'].max_size:,} | {r['spi']:.2f} | "
                       f"{r['share']:.0%} | {r['model']:.0%} | {verdict} | {r['fix'] or ''} | "
                       f"{after} |\n")
    return "".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", type=Path, default=None)
    p.add_argument("--family", default=None)
    args = p.parse_args(argv)
    t0 = time.monotonic()
    rows = []
    for shape in SHAPES:
        if args.family and shape.family != args.family:
            continue
        rows.append(row(shape))
        r = rows[-1]
        print(f"{shape.name}: share {r['share']:.3f} spi {r['spi']:.2f} arithmetic "
              f"{r['model']:.3f} finding {r['finding'] is not None} fix {r['fix']} "
              f"after {r['after']}", flush=True)
    wrong = [r for r in rows if (r["finding"] is not None) != (r["share"] > 0.5)
             or (r["after"] is not None and (r["after"][1] or r["after"][0] > 0.5))]
    text = (f"{HEADING} ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
            f"{(time.monotonic() - t0) / 60:.1f} min)\n\n"
            "`make bench-waste` (bench/waste.py, harness/replay_waste.py): real Reverb tables "
            "(oldest-first remover) polled every 0.5 s as the sidecar polls them, each run to "
            "its last insert and judged over the stretch the table stayed full (`spi_window_s` "
            f"{WINDOW_S:g} s: runs of seconds). *Never sampled*: measured, 1 - unique samples "
            "/ inserts over that stretch; *arithmetic*: e^-s at the served ratio s, with the "
            "shape's true burst where it has one (diagnosis/waste.py). A fix is applied as "
            "printed and the shape run again; it holds when that run is under half and not "
            "named. For a learner that pauses, the arithmetic takes the pause's inserts as one "
            "burst and overstates: after a pause the learner catches up over the items the table "
            "kept. Wrong verdicts or fixes that did not hold: "
            f"{len(wrong)} of {len(rows)}.\n"
            + render(rows))
    print(text, flush=True)
    if args.results:
        from bench.results_md import write_sections

        write_sections(args.results, [text])
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
