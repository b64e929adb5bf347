"""Configuration: frozen, grouped, validated once, read from flags/env/file here only."""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import tomllib
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import Any

from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.errors import ConfigError
from replaywatch.model import DeclaredLayout
from replaywatch.probe.protocol import Layout
from replaywatch.shards import Shard


def parse_address(address: str, what: str = "address") -> str:
    """Validates HOST:PORT (IPv6 as [::1]:PORT) and returns it normalized."""
    text = address.strip()
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise ConfigError(f"{what} ({address!r}) must be HOST:PORT, e.g. 127.0.0.1:8000")
    if not port.isdigit() or not 0 < int(port) <= 65535:
        raise ConfigError(f"{what} ({address!r}) has port {port!r}; it must be 1-65535")
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if ":" in bare and not host.startswith("["):
        raise ConfigError(f"{what} ({address!r}): write an IPv6 host in brackets, [::1]:PORT")
    if not bare or any(c.isspace() or c in "/?#@" for c in bare):
        raise ConfigError(f"{what} ({address!r}) has an invalid host {host!r}")
    return f"{host}:{int(port)}"


def parse_listen(listen: str, flag: str = "listen") -> tuple[str, int]:
    """HOST:PORT to bind; port 0 picks a free one."""
    host, sep, port = listen.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"{flag} ({listen!r}) must be HOST:PORT, e.g. 127.0.0.1:9321")
    return host.strip("[]"), int(port)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclasses.dataclass(frozen=True)
class ProbeTarget:
    """A trainer probe and the Reverb target whose tables its iterator reads."""

    url: str
    target: str | None  # None: the only Reverb target, resolved in WatchConfig


def parse_probe(spec: str) -> ProbeTarget:
    """`URL` or `TARGET=URL` (e.g. `127.0.0.1:8000=http://127.0.0.1:8001`)."""
    target: str | None = None
    url = spec.strip()
    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in url):
        raise ConfigError(f"probe ({spec!r}) must not contain spaces or control characters")
    head, eq, tail = url.partition("=")
    if eq and "://" not in head:
        target, url = parse_address(head, "probe's target"), tail.strip()
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"probe ({spec!r}) must be an http URL, e.g. http://127.0.0.1:8001")
    try:
        _ = parts.port  # urlsplit validates the port only when asked
    except ValueError:
        raise ConfigError(f"probe ({spec!r}) has an invalid port") from None
    return ProbeTarget(url=url.rstrip("/"), target=target)


# Rates shown beside each table are taken over this many seconds (the poller's
# picture and the API's history both use it).
RATE_WINDOW_S = 10.0

MAX_HISTORY_S = 86400.0  # a day at 1 Hz is ~86k snapshots per table: the memory bound


@dataclasses.dataclass(frozen=True)
class PollConfig:
    interval_s: float = 1.0
    timeout_s: float | None = None  # default: 80% of the interval, at most 5 s
    history_s: float = 900.0

    def __post_init__(self) -> None:
        if not self.interval_s > 0:
            raise ConfigError(f"interval ({self.interval_s:g}) must be > 0")
        if self.interval_s > 3600:
            raise ConfigError(f"interval ({self.interval_s:g}) must be <= 3600 seconds")
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise ConfigError(f"timeout ({self.timeout_s:g}) must be > 0")
        if self.history_s > MAX_HISTORY_S:
            raise ConfigError(f"history ({self.history_s:g}s) must be <= {MAX_HISTORY_S:g}s")
        if not self.history_s >= self.interval_s * 2:
            raise ConfigError(
                f"history ({self.history_s:g}s) must hold at least two polls "
                f"({2 * self.interval_s:g}s)"
            )

    @property
    def effective_timeout_s(self) -> float:
        return self.timeout_s if self.timeout_s is not None else min(0.8 * self.interval_s, 5.0)

    @property
    def max_points(self) -> int:
        return int(self.history_s / self.interval_s) + 2


@dataclasses.dataclass(frozen=True)
class ServeConfig:
    listen_host: str = "127.0.0.1"
    listen_port: int = 9321
    token: str | None = None
    protect_metrics: bool = False
    protect_healthz: bool = False
    # Connections and requests handled at once; beyond it the server answers 503 at once.
    # Without a bound, clients that time out and retry against a slow sidecar pile up
    # abandoned requests, and memory grows with the backlog.
    max_in_flight: int = 256
    # --metrics-listen: /metrics also served from a process of its own (metrics_port.py),
    # whose answer time does not wait on the poller's interpreter lock.
    metrics_listen: tuple[str, int] | None = None

    def __post_init__(self) -> None:
        if self.max_in_flight < 1:
            raise ConfigError(f"--max-in-flight must be at least 1, got {self.max_in_flight}")


ALL_JOBS = "all"  # --ray-job all


