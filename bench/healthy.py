"""False alarms on healthy runs of the agents/ workload: a healthy job must never be paged.

Every run is watched from its start line by three sidecars: one with the learner's
TrainerProbe and every ActorProbe of the start line (`actor_probes`), one with the
Reverb address alone, one with the learner's probe alone. Any warning or critical finding
any of them shows is a false alarm: the job is healthy by construction. The runs go side
by side, each for its own time:

  sync            --mode sync: one loop inserts and learns (insert blocking off)
  async           the asynchronous layout: insert blocking on, one actor in its
                  own process that waits on the learner (a parameter hand-off) after 8 steps
                  without seeing it step (--max-policy-lag 8), one batching worker:
                  seed_hang.ASYNC_FLAGS with one worker and a lag of 8, not 2. Lag 2 hangs
                  for real, with any number of workers (measured: after 25 episodes, 62 s):
                  an episode's first n_step - 1 = 2 steps insert nothing, so the actor can
                  wait on a learner whose next batch needs its inserts. Any 8 steps insert at
                  least 6 items, 768 samples, 3 batches, which one worker always completes.
  distributed     4 actors in their own processes, insert blocking on, no lag bound
  first_step_60s  distributed, the learner's first update sleeps 60 s after its first
                  batch (--first-step-delay-s: a stand-in for a long first jit compile,
                  acme#212) while the actors run ahead to max_diff
  first_step_60s_sync  the same in sync mode (not in the default set)
  queue           distributed actors feeding an on-policy `reverb.Table.queue`
  slow_step_12s   distributed, every learner update sleeps 12 s after its batch (a big
                  network on a small host): the actors wait at max_diff through each step
  eval_checkpoint a sync loop that evaluates about once a minute (no inserts, no samples)
                  and checkpoints its Reverb server every minute

Our agent has two modes: "async" and "distributed" are both its distributed mode
(Ray processes); they differ in whether actors wait on the learner.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

from agents import seed_hang
from bench import watched
from harness.procs import Proc, get_json

ASYNC = [*seed_hang.ASYNC_FLAGS]
ASYNC[ASYNC.index("--num-parallel-calls") + 1] = "1"
ASYNC[ASYNC.index("--max-policy-lag") + 1] = "8"
FIRST_STEP_DELAY_S = 60.0
AFTER_FIRST_STEP_S = 60.0
FIRST_STEP_EXTRA_S = 300.0


@dataclasses.dataclass(frozen=True)
class HealthyRun:
    name: str
    flags: list[str]
    first_step: bool = False  # runs for `first_step_s`, not `seconds`


RUNS = {r.name: r for r in (
    HealthyRun("sync", ["--mode", "sync"]),
    HealthyRun("async", ASYNC),
    HealthyRun("distributed", watched.DISTRIBUTED),
    HealthyRun("first_step_60s", [*watched.DISTRIBUTED, "--first-step-delay-s",
                                  f"{FIRST_STEP_DELAY_S:g}"], first_step=True),
    HealthyRun("first_step_60s_sync", ["--mode", "sync", "--first-step-delay-s",
                                       f"{FIRST_STEP_DELAY_S:g}"], first_step=True),
    # An on-policy queue (reverb.Table.queue) fed by the distributed actors.
    HealthyRun("queue", [*watched.DISTRIBUTED, "--queue", "--max-replay-size", "512"]),
    # A sync loop that evaluates (5 episodes, no inserts, no samples) every 3000 environment
    # steps, about once a minute here, and checkpoints its Reverb server every minute (so
    # make bench's short run sees a checkpoint too).
    HealthyRun("eval_checkpoint", ["--mode", "sync", "--eval-every", "3000",
                                   "--eval-episodes", "5", "--checkpoint-every-s", "60"]),
    # A learner whose every update takes 12 s more (a big network on a small host), its 4
    # actors held at max_diff through each step (bench-long).
    HealthyRun("slow_step_12s", [*watched.DISTRIBUTED, "--learner-step-delay-s", "12"]),
    # Prioritized replay: the learner sends each batch's |TD error| back as priorities, the
    # distributed actors insert (bench-long: priority updates, batch statistics and the share
    # never sampled judged on a healthy prioritized job).
    HealthyRun("prioritized", [*watched.DISTRIBUTED, "--sampler", "prioritized"]),
    HealthyRun("prioritized_sync", ["--mode", "sync", "--sampler", "prioritized"]),
    # A 10-minute first compile (bench-long).
    HealthyRun("first_step_600s", [*watched.DISTRIBUTED, "--first-step-delay-s", "600"],
               first_step=True),
)}
DEFAULT_RUNS = ("sync", "async", "distributed", "first_step_60s")
# Who watches each run: every probe; Reverb alone; the learner's probe alone.
SIDES = ("probe", "reverb", "trainer")
# make bench's two groups of three: six agents side by side on 2 cores starve a server of
# CPU for whole polls (bench-long's second run), which is not what these runs ask about.
BENCH_GROUPS = (("sync", "async", "distributed"),
                ("queue", "eval_checkpoint", "first_step_60s"))


class _Watched:
    """One healthy run: its agent, its two sidecars, what they said."""

    def __init__(self, run: HealthyRun, tmp: Path):
        self.run = run
        self.agent = watched.spawn_agent(run.flags, tmp / f"healthy-{run.name}.log")
        self.tmp = tmp
        self.procs: list[Proc] = []
        self.bases: dict[str, str] = {}
        self.start: dict[str, Any] | None = None
        self.attached_at: float | None = None
        self.deadline: float | None = None
        self.seen: dict[str, dict[str, float]] = {s: {} for s in SIDES}
        self.alarms: dict[str, dict[str, dict[str, Any]]] = {s: {} for s in SIDES}
        self.first_batch_at: float | None = None
        self.first_step_at: float | None = None
        self.last_probe: dict[str, Any] = {}
        self.result: dict[str, Any] | None = None

    def attach(self, seconds: float) -> None:
        hit = self.agent.event(lambda r: r.get("event") == "start")
        if hit is None:
            if self.agent.returncode is not None:
                raise RuntimeError(f"{self.run.name}: agent exited {self.agent.returncode}: "
                                   f"{self.agent.describe()}")
            return
        self.start = hit[1]
        self.procs, self.bases = watched.attach(self.start, self.tmp, f"healthy-{self.run.name}",
                                                trainer_side=True)
        self.attached_at = time.time()
        self.deadline = time.monotonic() + seconds

    def poll(self) -> None:
        now = time.time()
        for side, base in self.bases.items():
            try:
                found = get_json(f"{base}/api/v1/findings", 2)[1]["findings"]
            except (OSError, KeyError, ValueError):
                continue
            for f in found:
                self.seen[side].setdefault(f["kind"], now - (self.attached_at or now))
                if f["severity"] in ("warning", "critical") and f["kind"] not in self.alarms[side]:
                    self.alarms[side][f["kind"]] = {
                        "after_attach_s": round(now - (self.attached_at or now), 1),
                        "severity": f["severity"], "summary": f["summary"],
                        "evidence": f["evidence"], "fix": f["fix"],
                        "counters": _counters(base)}
        try:
            self.last_probe = get_json(f"{self.start['probe']}/probe", 2)[1]  # type: ignore[index]
        except (OSError, ValueError):
            return
        if self.first_batch_at is None and self.last_probe.get("batches_retrieved", 0) >= 1:
            self.first_batch_at = now
        if self.first_step_at is None and self.last_probe.get("learner_steps", 0) >= 1:
            self.first_step_at = now

    def done(self) -> bool:
        """Its time is up; a first-step run also watches AFTER_FIRST_STEP_S past its first
        step (a start slowed by a loaded machine must not end the run mid-compile), or
        FIRST_STEP_EXTRA_S longer if the step never comes."""
        now = time.monotonic()
        if now < self.deadline:  # type: ignore[operator]
            return False
        if not self.run.first_step:
            return True
        if self.first_step_at is not None:
            return time.time() - self.first_step_at >= AFTER_FIRST_STEP_S
        return now >= self.deadline + FIRST_STEP_EXTRA_S  # type: ignore[operator]

    def finish(self) -> dict[str, Any]:
        incidents = {}
        for side, base in self.bases.items():
            try:
                rows = get_json(f"{base}/api/v1/incidents?state=all&limit=1000", 5)[1]["incidents"]
                incidents[side] = [i["kind"] for i in rows if i["severity"] != "info"]
            except (OSError, KeyError, ValueError) as error:
                incidents[side] = [f"unreadable: {error}"]
        actors = [_actor_doc(u) for u in (self.start or {}).get("actor_probes", [])]
        alive = self.agent.returncode is None
        self.close()
        took = time.time() - (self.attached_at or time.time())
        steps = self.last_probe.get("learner_steps", 0)
        first = (None if self.first_step_at is None or self.first_batch_at is None
                 else round(self.first_step_at - self.first_batch_at, 1))
        self.result = {
            "run": self.run.name, "flags": self.run.flags, "seconds": round(took, 1),
            "agent_alive_at_end": alive, "learner_steps": steps,
            "learner_steps_per_s": round(steps / took, 1) if took > 0 else None,
            "first_batch_to_first_step_s": first,
            "actors": actors,
            **{f"{side}:alarms": self.alarms[side] for side in self.bases},
            **{f"{side}:kinds_seen": sorted(self.seen[side]) for side in self.bases},
            **{f"{side}:incidents": incidents[side] for side in self.bases}}
        return self.result

    def close(self) -> None:
        for p in self.procs:
            p.kill()
        self.agent.kill()


def _counters(base: str) -> dict[str, Any]:
    """Each table's limiter counters as the sidecar last read them (when an alarm opened)."""
    try:
        tables = get_json(f"{base}/api/v1/tables", 2)[1]["tables"]
    except (OSError, KeyError, ValueError) as error:
        return {"error": str(error)}
    return {t["name"]: {k: t["rate_limiter"].get(k) for k in ("inserts", "samples")}
            | {"current_size": t["current_size"], "uptime_s": _uptime(t)} for t in tables}


