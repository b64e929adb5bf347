// Everything a user of the mixin may want to change, in one place. Override it when you
// import the mixin, e.g. (import 'mixin.libsonnet') + { _config+:: { grafanaUrl: '...' } }.
// The defaults build exactly the checked-in dashboards/prometheus/alerts.yml and
// dashboards/grafana/replaywatch.json (tests/test_mixin.py).
{
  _config+:: {
    // Selects the sidecar's scrape job. Every alert and the dashboard's sidecar panel use it;
    // the compose Prometheus and the Kubernetes PodMonitor both name the job `replaywatch`.
    replaywatchSelector: 'job="replaywatch"',

    // Alert names are this prefix + the finding kind in CamelCase (worker_starvation ->
    // ReplaywatchWorkerStarvation), as mixins share one prefix per project.
    alertPrefix: 'Replaywatch',

    // How long a condition must hold before the alert fires. Critical findings: 1m, since the
    // sidecar has already waited its stall window (10 s by default) before naming the stall,
    // and a minute rides out a finding that opens and closes at once. Warnings are slower and
    // do not page: 5m. Raw fallbacks (scrape and Reverb reachability): 2m, past a blip.
    criticalFor: '1m',
    warningFor: '5m',
    fallbackFor: '2m',

    // runbook_url is runbookBase + '<kind>.md'; every kind has a page in docs/runbooks/.
    // To point the links at a fork, change this one string and rebuild.
    runbookBase: 'https://github.com/replaywatch/replaywatch/blob/main/docs/runbooks/',

    // dashboard_url: the replaywatch dashboard in your Grafana. The default is the compose
    // stack's Grafana (docker-compose.yml publishes it on 127.0.0.1:3000).
    grafanaUrl: 'http://localhost:3000',
    dashboardUrl: '%s/d/%s' % [self.grafanaUrl, self.dashboardUid],

    // The dashboard (dashboards/grafana/replaywatch.json), as Grafana identifies it.
    dashboardUid: 'replaywatch',
    dashboardTitle: 'replaywatch: Reverb replay and learner',
    dashboardTags: ['replaywatch', 'reverb', 'rl'],
    // Which Prometheus data sources the dashboard's `datasource` variable offers (Grafana's
    // instance-name filter, a regex; empty: all of them).
    datasourceRegex: '',
  },
}
