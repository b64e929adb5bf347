"""Benchmark: what TrainerProbe adds to each `next()` of the learner's iterator.

Times a tight loop over a plain Python iterator with and without the probe's
wrapper (the wrapper's cost does not depend on what the iterator yields), with
the probe's HTTP server running and, in a second pass, answering /probe
requests from another thread at 10 Hz. Prints microseconds per `next()` and
the share of a learner step (given, or measured from the agents/ learner).

    python -m bench.probe_cost [--iterations 200000] [--learner-step-ms 5.0]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import threading
import time

from replaywatch.probe import TrainerProbe
from replaywatch.sources.probe_http import HttpProbeSource


def per_call_us(make_iter, iterations: int, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        it = make_iter()
        start = time.perf_counter()
        for _ in itertools.islice(it, iterations):
            pass
        out.append((time.perf_counter() - start) / iterations * 1e6)
    return out


def scrape_loop(url: str, stop: threading.Event, hz: float) -> None:
    source = HttpProbeSource(url, timeout_s=2.0)  # as the sidecar polls: one kept-alive socket
    while not stop.wait(1.0 / hz):
        source.poll()
    source.close()


def measure(iterations: int, repeats: int, scrape_hz: float) -> dict[str, float]:
    probe = TrainerProbe(batch_size=256, num_parallel_calls=12)
    probe.start()
    stop = threading.Event()
    scraper = None
    if scrape_hz > 0:
        scraper = threading.Thread(target=scrape_loop, args=(probe.url, stop, scrape_hz),
                                   daemon=True)
        scraper.start()
    try:
        bare = per_call_us(lambda: itertools.repeat(0), iterations, repeats)
        wrapped = per_call_us(lambda: probe.wrap(itertools.repeat(0)), iterations, repeats)
    finally:
        stop.set()
        probe.stop()
    return {"bare_us": statistics.median(bare), "wrapped_us": statistics.median(wrapped),
            "overhead_us": statistics.median(wrapped) - statistics.median(bare),
            "spread_us": max(wrapped) - min(wrapped)}


def main() -> list[dict[str, float]]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iterations", type=int, default=200_000)
    p.add_argument("--repeats", type=int, default=5)
    # agents/README.md: the jitted update takes ~6.8 ms and sampling ~4.2 ms per step here;
    # make bench passes the step time bench.trainer_cost measured in the same session.
    p.add_argument("--learner-step-ms", type=float, default=11.0,
                   help="learner step time to compare against (default 11 ms)")
    args = p.parse_args()
    step_ms = args.learner_step_ms
    rows = []
    print(f"{'probe HTTP load':<18}{'bare next() us':>16}{'with probe us':>15}"
          f"{'overhead us':>13}{'of a learner step':>19}")
    for hz in (0.0, 10.0):
        r = measure(args.iterations, args.repeats, hz)
        share = r["overhead_us"] / (step_ms * 1000) * 100
        r.update(scrape_hz=hz, learner_step_ms=step_ms, share_pct=share)
        rows.append(r)
        print(f"{('none' if hz == 0 else f'{hz:g} Hz /probe'):<18}{r['bare_us']:>16.3f}"
              f"{r['wrapped_us']:>15.3f}{r['overhead_us']:>13.3f}{share:>18.4f}%")
    print(f"learner step: {step_ms:.2f} ms (agents/ TD3 on Pendulum, batch 256, CPU)")
    return rows


if __name__ == "__main__":
    main()
