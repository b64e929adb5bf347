// The dashboard is kept as Grafana's own JSON (dashboards/grafana/replaywatch.json), edited in
// Grafana and exported; the mixin imports it and applies `_config` (why: README.md). With the
// default `_config` the result equals the file (tests/test_mixin.py).
local dashboard = import '../grafana/replaywatch.json';
local defaultSelector = 'job="replaywatch"';

{
  local c = $._config,

  // The sidecar's job selector, wherever the JSON spells the default one.
  local selected(target) =
    if std.objectHas(target, 'expr')
    then target { expr: std.strReplace(target.expr, defaultSelector, c.replaywatchSelector) }
    else target,

  local panel(p) = p + (
    if std.objectHas(p, 'targets') then { targets: std.map(selected, p.targets) } else {}
  ) + (
    if std.objectHas(p, 'panels') then { panels: std.map(panel, p.panels) } else {}
  ),

  local variable(v) =
    if v.type == 'datasource' then v { regex: c.datasourceRegex } else v,

  grafanaDashboards+:: {
    'replaywatch.json': dashboard {
      uid: c.dashboardUid,
      title: c.dashboardTitle,
      tags: c.dashboardTags,
      panels: std.map(panel, dashboard.panels),
      templating+: { list: std.map(variable, dashboard.templating.list) },
    },
  },
}
