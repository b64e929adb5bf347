"""The composition root: flags -> config -> sources -> poller -> state -> app.

`replaywatch watch` serves the API and metrics while polling in the background;
`replaywatch check` polls for a few seconds and prints what it saw. Bad input is
one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Sequence
from typing import Any, NoReturn

from replaywatch import config as cfg
from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.errors import ConfigError
from replaywatch.history import History
from replaywatch.poller import Poller, SourceBinding, targets_of
from replaywatch.sources.probe import ProbeSource
from replaywatch.sources.reverb import ReverbSource
from replaywatch.state import StateStore
from replaywatch.targets_file import ParsedTargets, TargetsFile

log = logging.getLogger("replaywatch")


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error in one line, exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


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
                   help="a TrainerProbe URL; TARGET= names its Reverb server (repeatable)")
    p.add_argument("--interval", type=_positive_float, default=1.0, metavar="SECONDS",
                   help="poll interval (default 1.0)")
    p.add_argument("--timeout", type=_positive_float, default=None, metavar="SECONDS",
                   help="per-poll deadline (default 80%% of the interval, at most 5 s)")
    p.add_argument("--config", metavar="FILE", help="TOML file with a [thresholds] table")
    for name in Thresholds.field_names():
        kind = int if isinstance(getattr(Thresholds(), name), int) else _positive_float
        p.add_argument(f"--{name.replace('_', '-')}", dest=f"th_{name}", type=kind,
                       default=None, help=argparse.SUPPRESS)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="replaywatch", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    watch = sub.add_parser("watch", help="watch a job and serve the API, /metrics and the page")
    _add_source_flags(watch)
    watch.add_argument("--listen", default="127.0.0.1:9321", metavar="HOST:PORT")
    watch.add_argument("--history", type=_positive_float, default=900.0, metavar="SECONDS",
                       help="history kept per table (default 900 = 15 minutes)")
    watch.add_argument("--db", metavar="PATH", help="incident log (SQLite) path")
    watch.add_argument("--targets-file", metavar="PATH",
                       help="more targets in Prometheus file_sd format (JSON/YAML), reloaded")
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
    return parser


def config_from_args(args: argparse.Namespace, environ: dict[str, str]) -> cfg.WatchConfig:
    """The one place flags, environment and config file become a WatchConfig."""
    overrides: dict[str, Any] = cfg.load_config_file(args.config) if args.config else {}
    overrides.update(cfg.threshold_overrides(
        [(n, getattr(args, f"th_{n}")) for n in Thresholds.field_names()]
    ))
    thresholds = cfg.thresholds_from(overrides)
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
        )
    return cfg.WatchConfig(
        targets=targets, probes=probes, poll=poll, serve=serve, thresholds=thresholds,
        db_path=getattr(args, "db", None), trainer_pid=getattr(args, "trainer_pid", None),
        targets_file=getattr(args, "targets_file", None),
    )


def make_bindings(config: cfg.WatchConfig) -> list[SourceBinding]:
    timeout = config.poll.effective_timeout_s
    bindings = [SourceBinding(ReverbSource(t, timeout), t) for t in config.targets]
    for probe in config.probes:
        assert probe.target is not None  # resolved by WatchConfig
        bindings.append(SourceBinding(ProbeSource(probe.url, timeout), probe.target))
    return bindings


def bindings_from_file(parsed: ParsedTargets, timeout: float) -> list[SourceBinding]:
    out = []
    for entry in parsed.entries:
        out.append(SourceBinding(ReverbSource(entry.address, timeout), entry.address,
                                 entry.labels))
        if entry.probe_url:
            out.append(SourceBinding(ProbeSource(entry.probe_url, timeout), entry.address,
                                     entry.labels))
    return out


def make_reloader(config: cfg.WatchConfig, static: list[SourceBinding]
                  ) -> tuple[list[SourceBinding], Any, Any]:
    """Initial bindings, a reload function and the file's errors, for --targets-file.

    At start an unreadable or shapeless file is a ConfigError (exit 2); bad
    entries are reported and skipped. Later, a broken edit keeps what runs.
    """
    if not config.targets_file:
        return static, None, tuple
    timeout = config.poll.effective_timeout_s
    tf = TargetsFile(config.targets_file, reserved=frozenset(config.targets))
    parsed = tf.read_if_changed()
    if parsed is None:
        raise ConfigError(tf.last_error or f"targets file {config.targets_file}: unreadable")
    for error in parsed.errors:
        log.warning("%s", error)
    if not static and not parsed.entries:
        raise ConfigError(f"targets file {config.targets_file} has no valid target")

    def reload() -> list[SourceBinding] | None:
        fresh = tf.read_if_changed()
        if fresh is None:
            if tf.last_error:
                log.warning("%s; keeping the current targets", tf.last_error)
            return None
        for error in fresh.errors:
            log.warning("%s", error)
        return static + bindings_from_file(fresh, timeout)

    return static + bindings_from_file(parsed, timeout), reload, lambda: (
        (tf.last_error,) if tf.last_error else ())


def make_poller(config: cfg.WatchConfig, incidents_path: str | None = None
                ) -> tuple[Poller, History, StateStore, Any]:
    """config -> sources -> history -> evaluator -> poller -> state."""
    from replaywatch.evaluator import make_evaluator

    history = History(max_age_s=config.poll.history_s, max_points=config.poll.max_points)
    store = StateStore()
    bindings, reload, errors = make_reloader(config, make_bindings(config))
    # The evaluator asks the poller for the current targets at each cycle, so a
    # reloaded targets file is diagnosed from its next cycle on.
    evaluator, incidents = make_evaluator(config, lambda: targets_of(poller.bindings),
                                          incidents_path)
    poller = Poller(bindings, history, store, evaluator, interval_s=config.poll.interval_s,
                    timeout_s=config.poll.effective_timeout_s, reload=reload,
                    config_errors=errors)
    return poller, history, store, incidents


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.listen(512)
    sock.set_inheritable(True)
    return sock


def run_watch(config: cfg.WatchConfig, log_level: str = "info") -> int:
    import uvicorn

    from replaywatch.api import create_app
    from replaywatch.api.routes_health import METRICS_CACHE_KEY
    from replaywatch.metrics import make_registry, render

    if not cfg.is_loopback(config.serve.listen_host) and not config.serve.token:
        log.warning("listening on %s without a token: anyone who can reach it can read the "
                    "job's state; set REPLAYWATCH_TOKEN or --token-file",
                    config.serve.listen_host)
    poller, history, store, incidents = make_poller(config)
    sock = _bind(config.serve.listen_host, config.serve.listen_port)
    registry = make_registry(store.current)
    app = create_app(store, registry, history, incidents,
                     history_s=config.poll.history_s, serve=config.serve,
                     extra_routers=_page_routers())
    # Render /metrics on the poller's thread before each publish, so a scrape is
    # a cache hit: a fresh render of 50 targets x 5 tables took ~50 ms here, and
    # ~200 ms at p99 when it raced the next poll cycle for the GIL.
    poller.before_publish = lambda state: app.state.cache.get(
        METRICS_CACHE_KEY, state.cycle, lambda: render(make_registry(lambda: state)))
    stop = threading.Event()
    thread = threading.Thread(target=poller.run, args=(stop,), name="replaywatch-poller",
                              daemon=True)
    thread.start()
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    print(f"replaywatch: watching {', '.join(config.targets)}; serving http://{shown}:{port}/",
          file=sys.stderr, flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level=log_level, access_log=False,
                                           timeout_graceful_shutdown=2,
                                           limit_concurrency=config.serve.max_in_flight))
    # uvicorn shuts down gracefully on SIGTERM, then re-raises it to the handler
    # that was installed before it; ours turns it into a normal exit so that the
    # poller and the incident log below are closed.
    signal.signal(signal.SIGTERM, _exit_on_signal)
    try:
        server.run(sockets=[sock])
    finally:
        stop.set()
        thread.join(timeout=config.poll.interval_s + config.poll.effective_timeout_s + 2)
        poller.close()
        if incidents is not None:
            incidents.close()
    return 0


def _exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(0)


def _page_routers() -> tuple[Any, ...]:
    try:
        from replaywatch.api import page  # type: ignore[attr-defined]
    except ImportError:
        return ()
    return (page.router,)


def main(argv: Sequence[str] | None = None, environ: dict[str, str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, getattr(args, "log_level", "warning").upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        config = config_from_args(args, dict(os.environ if environ is None else environ))
        if args.command == "watch":
            return run_watch(config, args.log_level)
        from replaywatch.check import run_check

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
