"""The command line: flags, environment and config file -> WatchConfig -> a command.

`replaywatch watch` serves the API and metrics while polling in the background;
`replaywatch check` polls for a few seconds and prints what it saw. Both build
their parts in replaywatch.wiring. `replaywatch predict` runs the budget model on a
configuration before the job starts. `replaywatch bundle` saves a running sidecar's
evidence, `analyze` re-derives a bundle's verdict offline and `report` writes it as
Markdown. Bad input is one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from replaywatch import config as cfg
from replaywatch.analyze import add_arguments as add_analyze_arguments
from replaywatch.analyze import run_analyze
from replaywatch.check import run_check
from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.errors import ConfigError
from replaywatch.fetch_bundle import add_arguments as add_fetch_arguments
from replaywatch.fetch_bundle import run_fetch
from replaywatch.model import DeclaredLayout
from replaywatch.predict import add_arguments as add_predict_arguments
from replaywatch.predict import run_predict
from replaywatch.probe.protocol import Gate, Layout
from replaywatch.report import add_arguments as add_report_arguments
from replaywatch.report import run_report
from replaywatch.shards import parse_shard


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error in one line, exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _bool(text: str) -> bool:
    try:
        return cfg.parse_bool(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0 or value != value or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive number")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value


def _add_source_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--reverb", action="append", default=[], metavar="HOST:PORT",
                   help="a Reverb server to watch (repeatable)")
    p.add_argument("--probe", action="append", default=[], metavar="[TARGET=]URL",
                   help="a TrainerProbe or ActorProbe URL (its documents say which); TARGET= "
                        "names its Reverb server (repeatable)")
    p.add_argument("--ray", action="append", default=[], metavar="HOST:PORT",
                   help="an RLlib job's Ray cluster: its dashboard's address, as `ray job "
                        "submit` takes it (repeatable); nothing changes in the job")
    p.add_argument("--ray-token-file", metavar="FILE",
                   help="the cluster's auth token (default: RAY_AUTH_TOKEN, "
                        "RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token, as Ray reads it)")
    p.add_argument("--ray-temp-dir", default="/tmp/ray", metavar="DIR",
                   help="Ray's temp dir on this host, where the head lists its metrics "
                        "endpoints (default /tmp/ray)")
    p.add_argument("--ray-job", metavar="JOB_ID",
                   help="the job to watch (default: the newest with a live RLlib actor); "
                        "`all`: every RLlib job on the cluster, each a target of its own, "
                        "found every 10 s")
    p.add_argument("--ray-job-ttl", type=_positive_float, default=600.0, metavar="SECONDS",
                   help="with --ray-job all: how long a job whose RLlib actors all died stays "
                        "watched, then its incidents close as gone (default 600)")
    p.add_argument("--ray-results", metavar="PATH|URL",
                   help="the job's result.json, or a directory holding one (Tune's), or the "
                        "URL of an RLlibProbe in its driver (replaywatch.probe.rllib); with "
                        "--ray-job all, the directory every job's result.json is under, each "
                        "job reading its own")
    p.add_argument("--reverb-pid", action="append", default=[], metavar="[TARGET=]PID",
                   help="the Reverb server's process, for its memory and limit (default: the "
                        "process listening on a local target's port)")
    p.add_argument("--interval", type=_positive_float, default=1.0, metavar="SECONDS",
                   help="poll interval (default 1.0)")
    p.add_argument("--timeout", type=_positive_float, default=None, metavar="SECONDS",
                   help="per-poll deadline (default 80%% of the interval, at most 5 s)")
    p.add_argument("--config", metavar="FILE", help="TOML file with a [thresholds] table")
    p.add_argument("--layout", choices=tuple(Layout), default=None,
                   help="the job's layout, for jobs whose probes cannot say it: sync (insert "
                        "blocking disabled), sync-ratio (one loop, finite max_diff), async, "
                        "async-lag (actors wait on the learner)")
    p.add_argument("--gate", choices=[g.replace("_", "-") for g in Gate], default=None,
                   help="when a synchronous loop calls next(): only while can_sample(batch) "
                        "(Acme's LocalLayout), or on a schedule (TF-Agents' collect and train, "
                        "Acme's older Agent); unsaid, the probe's or both are judged")
    p.add_argument("--inserts-per-step", type=_positive_float, default=None, metavar="K",
                   help="with --gate schedule: inserts between learner steps")
    p.add_argument("--first-step-at", type=int, default=None, metavar="M",
                   help="with --gate schedule: items in the table at the first learner step")
    _add_threshold_flags(p)


def _add_threshold_flags(p: argparse.ArgumentParser) -> None:
    """`--stall-window-s 30` and the like, one per threshold (hidden from --help)."""
    for name in Thresholds.field_names():
        default = getattr(Thresholds(), name)
        kind = (_bool if isinstance(default, bool) else int if isinstance(default, int)
                else _positive_float)
        p.add_argument(f"--{name.replace('_', '-')}", dest=f"th_{name}", type=kind,
                       default=None, help=argparse.SUPPRESS)


def threshold_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The thresholds `--config FILE` and the threshold flags set (flags win)."""
    overrides: dict[str, Any] = cfg.load_config_file(args.config) if args.config else {}
    overrides.update(cfg.threshold_overrides(
        [(n, getattr(args, f"th_{n}")) for n in Thresholds.field_names()]
    ))
    return overrides


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="replaywatch", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    watch = sub.add_parser("watch", help="watch a job and serve the API, /metrics and the page")
    _add_source_flags(watch)
    watch.add_argument("--listen", default="127.0.0.1:9321", metavar="HOST:PORT")
    watch.add_argument("--metrics-listen", metavar="HOST:PORT",
                       help="also serve /metrics from a process of its own on this address, "
                            "its answer time independent of the sidecar's load (a fleet of "
                            "hundreds of targets); --protect-metrics applies there too")
    watch.add_argument("--history", type=_positive_float, default=900.0, metavar="SECONDS",
                       help="history kept per table (default 900 = 15 minutes)")
    watch.add_argument("--db", metavar="PATH", help="incident log (SQLite) path")
    watch.add_argument("--targets-file", metavar="PATH",
                       help="more targets in Prometheus file_sd format (JSON/YAML), reloaded")
    watch.add_argument("--shard", metavar="I/N",
                       help="poll only the targets whose stable hash is I mod N: N sidecars "
                            "given the same list split it, each target polled once")
    watch.add_argument("--kubernetes", metavar="SELECTOR",
                       help="the Reverb servers and probes of the pods this label selector "
                            "picks (container ports named reverb and rw-probe), followed as "
                            "pods come and go; in a pod, through its service account")
    watch.add_argument("--kube-namespace", metavar="NS",
                       help="the pods' namespace (default: the sidecar pod's own; all: every "
                            "namespace)")
    watch.add_argument("--kube-api", metavar="URL",
                       help="the API's URL where the sidecar is not in a pod, e.g. "
                            "http://127.0.0.1:8001 from `kubectl proxy`")
    watch.add_argument("--kube-token-file", metavar="FILE",
                       help="a bearer token for --kube-api (in a pod: the service account's)")
    watch.add_argument("--kube-job-label", default=cfg.JOB_LABEL, metavar="LABEL",
                       help=f"the pod label that names its job (default {cfg.JOB_LABEL}; "
                            "else the pod's controller)")
    watch.add_argument("--kube-ttl", type=_positive_float, default=cfg.POD_TTL_S,
                       metavar="SECONDS",
                       help="how long a failed pod stays watched (default 600)")
    watch.add_argument("--bundle-dir", metavar="DIR",
                       help="where a bundle is written when a critical finding opens "
                            "(default: bundles/ next to --db)")
    watch.add_argument("--bundle-keep", type=int, default=20, metavar="N",
                       help="the newest N bundles kept (default 20; 0: none written)")
    watch.add_argument("--trainer-pid", type=int, metavar="PID",
                       help="take py-spy stacks of this trainer when a critical finding opens")
    watch.add_argument("--token-file", metavar="FILE",
                       help="bearer token for the API and page (or REPLAYWATCH_TOKEN)")
    watch.add_argument("--protect-metrics", action="store_true",
                       help="require the token on /metrics too")
    watch.add_argument("--protect-healthz", action="store_true",
                       help="require the token on /healthz and /readyz too")
    watch.add_argument("--max-in-flight", type=_positive_int, default=256, metavar="N",
                       help="connections and requests served at once; more get 503 "
                            "(default 256), so a flood of clients cannot grow memory")
    watch.add_argument("--log-level", default="info",
                       choices=["debug", "info", "warning", "error"])
    check = sub.add_parser("check", help="poll for a while and print what is wrong")
    _add_source_flags(check)
    check.add_argument("--duration", type=_positive_float, default=10.0, metavar="SECONDS")
    check.add_argument("--json", action="store_true", help="print one JSON document")
    predict = sub.add_parser("predict", help="will this configuration hang? (before it starts)")
    add_predict_arguments(predict)
    fetch = sub.add_parser("bundle", help="save a running sidecar's evidence to a file")
    add_fetch_arguments(fetch)
    analyze = sub.add_parser("analyze", help="re-derive a bundle's verdict offline")
    add_analyze_arguments(analyze)
    analyze.add_argument("--config", metavar="FILE", help="TOML file with a [thresholds] "
                         "table: re-judge under these instead of the bundle's")
    _add_threshold_flags(analyze)
    report = sub.add_parser("report", help="a bundle as Markdown for an issue tracker")
    add_report_arguments(report)
    return parser


