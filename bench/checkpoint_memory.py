"""`make bench-checkpoint-memory`: what a checkpoint keeps alive, against a real cgroup limit.

A replay process (harness/replay_checkpoints.py) in a cgroup v1 memory group made here (as
root) fills its table (`--items` of 1 MiB, incompressible, max_size the same), checkpoints it
once with nothing inserted (the write the next is expected to last), then goes on inserting
`--rate` items a second and checkpoints every `--every-s`. Each item removed from the full
table while a write runs stays alive until the write ends. One sidecar polls the server and
its ReplayProbe every second.

  tight   the limit `--headroom` MiB above the group's anonymous memory after the quiet write: when
          memory_exhaustion (cause checkpoint) opens, its forecast of the process at the
          write's end against the limit, and the kernel's kill that follows (or not)
  fixed   the same job, its limit the one the tight run's fix printed: whether the write
          completes, the most the process used against the forecast, anything paged
  smaller the tight run's limit, its table at the max_size the fix printed instead

Two shapes (SHAPES): the one the rules were written against, and one they were not; `--items
N --rate R --headroom MIB` runs one of your own.

    python -m bench.checkpoint_memory [--results bench/RESULTS.md]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.results_md import write_sections
from harness.cgroups import remove_group
from harness.procs import PYTHON, Proc
from replaywatch.config import PollConfig, ProbeTarget, WatchConfig
from replaywatch.model import Name, Severity
from replaywatch.wiring import build_sidecar

V1 = Path("/sys/fs/cgroup/memory")
HEADING = "## What a checkpoint keeps alive, against a real cgroup limit"
MIB = 1 << 20
GIB = 1 << 30


def run(name: str, tmp: Path, args: argparse.Namespace, limit: int | None,
        items: int | None = None) -> dict[str, Any]:
    """One replay process watched through its second write (or its kill): `limit` set from
    its start, else `--headroom` above the group's anonymous memory after the quiet write."""
    items = items or args.items
    group = V1 / f"replaywatch-bench-{os.getpid()}-{name}"
    group.mkdir()
    go = tmp / f"{name}.go"
    replay = Proc([PYTHON, "harness/replay_checkpoints.py", "--cgroup", str(group),
                   "--dir", str(tmp / f"{name}-ckpt"), "--max-size", str(items),
                   "--fill", str(items), "--item-kib", "1024", "--every-s",
                   str(args.every_s), "--insert-rate", str(args.rate), "--go-file", str(go)],
                  stdout_path=tmp / f"{name}.log")
    out: dict[str, Any] = {"run": name, "items": items, "paged": []}
    try:
        up = replay.announce(timeout_s=300, match=lambda r: r.get("event") == "serving")
        if limit is not None:
            (group / "memory.limit_in_bytes").write_text(str(limit))
        config = WatchConfig(targets=(up["reverb"],),
                             probes=(ProbeTarget(up["replay_probe"], up["reverb"]),),
                             poll=PollConfig(interval_s=1.0, history_s=900.0))
        with build_sidecar(config, incidents_path=str(tmp / f"{name}.db")) as car:
            first = _wait_checkpoints(car, replay, 1, 600)
            out["quiet_write_s"] = first[0]["seconds"]
            if limit is None:
                # Its anonymous memory: the write's file pages count in usage_in_bytes too,
                # but the kernel reclaims them before it kills anything.
                limit = _anon(group) + args.headroom * MIB
                (group / "memory.limit_in_bytes").write_text(str(limit))
            (group / "memory.max_usage_in_bytes").write_text("0")  # the peak from here on
            out["limit_bytes"] = limit
            go.touch()
            began = time.monotonic()
            write_began = None
            most = 0
            while time.monotonic() - began < 300:
                t0 = time.monotonic()
                state = car.poller.tick()
                now = time.monotonic() - began
                readings = [m for m in state.memory.values() if m.counted_bytes is not None]
                most = max([most, *(m.counted_bytes or 0 for m in readings)])
                for f in state.findings:
                    if f.kind == Name.CHECKPOINTING and f.evidence.get("server_answers"):
                        write_began = write_began if write_began is not None else now - float(
                            f.evidence["checkpoint_for_s"])
                    if f.severity >= Severity.WARNING and f.kind not in out["paged"]:
                        out["paged"].append(str(f.kind))
                    if (f.kind == Name.MEMORY_EXHAUSTION and f.evidence.get("cause")
                            == "checkpoint" and "named" not in out):
                        out["named"] = {"at_s": round(now, 1), "fix": f.fix,
                                        "peak_bytes": f.evidence["peak_bytes"],
                                        "write_for_s": f.evidence.get("kept_alive_over_s"),
                                        "kept_alive_bytes": f.evidence["kept_alive_bytes"],
                                        "memory_bytes": f.evidence["memory_bytes"]}
                    if f.kind == Name.CHECKPOINTING and "forecast" not in out and (
                            f.evidence.get("peak_bytes") is not None):
                        out["forecast"] = {"at_s": round(now, 1),
                                           "peak_bytes": f.evidence["peak_bytes"],
                                           "write_for_s": f.evidence["checkpoint_for_s"]}
                if replay.returncode is not None:
                    out["killed_at_s"] = round(now, 1)
                    break
                done = _checkpoints(replay)
                if len(done) >= 2:
                    out["second_write_s"] = done[1]["seconds"]
                    out["second_error"] = done[1].get("error")
                    break
                time.sleep(max(0.0, 1.0 - (time.monotonic() - t0)))
        out["write_began_s"] = None if write_began is None else round(write_began, 1)
        out["most_counted_bytes"] = most
        out["max_usage_bytes"] = int((group / "memory.max_usage_in_bytes").read_text())
        out["oom_kills"] = _oom_kills(group)
        return out
    finally:
        replay.kill()
        remove_group(group)


