"""A new critical kind, added as CONTRIBUTING says (its declaration and its rule, nothing else),
is diagnosed live, judged the same by `analyze`, pages through a generated alert and is
counted by the dashboard.

The kind lives only in this test: its name in an enum of its own, its `Kind` and its `Rule`
put into `kinds.ALL` and `rules.ALL` for the test's length. A real Reverb server, the
sidecar's own poller and keeper, the mixin built by the Debian jsonnet.
"""

from __future__ import annotations

import enum
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import reverb

from replaywatch import bundle as bd
from replaywatch.config import PollConfig, WatchConfig
from replaywatch.diagnosis import kinds, rules
from replaywatch.diagnosis.case import TableCase, limiter_evidence
from replaywatch.diagnosis.registry import Rule, Shape
from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.model import Finding, Severity
from replaywatch.wiring import build_sidecar

ROOT = Path(__file__).resolve().parents[1]
MIXIN = ROOT / "dashboards" / "mixin"
TABLE = "frozen_table"


class Extra(enum.StrEnum):
    TABLE_FROZEN = "table_frozen"


TABLE_FROZEN = kinds.Kind(
    Extra.TABLE_FROZEN, Severity.CRITICAL, needs_probe=False,  # type: ignore[arg-type]
    meaning="A table named to be frozen exists.", fix="Unfreeze it.")


def is_table_frozen(case: TableCase, th: Thresholds) -> Finding | None:
    """The test's own predicate: the table is the one it made."""
    if case.name != TABLE:
        return None
    return case.finding(TABLE_FROZEN, f"Table '{case.name}' is frozen.",
                        limiter_evidence(case.latest), TABLE_FROZEN.fix,
                        since=case.history[0].observed_at)


@pytest.fixture
def declared(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(kinds, "ALL", (*kinds.ALL[:1], TABLE_FROZEN, *kinds.ALL[1:]))
    monkeypatch.setattr(kinds, "BY_NAME", {k.name: k for k in kinds.ALL})
    monkeypatch.setattr(rules, "ALL", (*rules.ALL,
                                       Rule(TABLE_FROZEN, is_table_frozen, Shape.TABLE_SETTINGS)))
    yield


def test_a_new_critical_kind_needs_only_its_declaration_and_its_rule(
        declared: None, tmp_path: Path) -> None:
    server = reverb.Server([reverb.Table(TABLE, reverb.selectors.Uniform(),
                                         reverb.selectors.Fifo(), 100,
                                         reverb.rate_limiters.MinSize(1))], port=None)
    try:
        config = WatchConfig(targets=(f"127.0.0.1:{server.port}",),
                             poll=PollConfig(interval_s=0.5))
        with build_sidecar(config, incidents_path=str(tmp_path / "i.db")) as sidecar:
            live: tuple[Finding, ...] = ()
            for _ in range(3):
                live = sidecar.poller.tick().findings
            last = sidecar.keeper.last_cycle(config.targets[0])
    finally:
        server.stop()
    (found,) = [f for f in live if f.kind == Extra.TABLE_FROZEN]
    assert found.severity is Severity.CRITICAL and found.table == TABLE
    # analyze replays the cycle to the same verdict.
    assert last is not None
    replayed, errors = bd.judged(last[0])
    assert errors == () and [f.to_document() for f in replayed] == [
        f.to_document() for f in last[1]]
    # The alert: generated from the declaration, through the mixin's own jsonnet.
    alerts = _alerts_with(kinds.ALL, tmp_path)
    (rule,) = [r for g in alerts["groups"] for r in g["rules"]
               if r["alert"] == "ReplaywatchTableFrozen"]
    assert rule["expr"] == ('replaywatch_finding_active{job="replaywatch", kind="table_frozen", '
                            'severity="critical"} == 1')
    assert rule["labels"]["severity"] == "critical"
    assert "A table named to be frozen exists." in rule["annotations"]["description"]
    assert rule["annotations"]["runbook_url"].endswith("/docs/runbooks/table_frozen.md")
    # The dashboard counts critical findings by their severity, whatever their kind.
    board = json.loads((ROOT / "dashboards" / "grafana" / "replaywatch.json").read_text())
    (panel,) = [p for p in _panels(board) if p.get("title") == "Active critical findings"]
    (expr,) = [t["expr"] for t in panel["targets"]]
    assert 'severity="critical"' in expr and "kind" not in expr


def _alerts_with(declared: tuple[kinds.Kind, ...], tmp: Path) -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("mixin_build", MIXIN / "build.py")
    assert spec is not None and spec.loader is not None
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    folder = tmp / "mixin"
    shutil.copytree(MIXIN, folder)
    (folder / "kinds.libsonnet").write_text(build.kinds_libsonnet(declared))
    return build.evaluate("(import 'mixin.libsonnet').prometheusAlerts", folder=folder)


def _panels(board: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for p in board["panels"]:
        out.append(p)
        out += p.get("panels", [])
    return out