@dataclasses.dataclass(frozen=True)
class RayTarget:
    """An RLlib job's Ray cluster, read from outside (sources/ray_cluster.py): the dashboard's
    address (what `ray job submit --address` takes, `http://HOST:8265`), its token (else found
    as Ray finds it), Ray's temp dir on this host (the metrics' service-discovery file), the
    job (else the newest with a live RLlib actor) and a result.json (or its directory)."""

    dashboard: str
    token: str | None = None
    temp_dir: str = "/tmp/ray"
    job_id: str | None = None  # ALL_JOBS: every RLlib job on the cluster, each a target
    results: str | None = None
    job_ttl_s: float = 600.0  # ALL_JOBS: how long a job whose RLlib actors died stays watched

    @property
    def every_job(self) -> bool:
        return self.job_id == ALL_JOBS

    def job_name(self, job_id: str) -> str:
        """A discovered job's target name: the dashboard's URL and the job."""
        return f"{self.name} job {job_id}"

    @property
    def name(self) -> str:
        """The target's name everywhere (findings, /metrics, the page): the dashboard's URL."""
        return self.dashboard if "://" in self.dashboard else f"http://{self.dashboard}"


JOB_LABEL = "app.kubernetes.io/instance"  # --kubernetes: the pod label that names its job
POD_TTL_S = 600.0  # --kubernetes: how long a failed pod stays watched
ALL_NAMESPACES = "all"  # --kube-namespace all


@dataclasses.dataclass(frozen=True)
class KubeTarget:
    """Where and what to discover: the API's URL (in-cluster: the service account's), its
    bearer token file and CA, the namespace (`all`: every one), the label selector."""

    selector: str
    namespace: str
    api: str
    token_file: str | None = None
    ca_file: str | None = None
    job_label: str = JOB_LABEL
    ttl_s: float = POD_TTL_S

    @property
    def pods_path(self) -> str:
        query = urllib.parse.urlencode({"labelSelector": self.selector})
        if self.namespace == ALL_NAMESPACES:
            return f"/api/v1/pods?{query}"
        return f"/api/v1/namespaces/{urllib.parse.quote(self.namespace)}/pods?{query}"

    def describe(self) -> str:
        where = ("every namespace" if self.namespace == ALL_NAMESPACES
                 else f"namespace {self.namespace}")
        return f"pods {self.selector!r} in {where} ({self.api})"


def parse_ray(spec: str) -> str:
    """`--ray HOST:PORT` or `http://HOST:PORT`: the dashboard's address, as a URL."""
    text = spec.strip()
    if not text or any(c.isspace() or ord(c) < 32 for c in text):
        raise ConfigError(f"--ray ({spec!r}) must be the dashboard's address, e.g. "
                          "127.0.0.1:8265")
    url = text if "://" in text else f"http://{text}"
    parts = urllib.parse.urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme not in ("http", "https") or not parts.hostname or port is None:
        raise ConfigError(f"--ray ({spec!r}) must be the dashboard's HOST:PORT, e.g. "
                          "127.0.0.1:8265 (the address `ray job submit` takes)")
    return url.rstrip("/")


@dataclasses.dataclass(frozen=True)
class WatchConfig:
    targets: tuple[str, ...]
    probes: tuple[ProbeTarget, ...] = ()
    poll: PollConfig = PollConfig()
    serve: ServeConfig = ServeConfig()
    thresholds: Thresholds = Thresholds()
    db_path: str | None = None
    trainer_pid: int | None = None
    targets_file: str | None = None
    # sync, sync-ratio, async, async-lag, and a loop's gate: for jobs not wrapped
    # (DeclaredLayout's spec, "sync gate=schedule inserts_per_step=4")
    layout: str | None = None
    bundle_dir: str | None = None  # None: `bundles` next to the incident log
    bundle_keep: int = 20  # the newest bundles kept; 0 writes none
    # (target, pid) of Reverb servers whose process is named (--reverb-pid); a local
    # target's is found by its port (sources/memory.py)
    reverb_pids: tuple[tuple[str, int], ...] = ()
    ray: tuple[RayTarget, ...] = ()  # RLlib jobs' clusters (--ray)
    shard: Shard | None = None  # --shard I/N: the targets whose hash is I mod N (shards.py)
    kubernetes: KubeTarget | None = None  # --kubernetes: pods found by a label selector

    def __post_init__(self) -> None:
        if self.bundle_keep < 0:
            raise ConfigError(f"--bundle-keep must be 0 or more, got {self.bundle_keep}")
        try:
            DeclaredLayout.parse(self.layout)
        except ValueError as e:
            raise ConfigError(f"--layout {self.layout!r}: {e}") from None
        if (not self.targets and not self.targets_file and not self.ray
                and self.kubernetes is None):
            raise ConfigError("give at least one --reverb HOST:PORT, --ray HOST:PORT (or "
                              "--targets-file, --kubernetes SELECTOR)")
        rays = [r.name for r in self.ray]
        if len(set(rays)) != len(rays):
            raise ConfigError(f"--ray {next(r for r in rays if rays.count(r) > 1)} given twice")
        if len(set(self.targets)) != len(self.targets):
            dup = next(t for t in self.targets if self.targets.count(t) > 1)
            raise ConfigError(f"--reverb {dup} is given twice")
        urls = [p.url for p in self.probes]
        if len(set(urls)) != len(urls):
            raise ConfigError(f"--probe {next(u for u in urls if urls.count(u) > 1)} given twice")
        resolved = []
        for probe in self.probes:
            if probe.target is None:
                if len(self.targets) != 1:
                    raise ConfigError(
                        f"probe {probe.url}: with several Reverb targets, name its target "
                        "as TARGET=URL"
                    )
                probe = ProbeTarget(probe.url, self.targets[0])
            elif probe.target not in self.targets:
                raise ConfigError(f"probe {probe.url}: target {probe.target} is not a --reverb")
            resolved.append(probe)
        object.__setattr__(self, "probes", tuple(resolved))