def _uptime(table: dict[str, Any]) -> float | None:
    """The server's uptime: the table worker's time in all its states (rules_startup.uptime_s)."""
    try:
        return round(sum(table["worker_time"].values()) / 1000.0, 1)
    except (KeyError, TypeError, AttributeError):
        return None


def _actor_doc(url: str) -> dict[str, Any]:
    try:
        doc = get_json(f"{url}/probe", 2)[1]
    except (OSError, ValueError) as error:
        return {"url": url, "error": str(error)}
    keep = ("name", "steps_total", "items_created_total", "waits_total",
            "waiting_seconds_total", "calls")
    out = {"url": url, **{k: doc.get(k) for k in keep if k in doc}}
    # Seconds inside each writer call: how long actors sat in flush() at max_diff.
    out["calls"] = {c: round(v.get("seconds_total", 0.0), 1)
                    for c, v in out.get("calls", {}).items()}
    return out


def healthy(seconds: float, tmp: Path, names: tuple[str, ...] = DEFAULT_RUNS,
            first_step_s: float = 150.0, start_timeout_s: float = 300.0) -> list[dict[str, Any]]:
    """The named runs side by side, each watched for its time from its start line."""
    watched = [_Watched(RUNS[n], tmp) for n in names]
    started = time.monotonic()
    try:
        while any(w.result is None for w in watched):
            for w in watched:
                if w.result is not None:
                    continue
                if w.start is None:
                    w.attach(first_step_s if w.run.first_step else seconds)
                    if w.start is None and time.monotonic() - started > start_timeout_s:
                        raise TimeoutError(f"{w.run.name}: no start line in {start_timeout_s:g} s")
                    continue
                w.poll()
                if w.done():
                    w.finish()
            time.sleep(1.0)
    finally:
        for w in watched:
            w.close()
    return [w.result for w in watched if w.result is not None]


