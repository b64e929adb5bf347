"""make bench-batch-stats: what reading each batch's SampleInfo costs a learner step.

A real Reverb table of 20,000 items, `TrajectoryDataset.from_table_signature` batched by 256
and prefetched, a learner loop that takes a batch through a TrainerProbe and runs a fixed
step (a 256 x 1024 by 1024 x 1024 float32 product and its gradient-sized update, about the
cost of a small learner's update on CPU). Two trainer probes wrap the same iterator, one with
`batch_stats` on, one off; the loop takes its batch through each in turn, BLOCK steps at a
time, STEPS steps after WARMUP; the median step time of each and the overhead.

    python -m bench.batch_stats [--results bench/RESULTS.md]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

HEADING = "## What the batch statistics cost a learner step"
STEPS, WARMUP, BLOCK, BATCH = 2400, 50, 50, 256


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", type=Path, default=None)
    args = p.parse_args(argv)
    import numpy as np
    import reverb
    import tensorflow as tf

    from replaywatch.probe import TrainerProbe
    from replaywatch.probe.batch_stats import READ_EVERY_S, BatchStats

    signature = {"x": tf.TensorSpec([64], tf.float32)}
    server = reverb.Server([reverb.Table("replay", reverb.selectors.Prioritized(0.8),
                                         reverb.selectors.Fifo(), 20_000,
                                         reverb.rate_limiters.MinSize(1), signature=signature)],
                           port=None)
    client = reverb.Client(f"127.0.0.1:{server.port}")
    with client.trajectory_writer(num_keep_alive_refs=1) as writer:
        for i in range(20_000):
            writer.append({"x": np.full(64, i, np.float32)})
            writer.create_item("replay", 1.0 + i % 7, {"x": writer.history["x"][-1]})
    weights = np.random.default_rng(0).standard_normal((1024, 1024)).astype(np.float32)
    inputs = np.random.default_rng(1).standard_normal((BATCH, 1024)).astype(np.float32)
    # One dataset, two probes wrapping the same iterator, the loop switching between them
    # every BLOCK steps: both settings see the same pipeline, warm-up and machine; only the
    # statistics differ (separate runs differed by more than the cost measured).
    medians: dict[str, tuple[float, float]] = {}
    # First both off (the bench's own noise between two identical probes), then on and off.
    for label, same in (("both off", True), ("on against off", False)):
        source = iter(reverb.TrajectoryDataset.from_table_signature(
            server_address=f"127.0.0.1:{server.port}", table="replay",
            max_in_flight_samples_per_worker=2 * BATCH).batch(BATCH).prefetch(2))
        probes = {on: TrainerProbe(table="replay", batch_size=BATCH,
                                   batch_stats=on and not same) for on in (True, False)}
        wrapped = {on: p.wrap(source) for on, p in probes.items()}
        times: dict[bool, list[float]] = {True: [], False: []}
        for i in range(WARMUP + STEPS):
            on = (i // BLOCK) % 2 == 0
            t0 = time.perf_counter()
            next(wrapped[on])
            out = inputs @ weights
            weights -= 1e-6 * (inputs.T @ out)  # the update: a gradient-sized product
            probes[on].step()
            if i >= WARMUP:
                times[on].append(time.perf_counter() - t0)
        time.sleep(2 * READ_EVERY_S)
        if not same:
            stats = probes[True].snapshot()["batch_stats"]
            assert stats["batches"] > 0, "no batch was read"
            # By accounting, clear of the step's noise: the reading thread's own CPU per batch,
            # and what `offer` (on the learner's thread) takes, against the median step.
            thread_us = 1e6 * stats["cpu_seconds"] / stats["batches"]
            kept = [next(source) for _ in range(200)]
            offered = BatchStats()
            t0 = time.perf_counter()
            for batch in kept * 5:
                offered.offer(batch)
            offer_us = 1e6 * (time.perf_counter() - t0) / (5 * len(kept))
        medians[label] = (statistics.median(times[True]) * 1e3,
                          statistics.median(times[False]) * 1e3)
    server.stop()
    step_ms = medians["on against off"][1]
    rows = "".join(f"| {label} | {a:.2f} ms | {b:.2f} ms | {100 * (a - b) / b:+.2f}% |\n"
                   for label, (a, b) in medians.items())
    text = (f"{HEADING} ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})\n\n"
            f"`make bench-batch-stats` (bench/batch_stats.py): a real prioritized table of "
            f"20,000 items, batches of {BATCH} through the trainer probe, a fixed learner step "
            f"(two 256x1024x1024 float32 products, CPU); one iterator, the loop switching "
            f"between two probes every {BLOCK} steps, {STEPS} steps. First both probes without "
            "the statistics (the bench's own noise), then one with them.\n\n"
            "| probes | median step, first | median step, second | difference |\n"
            "| --- | ---: | ---: | ---: |\n" + rows
            + f"\nBy accounting: the reading thread's own CPU {thread_us:.1f} us a batch "
            f"({100 * thread_us / (1e3 * step_ms):.2f}% of the {step_ms:.2f} ms step, were it "
            f"all taken from the learner), and `offer` on the learner's thread {offer_us:.1f} "
            f"us a batch ({100 * offer_us / (1e3 * step_ms):.2f}%).\n")
    print(text, flush=True)
    if args.results:
        from bench.results_md import write_sections

        write_sections(args.results, [text])
    return 0


if __name__ == "__main__":
    sys.exit(main())
