// replaywatch alerts: the engine's verdict, plus raw fallbacks so a broken engine cannot hide
// an outage.
//
// - One alert per critical finding kind, on replaywatch_finding_active{kind=...}: every kind
//   declared critical in replaywatch/diagnosis/kinds.py (kinds.libsonnet, generated). Its name
//   (prefix + CamelCase kind), expr and runbook_url follow from the kind; `for` is
//   _config.criticalFor.
// - One alert for every warning kind (severity="warning", by the finding's own severity label),
//   slower and not paging: a warning kind needs no entry here. Info kinds have no alert.
// - Raw fallbacks: the sidecar's own scrape (`up`) and the Reverb server's reachability
//   (replaywatch_target_up), which need no diagnosis to be right; and the rules that could
//   not judge (replaywatch_rule_errors), so a broken rule is not taken for a healthy job.
//
// Every alert carries labels.severity (critical or warning) and the annotations summary,
// description, runbook_url (_config.runbookBase + <kind>.md) and dashboard_url
// (_config.dashboardUrl, with the alert's target and table picked in the dashboard's
// variables). The promtool tests of the built rules are in ../prometheus/alerts_test.yml.
//
// A new critical kind needs no edit here: declare it (with its `alert` texts) in kinds.py,
// run `python dashboards/mixin/build.py`, add a promtool case to alerts_test.yml.
{
  local c = $._config,

  // The finding kinds that page, one entry each, from their declaration in
  // replaywatch/diagnosis/kinds.py (kinds.libsonnet, which build.py writes): the kind, its
  // summary and description (name {{ $labels.target }} and {{ $labels.table }}).
  findings:: [
    {
      kind: k.kind,
      severity: 'critical',
      'for': c.criticalFor,
      summary: k.summary,
      description: k.description,
    }
    for k in (import 'kinds.libsonnet')
  ],

  // Every warning kind, by the severity label the sidecar puts on its findings. The runbook is
  // named by the firing finding's kind.
  warnings:: {
    name: 'WarningFinding',
    expr: 'replaywatch_finding_active{%s, severity="warning"} == 1' % c.replaywatchSelector,
    severity: 'warning',
    'for': c.warningFor,
    runbook: '{{ $labels.kind }}',
    dashboardVars: ['target'],  // table is empty for a target-wide warning
    summary: 'replaywatch {{ $labels.kind }}: {{ $labels.target }}{{ with $labels.table }} table {{ . }}{{ end }}',
    description: 'replaywatch reports {{ $labels.kind }} on {{ $labels.target }}{{ with $labels.table }} table {{ . }}{{ end }}. Not a stall yet; the evidence and the fix: GET /api/v1/findings on the sidecar {{ $labels.instance }}.',
  },

  fallbacks:: [
    {
      name: 'SidecarDown',
      expr: 'up{%s} == 0' % c.replaywatchSelector,
      severity: 'critical',
      'for': c.fallbackFor,
      runbook: 'sidecar_down',
      dashboardVars: [],  // a down sidecar names no target
      summary: 'replaywatch sidecar {{ $labels.instance }} is down',
      description: 'Prometheus cannot scrape the replaywatch sidecar at {{ $labels.instance }}: every other replaywatch alert for the targets and tables it watches is silent until it is back.',
    },
    {
      name: 'TargetDown',
      // A server that loads a checkpoint (its port serves once the load ends) or whose table
      // lock a checkpoint its probe saw holds is not down: the diagnosis says so and the
      // page waits for it.
      expr: 'replaywatch_target_up{%s} == 0 unless on (instance, target) replaywatch_finding_active{%s, kind=~"restoring|checkpointing"} == 1' % [c.replaywatchSelector, c.replaywatchSelector],
      severity: 'critical',
      'for': c.fallbackFor,
      runbook: 'target_down',
      dashboardVars: ['target'],
      summary: 'Reverb server {{ $labels.target }} does not answer',
      description: 'The replaywatch sidecar {{ $labels.instance }} cannot reach the Reverb server {{ $labels.target }}: none of its tables can be sampled or inserted into, and none is diagnosed while it is down.',
    },
    // A rule that raises costs its own finding (the others still judge): the verdicts this
    // sidecar sends are then incomplete, which must not stay silent. A replaywatch bug, not
    // the job's: a warning, not a page.
    // Sidecars sharding one list (--shard I/N): summed over them, the targets they own must be
    // the list. Less: a shard is down or was given another N or another list; more: two own
    // the same target. Either way some target is watched twice or not at all.
    {
      name: 'ShardsDisagree',
      expr: 'sum(replaywatch_targets{%s, state="owned"}) != max(sum by (instance) (replaywatch_targets{%s}))' % [c.replaywatchSelector, c.replaywatchSelector],
      severity: 'warning',
      'for': c.warningFor,
      runbook: 'shards_disagree',
      dashboardVars: [],
      summary: 'replaywatch shards own {{ $value }} targets, not their list',
      description: 'The replaywatch sidecars run with --shard own, summed over them, another number of targets than the list they were given: a shard is down, or the shards were given another N or another list. Some target is watched by no sidecar, or by two. Compare replaywatch_shard_index, replaywatch_shard_count and replaywatch_targets across the instances.',
    },
    {
      name: 'RuleErrors',
      expr: 'replaywatch_rule_errors{%s} > 0' % c.replaywatchSelector,
      severity: 'warning',
      'for': c.warningFor,
      runbook: 'rule_errors',
      dashboardVars: [],
      summary: 'replaywatch sidecar {{ $labels.instance }}: {{ $value }} rule(s) cannot judge',
      description: 'A diagnosis rule of the replaywatch sidecar {{ $labels.instance }} raises at every poll: the finding it would give is missing, so its silence is not a verdict. The rule and its error: GET /api/v1/findings (rule_errors) on the sidecar, or its log.',
    },
  ],

  local camel(kind) = std.join('', [std.asciiUpper(w[0]) + w[1:] for w in std.split(kind, '_')]),

  // Grafana opens the dashboard on the alert's target and table (its `var-` URL parameters).
  local dashboardUrl(vars) =
    c.dashboardUrl + (
      if vars == [] then ''
      else '?' + std.join('&', ['var-%s={{ $labels.%s | urlquery }}' % [v, v] for v in vars])
    ),

  // One entry -> one Prometheus rule; defaults derive name, expr and runbook from the kind.
  local rule(entry) =
    local e = {
      name: camel(entry.kind),
      // The finding's own severity: a kind that pages may also be said as a warning.
      expr: 'replaywatch_finding_active{%s, kind="%s", severity="critical"} == 1' % [c.replaywatchSelector, entry.kind],
      runbook: entry.kind,
      dashboardVars: ['target', 'table'],
    } + entry;
    assert std.member(['critical', 'warning'], e.severity) : e.name + ': severity must be critical or warning';
    {
      alert: c.alertPrefix + e.name,
      expr: e.expr,
      'for': e['for'],
      labels: { severity: e.severity },
      annotations: {
        summary: e.summary,
        description: e.description,
        runbook_url: c.runbookBase + e.runbook + '.md',
        dashboard_url: dashboardUrl(e.dashboardVars),
      },
    },

  prometheusAlerts+:: {
    groups+: [
      {
        name: 'replaywatch-findings',
        rules: std.map(rule, $.findings + [$.warnings]),
      },
      {
        name: 'replaywatch-fallbacks',
        rules: std.map(rule, $.fallbacks),
      },
    ],
  },
}