def render(results: list[dict[str, Any]]) -> str:
    """The false-alarm table, then each alarm's finding (kind, summary, evidence)."""
    lines = ["| run | watched s | learner steps/s | first step s | probe+actors sidecar: "
             "warning/critical | incidents | Reverb-only: warning/critical | incidents | "
             "trainer probe only: warning/critical | info kinds (probe / Reverb) |",
             "| --- | ---: | ---: | ---: | --- | --- | --- | --- | --- | --- |"]
    details = []
    for r in results:
        first = r["first_batch_to_first_step_s"]
        lines.append(
            f"| {r['run']} | {r['seconds']:.0f} | {r['learner_steps_per_s']} | "
            f"{'-' if first is None else first} | "
            f"{', '.join(r['probe:alarms']) or 'none'} | "
            f"{', '.join(r['probe:incidents']) or 'none'} | "
            f"{', '.join(r['reverb:alarms']) or 'none'} | "
            f"{', '.join(r['reverb:incidents']) or 'none'} | "
            f"{_alarms(r, 'trainer')} | "
            f"{_info(r, 'probe')} / {_info(r, 'reverb')} |")
        for side in (s for s in SIDES if f"{s}:alarms" in r):
            for kind, f in r[f"{side}:alarms"].items():
                details.append(f"- {r['run']}, {side} sidecar, `{kind}` ({f['severity']}) "
                               f"{f['after_attach_s']} s after the sidecars attached: "
                               f"{f['summary']} Evidence: `{_short(f['evidence'])}`; "
                               f"counters then: `{_short(f.get('counters'))}`")
    flags = [f"- {r['run']}: `{' '.join(r['flags'])}`; actors: "
             + (", ".join(f"{a.get('name', a['url'])} {a.get('steps_total', '?')} steps, "
                          f"{a.get('items_created_total', '?')} items, "
                          f"{a.get('waits_total', '?')} waits on the learner "
                          f"({a.get('waiting_seconds_total', 0) or 0:.0f} s), writer s "
                          f"{a.get('calls', {})}" for a in r["actors"]) or "none")
             for r in results]
    return "\n".join(lines + [""] + flags + ([""] + details if details else []))


def _alarms(r: dict[str, Any], side: str) -> str:
    """A side's alarms; "-" where a run was not watched from it (an older table's)."""
    if f"{side}:alarms" not in r:
        return "-"
    return ", ".join(r[f"{side}:alarms"]) or "none"


def _info(r: dict[str, Any], side: str) -> str:
    return ", ".join(k for k in r[f"{side}:kinds_seen"] if k not in r[f"{side}:alarms"]) or "-"


def _short(evidence: Any, limit: int = 600) -> str:
    import json

    text = json.dumps(evidence, sort_keys=True, default=str)
    return text if len(text) <= limit else text[:limit] + " ..."
