"""A Reverb server inside a memory cgroup, filled with frame-sized items by a real writer.

    python harness/memory_hog.py --cgroup /sys/fs/cgroup/memory/X --max-size 30000 \
        --rate 50

It joins the cgroup before anything big is loaded (its own pid into cgroup.procs), starts a
server with one table (`max_size`, MinSize(1), FIFO), prints {"reverb": ADDR, "pid": PID},
then inserts 84x84x9 random uint8 frames (63,504 bytes, incompressible, as camera frames are
to zstd) at `--rate` items a second until the table is full (then keeps inserting: FIFO
evicts) or the kernel kills it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cgroup", type=Path, default=None)
    p.add_argument("--max-size", type=int, required=True)
    p.add_argument("--rate", type=float, required=True)
    args = p.parse_args()
    if args.cgroup is not None:
        (args.cgroup / "cgroup.procs").write_text(f"{os.getpid()}\n")
    import numpy as np
    import reverb

    server = reverb.Server([reverb.Table(
        "replay", reverb.selectors.Uniform(), reverb.selectors.Fifo(), args.max_size,
        reverb.rate_limiters.MinSize(1))], port=None)
    client = reverb.Client(f"127.0.0.1:{server.port}")
    print(json.dumps({"reverb": f"127.0.0.1:{server.port}", "pid": os.getpid()}), flush=True)
    rng = np.random.default_rng(0)
    frames = [rng.integers(0, 256, (84, 84, 9), np.uint8) for _ in range(64)]
    started, n = time.monotonic(), 0
    with client.trajectory_writer(num_keep_alive_refs=1) as writer:
        while True:
            # Each item its own bytes: a frame with a counter written in, so no two chunks
            # are alike and none is shared.
            frame = frames[n % len(frames)].copy()
            frame.flat[:8] = np.frombuffer(n.to_bytes(8, "little"), np.uint8)
            writer.append({"x": frame})
            writer.create_item("replay", 1.0, {"x": writer.history["x"][-1]})
            writer.flush()
            n += 1
            ahead = started + n / args.rate - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)
            if n % 500 == 0:
                print(json.dumps({"inserted": n, "s": round(time.monotonic() - started, 1)}),
                      file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