def reverb_pids(given: Sequence[str], targets: Sequence[str]) -> tuple[tuple[str, int], ...]:
    """`--reverb-pid [TARGET=]PID` as (target, pid); a bare PID names the only target."""
    out = []
    for text in given:
        target, sep, pid = text.rpartition("=")
        if not sep:
            if len(targets) != 1:
                raise ConfigError(f"--reverb-pid {text}: name its target (TARGET=PID) when "
                                  "there is more than one --reverb")
            target = targets[0]
        if target not in targets:
            raise ConfigError(f"--reverb-pid {text}: {target} is not a --reverb")
        if not pid.isdigit() or int(pid) < 1:
            raise ConfigError(f"--reverb-pid {text}: {pid!r} is not a process id")
        out.append((target, int(pid)))
    return tuple(out)


def thresholds_from(values: Mapping[str, Any], base: Thresholds = Thresholds()) -> Thresholds:
    """Overrides `base` with known threshold names; unknown names are errors."""
    known = set(Thresholds.field_names())
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(f"unknown threshold {unknown[0]!r}; known: {', '.join(sorted(known))}")
    values = dict(values)
    if "stall_window_s" in values and "learned_windows" not in values:
        # A window the user sets is the window: it pins it over the learned rhythm.
        values["learned_windows"] = False
    try:
        return dataclasses.replace(base, **values)
    except (TypeError, ValueError) as e:
        raise ConfigError(str(e)) from None


def parse_bool(text: str) -> bool:
    """true/false, yes/no, on/off, 1/0; ValueError otherwise."""
    value = text.strip().lower()
    if value in ("true", "yes", "on", "1"):
        return True
    if value in ("false", "no", "off", "0"):
        return False
    raise ValueError(f"{text!r} is not true or false")


def load_config_file(path: str) -> dict[str, Any]:
    """A TOML file with a `[thresholds]` table; its threshold overrides."""
    section = read_toml(path).get("thresholds", {})
    if not isinstance(section, dict):
        raise ConfigError(f"config file {path}: [thresholds] must be a table")
    return section


def layout_from_file(path: str) -> str | None:
    """The file's top-level `layout = "..."` (the job's layout, as --layout, and its gate as
    --gate: "sync gate=schedule inserts_per_step=4"), if any."""
    value = read_toml(path).get("layout")
    try:
        DeclaredLayout.parse(value if isinstance(value, str) else None)
    except ValueError as e:
        raise ConfigError(f"config file {path}: layout {value!r}: {e}") from None
    if value is not None and not isinstance(value, str):
        raise ConfigError(f"config file {path}: layout {value!r} must be a string, one of "
                          f"{', '.join(Layout)}")
    return value


def read_toml(path: str, allowed: Sequence[str] = ("thresholds", "layout")) -> dict[str, Any]:
    """A TOML file as a dict; an unreadable file or a key outside `allowed` is a ConfigError."""
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except OSError as e:
        raise ConfigError(f"config file {path}: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path}: not valid TOML ({e})") from None
    unknown = sorted(set(doc) - set(allowed))
    if unknown:
        raise ConfigError(f"config file {path}: unknown section [{unknown[0]}]")
    return doc


def read_token(environ: Mapping[str, str], token_file: str | None) -> str | None:
    """The bearer token from a file (preferred) or REPLAYWATCH_TOKEN."""
    if token_file:
        try:
            with open(token_file, encoding="utf-8") as f:
                token = f.read().strip()
        except OSError as e:
            raise ConfigError(f"token file {token_file}: {e.strerror or e}") from None
        if not token:
            raise ConfigError(f"token file {token_file} is empty")
        return token
    return environ.get("REPLAYWATCH_TOKEN") or None


def default_db_path(environ: Mapping[str, str] = os.environ) -> str:
    state = environ.get("XDG_STATE_HOME") or os.path.join(
        environ.get("HOME", "."), ".local", "state"
    )
    return os.path.join(state, "replaywatch", "incidents.sqlite3")


def threshold_overrides(pairs: Sequence[tuple[str, Any]]) -> dict[str, Any]:
    return {name: value for name, value in pairs if value is not None}
