"""Dashboards and alerts are code: checked by promtool/amtool, a real Prometheus, and the repo.

No Docker engine and no Grafana server run here. The compose file is validated offline by
docker-compose itself and by checking what it mounts and builds; the dashboard by its
structure and by sending every one of its PromQL expressions to a real Prometheus.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.procs import ROOT, Proc, wait_until
from replaywatch import metrics_ray
from replaywatch.diagnosis import kinds
from replaywatch.metric_families import Family
from replaywatch.metrics import render_published
from replaywatch.model import Finding, Name, Severity
from tests.support.monitoring import (
    ALERTMANAGER_YML,
    ALERTS_YML,
    DASHBOARD_JSON,
    DASHBOARDS,
    PROMETHEUS_YML,
    Prometheus,
    load_dashboard,
    panel_targets,
    panels,
    row_panels,
    substitute,
)
from tests.test_docs import full_picture

pytestmark = pytest.mark.slow  # promtool, Prometheus, docker-compose: Debian packages

PROMTOOL = "/usr/bin/promtool"
AMTOOL = "/usr/bin/amtool"
DOCKER_COMPOSE = "/usr/bin/docker-compose"
COMPOSE_YML = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
RUNBOOKS = ROOT / "docs" / "runbooks"
# Runbooks of the sidecar's own alerts, beside one per finding kind.
SIDECAR_RUNBOOKS = {"sidecar_down", "rule_errors", "shards_disagree"}
# Where every alert's runbook_url points (_config.runbookBase in dashboards/mixin/).
RUNBOOK_BASE = "https://github.com/replaywatch/replaywatch/blob/main/docs/runbooks/"
GRID_COLUMNS = 24
RLLIB_ROW = "RLlib jobs"
# The kinds only an RLlib job raises; the row's findings panel is where they show.
RLLIB_KINDS = (Name.ENV_RUNNER_STALLED, Name.DRIVER_STALLED, Name.RLLIB_ACTOR_DOWN,
               Name.ENV_STEPS_DROPPED)


def _run(args: list[str], cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=60)


def _alert_rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(ALERTS_YML.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def _kinds(severity: str) -> set[str]:
    """The declared finding kinds of one severity (replaywatch/diagnosis/kinds.py)."""
    return {k.name for k in kinds.ALL if k.severity.label == severity}


# -- promtool and amtool ---------------------------------------------------------------------

def test_prometheus_config_and_its_rule_file_pass_promtool_check_config(tmp_path: Path) -> None:
    # A copy, as the e2e test runs it: rule_files resolve next to the config.
    shutil.copy(PROMETHEUS_YML, tmp_path / "prometheus.yml")
    shutil.copy(ALERTS_YML, tmp_path / "alerts.yml")
    result = _run([PROMTOOL, "check", "config", str(tmp_path / "prometheus.yml")])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout + result.stderr


def test_alert_rules_pass_promtool_check_rules() -> None:
    result = _run([PROMTOOL, "check", "rules", str(ALERTS_YML)])
    assert result.returncode == 0, result.stdout + result.stderr


def test_alert_rules_pass_their_promtool_unit_tests() -> None:
    result = _run([PROMTOOL, "test", "rules", "alerts_test.yml"], cwd=ALERTS_YML.parent)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_rule_has_a_firing_and_a_quiet_promtool_case() -> None:
    cases = yaml.safe_load((ALERTS_YML.parent / "alerts_test.yml").read_text())["tests"]
    checks = [c for case in cases for c in case["alert_rule_test"]]
    for rule in _alert_rules():
        mine = [c for c in checks if c["alertname"] == rule["alert"]]
        assert any(c.get("exp_alerts") for c in mine), f"{rule['alert']} never fires in a test"
        assert any(not c.get("exp_alerts") for c in mine), f"{rule['alert']} never stays quiet"


def test_alertmanager_config_passes_amtool_check_config() -> None:
    result = _run([AMTOOL, "check-config", str(ALERTMANAGER_YML)])
    assert result.returncode == 0, result.stdout + result.stderr


# -- alerts against the engine and the runbooks ----------------------------------------------

def test_the_declaration_has_critical_and_warning_kinds() -> None:
    # Guards the tests below: with no kinds of a severity they would prove nothing.
    assert _kinds("critical") and _kinds("warning") and _kinds("info")


def test_every_warning_and_critical_kind_fires_an_alert_in_a_promtool_case() -> None:
    cases = yaml.safe_load((ALERTS_YML.parent / "alerts_test.yml").read_text())["tests"]
    fired: dict[str, set[str]] = {}
    for case in cases:
        for check in case["alert_rule_test"]:
            for alert in check.get("exp_alerts") or []:
                fired.setdefault(alert["exp_labels"].get("kind"), set()).add(check["alertname"])
    for kind in _kinds("critical"):
        assert "Replaywatch" + kind.title().replace("_", "") in fired.get(kind, set()), kind
    for kind in _kinds("warning"):
        assert "ReplaywatchWarningFinding" in fired.get(kind, set()), kind


def test_every_critical_finding_kind_has_its_own_alert() -> None:
    alerted = {}
    for rule in _alert_rules():
        match = re.fullmatch(r'replaywatch_finding_active\{job="replaywatch", kind="(\w+)", '
                             r'severity="critical"\} == 1',
                             rule["expr"])
        if match:
            alerted[match.group(1)] = rule
    for kind in _kinds("critical"):
        assert kind in alerted, f"no alert on replaywatch_finding_active{{kind={kind!r}}}"
        rule = alerted[kind]
        assert rule["labels"]["severity"] == "critical"
        assert rule["alert"] == "Replaywatch" + kind.title().replace("_", "")


def test_warning_findings_and_raw_fallbacks_have_alerts() -> None:
    exprs = {rule["expr"]: rule for rule in _alert_rules()}
    warning = exprs['replaywatch_finding_active{job="replaywatch", severity="warning"} == 1']
    assert warning["labels"]["severity"] == "warning"
    assert exprs['up{job="replaywatch"} == 0']["alert"] == "ReplaywatchSidecarDown"
    target_down = next(r for e, r in exprs.items()
                       if e.startswith('replaywatch_target_up{job="replaywatch"} == 0'))
    assert target_down["alert"] == "ReplaywatchTargetDown"
    # ... held while the diagnosis says the server loads or checkpoints
    assert 'kind=~"restoring|checkpointing"' in target_down["expr"]
    rule_errors = exprs['replaywatch_rule_errors{job="replaywatch"} > 0']
    assert (rule_errors["alert"], rule_errors["labels"]["severity"]) == (
        "ReplaywatchRuleErrors", "warning")


def test_every_alert_has_for_severity_annotations_and_a_runbook_that_exists() -> None:
    for rule in _alert_rules():
        name, notes = rule["alert"], rule["annotations"]
        assert re.fullmatch(r"\d+[smh]", rule.get("for", "")), f"{name}: no for:"
        assert rule["labels"]["severity"] in ("critical", "warning"), name
        assert notes["summary"] and notes["description"], name
        if "finding_active" in rule["expr"] or "target_up" in rule["expr"]:
            for text in (notes["summary"], notes["description"]):
                assert "{{ $labels.target }}" in text, f"{name}: target not named"
        if rule["expr"].startswith("replaywatch_finding_active") and "kind=" in rule["expr"]:
            for text in (notes["summary"], notes["description"]):
                assert "{{ $labels.table }}" in text, f"{name}: table not named"
        url = notes["runbook_url"]
        assert url.startswith(RUNBOOK_BASE), f"{name}: {url} is not under {RUNBOOK_BASE}"
        page = url.removeprefix(RUNBOOK_BASE)
        # The warning alert names its runbook by the finding's kind label.
        pages = ([f"{kind}.md" for kind in _kinds("warning")]
                 if page == "{{ $labels.kind }}.md" else [page])
        for page in pages:
            assert (RUNBOOKS / page).is_file(), f"{name}: docs/runbooks/{page} is missing"


def test_runbooks_exist_exactly_for_the_declared_kinds_and_the_sidecar() -> None:
    assert {p.stem for p in RUNBOOKS.glob("*.md")} == set(kinds.BY_NAME) | SIDECAR_RUNBOOKS
    for kind in kinds.ALL:
        assert (ROOT / kind.runbook).is_file(), kind.runbook


def test_every_runbook_title_names_its_kind_and_declared_severity() -> None:
    for kind in kinds.ALL:
        title = (ROOT / kind.runbook).read_text().splitlines()[0]
        assert title.startswith(f"# {kind.name} ({kind.severity.label})"), title


def test_every_runbook_says_what_it_means_how_to_confirm_and_how_to_fix() -> None:
    expected = set(kinds.BY_NAME) | SIDECAR_RUNBOOKS
    for kind in expected:
        text = (RUNBOOKS / f"{kind}.md").read_text()
        for heading in ("## What it means", "## How to confirm", "## How to fix"):
            assert heading in text, f"docs/runbooks/{kind}.md lacks {heading!r}"


# -- the Grafana dashboard --------------------------------------------------------------------

def test_dashboard_has_a_datasource_variable_and_target_and_table_variables() -> None:
    dashboard = load_dashboard()
    assert dashboard["schemaVersion"] >= 39
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name, metric in (("target", "replaywatch_target_up"),
                         ("table", "replaywatch_table_size_items")):
        var = variables[name]
        assert var["type"] == "query"
        assert var["datasource"]["uid"] == "${datasource}"
        assert var["definition"].startswith(f"label_values({metric}")
        assert var["definition"].endswith(f", {name})")


def test_every_panel_has_a_unique_id_a_grid_position_a_unit_and_the_datasource() -> None:
    seen: set[int] = set()
    for panel in panels(load_dashboard()):
        assert panel["id"] not in seen, f"duplicate panel id {panel['id']}"
        seen.add(panel["id"])
        grid = panel["gridPos"]
        assert {"x", "y", "w", "h"} <= grid.keys(), panel["title"]
        assert 0 <= grid["x"] and grid["x"] + grid["w"] <= GRID_COLUMNS, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["fieldConfig"]["defaults"].get("unit"), f"{panel['title']}: no unit"
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], f"{panel['title']}: no queries"
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]
            assert target["expr"].strip(), panel["title"]


def test_panels_do_not_overlap() -> None:
    cells: dict[tuple[int, int], str] = {}
    for panel in panels(load_dashboard()):
        g = panel["gridPos"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{panel['title']!r} overlaps {cells[(x, y)]!r}"
                cells[(x, y)] = panel["title"]


def test_rates_use_rate_interval_and_queries_filter_by_target() -> None:
    for panel, target in panel_targets(load_dashboard()):
        expr = target["expr"]
        for window in re.findall(r"\[([^\]]+)\]", expr):
            assert window == "$__rate_interval", f"{panel['title']}: window [{window}]"
        # The sidecar's own gauges have no target label.
        if "replaywatch_" in expr and not any(m in expr for m in (
                "replaywatch_poll_cycle_duration_seconds", "replaywatch_rule_errors")):
            assert 'target=~"$target"' in expr, f"{panel['title']}: {expr}"
        if "replaywatch_table_" in expr:
            assert 'table=~"$table"' in expr, f"{panel['title']}: {expr}"


def test_the_dashboard_shows_every_metric_the_brief_names() -> None:
    exprs = " ".join(t["expr"] for _, t in panel_targets(load_dashboard()))
    for metric in ("replaywatch_finding_active", "replaywatch_table_inserts_total",
                   "replaywatch_table_samples_total",
                   "replaywatch_table_observed_samples_per_insert",
                   "replaywatch_table_samples_per_insert", "replaywatch_table_rate_limiter_cursor",
                   "replaywatch_table_rate_limiter_min_diff",
                   "replaywatch_table_rate_limiter_max_diff", "replaywatch_table_sample_headroom",
                   "replaywatch_table_insert_headroom", "replaywatch_table_size_items",
                   "replaywatch_table_max_size_items", "replaywatch_table_worker_seconds_total",
                   "replaywatch_probe_blocked_duration_seconds",
                   "replaywatch_probe_next_blocked_seconds_total",
                   "replaywatch_probe_batches_total",
                   "replaywatch_probe_learner_steps_total", "replaywatch_target_up",
                   "replaywatch_probe_up", "replaywatch_poll_duration_seconds"):
        assert metric in exprs, f"no panel shows {metric}"
    # float max (1.8e308) would flatten the band: max_diff is only drawn when finite.
    assert "replaywatch_table_rate_limiter_max_diff{" in exprs
    assert re.search(r"replaywatch_table_rate_limiter_max_diff\{[^}]*\} < 1e300", exprs)


def _rllib_families() -> list[Family]:
    return [f for f in vars(metrics_ray).values() if isinstance(f, Family)]


def test_the_rllib_row_shows_every_family_metrics_ray_exports() -> None:
    row = row_panels(load_dashboard(), RLLIB_ROW)
    exprs = {p["title"]: " ".join(t["expr"] for t in p["targets"]) for p in row}
    shown = " ".join(exprs.values())
    assert len(_rllib_families()) == 6  # actors, restarts, longest call, three counters
    for family in _rllib_families():
        if family.type == "counter":  # a counter is read as a rate, by its exposed name
            assert re.search(rf"rate\({family.name}_total\{{[^}}]*\}}\[", shown), family.name
        else:
            assert re.search(rf"{family.name}\{{", shown), family.name
    sampled_vs_trained = exprs["Env steps sampled vs trained per second"]
    assert "env_steps_sampled_total" in sampled_vs_trained
    assert "env_steps_trained_total" in sampled_vs_trained
    findings = exprs["Findings on RLlib jobs"]
    assert 'table=~"job:.*"' in findings and "replaywatch_finding_active" in findings
    (panel,) = [p for p in row if p["title"] == "Findings on RLlib jobs"]
    for kind in RLLIB_KINDS:
        assert kind.value in panel["description"], kind
    # Nothing outside the row reads an RLlib family: a Reverb job's panels stay full.
    outside = [t["expr"] for p, t in panel_targets(load_dashboard())
               if p not in row and "replaywatch_rllib_" in t["expr"]]
    assert not outside, outside


class _Exposition(BaseHTTPRequestHandler):
    body = b""

    def do_GET(self) -> None:  # noqa: N802  (http.server's name)
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def rllib_exposition() -> Iterator[str]:
    """The sidecar's own /metrics text for a picture with an RLlib job and one of its
    findings, served on loopback; yields host:port."""
    picture = full_picture()
    (snap,) = picture.ray.values()
    finding = Finding(Name.ENV_RUNNER_STALLED, Severity.CRITICAL, snap.target,
                      f"job:{snap.job_id}", "s", {}, "f", 1.0, 2.0)
    picture = dataclasses.replace(picture, findings=(*picture.findings, finding))
    handler = type("Handler", (_Exposition,), {"body": render_published(picture)})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_every_rllib_panel_returns_data_from_the_sidecars_exposition(
    spawn: Callable[..., Proc], tmp_path: Path, rllib_exposition: str,
) -> None:
    config = {"global": {"scrape_interval": "1s"}, "scrape_configs": [
        {"job_name": "replaywatch", "static_configs": [{"targets": [rllib_exposition]}]}]}
    prometheus = Prometheus(spawn, config, tmp_path / "prometheus")
    values = {"target": ".*", "table": ".*"}
    exprs = [(p["title"], substitute(t["expr"], values))
             for p in row_panels(load_dashboard(), RLLIB_ROW) for t in p["targets"]]
    assert len(exprs) >= 6

    def empty() -> list[str]:
        return [f"{title}: {expr}" for title, expr in exprs if not prometheus.query(expr)]

    # rate() needs two scrapes in its window: wait for them rather than fail on the first.
    try:
        wait_until(lambda: not empty(), timeout_s=30, interval_s=0.5)
    except TimeoutError:
        pytest.fail("RLlib panels without data:\n" + "\n".join(empty()))


def test_every_dashboard_expression_parses_in_a_real_prometheus(
    spawn: Callable[..., Proc], tmp_path: Path,
) -> None:
    config = {"global": {"scrape_interval": "15s"}, "scrape_configs": []}
    prometheus = Prometheus(spawn, config, tmp_path / "prometheus")
    assert prometheus.api("query", query="rate(x[")[0] == 400  # a parse error is a 400
    dashboard = load_dashboard()
    values = {"target": ".*", "table": ".*"}
    exprs = [(p["title"], substitute(t["expr"], values)) for p, t in panel_targets(dashboard)]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":  # label_values(metric, label): the metric must parse
            inner = re.fullmatch(r"label_values\((.+), \w+\)", variable["definition"])
            assert inner, variable["definition"]
            exprs.append((f"${variable['name']}", substitute(inner.group(1), values)))
    failures = []
    for title, expr in exprs:
        status, body = prometheus.api("query", query=expr)
        if status != 200:
            failures.append(f"{title}: {expr}: HTTP {status} {body}")
    assert not failures, "\n".join(failures)


# -- Grafana provisioning -------------------------------------------------------------------

def _compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE_YML.read_text())


def _mounts(service: dict[str, Any]) -> dict[str, str]:
    """container path -> host path (relative to the repo) of the service's bind mounts."""
    out = {}
    for volume in service.get("volumes", []):
        host, container = volume.split(":")[:2]
        if host.startswith("./"):
            out[container] = host
    return out


