"""`make bench-checkpoints`: a checkpoint of a replay large enough that its write takes tens of
seconds, then its restore, as the sidecar sees them beside other servers.

A replay process (harness/replay_checkpoints.py) fills its table with `--gib` GiB of
incompressible 1 MiB items and checkpoints it once through its ReplayProbe; three other real
Reverb servers run their own insert and sample loops (harness/reverb_workload.py). One
sidecar polls the four servers and the replay's probe every second. Then the replay process
is killed and started again on the same directory and ports, the new one held to
`--cpu-share` of a core by a cpu cgroup (v1, as root), as a busy host or a slow disk holds a
real load, so that the restore lasts long enough to read.

Reported: during the write, how many cycles named `checkpointing`, what was paged on the
replay target, and the other servers' polls (p50, p99, max; cycles that missed one; polls
skipped as late); during the restore, `restoring` and `target_down` cycles, and each reading's
whole load (its time so far plus its ETA) against the load's real length as the probe timed
it, once a quarter of it passed; after it, whether `server_restarted` said it was restored.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench.results_md import write_sections
from bench.stats import percentile
from harness.cgroups import cpu_limited
from harness.procs import PYTHON, Proc, free_port
from replaywatch.config import PollConfig, ProbeTarget, WatchConfig
from replaywatch.model import Name, Severity
from replaywatch.state import Published
from replaywatch.wiring import Sidecar, build_sidecar

HEADING = "## A long checkpoint and its restore"
OTHERS = 3


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gib", type=float, default=1.25)
    p.add_argument("--cpu-share", type=float, default=0.05)
    p.add_argument("--results", type=Path, default=None)
    args = p.parse_args()
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="rwck-") as tmp:
        out = run(Path(tmp), args)
    text = render(out, args, (time.monotonic() - began) / 60)
    print(text)
    if args.results:
        write_sections(args.results, [text])
    w, r = out["write"], out["restore"]
    ok = (w["checkpointing"] > 0 and not w["paged"] and w["missed"] == 0 and w["late"] == 0
          and r["restoring"] > 0 and r["target_down"] == 0 and r["restored"]
          and r["worst_error"] is not None and r["worst_error"] <= 0.3)
    return 0 if ok else 1


def run(tmp: Path, args: argparse.Namespace) -> dict[str, Any]:
    ckpt, port, probe_port = tmp / "ckpt", free_port(), free_port()
    same = [PYTHON, "harness/replay_checkpoints.py", "--dir", str(ckpt), "--port", str(port),
            "--probe-port", str(probe_port), "--max-size", "100000"]
    with ExitStack() as stack:
        group = _slow_group(stack, args.cpu_share)
        others = [Proc([PYTHON, "harness/reverb_workload.py", "--port", "0"],
                       stdout_path=tmp / f"reverb-{i}.log") for i in range(OTHERS)]
        replay = Proc([*same, "--fill", str(int(args.gib * 1024)), "--item-kib", "1024",
                       "--checkpoint-once"], stdout_path=tmp / "replay.log")
        procs = [*others, replay]
        stack.callback(_kill_all, procs)  # before the group goes
        addresses = [o.announce(timeout_s=120)["reverb"] for o in others]
        up = replay.announce(timeout_s=300, match=lambda r: r.get("event") == "serving")
        target = up["reverb"]
        config = WatchConfig(targets=(target, *addresses),
                             probes=(ProbeTarget(up["replay_probe"], target),),
                             poll=PollConfig(interval_s=1.0))
        with build_sidecar(config, incidents_path=str(tmp / "i.db")) as car:
            write = watch_write(car, replay, target, addresses)
            replay.kill()
            go = tmp / "go"
            loading = Proc([*same, "--wait-file", str(go)], stdout_path=tmp / "load.log")
            procs.append(loading)
            pid = loading.announce(timeout_s=120, match=lambda r: r.get("event") == "probe")[
                "pid"]
            if group is not None:
                (group / "cgroup.procs").write_text(str(pid))
            go.touch()
            restore = watch_restore(car, target)
    restore["throttled"] = group is not None
    write["checkpoint_bytes"] = restore.get("bytes")
    return {"write": write, "restore": restore}


def _kill_all(procs: list[Proc]) -> None:
    for proc in procs:
        proc.kill()


def _slow_group(stack: ExitStack, share: float) -> Path | None:
    try:
        return stack.enter_context(cpu_limited(share, "replaywatch-bench"))
    except OSError as e:
        print(f"no cpu cgroup ({e.strerror}): the restore runs at full speed")
        return None


def tick(car: Sidecar, t0: float) -> Published:
    state = car.poller.tick()
    time.sleep(max(0.0, 1.0 - (time.monotonic() - t0)))
    return state


def watch_write(car: Sidecar, replay: Proc, target: str, others: list[str]) -> dict[str, Any]:
    polls: list[float] = []
    missed = cycles = checkpointing = 0
    paged: set[str] = set()
    late0: dict[str, int] = {}
    state = car.poller.tick()
    wrote: dict[str, Any] | None = None
    while wrote is None:
        t0 = time.monotonic()
        before = {n: s.polls_total for n, s in state.sources.items()}
        state = tick(car, t0)
        cycles += 1
        for name in others:
            s = state.sources[name]
            late0.setdefault(name, s.late_polls_total)
            missed += s.polls_total - before.get(name, 0) < 1
            if s.last_duration_s is not None:
                polls.append(1000 * s.last_duration_s)
        mine = [f for f in state.findings if f.target == target]
        checkpointing += any(f.kind == Name.CHECKPOINTING for f in mine)
        paged |= {str(f.kind) for f in mine if f.severity >= Severity.WARNING}
        wrote = _checkpoint_said(replay)
    late = sum(state.sources[n].late_polls_total - late0.get(n, 0) for n in others)
    return {"cycles": cycles, "seconds": wrote.get("seconds"), "error": wrote.get("error"),
            "checkpointing": checkpointing, "paged": sorted(paged), "missed": missed,
            "late": late, "p50_ms": statistics.median(polls),
            "p99_ms": percentile(polls, 0.99), "max_ms": max(polls)}


def _checkpoint_said(replay: Proc) -> dict[str, Any] | None:
    """The replay's line about its checkpoint call, once it printed it."""
    assert replay.log_path is not None
    for line in replay.log_path.read_text(errors="replace").splitlines():
        if '"event": "checkpoint"' in line:
            return dict(json.JSONDecoder().raw_decode(line[line.index("{"):])[0])
    return None


