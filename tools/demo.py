"""`make demo`: the JAX agent on Reverb with replaywatch attached, and where to look.

Starts `python -m agents.run` (healthy synchronous TD3 on Pendulum by default,
the seed incident's hang with DEADLOCK=1), reads its start line for the Reverb
address, the learner's probe URL and the actor probes' URLs, attaches `replaywatch
watch` to all of them, prints the URLs, then prints the active findings every few
seconds until the agent finishes or you press Ctrl-C.

What it shows is its own: a port already answering is refused before anything starts
(DEMO_PORT=0 picks a free one), and the page is read only once the sidecar it started
serves this agent's Reverb address. Every agent and sidecar of every start (a DEADLOCK=1
start that fed its workers is started again) ends with the demo: on Ctrl-C, SIGTERM and
SIGHUP through the clean-up below, when the demo's own parent goes away (`timeout make
demo` ends make, not always its children), and when the demo is SIGKILLed, because each
child is started with a parent-death signal.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# `python tools/demo.py` puts tools/ on sys.path; agents/ and harness/ live at the root and
# are not installed (the wheel is replaywatch alone).
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agents import seed_hang  # noqa: E402
from harness.agent import AgentProcess  # noqa: E402
from harness.procs import PYTHON, Proc, free_port, get_json, wait_until  # noqa: E402

HEALTHY = ["--mode", "sync", "--steps", "20000", "--eval-every", "5000"]
# The seed's shape: a synchronous loop, Acme's 12 batching workers (agents/README.md).
DEADLOCK = [*seed_hang.FLAGS, "--steps", "1000000", "--eval-every", "0"]


def read_json(url: str) -> Any:
    status, doc = get_json(url, 2)
    if status != 200:
        raise OSError(f"{url} answered {status}")
    return doc


def findings(base: str) -> list[dict]:
    try:
        return read_json(f"{base}/api/v1/findings")["findings"]
    except (OSError, ValueError, KeyError):
        return []


# One start: the agent, its start line, the sidecar attached to it.
Started = tuple[AgentProcess, dict, Proc]
SIDECAR_START_S = 60.0


def port_in_use(port: int) -> bool:
    """Something already listens on 127.0.0.1:port.

    With SO_REUSEADDR, as the sidecar's own server binds: without it the connections a
    demo stopped a moment ago leave in TIME_WAIT (a minute) read as "in use", and `make demo`
    run again at once was refused with nothing listening."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def serves(base: str, reverb: str) -> bool:
    """The sidecar at `base` answers and watches this agent's Reverb address."""
    try:
        doc = read_json(f"{base}/api/v1/targets")
    except (OSError, ValueError):
        return False
    names = {t.get("name") for t in doc.get("targets", [])}
    return reverb in names or reverb.replace("localhost", "127.0.0.1") in names


def watch_parent(parent: int) -> None:
    """SIGHUP to ourselves once our parent is gone (we were re-parented): `make` killed
    under us must not leave the demo, and so its agent, running."""
    def loop() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGHUP)

    threading.Thread(target=loop, daemon=True, name="watch-parent").start()


def main() -> int:
    # SIGTERM (a supervisor, `timeout make demo`) and SIGHUP (a closed terminal, or the
    # parent gone) take the clean-up below, as Ctrl-C does.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda *_: sys.exit(0))
    # A process started with SIGINT ignored (a background job, a test runner's worker) keeps
    # it ignored, and Python then raises no KeyboardInterrupt: Ctrl-C must still stop us.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    watch_parent(os.getppid())
    deadlock = os.environ.get("DEADLOCK", "0") not in ("", "0")
    try:
        port = int(os.environ.get("DEMO_PORT", "9321"))
    except ValueError:
        raise SystemExit(f"demo: DEMO_PORT must be a port number, not "
                         f"{os.environ.get('DEMO_PORT')!r}") from None
    if port == 0:
        port = free_port()
    elif port_in_use(port):
        raise SystemExit(f"demo: 127.0.0.1:{port} is already in use (another demo or "
                         "sidecar?): stop it, or run `make demo DEMO_PORT=0` for a free port")
    var = Path(os.environ.get("DEMO_DIR") or ROOT / "var")  # logs and the incident log
    var.mkdir(parents=True, exist_ok=True)
    log = var / "demo-agent.log"
    base = f"http://127.0.0.1:{port}"
    # Every start, so `finally` stops them all (each kills its process group).
    stops: list[Callable[[], object]] = []

    def launch(attempt: int) -> Started:
        agent = AgentProcess([*(DEADLOCK if deadlock else HEALTHY),
                              "--probe-listen", "127.0.0.1:0"], log=log,
                             death_signal=signal.SIGKILL).spawn()
        stops.append(agent.kill)
        try:
            start = agent.start_line(timeout_s=180)
        except AssertionError as error:
            raise SystemExit(f"demo: the agent printed no start line ({error}); "
                             f"see {log}") from None
        # Attached at once, as a user would: the sidecar sees the run before any hang. The
        # actor probes too (`--probe URL` each: the documents say their roles), so a stall
        # can be told from dead actors.
        probes = [start["probe"], *start.get("actor_probes", [])]
        sidecar = Proc([PYTHON, "-m", "replaywatch", "watch", "--reverb", start["reverb"],
                        *[a for url in probes for a in ("--probe", url)],
                        "--listen", f"127.0.0.1:{port}",
                        "--db", str(var / "demo-incidents.sqlite3")],
                       stdout_path=var / "demo-sidecar.log",
                       death_signal=signal.SIGTERM)
        stops.append(sidecar.terminate)
        try:
            wait_until(lambda: sidecar.returncode is not None or serves(base, start["reverb"]),
                       SIDECAR_START_S)
        except (AssertionError, TimeoutError):
            pass
        if sidecar.returncode is not None or not serves(base, start["reverb"]):
            raise SystemExit(f"demo: the sidecar did not start on {base} "
                             f"({_last_line(sidecar)}); see {var / 'demo-sidecar.log'}")
        return agent, start, sidecar

    def stop_both(started: Started) -> None:
        started[2].terminate()
        started[0].kill()

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
  actor probes: {', '.join(start.get('actor_probes', [])) or 'none'}
  status page:  {base}/
  findings:     {base}/api/v1/findings
  tables:       {base}/api/v1/tables
  metrics:      {base}/metrics
  logs:         {log}, {var / 'demo-sidecar.log'}
Ctrl-C stops both.
""", flush=True)
        last = None
        while agent.returncode is None:
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
        for stop in reversed(stops):
            stop()


def _last_line(proc: Proc) -> str:
    code = proc.returncode
    lines = (proc.log_path.read_text(errors="replace").strip().splitlines()
             if proc.log_path and proc.log_path.exists() else [])
    said = lines[-1] if lines else "no output"
    return f"exit {code}: {said}" if code is not None else f"not serving: {said}"


if __name__ == "__main__":
    raise SystemExit(main())