def config_from_args(args: argparse.Namespace, environ: dict[str, str]) -> cfg.WatchConfig:
    """The one place flags, environment and config file become a WatchConfig."""
    thresholds = cfg.thresholds_from(threshold_overrides(args))
    targets = tuple(cfg.parse_address(a, "--reverb") for a in args.reverb)
    probes = tuple(cfg.parse_probe(p) for p in args.probe)
    poll = cfg.PollConfig(
        interval_s=args.interval,
        timeout_s=args.timeout,
        history_s=getattr(args, "history", max(900.0, 2 * args.interval)),
    )
    serve = cfg.ServeConfig()
    if args.command == "watch":
        host, port = cfg.parse_listen(args.listen)
        serve = cfg.ServeConfig(
            listen_host=host, listen_port=port,
            token=cfg.read_token(environ, args.token_file),
            protect_metrics=args.protect_metrics,
            protect_healthz=args.protect_healthz,
            max_in_flight=args.max_in_flight,
            metrics_listen=(cfg.parse_listen(args.metrics_listen, "--metrics-listen")
                            if args.metrics_listen else None),
        )
    return cfg.WatchConfig(
        targets=targets, probes=probes, poll=poll, serve=serve, thresholds=thresholds,
        db_path=getattr(args, "db", None), trainer_pid=getattr(args, "trainer_pid", None),
        targets_file=getattr(args, "targets_file", None),
        layout=declared_layout(args),
        bundle_dir=getattr(args, "bundle_dir", None),
        bundle_keep=getattr(args, "bundle_keep", 20),
        reverb_pids=cfg.reverb_pids(getattr(args, "reverb_pid", []), targets),
        ray=ray_targets(args),
        shard=parse_shard(args.shard) if getattr(args, "shard", None) else None,
        kubernetes=kube(args),
    )


