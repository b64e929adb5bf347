"""A Reverb server inside a memory cgroup, filled with frame-sized items by a real writer.

    python harness/memory_hog.py --cgroup /sys/fs/cgroup/memory/X --max-size 30000 \
        --rate 50

It joins the cgroup before anything big is loaded (its own pid into cgroup.procs), starts a
server with one table (`max_size`, MinSize(1), FIFO), prints {"reverb": ADDR, "pid": PID},
then inserts 84x84x9 random uint8 frames (63,504 bytes, incompressible, as camera frames are
to zstd) at `--rate` items a second until the table is full (then keeps inserting: FIFO
evicts) or the kernel kills it.

    python harness/memory_hog.py --max-size 500 --rate 20 --keep-episode --actor-probe

`--keep-episode`: the writer is made with num_keep_alive_refs 1,000,000 and never ends its
episode (a continuing task), so the server keeps every chunk alive with its table full: a
leak. `--actor-probe`: the writer is made through an ActorProbe's wrapped client, whose URL
is printed as "actor_probe". `--replay-probe`: a ReplayProbe serves the process's memory,
its URL printed as "replay_probe".

    python harness/memory_hog.py --cgroup /sys/fs/cgroup/memory/X --max-size 40000 --serve-only
    python harness/memory_hog.py --write-to 127.0.0.1:PORT --rate 100

As a real job runs: the server alone in its cgroup (`--serve-only`: no writer), its frames
inserted by an actor in a process of its own (`--write-to`: no server), which pays its own
client's memory and starts when it is ready, not when the server does.
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
    p.add_argument("--max-size", type=int, default=None)
    p.add_argument("--rate", type=float, default=None)
    p.add_argument("--serve-only", action="store_true")
    p.add_argument("--write-to", default=None)
    p.add_argument("--keep-episode", action="store_true")
    p.add_argument("--actor-probe", action="store_true")
    p.add_argument("--replay-probe", action="store_true")
    args = p.parse_args()
    if args.max_size is None and args.write_to is None:
        p.error("--max-size is needed for a server")
    if args.rate is None and not args.serve_only:
        p.error("--rate is needed for a writer")
    if args.cgroup is not None:
        (args.cgroup / "cgroup.procs").write_text(f"{os.getpid()}\n")
    import numpy as np
    import reverb

    if args.write_to is not None:
        address = args.write_to
        start: dict[str, object] = {"writer": address, "pid": os.getpid()}
    else:
        server = reverb.Server([reverb.Table(
            "replay", reverb.selectors.Uniform(), reverb.selectors.Fifo(), args.max_size,
            reverb.rate_limiters.MinSize(1))], port=None)
        address = f"127.0.0.1:{server.port}"
        start = {"reverb": address, "pid": os.getpid()}
    client = reverb.Client(address)
    probe = None
    if args.replay_probe:
        from replaywatch.probe import ReplayProbe

        replay = ReplayProbe()
        replay.start()
        start["replay_probe"] = replay.url
    if args.actor_probe:
        from replaywatch.probe import ActorProbe

        probe = ActorProbe(table="replay", name="actor-0")
        probe.start()
        client = probe.wrap_client(client)
        start["actor_probe"] = probe.url
    print(json.dumps(start), flush=True)
    if args.serve_only:
        server.wait()
        return
    rng = np.random.default_rng(0)
    frames = [rng.integers(0, 256, (84, 84, 9), np.uint8) for _ in range(64)]
    started, n = time.monotonic(), 0
    keep = 1_000_000 if args.keep_episode else 1
    with client.trajectory_writer(num_keep_alive_refs=keep) as writer:
        while True:
            # Each item its own bytes: a frame with a counter written in, so no two chunks
            # are alike and none is shared.
            frame = frames[n % len(frames)].copy()
            frame.flat[:8] = np.frombuffer(n.to_bytes(8, "little"), np.uint8)
            writer.append({"x": frame})
            writer.create_item("replay", 1.0, {"x": writer.history["x"][-1]})
            writer.flush()
            if probe is not None:
                probe.step()
            n += 1
            ahead = started + n / args.rate - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)
            if n % 500 == 0:
                print(json.dumps({"inserted": n, "s": round(time.monotonic() - started, 1)}),
                      file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