def test_grafana_provisioning_opens_the_mounted_dashboard_on_the_compose_prometheus() -> None:
    grafana = _compose()["services"]["grafana"]
    mounts = _mounts(grafana)
    provisioning = DASHBOARDS / "grafana" / "provisioning"
    provider = yaml.safe_load((provisioning / "dashboards" / "replaywatch.yml").read_text())
    path = provider["providers"][0]["options"]["path"]
    assert mounts[f"{path}/replaywatch.json"] == "./dashboards/grafana/replaywatch.json"
    env = grafana["environment"]
    assert env["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"] == f"{path}/replaywatch.json"
    assert env["GF_AUTH_ANONYMOUS_ENABLED"] == "true"
    assert env["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"
    datasources = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())
    (source,) = datasources["datasources"]
    assert source["type"] == "prometheus" and source["isDefault"] is True
    assert source["url"] == "http://prometheus:9090"
    assert mounts["/etc/grafana/provisioning/datasources"].endswith("provisioning/datasources")
    assert mounts["/etc/grafana/provisioning/dashboards"].endswith("provisioning/dashboards")


# -- docker-compose and the Dockerfile, offline -----------------------------------------------

def test_compose_file_passes_docker_compose_config_offline(tmp_path: Path) -> None:
    # `config` only parses and validates; it does not talk to a Docker engine.
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    result = subprocess.run([DOCKER_COMPOSE, "-f", str(COMPOSE_YML), "config", "-q"],
                            cwd=ROOT, capture_output=True, text=True, timeout=60, env=env)
    # A problem in the file is one "ERROR: ..." line; a traceback is docker-compose itself
    # failing (the structural tests below still run).
    if result.returncode != 0 and "Traceback (most recent call last)" in result.stderr:
        pytest.skip(f"docker-compose itself fails here: {result.stderr[-300:]}")
    assert result.returncode == 0, result.stderr


