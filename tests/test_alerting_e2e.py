"""End to end: the seed's hang -> sidecar finding -> Prometheus alert -> Alertmanager webhook.

Everything is real and on loopback: the JAX agent (`python -m agents.run`) in the seed
incident's layout, `replaywatch watch`, Debian's Prometheus loaded with the repo's
prometheus.yml and alerts.yml, Debian's Alertmanager with the repo's alertmanager.yml, and a
webhook receiver run by the test. Only intervals, `for:` and addresses are rewritten, in
temporary copies. Then every PromQL expression of the dashboard is run against that
Prometheus with the live target and table: no panel may be empty. Last, the trainer's side
of the same hang from its probe: blocked in `next()` on 12 workers, no batch ever delivered.
(One worker keeps delivering: tests/test_agents_hang.py.)
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from agents import seed_hang
from harness.procs import PYTHON, Proc, free_port, get_json, wait_until
from tests.support.monitoring import (
    ALERTMANAGER_YML,
    ALERTS_YML,
    FLOAT_MAX_FILTER,
    PROMETHEUS_YML,
    Alertmanager,
    Prometheus,
    grafana_regex_escape,
    load_dashboard,
    panel_targets,
    row_panels,
    substitute,
)

pytestmark = pytest.mark.agents

# The seed incident's layout as agents/README.md records it: a synchronous loop with Acme's
# 12 batching workers, batch 256, samples_per_insert 128; tolerance 0.002 and min replay
# 4000 make the limiter release 1024 samples at once, too few for 12 workers to fill a batch.
# Whether they strand the workers is a race (agents/seed_hang.py): the agent is started
# again when a start's workers were fed, and the sidecar attaches to the one that hangs.
HANG_FLAGS = seed_hang.FLAGS
HANG_TIMEOUT_S = 150.0  # from Prometheus' start (the hang already under way) to the finding
SCRAPE_S = 1
EVAL_S = 1
# alerts.yml says `for: 1m` for critical findings (5m warnings, 2m fallbacks); this test
# rewrites every `for:` in its temporary copy to FOR_S, and asserts against FOR_S.
FOR_S = 5
# Blocked in next() longer than this, the learner is not waiting on a slow batch.
STRANDED_FOR_S = 10.0
ALERT = "ReplaywatchWorkerStarvation"
KIND = "worker_starvation"


class Webhook:
    """Alertmanager's webhook receiver: keeps every notification it is sent."""

    def __init__(self) -> None:
        self.notifications: list[dict[str, Any]] = []
        lock = threading.Lock()
        received = self.notifications

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                with lock:
                    received.append(json.loads(body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/alerts"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def alerts(self, alertname: str, status: str) -> list[dict[str, Any]]:
        return [a for n in list(self.notifications) for a in n["alerts"]
                if a["labels"].get("alertname") == alertname and a["status"] == status]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def webhook() -> Iterator[Webhook]:
    hook = Webhook()
    yield hook
    hook.close()


def prometheus_config(sidecar: str, alertmanager: str) -> dict[str, Any]:
    """The repo's prometheus.yml with 1 s intervals and the test's addresses."""
    config = yaml.safe_load(PROMETHEUS_YML.read_text())
    config["global"].update(scrape_interval=f"{SCRAPE_S}s", evaluation_interval=f"{EVAL_S}s")
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "replaywatch"]
    job.update(scrape_interval=f"{SCRAPE_S}s", scrape_timeout=f"{SCRAPE_S}s",
               static_configs=[{"targets": [sidecar]}])
    (am,) = config["alerting"]["alertmanagers"]
    am["static_configs"] = [{"targets": [alertmanager]}]
    return config


def alert_rules() -> str:
    """The repo's alerts.yml with every `for:` set to FOR_S."""
    rules = yaml.safe_load(ALERTS_YML.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            assert "for" in rule, rule["alert"]
            rule["for"] = f"{FOR_S}s"
    return yaml.safe_dump(rules, sort_keys=False)


def alertmanager_config(webhook_url: str) -> dict[str, Any]:
    """The repo's alertmanager.yml (routes, inhibition) posting to the test's webhook now."""
    config = yaml.safe_load(ALERTMANAGER_YML.read_text())
    config["route"].update(group_wait="1s", group_interval="1s")
    for receiver in config["receivers"]:
        for hook in receiver.get("webhook_configs", []):
            hook["url"] = webhook_url
    return config


def run_start(samples: list[list[Any]], before: float, gap_s: float) -> float:
    """The first timestamp of the unbroken run of samples that reaches `before`."""
    stamps = sorted(float(t) for t, _ in samples if float(t) <= before)
    start = stamps[-1]
    for earlier in reversed(stamps[:-1]):
        if start - earlier > gap_s:
            break
        start = earlier
    return start


def _tail(proc: Proc) -> str:
    assert proc.log_path is not None
    return proc.log_path.read_text(errors="replace")[-1500:]


# One attempt: the agent, its start line, the sidecar, its base URL, Prometheus, its start.
Started = tuple[Proc, dict[str, Any], Proc, str, Prometheus, float]


@pytest.mark.timeout(420)  # up to seed_hang.ATTEMPTS agent starts, then the alert path
def test_the_seed_hang_fires_worker_starvation_to_the_webhook_and_fills_every_panel(
    spawn: Callable[..., Proc], sidecar: Callable[..., tuple[Proc, str]], webhook: Webhook,
    tmp_path: Path,
) -> None:
    alertmanager = Alertmanager(spawn, alertmanager_config(webhook.url), tmp_path / "am")

    def start_watched_agent(attempt: int) -> Started:
        # The sidecar is watching the agent's ports before the agent starts, so it sees the
        # inserts before the hang however slowly either process starts; Prometheus scrapes
        # it from then on too: the observed samples-per-insert panel has data only while the
        # sidecar's 10 s rate window still holds inserts, and a Prometheus started after the
        # hang (as it was) missed that window under load (twice, 2026-12-01).
        reverb_port, probe_port = free_port(), free_port()
        watcher, base = sidecar("--reverb", f"127.0.0.1:{reverb_port}", "--probe",
                                f"127.0.0.1:{reverb_port}=http://127.0.0.1:{probe_port}",
                                "--interval", "1",
                                "--db", str(tmp_path / f"incidents-{attempt}.sqlite3"))
        prometheus = Prometheus(spawn, prometheus_config(base.removeprefix("http://"),
                                                         f"127.0.0.1:{alertmanager.port}"),
                                tmp_path / f"prometheus-{attempt}",
                                extra_files={"alerts.yml": alert_rules()})
        started_at = float(prometheus.query("vector(time())")[0]["value"][1])
        agent = spawn([PYTHON, "-m", "agents.run", *HANG_FLAGS,
                       "--reverb-port", str(reverb_port),
                       "--probe-listen", f"127.0.0.1:{probe_port}", "--eval-every", "0",
                       "--steps", "10000000", "--seed", str(attempt)], name="agent")
        start = agent.announce()
        assert start["reverb"] == f"127.0.0.1:{reverb_port}", start
        return agent, start, watcher, base, prometheus, started_at

    def stop(started: Started) -> None:
        started[4].proc.kill()
        started[2].kill()
        started[0].kill()

    (agent, start, _, base, prometheus, started_at), _ = seed_hang.until_stranded(
        start_watched_agent, lambda started: get_json(started[1]["probe"] + "/probe")[1], stop)
    target, table = start["reverb"], start["table"]
    finding = f'replaywatch_finding_active{{kind="{KIND}", target="{target}", table="{table}"}}'

    try:
        wait_until(lambda: prometheus.query(finding), timeout_s=HANG_TIMEOUT_S, interval_s=0.5)
    except TimeoutError:
        pytest.fail(f"no {KIND} within {HANG_TIMEOUT_S}s of the sidecar's start (flags "
                    f"{' '.join(HANG_FLAGS)}); findings: "
                    f"{get_json(f'{base}/api/v1/findings')[1]}\nagent: {_tail(agent)}")

    # Firing at the latest for: + two evaluations after Prometheus first saw the finding
    # (one to mark it pending, one of slack for the evaluation tick); the wall-clock wait
    # adds a little for this test's own polling.
    def firing() -> list[dict[str, Any]]:
        alerts = prometheus.api("alerts")[1]["data"]["alerts"]
        return [a for a in alerts if a["labels"]["alertname"] == ALERT
                and a["state"] == "firing" and a["labels"].get("table") == table]

    (alert,) = wait_until(firing, timeout_s=FOR_S + 2 * EVAL_S + 3, interval_s=0.2)
    assert alert["labels"]["target"] == target and alert["labels"]["severity"] == "critical"
    window = "[10m]"
    seen = prometheus.query(finding + window)[0]["values"]
    fired = prometheus.query(f'ALERTS{{alertname="{ALERT}", alertstate="firing", '
                             f'table="{table}"}}' + window)[0]["values"]
    first_fired = min(float(t) for t, _ in fired)
    appeared = run_start(seen, first_fired, gap_s=3 * SCRAPE_S)
    assert FOR_S - EVAL_S <= first_fired - appeared <= FOR_S + 2 * EVAL_S, (appeared, first_fired)

    # Alertmanager (group_wait 1 s here) hands it to the webhook with the runbook.
    (sent, *_) = wait_until(lambda: webhook.alerts(ALERT, "firing"), timeout_s=20)
    assert sent["labels"]["target"] == target and sent["labels"]["table"] == table
    assert sent["annotations"]["runbook_url"].endswith(f"/docs/runbooks/{KIND}.md")
    assert table in sent["annotations"]["summary"] and target in sent["annotations"]["summary"]

    assert_every_panel_has_data(prometheus, target, table, started_at)

    # The trainer's side of the same hang, as its probe shows it from outside (one agent for
    # both claims: a start-up is ~10 s of both cores): the learner has been blocked in
    # next() for longer than any batch takes, with no batch ever delivered, on 12 workers.
    probe_url = start["probe"]
    probe = wait_until(lambda: (p := get_json(f"{probe_url}/probe")[1])["blocked_for_s"]
                       > STRANDED_FOR_S and p, timeout_s=30)
    assert probe["blocked_in_next"] and probe["ready"] is False, probe
    assert probe["num_parallel_calls"] == 12 and probe["batches_retrieved"] == 0, probe
    stacks = get_json(f"{probe_url}/stacks")[1]
    main = next(t for t in stacks["threads"] if t["name"] == "MainThread")
    assert any(frame["function"] == "__next__" for frame in main["frames"]), main
    assert agent.returncode is None


BASELINE_METRICS = ("replaywatch_table_rate_baseline_per_second",
                    "replaywatch_table_rate_band_low_per_second")
RLLIB_ROW = "RLlib jobs"
LEARNER_HEALTH_PANEL = "Priorities: updates, refusals and the sampler's reach"
# The seed hang's learner never takes a batch and sends no priority: its probe has no batch
# statistics and no priority counts (tests/test_priorities.py reads them off a real learner),
# and no ratio it trains at (tests/test_consumption.py has it).
LEARNER_HEALTH_METRICS = ("replaywatch_probe_priority_update_", "replaywatch_probe_batch_",
                          "replaywatch_table_consumed_samples_per_insert")


def assert_every_panel_has_data(prometheus: Prometheus, target: str, table: str,
                                since: float) -> None:
    """Each dashboard expression, as Grafana would send it for this target and table over the
    time since Prometheus started, returns at least one series with samples."""
    values = {"target": grafana_regex_escape(target), "table": grafana_regex_escape(table)}
    now = float(prometheus.query("vector(time())")[0]["value"][1])
    sync = prometheus.query(f'replaywatch_table_insert_blocking_disabled{{table="{table}"}} == 1')
    empty, panels_with_data, panels_seen = [], set(), set()
    dashboard = load_dashboard()
    # A Reverb job has no RLlib series; test_dashboards.py fills that row from the
    # sidecar's own exposition of an RLlib job.
    rllib = [p["title"] for p in row_panels(dashboard, RLLIB_ROW)]
    for panel, target_ in panel_targets(dashboard):
        if panel["title"] in rllib:
            continue
        expr = substitute(target_["expr"], values)
        panels_seen.add(panel["title"])
        status, body = prometheus.api("query_range", query=expr, start=since, end=now, step=1)
        assert status == 200, f"{panel['title']}: {expr}: HTTP {status} {body}"
        if any(series["values"] for series in body["data"]["result"]):
            panels_with_data.add(panel["title"])
        elif not (FLOAT_MAX_FILTER in expr and sync) and not any(
                name in expr for name in (*BASELINE_METRICS, *LEARNER_HEALTH_METRICS)):
            # max_diff and insert headroom are float max in a synchronous layout and are
            # filtered out on purpose; a throughput baseline exists only after
            # throughput_min_baseline_s (3 min) of moving rates, longer than this run (the
            # metrics test shows them once established); anything else empty is broken.
            empty.append(f"{panel['title']} [{target_['refId']}]: {expr}")
    assert not empty, "expressions without data:\n" + "\n".join(empty)
    assert panels_with_data == panels_seen - {LEARNER_HEALTH_PANEL}
