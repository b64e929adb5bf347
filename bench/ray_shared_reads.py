"""`make bench-ray-reads`: what N RLlib jobs on one Ray cluster cost the sidecar per cycle,
each job reading the cluster alone against the jobs sharing the reads that are the same for
each (sources/ray_shared.py: the actors list, the live workers, every node's metrics page).

The cluster is the recorded Ray 2.60 dashboard and DQN metrics page (tests/fixtures/ray/,
115 KB) served over real HTTP by a process of its own (the state API's tasks of another
recording: each job reads its own anyway), so the CPU counted is the sidecar
side's only: N job sources polled together on N threads, once a second, as a cycle polls
them. A real node's page holds every job's series, so there it grows with N too; here it
does not, and the saving shown is the smaller one.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import http.server
import json
import multiprocessing
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.results_md import write_sections
from replaywatch.sources.ray_cluster import SD_FILE, RayClusterSource
from replaywatch.sources.ray_shared import ClusterReads

HEADING = "## Many RLlib jobs on one cluster: reads shared per cycle"
JOB = "01000000"


FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "ray"
# What the recorded dashboard answers, by the start of the path; its metrics page beside it.
ANSWERS = (("/api/v0/actors?", "actors.json"), ("/api/v0/workers?", "workers.json"),
           ("/api/v0/tasks?", "tasks.json"), ("/metrics", "metrics_dqn.txt"))


def serve(temp_dir: str, ready: Any) -> None:
    """The recorded documents over real HTTP (the files are read, never imported: bench
    takes nothing from the tests), and the service-discovery file naming this server."""
    bodies = [(prefix, (FIXTURES / name).read_bytes()) for prefix, name in ANSWERS]

    class Recorded(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            body = next((b for prefix, b in bodies if self.path.startswith(prefix)), None)
            self.send_response(200 if body is not None else 404)
            self.send_header("Content-Length", str(len(body or b"")))
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorded)
    address = f"127.0.0.1:{server.server_address[1]}"
    (Path(temp_dir) / SD_FILE).write_text(json.dumps([{"targets": [address]}]))
    ready.send(f"http://{address}")
    server.serve_forever()


def measure(dashboard: str, temp_dir: str, jobs: int, shared: bool, cycles: int
            ) -> dict[str, float]:
    reads = ClusterReads(fresh_s=0.5) if shared else None
    sources = [RayClusterSource(dashboard, token="recorded", temp_dir=temp_dir, job_id=JOB,
                                environ={}, shared=reads) for _ in range(jobs)]
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        list(pool.map(lambda s: s.poll(time.time()), sources))  # connections, the token
        time.sleep(1.0)
        cpu0, wall = time.process_time(), []
        for _ in range(cycles):
            t0 = time.perf_counter()
            list(pool.map(lambda s: s.poll(time.time()), sources))
            wall.append(time.perf_counter() - t0)
            time.sleep(max(0.0, 1.0 - wall[-1]))
        cpu = time.process_time() - cpu0
    return {"cpu_ms": 1000 * cpu / cycles, "wall_ms": 1000 * sorted(wall)[len(wall) // 2]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, nargs="+", default=[1, 4, 8, 16])
    p.add_argument("--cycles", type=int, default=15)
    p.add_argument("--results", type=Path, default=None)
    args = p.parse_args()
    began = time.monotonic()
    temp = tempfile.mkdtemp(prefix="rw-ray-reads-")
    mine, theirs = multiprocessing.Pipe()
    server = multiprocessing.get_context("spawn").Process(target=serve, args=(temp, theirs),
                                                          daemon=True)
    server.start()
    dashboard = mine.recv()
    rows = []
    try:
        for n in args.jobs:
            apart = measure(dashboard, temp, n, False, args.cycles)
            together = measure(dashboard, temp, n, True, args.cycles)
            rows.append((n, apart, together))
            print(f"{n} jobs: apart {apart['cpu_ms']:.1f} ms CPU a cycle, shared "
                  f"{together['cpu_ms']:.1f}", flush=True)
    finally:
        server.terminate()
    lines = [f"{HEADING} ({(time.monotonic() - began) / 60:.1f} min, "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})", "",
             "`make bench-ray-reads` (bench/ray_shared_reads.py): N job sources of one cluster "
             "(`--ray-job all`), polled together once a second for "
             f"{args.cycles} cycles against the recorded Ray 2.60 dashboard and DQN metrics "
             "page (115 KB) served by a process of its own; the sidecar side's CPU only. A "
             "real node's page holds every job's series and grows with N; this one does not, "
             "so the saving here is the smaller one.", "",
             "| jobs | CPU ms a cycle, each job reading alone | shared | cycle p50 ms, alone "
             "| shared |", "| ---: | ---: | ---: | ---: | ---: |"]
    lines += [f"| {n} | {a['cpu_ms']:.1f} | {t['cpu_ms']:.1f} | {a['wall_ms']:.1f} | "
              f"{t['wall_ms']:.1f} |" for n, a, t in rows]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.results:
        write_sections(args.results, [text])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
