"""The monitoring mixin (dashboards/mixin/) is the source of the alert rules: its output, by the
Debian `jsonnet`, equals the checked-in alerts.yml and dashboard, covers the declared kinds, and
follows the mixin conventions (one CamelCase prefix, severity, four annotations).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.procs import ROOT
from replaywatch.diagnosis import kinds
from tests.support.monitoring import ALERTS_YML, DASHBOARD_JSON, load_dashboard

pytestmark = pytest.mark.slow  # runs jsonnet and jsonnetfmt, Debian's (about 2 s in all)

MIXIN = ROOT / "dashboards" / "mixin"
RUNBOOKS = ROOT / "docs" / "runbooks"
sys.path.insert(0, str(MIXIN))
import build  # noqa: E402  (dashboards/mixin/build.py: not a package, a script)

ANNOTATIONS = {"summary", "description", "runbook_url", "dashboard_url"}
# Overrides a user could set, each different from the default, to see that _config is applied.
OVERRIDES = """{
  replaywatchSelector: 'job="rw-sidecar", namespace="rl"',
  alertPrefix: 'Rw',
  criticalFor: '3m',
  runbookBase: 'https://runbooks.example/rw/',
  grafanaUrl: 'https://grafana.example',
  dashboardUid: 'rw-uid',
  dashboardTitle: 'RW',
  dashboardTags: ['rl'],
  datasourceRegex: 'prom-.*',
}"""


def _output(config: str = "{}") -> dict[str, Any]:
    mixin = f"(import 'mixin.libsonnet') + {{ _config+:: {config} }}"
    out: dict[str, Any] = build.evaluate(
        f"local m = {mixin}; {{config: m._config, alerts: m.prometheusAlerts, "
        "dashboards: m.grafanaDashboards}")
    return out


@pytest.fixture(scope="module")
def built() -> dict[str, Any]:
    return _output()


@pytest.fixture(scope="module")
def overridden() -> dict[str, Any]:
    return _output(OVERRIDES)


def _rules(alerts: dict[str, Any]) -> list[dict[str, Any]]:
    return [rule for group in alerts["groups"] for rule in group["rules"]]


def _declared(severity: str) -> set[str]:
    return {k.name for k in kinds.ALL if k.severity.label == severity}


def _camel(kind: str) -> str:
    return "".join(word.capitalize() for word in kind.split("_"))


# -- the mixin's output is the checked-in files ---------------------------------------------

def test_the_built_alerts_equal_the_checked_in_alerts_yml(built: dict[str, Any]) -> None:
    assert built["alerts"] == yaml.safe_load(ALERTS_YML.read_text())


def test_alerts_yml_is_byte_for_byte_what_build_py_writes_and_says_so() -> None:
    assert build.main(["--check"]) == 0, "alerts.yml is stale: python dashboards/mixin/build.py"
    text = ALERTS_YML.read_text()
    assert text.startswith("# GENERATED") and build.COMMAND in text.splitlines()[1]


def test_the_built_dashboard_equals_the_checked_in_json(built: dict[str, Any]) -> None:
    assert list(built["dashboards"]) == [DASHBOARD_JSON.name]
    assert built["dashboards"][DASHBOARD_JSON.name] == load_dashboard()


# -- against the declared kinds and the runbooks --------------------------------------------

def test_every_critical_kind_has_its_own_alert_and_warnings_have_theirs(
        built: dict[str, Any]) -> None:
    config, rules = built["config"], _rules(built["alerts"])
    by_name = {rule["alert"]: rule for rule in rules}
    assert _declared("critical") and _declared("warning")  # else this proves nothing
    for kind in _declared("critical"):
        rule = by_name.get(f"{config['alertPrefix']}{_camel(kind)}")
        assert rule, f"critical kind {kind} has no alert: add one in dashboards/mixin/"
        assert f'kind="{kind}"' in rule["expr"] and rule["labels"]["severity"] == "critical"
    (warning,) = [r for r in rules if 'severity="warning"' in r["expr"]]
    assert warning["labels"]["severity"] == "warning"
    assert warning["annotations"]["runbook_url"].endswith("{{ $labels.kind }}.md")


def test_a_kind_alert_has_its_kinds_declared_severity(built: dict[str, Any]) -> None:
    for rule in _rules(built["alerts"]):
        match = re.search(r'\bkind="(\w+)"', rule["expr"])
        if match:
            declared = kinds.BY_NAME[match.group(1)].severity.label
            assert rule["labels"]["severity"] == declared, rule["alert"]


# -- mixin conventions ------------------------------------------------------------------------

def test_names_labels_and_annotations_follow_the_mixin_conventions(built: dict[str, Any]) -> None:
    config, rules = built["config"], _rules(built["alerts"])
    assert config["alertPrefix"] == "Replaywatch"
    assert len({rule["alert"] for rule in rules}) == len(rules), "duplicate alert names"
    for rule in rules:
        name = rule["alert"]
        assert re.fullmatch(r"Replaywatch(?:[A-Z][a-z0-9]*)+", name), f"{name}: not CamelCase"
        assert rule["labels"]["severity"] in ("critical", "warning"), name
        assert re.fullmatch(r"\d+[smh]", rule["for"]), name
        assert config["replaywatchSelector"] in rule["expr"], f"{name}: no job selector"
        notes = rule["annotations"]
        assert set(notes) == ANNOTATIONS, name
        assert all(notes[key].strip() for key in ANNOTATIONS), name
        assert notes["dashboard_url"].startswith(config["dashboardUrl"]), name
        url = notes["runbook_url"]
        assert url.startswith(config["runbookBase"]), name
        page = url.removeprefix(config["runbookBase"])
        pages = ([f"{k}.md" for k in _declared("warning")]
                 if page == "{{ $labels.kind }}.md" else [page])
        for page in pages:
            assert (RUNBOOKS / page).is_file(), f"{name}: docs/runbooks/{page} is missing"


def test_the_mixin_sources_are_jsonnetfmt_formatted() -> None:
    sources = sorted(str(p) for p in MIXIN.glob("*.libsonnet"))
    done = subprocess.run(["jsonnetfmt", "--test", *sources], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0, (f"not formatted: run jsonnetfmt -i dashboards/mixin/*.libsonnet"
                                  f"\n{done.stderr}")


def test_dashboard_url_opens_the_checked_in_dashboard(built: dict[str, Any]) -> None:
    config = built["config"]
    assert config["dashboardUrl"] == f"{config['grafanaUrl']}/d/{load_dashboard()['uid']}"


# -- _config is applied, not only declared ----------------------------------------------------

def test_config_overrides_reach_every_alert(overridden: dict[str, Any]) -> None:
    rules = _rules(overridden["alerts"])
    for rule in rules:
        assert rule["alert"].startswith("Rw") and not rule["alert"].startswith("Replaywatch")
        assert 'job="rw-sidecar", namespace="rl"' in rule["expr"], rule["alert"]
        assert 'job="replaywatch"' not in rule["expr"], rule["alert"]
        notes = rule["annotations"]
        assert notes["runbook_url"].startswith("https://runbooks.example/rw/")
        assert notes["dashboard_url"].startswith("https://grafana.example/d/rw-uid")
    starved = {r["alert"]: r for r in rules}["RwWorkerStarvation"]
    assert starved["for"] == "3m"


def test_config_overrides_reach_the_dashboard(overridden: dict[str, Any]) -> None:
    dashboard = overridden["dashboards"][DASHBOARD_JSON.name]
    assert (dashboard["uid"], dashboard["title"], dashboard["tags"]) == ("rw-uid", "RW", ["rl"])
    (datasource,) = [v for v in dashboard["templating"]["list"] if v["type"] == "datasource"]
    assert datasource["regex"] == "prom-.*"
    text = str(dashboard["panels"])
    assert 'up{job="rw-sidecar", namespace="rl"}' in text and 'job="replaywatch"' not in text


def test_build_check_names_the_command_when_alerts_yml_is_stale(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    stale = tmp_path / "alerts.yml"
    stale.write_text(ALERTS_YML.read_text().replace("for: 1m", "for: 90s", 1))
    monkeypatch.setattr(build, "ALERTS", stale)
    monkeypatch.setattr(build, "ROOT", tmp_path)
    assert build.main(["--check"]) == 1
    assert build.COMMAND in capsys.readouterr().err
    assert "for: 90s" in stale.read_text()  # --check writes nothing


def test_a_jsonnet_error_is_one_line_and_exit_2(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(build, "mixin", lambda field: build.evaluate("{} + 1"))
    assert build.main(["--check"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("build.py: error: jsonnet failed") and err.count("\n") == 1
