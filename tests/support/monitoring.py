"""Real Prometheus and Alertmanager for tests, and the dashboard's PromQL with variables filled.

Grafana does not run here, so a dashboard is tested by what it asks Prometheus: every
target expression, with Grafana's variables substituted the way Grafana would, sent to a
real Prometheus (Debian's /usr/bin/prometheus). A parse error is HTTP 400 there.
"""

from __future__ import annotations

import json
import re
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

from harness.procs import ROOT, Proc, free_port, get_json, get_text, wait_until

DASHBOARDS = ROOT / "dashboards"
DASHBOARD_JSON = DASHBOARDS / "grafana" / "replaywatch.json"
PROMETHEUS_YML = DASHBOARDS / "prometheus" / "prometheus.yml"
ALERTS_YML = DASHBOARDS / "prometheus" / "alerts.yml"
ALERTMANAGER_YML = DASHBOARDS / "alertmanager" / "alertmanager.yml"
PROMETHEUS = "/usr/bin/prometheus"
ALERTMANAGER = "/usr/bin/prometheus-alertmanager"

# The rate-limiter panels drop max_diff (and max_diff - cursor) when it is float max, as in
# a synchronous layout; those expressions are empty by design for such a table.
FLOAT_MAX_FILTER = "< 1e300"
# Grafana's built-in interval variables, at values a 1-5 s scrape would give.
BUILTIN_VARIABLES = {"__rate_interval": "1m", "__interval": "15s", "__range": "5m",
                     "__interval_ms": "15000", "__range_s": "300", "__range_ms": "300000"}
_REGEX_SPECIAL = set("\\^$*+?.()|{}[]")


def load_dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD_JSON.read_text())


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, rows' nested panels included (a collapsed row holds its own)."""
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])


def row_panels(dashboard: dict[str, Any], title: str) -> list[dict[str, Any]]:
    """The panels under the row titled `title`: its own if collapsed, else those placed
    between it and the next row, as Grafana draws them."""
    rows = sorted((p["gridPos"]["y"], p) for p in dashboard["panels"] if p["type"] == "row")
    ((y, row),) = [(y, r) for y, r in rows if r["title"] == title]
    if row.get("collapsed"):
        return list(row["panels"])
    below = [y_ for y_, _ in rows if y_ > y]
    end = min(below, default=float("inf"))
    return [p for p in dashboard["panels"]
            if p["type"] != "row" and y < p["gridPos"]["y"] < end]


def grafana_regex_escape(value: str) -> str:
    """A value of a multi-value variable as Grafana writes it into `=~"..."`: regex-escaped,
    with the backslash itself doubled for the PromQL string."""
    return "".join("\\\\" + c if c in _REGEX_SPECIAL else c for c in value)


def substitute(expr: str, values: dict[str, str]) -> str:
    """Fills `$var`, `${var}`, `${var:fmt}` and `[[var]]` from `values` + Grafana's built-ins."""
    known = {**BUILTIN_VARIABLES, **values}

    def fill(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2) or match.group(3)
        if name not in known:
            raise KeyError(f"unknown dashboard variable ${name} in {expr!r}")
        return known[name]

    return re.sub(r"\$\{(\w+)(?::\w+)?\}|\[\[(\w+)\]\]|\$(\w+)", fill, expr)


def panel_targets(dashboard: dict[str, Any]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    for panel in panels(dashboard):
        for target in panel.get("targets", []):
            yield panel, target


class Prometheus:
    """A Prometheus server on a free loopback port with its own storage; kill() to stop."""

    def __init__(self, spawn: Callable[..., Proc], config: dict[str, Any], workdir: Path,
                 extra_files: dict[str, str] | None = None):
        workdir.mkdir(parents=True, exist_ok=True)
        for name, text in (extra_files or {}).items():
            (workdir / name).write_text(text)
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = spawn([PROMETHEUS, f"--config.file={workdir / 'prometheus.yml'}",
                           f"--storage.tsdb.path={workdir / 'data'}",
                           f"--web.listen-address=127.0.0.1:{self.port}"], name="prometheus")
        wait_until(lambda: get_text(f"{self.url}/-/ready", 1.0)[0] == 200, timeout_s=30)

    def api(self, path: str, **params: Any) -> tuple[int, Any]:
        query = urllib.parse.urlencode(params)
        return get_json(f"{self.url}/api/v1/{path}?{query}", timeout_s=10)

    def query(self, expr: str, **params: Any) -> list[dict[str, Any]]:
        status, body = self.api("query", query=expr, **params)
        assert status == 200, f"{expr!r}: HTTP {status} {body}"
        return body["data"]["result"]


class Alertmanager:
    """An Alertmanager on a free loopback port, clustering off (it would bind 0.0.0.0)."""

    def __init__(self, spawn: Callable[..., Proc], config: dict[str, Any], workdir: Path):
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "alertmanager.yml").write_text(yaml.safe_dump(config, sort_keys=False))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = spawn([ALERTMANAGER, f"--config.file={workdir / 'alertmanager.yml'}",
                           f"--storage.path={workdir / 'data'}",
                           f"--web.listen-address=127.0.0.1:{self.port}",
                           "--cluster.listen-address="], name="alertmanager")
        wait_until(lambda: get_text(f"{self.url}/-/ready", 1.0)[0] == 200, timeout_s=30)
