"""Benchmark: what one ServerInfo call costs the Reverb server's host, by table count.

Times replaywatch's grpcio call (with decoding) and `reverb.Client.server_info`
against real servers of 1, 10 and 100 tables, what a dead server costs
each of them per poll, and the sidecar's own decode of a recorded 100-table
answer (tests/fixtures/server_info_100tables.bin: protobuf's parse alone, and
parse plus the snapshots the poller keeps).

    python -m bench.server_info_cost [--calls 200]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import reverb

from bench.from_git import module_at
from replaywatch.sources.reverb import ReverbSource, snapshots_from_response
from replaywatch.sources.reverb_wire import decode_server_info

RECORDED_100 = Path(__file__).resolve().parents[1] / "tests/fixtures/server_info_100tables.bin"


def _server(tables: int) -> reverb.Server:
    return reverb.Server(tables=[
        reverb.Table(f"table_{i}", reverb.selectors.Uniform(), reverb.selectors.Fifo(),
                     max_size=1000, rate_limiter=reverb.rate_limiters.MinSize(1))
        for i in range(tables)])


def _time_ms(call, n: int) -> tuple[float, float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        call()
        out.append((time.perf_counter() - t0) * 1000)
    out.sort()
    return statistics.median(out), out[min(len(out) - 1, int(0.99 * len(out)))]


# The hand-written pure-Python decoder that protobuf replaced, read from
# git at the commit before, so the "before" is measured in the same run on the same bytes.
HAND_DECODER = "8d6b376^:replaywatch/sources/reverb_wire.py"


def _hand_decoder() -> Callable[[bytes], object] | None:
    """The old decoder's `decode_server_info`, or None where git or its history is missing."""
    module = module_at(HAND_DECODER, "hand_reverb_wire")
    return None if module is None else module.decode_server_info  # type: ignore[no-any-return]


def decode_cost(calls: int) -> dict[str, float]:
    """Decode time of one 100-table answer, in ms: p50 and the fastest (least disturbed)."""
    raw = RECORDED_100.read_bytes()
    out: dict[str, float] = {}
    hand = _hand_decoder()
    cases: list[tuple[str, Callable[[], object]]] = [
        ("parse", lambda: decode_server_info(raw)),
        ("snapshots", lambda: snapshots_from_response(raw, "t", 0.0))]
    if hand is not None:
        cases.append(("hand_parse", lambda: hand(raw)))
    for key, call in cases:
        times = []
        for _ in range(calls):
            t0 = time.perf_counter()
            call()
            times.append((time.perf_counter() - t0) * 1000)
        out[f"{key}_p50_ms"], out[f"{key}_min_ms"] = statistics.median(times), min(times)
    return out


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=200)
    args = p.parse_args(argv)
    rows = []
    for tables in (1, 10, 100):
        server = _server(tables)
        address = f"127.0.0.1:{server.port}"
        source = ReverbSource(address, timeout_s=2.0)
        client = reverb.Client(address)
        source.fetch()
        client.server_info(timeout=5)
        ours = _time_ms(lambda s=source, a=address: snapshots_from_response(s.fetch(), a, 0.0),
                        args.calls)
        theirs = _time_ms(lambda c=client: c.server_info(timeout=5), args.calls)
        rows.append({"tables": tables, "grpcio_p50_ms": ours[0], "grpcio_p99_ms": ours[1],
                     "reverb_client_p50_ms": theirs[0], "reverb_client_p99_ms": theirs[1]})
        server.stop()
    dead = ReverbSource("127.0.0.1:9", timeout_s=1.0)
    dead_ours = _time_ms(dead.poll, 20)
    dead_client = reverb.Client("127.0.0.1:9")

    def client_dead() -> None:
        try:
            dead_client.server_info(timeout=1)
        except Exception:
            pass

    dead_theirs = _time_ms(client_dead, 5)
    print("| tables | replaywatch grpcio p50 ms | p99 ms | reverb.Client p50 ms | p99 ms |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['tables']} | {r['grpcio_p50_ms']:.2f} | {r['grpcio_p99_ms']:.2f} | "
              f"{r['reverb_client_p50_ms']:.2f} | {r['reverb_client_p99_ms']:.2f} |")
    print(f"| dead server | {dead_ours[0]:.2f} | {dead_ours[1]:.2f} | {dead_theirs[0]:.0f} | "
          f"{dead_theirs[1]:.0f} |")
    rows.append({"tables": "dead", "grpcio_p50_ms": dead_ours[0],
                 "reverb_client_p50_ms": dead_theirs[0]})
    decode = decode_cost(max(args.calls, 500))
    print(f"\nDecoding a recorded 100-table answer ({RECORDED_100.stat().st_size} bytes) with "
          f"protobuf (upb): parse p50 {decode['parse_p50_ms']:.3f} ms (min "
          f"{decode['parse_min_ms']:.3f}), parse + snapshots p50 {decode['snapshots_p50_ms']:.2f}"
          f" ms (min {decode['snapshots_min_ms']:.2f}).")
    if "hand_parse_p50_ms" in decode:
        print(f"Before, the hand-written pure-Python decoder it replaced ({HAND_DECODER}, from "
              f"git), on the same bytes: parse p50 {decode['hand_parse_p50_ms']:.2f} ms (min "
              f"{decode['hand_parse_min_ms']:.2f}): "
              f"{decode['hand_parse_p50_ms'] / decode['parse_p50_ms']:.0f}x slower.")
    else:
        print("Before: the hand-written decoder could not be read from git (no history here); "
              "it took ~12 ms to parse in the run that replaced it.")
    rows.append({"tables": "decode_100", **decode})
    return rows


if __name__ == "__main__":
    main()
