// replaywatch alerts: the engine's verdict, plus raw fallbacks so a broken engine cannot hide
// an outage.
//
// - One alert per critical finding kind, on replaywatch_finding_active{kind=...}: an entry in
//   `findings` below. Its name (prefix + CamelCase kind), expr and runbook_url follow from the
//   kind; `for` is _config.criticalFor.
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
// To add an alert for a new critical kind: add an entry to `findings`, run
// `python dashboards/mixin/build.py`, add a promtool case to alerts_test.yml.
{
  local c = $._config,

  // The finding kinds that page, one entry each:
  //   kind         the kind as declared in replaywatch/diagnosis/kinds.py
  //   severity     'critical' (its declared severity)
  //   for          how long the finding must stay open
  //   summary      one line; name {{ $labels.target }} and {{ $labels.table }}
  //   description  what stopped and where the evidence is; same labels
  findings:: [
    {
      kind: 'worker_starvation',
      severity: 'critical',
      'for': c.criticalFor,
      summary: 'Learner starved by its batching workers: {{ $labels.target }} table {{ $labels.table }}',
      description: 'The learner reading table {{ $labels.table }} on {{ $labels.target }} has been blocked in next() while parallel batching workers hold samples that no batch completes; training has stopped. Evidence and the fix: GET /api/v1/findings on the sidecar {{ $labels.instance }}.',
    },
    {
      kind: 'sample_blocked',
      severity: 'critical',
      'for': c.criticalFor,
      summary: 'Sampling blocked, inserts stopped: {{ $labels.target }} table {{ $labels.table }}',
      description: 'The rate limiter of table {{ $labels.table }} on {{ $labels.target }} refuses samples and no actor inserts: the actors are dead, stuck or too slow, and the learner waits. Evidence and the fix: GET /api/v1/findings on the sidecar {{ $labels.instance }}.',
    },
    {
      kind: 'insert_blocked',
      severity: 'critical',
      'for': c.criticalFor,
      summary: 'Inserts blocked at max_diff, sampling stopped: {{ $labels.target }} table {{ $labels.table }}',
      description: 'Actors wait at max_diff on table {{ $labels.table }} of {{ $labels.target }} and the learner draws nothing: the learner stopped consuming. Evidence and the fix: GET /api/v1/findings on the sidecar {{ $labels.instance }}.',
    },
    {
      kind: 'learner_stalled',
      severity: 'critical',
      'for': c.criticalFor,
      summary: 'Learner update step hung: {{ $labels.target }} table {{ $labels.table }}',
      description: 'The learner takes no batch and no step although its iterator on table {{ $labels.table }} of {{ $labels.target }} has data: its update step hangs. The stacks are kept with the incident: GET /api/v1/findings on the sidecar {{ $labels.instance }}.',
    },
    {
      kind: 'batch_exceeds_headroom',
      severity: 'critical',
      'for': c.criticalFor,
      summary: 'Configuration will hang the learner in next(): {{ $labels.target }} table {{ $labels.table }}',
      description: 'Once inserting stops, the rate limiter of table {{ $labels.table }} on {{ $labels.target }} releases fewer samples than one batch (or a policy-lag bound frees less than a batch a step): the learner will block in next() for good. The released samples and the fixes the budget model proves: GET /api/v1/findings on the sidecar {{ $labels.instance }}.',
    },
    {
      kind: 'warmup_impossible',
      severity: 'critical',
      'for': c.criticalFor,
      summary: 'Table can never fill to min_size_to_sample: {{ $labels.target }} table {{ $labels.table }}',
      description: 'Table {{ $labels.table }} on {{ $labels.target }} holds at most max_size items, fewer than its min_size_to_sample: the learner can never sample and the job never starts training. Which number to change to what: GET /api/v1/findings on the sidecar {{ $labels.instance }}.',
    },
    {
      kind: 'writer_stalled',
      severity: 'critical',
      'for': c.criticalFor,
      summary: 'Actor stuck in a Reverb writer call: {{ $labels.target }} table {{ $labels.table }}',
      description: 'An actor writing to table {{ $labels.table }} on {{ $labels.target }} has been inside create_item/flush/end_episode for the stall window while the limiter would accept its inserts (or the server is down): its writer or connection is stuck, not throttled. The call, how long and the items pending: GET /api/v1/findings on the sidecar {{ $labels.instance }}.',
    },
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
      expr: 'replaywatch_target_up{%s} == 0' % c.replaywatchSelector,
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
      expr: 'replaywatch_finding_active{%s, kind="%s"} == 1' % [c.replaywatchSelector, entry.kind],
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
