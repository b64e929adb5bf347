"""A small real Reverb workload for tests and bench: a server plus insert and sample loops.

Run as a subprocess so tests can kill it, freeze it (SIGSTOP) and restart it on
the same port. Prints one JSON line {"reverb": ADDR, "pid": PID} when serving, with "probe":
URL under `--actor-probe` (an ActorProbe in this process around its writers, as a sync loop's
probe shares the process with its server).

    python harness/reverb_workload.py --port 0 --tables 1 --insert-hz 50
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

import numpy as np
import reverb

from replaywatch.probe import ActorProbe


def make_table(name: str, spi: float, min_size: int, error_buffer: float, max_size: int
               ) -> reverb.Table:
    limiter = reverb.rate_limiters.SampleToInsertRatio(
        samples_per_insert=spi, min_size_to_sample=min_size, error_buffer=error_buffer)
    return reverb.Table(name=name, sampler=reverb.selectors.Uniform(),
                        remover=reverb.selectors.Fifo(), max_size=max_size, rate_limiter=limiter)


def insert_loop(client: reverb.Client, table: str, hz: float, stop: threading.Event,
                probe: ActorProbe | None = None) -> None:
    with client.trajectory_writer(num_keep_alive_refs=1) as plain:
        writer = probe.wrap_writer(plain) if probe else plain
        step = 0
        while not stop.is_set():
            if probe:
                probe.step()
            writer.append({"x": np.full((4,), step, np.float32)})
            writer.create_item(table, priority=1.0, trajectory={"x": writer.history["x"][-1]})
            writer.flush(block_until_num_items=8, timeout_ms=1000) if step % 8 == 0 else None
            step += 1
            if hz > 0:
                time.sleep(1.0 / hz)


def sample_loop(client: reverb.Client, table: str, hz: float, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            for _ in client.sample(table, num_samples=1):
                pass
        except Exception:
            time.sleep(0.05)
        if hz > 0:
            time.sleep(1.0 / hz)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--tables", type=int, default=1)
    p.add_argument("--spi", type=float, default=1.0)
    p.add_argument("--min-size", type=int, default=10)
    p.add_argument("--error-buffer", type=float, default=50.0)
    p.add_argument("--max-size", type=int, default=10000)
    p.add_argument("--insert-hz", type=float, default=50.0)
    p.add_argument("--sample-hz", type=float, default=0.0, help="0: as fast as the limiter allows")
    p.add_argument("--no-load", action="store_true", help="serve the tables, insert nothing")
    p.add_argument("--actor-probe", action="store_true",
                   help="an ActorProbe around the first table's writer, served from here")
    p.add_argument("--servers", type=int, default=1,
                   help="independent Reverb servers in this process (ports from --port up, "
                        "or any); load runs on the first only")
    args = p.parse_args()
    servers = []
    for n in range(args.servers):
        tables = [make_table(f"table_{i}", args.spi, args.min_size, args.error_buffer,
                             args.max_size) for i in range(args.tables)]
        servers.append((reverb.Server(tables=tables, port=(args.port + n) if args.port else
                                      None), tables))
    server, tables = servers[0]
    address = f"127.0.0.1:{server.port}"
    # The start line goes out in one write before the load threads start: their C++ log
    # lines share the file with stdout and could otherwise land inside it.
    probe = ActorProbe(table=tables[0].name, name="loop") if args.actor_probe else None
    started = {"probe": f"http://127.0.0.1:{probe.start()}"} if probe else {}
    sys.stdout.write(json.dumps({"reverb": address, "pid": os.getpid(), **started,
                                 "all": [f"127.0.0.1:{s.port}" for s, _ in servers]}) + "\n")
    sys.stdout.flush()
    stop = threading.Event()
    if not args.no_load:
        client = reverb.Client(address)
        for i, t in enumerate(tables):
            threading.Thread(target=insert_loop, daemon=True, args=(
                client, t.name, args.insert_hz, stop, probe if i == 0 else None)).start()
            threading.Thread(target=sample_loop, args=(client, t.name, args.sample_hz, stop),
                             daemon=True).start()
    try:
        server.wait()
    except KeyboardInterrupt:
        stop.set()
        sys.exit(0)


if __name__ == "__main__":
    main()
