"""A replay process as users write one, with its ReplayProbe handed the server: a Reverb
server made by `probe.server(...)` (its checkpointer from --dir, else Reverb's temporary
default), filled with --fill items of --item-kib incompressible bytes, and checkpointed
through `probe.checkpoint(client)` every --every-s seconds (or once, --checkpoint-once).

It prints one JSON line when its probe serves (before the server is made: a restore loads
meanwhile) and one when the server serves:
    {"event": "probe", "replay_probe": URL, "pid": PID}
    {"event": "serving", "reverb": "127.0.0.1:PORT", "replay_probe": URL, "size": N,
     "restore_s": S}
and one after each checkpoint call ({"event": "checkpoint", "path"|"error", "seconds"}).
Runs until killed.

`--cgroup DIR` joins a cgroup (v1 memory, as root) first; `--insert-rate R` goes on inserting
R items a second once the first checkpoint completed and `--go-file` exists (a bench sets the
group's limit in between), as actors go on writing while a replay checkpoints.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def say(record: dict) -> None:
    print(json.dumps(record), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--dir", default=None, help="the checkpointer's directory; none: Reverb's default")
    add("--every-s", type=float, default=None, help="checkpoint every this many seconds")
    add("--checkpoint-once", action="store_true", help="one checkpoint after the fill")
    add("--max-size", type=int, default=1000)
    add("--spi", type=float, default=None, help="SampleToInsertRatio's; none: MinSize(1)")
    add("--min-size", type=int, default=1)
    add("--error-buffer", type=float, default=100.0)
    add("--sampler", choices=("uniform", "prioritized"), default="uniform")
    add("--fill", type=int, default=0, help="items to insert once serving")
    add("--item-kib", type=int, default=1)
    add("--port", type=int, default=0, help="0: any free port")
    add("--probe-port", type=int, default=0, help="the ReplayProbe's; 0: any free port")
    add("--cgroup", default=None, help="a cgroup directory to join before anything loads")
    add("--insert-rate", type=float, default=0.0,
        help="items/s inserted after the first checkpoint (0: none)")
    add("--go-file", default=None, help="--insert-rate waits for this file to exist")
    add("--wait-file", default=None,
        help="make the server only once this file exists (a test places the process first)")
    args = parser.parse_args()
    if args.cgroup:
        with open(os.path.join(args.cgroup, "cgroup.procs"), "w") as procs:
            procs.write(str(os.getpid()))

    import numpy as np
    import reverb

    from replaywatch.probe import ReplayProbe

    probe = ReplayProbe(name="replay", listen=f"127.0.0.1:{args.probe_port}")
    probe.start()
    say({"event": "probe", "replay_probe": probe.url, "pid": os.getpid()})
    limiter = (reverb.rate_limiters.MinSize(args.min_size) if args.spi is None else
               reverb.rate_limiters.SampleToInsertRatio(args.spi, args.min_size,
                                                        args.error_buffer))
    sampler = (reverb.selectors.Uniform() if args.sampler == "uniform"
               else reverb.selectors.Prioritized(0.6))
    table = reverb.Table("replay", sampler=sampler, remover=reverb.selectors.Fifo(),
                         max_size=args.max_size, rate_limiter=limiter)
    checkpointer = (reverb.checkpointers.DefaultCheckpointer(path=args.dir) if args.dir
                    else None)
    while args.wait_file and not os.path.exists(args.wait_file):
        time.sleep(0.05)
    began = time.monotonic()
    server = probe.server([table], port=args.port or None, checkpointer=checkpointer,
                          checkpoint_every_s=args.every_s)
    restore_s = time.monotonic() - began
    address = f"127.0.0.1:{server.port}"
    client = reverb.Client(address)
    if args.fill:
        rng = np.random.default_rng(0)
        frame = rng.integers(0, 255, size=(args.item_kib << 10,), dtype=np.uint8)
        with client.trajectory_writer(1) as writer:
            for i in range(args.fill):
                # A different frame each item: a checkpoint compresses nothing away
                writer.append({"x": np.roll(frame, i)})
                writer.create_item("replay", 1.0, {"x": writer.history["x"][-1:]})
                if i % 32 == 0:
                    writer.flush()
    say({"event": "serving", "reverb": address, "replay_probe": probe.url,
         "size": client.server_info(timeout=10)["replay"].current_size,
         "restore_s": round(restore_s, 3)})
    once = args.checkpoint_once
    inserting = None
    while True:
        if once or args.every_s:
            t0 = time.monotonic()
            try:
                say({"event": "checkpoint", "path": probe.checkpoint(client),
                     "seconds": round(time.monotonic() - t0, 3)})
            except Exception as e:  # kept by the probe; the loop goes on, as a node's would
                say({"event": "checkpoint", "error": f"{type(e).__name__}: {e}"[:300],
                     "seconds": round(time.monotonic() - t0, 3)})
            once = False
        if args.insert_rate and inserting is None:
            inserting = threading.Thread(target=insert_steadily, daemon=True,
                                         args=(address, args, args.fill))
            inserting.start()
        time.sleep(args.every_s or 3600)


def insert_steadily(address: str, args: argparse.Namespace, done: int) -> None:
    """Items of --item-kib at --insert-rate a second, each its own frame, until killed."""
    import numpy as np
    import reverb

    while args.go_file and not os.path.exists(args.go_file):
        time.sleep(0.05)
    frame = np.random.default_rng(1).integers(0, 255, size=(args.item_kib << 10,),
                                              dtype=np.uint8)
    began, i = time.monotonic(), 0
    with reverb.Client(address).trajectory_writer(1) as writer:
        while True:
            writer.append({"x": np.roll(frame, done + i)})
            writer.create_item("replay", 1.0, {"x": writer.history["x"][-1:]})
            writer.flush()
            i += 1
            time.sleep(max(0.0, began + i / args.insert_rate - time.monotonic()))


if __name__ == "__main__":
    main()
