// The replaywatch monitoring mixin: `_config`, `prometheusAlerts`, `grafanaDashboards`.
// Build the checked-in files from it with `python dashboards/mixin/build.py`; see README.md.
(import 'config.libsonnet') +
(import 'alerts.libsonnet') +
(import 'dashboards.libsonnet')