def test_compose_mounts_and_builds_only_files_that_exist() -> None:
    compose = _compose()
    for name, service in compose["services"].items():
        for container, host in _mounts(service).items():
            assert (ROOT / host).exists(), f"{name}: mounts missing {host} at {container}"
        if "build" in service:
            build = service["build"]
            assert (ROOT / build["context"] / build.get("dockerfile", "Dockerfile")).is_file()
    for line in DOCKERFILE.read_text().splitlines():
        if line.startswith("COPY "):
            for source in line.split()[1:-1]:
                assert (ROOT / source).exists(), f"Dockerfile copies missing {source}"
    assert "FROM python:3.11-slim" in DOCKERFILE.read_text()
    assert "pip install -c constraints.txt -e '.[agents]'" in DOCKERFILE.read_text()


def test_compose_wires_trainer_sidecar_prometheus_alertmanager_and_grafana() -> None:
    services = _compose()["services"]
    assert set(services) == {"trainer", "replaywatch", "prometheus", "alertmanager", "grafana"}
    for name, service in services.items():
        assert service["healthcheck"]["test"], f"{name}: no healthcheck"
    trainer = " ".join(services["trainer"]["command"])
    assert "-m agents.run --mode sync" in trainer
    assert "--reverb-port 8000" in trainer and "--probe-listen 0.0.0.0:8001" in trainer
    sidecar = " ".join(services["replaywatch"]["command"])
    assert "--reverb trainer:8000" in sidecar
    assert "--probe trainer:8000=http://trainer:8001" in sidecar
    assert "--listen 0.0.0.0:9321" in sidecar
    prometheus = yaml.safe_load(PROMETHEUS_YML.read_text())
    (job,) = [j for j in prometheus["scrape_configs"] if j["job_name"] == "replaywatch"]
    assert job["static_configs"][0]["targets"] == ["replaywatch:9321"]
    assert prometheus["rule_files"] == ["alerts.yml"]
    (am,) = prometheus["alerting"]["alertmanagers"]
    assert am["static_configs"][0]["targets"] == ["alertmanager:9093"]
    mounts = _mounts(services["prometheus"])
    assert mounts["/etc/prometheus/prometheus.yml"] == "./dashboards/prometheus/prometheus.yml"
    assert mounts["/etc/prometheus/alerts.yml"] == "./dashboards/prometheus/alerts.yml"
    assert (_mounts(services["alertmanager"])["/etc/alertmanager/alertmanager.yml"]
            == "./dashboards/alertmanager/alertmanager.yml")


def test_dashboard_json_is_what_compose_and_the_readme_name() -> None:
    assert DASHBOARD_JSON.is_file()
    readme = (DASHBOARDS / "README.md").read_text()
    for path in ("dashboards/grafana/replaywatch.json", "dashboards/prometheus/alerts.yml"):
        assert path in readme