def watch_restore(car: Sidecar, target: str) -> dict[str, Any]:
    readings: list[tuple[float, float]] = []
    restoring = target_down = cycles = 0
    restored = None
    paged: set[str] = set()
    deadline = time.monotonic() + 600
    code = None
    while time.monotonic() < deadline:
        state = tick(car, time.monotonic())
        cycles += 1
        mine = {f.kind: f for f in state.findings if f.target == target}
        f = mine.get(Name.RESTORING)
        if f is not None:
            restoring += 1
            if f.evidence.get("eta_s") is not None:
                readings.append((f.evidence["restoring_for_s"], f.evidence["eta_s"]))
        target_down += Name.TARGET_DOWN in mine
        paged |= {str(k) for k, g in mine.items() if g.severity >= Severity.WARNING}
        if Name.SERVER_RESTARTED in mine:
            restored = mine[Name.SERVER_RESTARTED].evidence["tables"]["replay"][
                "restored_from_checkpoint"]
        m = state.memory.get(target)
        code = m.code if m is not None else None
        if (restored is not None and code is not None and code.restore is not None
                and code.restore.ended_at is not None):
            break
    took = (code.restore.ended_at - code.restore.started_at
            if code is not None and code.restore is not None and code.restore.ended_at
            else None)
    errors = [(so_far + eta - took) / took for so_far, eta in readings
              if took and so_far >= took / 4]
    return {"cycles": cycles, "restoring": restoring, "target_down": target_down,
            "paged": sorted(paged), "restored": bool(restored), "took_s": took,
            "bytes": code.restore.bytes if code is not None and code.restore else None,
            "readings": len(errors),
            "worst_error": max((abs(e) for e in errors), default=None),
            "mean_error": statistics.mean(errors) if errors else None}


def render(out: dict[str, Any], args: argparse.Namespace, minutes: float) -> str:
    w, r = out["write"], out["restore"]
    gib = (r["bytes"] or 0) / (1 << 30)
    pct = lambda x: "n/a" if x is None else f"{100 * x:+.1f} %"  # noqa: E731
    lines = [f"{HEADING} ({gib:.2f} GiB, {minutes:.1f} min, "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})", "",
             "`make bench-checkpoints` (bench/checkpoints.py): a replay process "
             "(harness/replay_checkpoints.py) filled with incompressible 1 MiB items and "
             "checkpointed once through its ReplayProbe, beside three real Reverb servers "
             "with their own loops; one sidecar polls the four and the probe every second. "
             "Then the replay is started again on its checkpoint directory and ports, held to "
             f"{100 * args.cpu_share:g} % of a core by a cpu cgroup"
             + ("" if r["throttled"] else " (not here: no cpu cgroup, full speed)")
             + ".", "",
             "| the write | |", "| --- | ---: |",
             f"| checkpoint written in | {w['seconds']:.1f} s |" if w["seconds"] else
             f"| checkpoint failed | {w['error']} |",
             f"| cycles that named checkpointing | {w['checkpointing']} of {w['cycles']} |",
             f"| paged on the replay meanwhile | {', '.join(w['paged']) or 'nothing'} |",
             f"| the other servers' polls: p50 / p99 / max | {w['p50_ms']:.1f} / "
             f"{w['p99_ms']:.1f} / {w['max_ms']:.1f} ms |",
             f"| cycles that missed one of them, polls skipped late | {w['missed']}, "
             f"{w['late']} |", "",
             "| the restore | |", "| --- | ---: |",
             f"| load, as the probe timed it | {r['took_s']:.1f} s |" if r["took_s"] else
             "| load | not seen to end |",
             f"| cycles that named restoring / target_down | {r['restoring']} / "
             f"{r['target_down']} of {r['cycles']} |",
             f"| readings past a quarter of the load | {r['readings']} |",
             f"| their whole load (so far + ETA) against the real one: worst, mean | "
             f"{pct(r['worst_error'])}, {pct(r['mean_error'])} |",
             f"| paged on the replay | {', '.join(r['paged']) or 'nothing'} |",
             f"| server_restarted said restored from a checkpoint | "
             f"{'yes' if r['restored'] else 'no'} |", "",
             "Reverb 0.14 writes a checkpoint outside its table lock: ServerInfo and inserts "
             "are answered at once throughout the write, so only the replay's probe can say "
             "one is being written. `reverb.Server(...)` holds Python's GIL for its whole "
             "load; a child process answers on the probe's socket meanwhile "
             "(replaywatch/probe/restore_watch.py).", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