def _anon(group: Path) -> int:
    for line in (group / "memory.stat").read_text().splitlines():
        if line.startswith("total_rss "):
            return int(line.split()[1])
    raise SystemExit(f"no total_rss in {group}/memory.stat")


def _oom_kills(group: Path) -> int | None:
    for line in (group / "memory.oom_control").read_text().splitlines():
        if line.startswith("oom_kill "):
            return int(line.split()[1])
    return None


def _checkpoints(replay: Proc) -> list[dict[str, Any]]:
    assert replay.log_path is not None
    return [json.JSONDecoder().raw_decode(line[line.index("{"):])[0]
            for line in replay.log_path.read_text(errors="replace").splitlines()
            if '"event": "checkpoint"' in line]


def _wait_checkpoints(car: Any, replay: Proc, n: int, timeout_s: float) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        car.poller.tick()
        done = _checkpoints(replay)
        if len(done) >= n:
            return done
        if replay.returncode is not None:
            raise SystemExit(f"the replay process exited ({replay.returncode}) before its "
                             f"checkpoint {n}")
        time.sleep(1.0)
    raise SystemExit(f"no checkpoint {n} within {timeout_s:.0f} s")


def printed_limit(fix: str) -> int:
    """The limit the fix printed ('Raise the memory limit to at least X GiB')."""
    found = re.search(r"at least ([\d.]+) GiB", fix)
    if found is None:
        raise SystemExit(f"the fix prints no limit: {fix}")
    return int(float(found.group(1)) * GIB)


def printed_max_size(fix: str) -> int:
    """The max_size the fix printed ('or lower max_size of 'T' to N')."""
    found = re.search(r"max_size of '[^']*' to ([\d,]+)", fix)
    if found is None:
        raise SystemExit(f"the fix prints no max_size: {fix}")
    return int(found.group(1).replace(",", ""))


def render(tables: list[str], args: argparse.Namespace, minutes: float) -> str:
    return "\n".join([
        HEADING, "",
        f"`make bench-checkpoint-memory` ({minutes:.1f} min, Reverb 0.14, a cgroup v1 memory "
        "limit): a full table of 1 MiB items, a quiet checkpoint, then items inserted at a "
        f"steady rate and a checkpoint every {args.every_s:g} s. Named and killed: when "
        "memory_exhaustion (cause checkpoint) opened and when the kernel killed the process, in "
        "seconds after the second write began; forecast: the process at the write's end as the "
        "sidecar said it, against what the group then used at most (MiB). Each shape: tight "
        "(the limit a little above the quiet use), fixed (the limit its fix printed), smaller "
        "(the tight limit, the max_size its fix printed).", "", *tables])


