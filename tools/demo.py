"""`make demo`: the JAX agent on Reverb with replaywatch attached, and where to look.

Starts `python -m agents.run` (healthy synchronous TD3 on Pendulum by default,
the seed incident's hang with DEADLOCK=1), reads its start line for the Reverb
address and probe URL, attaches `replaywatch watch` to both, prints the URLs,
then prints the active findings every few seconds until the agent finishes or
you press Ctrl-C. Both processes are stopped on the way out.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from agents import seed_hang

ROOT = Path(__file__).resolve().parents[1]
HEALTHY = ["--mode", "sync", "--steps", "20000", "--eval-every", "5000"]
# The seed's shape: a synchronous loop, Acme's 12 batching workers (agents/README.md).
DEADLOCK = [*seed_hang.FLAGS, "--steps", "1000000", "--eval-every", "0"]


def start_line(proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 180.0) -> dict:
    """The agent's first JSON line naming its Reverb address (it goes to the log file,
    so the agent never blocks on a full pipe)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in log.read_text(errors="replace").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and record.get("reverb"):
                return record
        if proc.poll() is not None:
            raise SystemExit(f"demo: the agent exited ({proc.returncode}) before starting; "
                             f"see {log}")
        time.sleep(0.2)
    raise SystemExit("demo: the agent printed no start line in time")


def read_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=2) as r:
        return json.loads(r.read())


def findings(base: str) -> list[dict]:
    try:
        return read_json(f"{base}/api/v1/findings")["findings"]
    except (OSError, ValueError, KeyError):
        return []


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


# One start: the agent, its start line, the sidecar attached to it.
Started = tuple[subprocess.Popen[bytes], dict, subprocess.Popen[bytes]]


def main() -> int:
    # A SIGTERM (a supervisor, `timeout make demo`) must reach the clean-up below too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    deadlock = os.environ.get("DEADLOCK", "0") not in ("", "0")
    port = int(os.environ.get("DEMO_PORT", "9321"))
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    (ROOT / "var").mkdir(exist_ok=True)
    log = ROOT / "var" / "demo-agent.log"
    base = f"http://127.0.0.1:{port}"
    procs: list[subprocess.Popen[bytes]] = []  # every start, so `finally` stops them all

    def launch(attempt: int) -> Started:
        agent = subprocess.Popen(
            [sys.executable, "-m", "agents.run", *(DEADLOCK if deadlock else HEALTHY),
             "--probe-listen", "127.0.0.1:0"],
            cwd=ROOT, env=env, stdout=open(log, "wb"), stderr=subprocess.STDOUT,
            start_new_session=True)
        procs.append(agent)
        start = start_line(agent, log)
        # Attached at once, as a user would: the sidecar sees the run before any hang.
        sidecar = subprocess.Popen(
            [sys.executable, "-m", "replaywatch", "watch", "--reverb", start["reverb"],
             "--probe", start["probe"], "--listen", f"127.0.0.1:{port}",
             "--db", str(ROOT / "var" / "demo-incidents.sqlite3")],
            cwd=ROOT, env=env, start_new_session=True,
            stderr=open(ROOT / "var" / "demo-sidecar.log", "w"))
        procs.append(sidecar)
        return agent, start, sidecar

    def stop_both(started: Started) -> None:
        stop(started[2])
        stop(started[0])

    try:
        if deadlock:
            # The hang is a race the learner usually wins (agents/seed_hang.py): when the
            # workers were fed instead, start again, as the tests do.
            try:
                (agent, start, _), attempt = seed_hang.until_stranded(
                    launch, lambda started: read_json(started[1]["probe"] + "/probe"),
                    stop_both)
            except (RuntimeError, TimeoutError, OSError, ValueError) as error:
                raise SystemExit(f"demo: no hang to show: {error}; see {log}") from None
            if attempt > 1:
                print(f"demo: the workers were fed in {attempt - 1} start(s) (the race went "
                      "the healthy way); this start stranded them", flush=True)
        else:
            agent, start, _ = launch(1)
        print(f"""
replaywatch demo: {'the seed incident (12 batching workers, synchronous)' if deadlock
                   else 'healthy synchronous TD3 on Pendulum-v1'}
  agent:        Reverb at {start['reverb']}, probe at {start['probe']}
  status page:  {base}/
  findings:     {base}/api/v1/findings
  tables:       {base}/api/v1/tables
  metrics:      {base}/metrics
  logs:         var/demo-agent.log, var/demo-sidecar.log
Ctrl-C stops both.
""", flush=True)
        last = None
        while agent.poll() is None:
            time.sleep(5)
            now = sorted(f"{f['severity']}: {f['kind']} {f['table']}".strip()
                         for f in findings(base))
            if now != last:
                print(time.strftime("%H:%M:%S"), "findings:", ", ".join(now) or "none",
                      flush=True)
                last = now
        print(f"demo: the agent finished (exit {agent.returncode})")
        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        for proc in reversed(procs):
            stop(proc)


if __name__ == "__main__":
    raise SystemExit(main())