def kube(args: argparse.Namespace) -> cfg.KubeTarget | None:
    """--kubernetes and its options, completed from the pod's service account."""
    if not getattr(args, "kubernetes", None):
        for flag in ("kube_namespace", "kube_api", "kube_token_file"):
            if getattr(args, flag, None):
                raise ConfigError(f"--{flag.replace('_', '-')} goes with --kubernetes SELECTOR")
        return None
    from replaywatch.kubernetes_sd import kube_target

    return kube_target(args.kubernetes, args.kube_namespace, args.kube_api,
                       args.kube_token_file, None, args.kube_job_label, args.kube_ttl)


def ray_targets(args: argparse.Namespace) -> tuple[cfg.RayTarget, ...]:
    """--ray and its options: one RayTarget per cluster (the options apply to each)."""
    token = None
    if args.ray_token_file:
        try:
            with open(args.ray_token_file, encoding="utf-8") as f:
                token = f.read().strip() or None
        except OSError as e:
            raise ConfigError(f"--ray-token-file {args.ray_token_file}: {e.strerror}") from None
        if token is None:
            raise ConfigError(f"--ray-token-file {args.ray_token_file} is empty")
    if args.ray_job == cfg.ALL_JOBS and args.ray_results and not os.path.isdir(
            args.ray_results):
        raise ConfigError(f"--ray-results {args.ray_results}: with --ray-job all it is the "
                          "directory every job's result.json is under (each job reads its "
                          "own), not one job's file or probe")
    return tuple(cfg.RayTarget(cfg.parse_ray(a), token, args.ray_temp_dir, args.ray_job,
                               args.ray_results, args.ray_job_ttl) for a in args.ray)


def declared_layout(args: argparse.Namespace) -> str | None:
    """--layout (or the config file's) and the loop's --gate, as one DeclaredLayout spec."""
    from_file = DeclaredLayout.parse(cfg.layout_from_file(args.config) if args.config
                                     else None) or DeclaredLayout()
    if args.gate is None and (args.inserts_per_step is not None
                              or args.first_step_at is not None):
        raise ConfigError("--inserts-per-step and --first-step-at go with --gate schedule")
    said = from_file if args.gate is None else DeclaredLayout(
        None, Gate(args.gate.replace("-", "_")),
        args.inserts_per_step, args.first_step_at)
    try:
        spec = dataclasses.replace(said, kind=args.layout or from_file.kind).spec()
        DeclaredLayout.parse(spec)  # the same checks a config file's spec gets
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return spec or None


def main(argv: Sequence[str] | None = None, environ: dict[str, str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, getattr(args, "log_level", "warning").upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        if args.command == "predict":
            return run_predict(args, sys.stdout)
        if args.command == "analyze":
            return run_analyze(args, threshold_overrides(args), sys.stdout)
        if args.command == "report":
            return run_report(args, sys.stdout)
        if args.command == "bundle":
            return run_fetch(args, dict(os.environ if environ is None else environ),
                             sys.stdout)
        config = config_from_args(args, dict(os.environ if environ is None else environ))
        if args.command == "watch":
            # The one function-level import, on purpose: the web stack (fastapi,
            # pydantic, uvicorn) costs ~0.9 s to import (1.07 s for replaywatch.api
            # against 0.17 s for the poller, on the 2-core CI machine), which every
            # `check`, `--help` and bad command line would otherwise pay.
            from replaywatch.watch import run_watch

            return run_watch(config, args.log_level)
        return run_check(config, args.duration, args.json)
    except ConfigError as e:
        print(f"replaywatch {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0


def entrypoint() -> NoReturn:
    sys.exit(main())


if __name__ == "__main__":
    entrypoint()