def table(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    def mib(b: Any) -> str:
        return "-" if b is None else f"{b / MIB:,.0f}"

    lines = [f"{args.items} items, {args.rate:g} items/s, {args.headroom} MiB of headroom:", "",
             "| run | max_size | limit MiB | quiet write s | named s | forecast MiB | most used "
             "MiB (counted / cgroup) | write 2 | killed | paged |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        named = r.get("named")
        at = (None if named is None or r.get("write_began_s") is None
              else named["at_s"] - r["write_began_s"])
        forecast = (named or r.get("forecast") or {}).get("peak_bytes")
        second = (f"{r['second_write_s']:.1f} s" if r.get("second_write_s") is not None
                  and not r.get("second_error") else (r.get("second_error") or "cut"))
        killed = ("-" if r.get("killed_at_s") is None else
                  f"{r['killed_at_s'] - (r.get('write_began_s') or 0.0):.0f} s into it "
                  f"(oom_kill {r.get('oom_kills')})")
        lines.append(
            f"| {r['run']} | {r['items']} | {mib(r.get('limit_bytes'))} | "
            f"{r.get('quiet_write_s', 0):.1f} | "
            f"{'-' if at is None else f'{at:.0f}'} | {mib(forecast)} | "
            f"{mib(r['most_counted_bytes'])} / {mib(r['max_usage_bytes'])} | {second} | "
            f"{killed} | {', '.join(r['paged']) or 'nothing'} |")
    tight = rows[0].get("named")
    if tight:
        lines += ["", f"Its fix: \"{tight['fix']}\""]
    return "\n".join(lines) + "\n"


# (items of 1 MiB, items/s inserted, MiB of headroom): the first the one the rules were
# written against, the second a shape they were not
SHAPES = ((900, 20.0, 240), (700, 30.0, 200))


def shape(tmp: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    """The three runs of one shape: tight, then the fix's limit, then the fix's max_size."""
    tight = run("tight", tmp, args, None)
    print(json.dumps(tight, default=str))
    rows = [tight]
    if tight.get("named"):
        fixed = run("fixed", tmp, args, printed_limit(tight["named"]["fix"]))
        print(json.dumps(fixed, default=str))
        smaller = run("smaller", tmp, args, tight["limit_bytes"],
                      printed_max_size(tight["named"]["fix"]))
        print(json.dumps(smaller, default=str))
        rows += [fixed, smaller]
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--items", type=int, default=None, help="one shape: its items ...")
    p.add_argument("--rate", type=float, default=20.0, help="... its insert rate ...")
    p.add_argument("--headroom", type=int, default=240, help="... MiB above the quiet use")
    p.add_argument("--every-s", type=float, default=6.0)
    p.add_argument("--results", type=Path, default=None)
    args = p.parse_args()
    if not V1.is_dir() or not os.access(V1, os.W_OK):
        print(f"no writable cgroup v1 memory controller at {V1} (run as root)")
        return 1
    shapes = SHAPES if args.items is None else ((args.items, args.rate, args.headroom),)
    began = time.monotonic()
    tables, ok = [], True
    for items, rate, headroom in shapes:
        one = argparse.Namespace(**{**vars(args), "items": items, "rate": rate,
                                    "headroom": headroom})
        with tempfile.TemporaryDirectory(prefix="rwcm-") as tmp:
            rows = shape(Path(tmp), one)
        tables.append(table(rows, one))
        ok = ok and (len(rows) == 3 and rows[0].get("killed_at_s") is not None
                     and all(r.get("killed_at_s") is None and not r["paged"]
                             and r.get("second_write_s") is not None for r in rows[1:]))
    text = render(tables, args, (time.monotonic() - began) / 60)
    print(text)
    if args.results:
        write_sections(args.results, [text])
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
