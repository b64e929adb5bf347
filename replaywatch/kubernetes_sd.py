"""Targets from the Kubernetes API: the replay servers and probes of every pod a label
selector picks (`watch --kubernetes SELECTOR`), followed as pods come and go.

The convention is a PodMonitor's: container ports are found by their name.

    containerPort named `reverb`     a Reverb server; POD_IP:PORT is a target
    containerPort named `rw-probe`   a trainer, actor or replay probe (its document says
                                     which); http://POD_IP:PORT is polled

A probe belongs to the Reverb server of its own pod where it has one (a trainer that holds
its replay); else to the server its pod's annotation `replaywatch.io/reverb` names (a pod's
name, or HOST:PORT); else to the only server of its job. A job with several servers and no
annotation is said, never guessed. A pod's job is its label `--kube-job-label` (default
`app.kubernetes.io/instance`), else the name of its controller (a Job, a StatefulSet), else
its own name; it becomes the target's `job` label, so the servers a job shards its
experience over are one row of the fleet page.

Which pods are watched:
- Running, with an IP: ready or not (a server loading a checkpoint is not Ready, and is
  watched: `restoring`);
- Failed: still watched for the TTL (10 minutes) from when it was first seen failed, so that
  a crash is judged (`target_down` pages) and not lost with the pod, then it leaves and its
  incidents close as gone;
- not a pod being deleted (`deletionTimestamp` set) or one that Succeeded: its end was
  ordered or clean, its targets leave at once, with nothing paged.

The pods are listed once, then followed with a watch (the API's stream of ADDED, MODIFIED
and DELETED events) on a thread of their own, so that a deleted pod leaves before its
server's silence could read as `target_down`, and a new one appears at the next cycle. A
broken stream is listed again, with a backoff; what the API cannot say keeps what is
watched (the API's blindness is not every pod gone).

`parse_pods` is the pure part: the pods known at `now` to targets and errors.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import logging
import os
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable
from typing import Any

from replaywatch.config import ALL_NAMESPACES, JOB_LABEL, POD_TTL_S, KubeTarget
from replaywatch.errors import ConfigError
from replaywatch.targets_file import ParsedTargets, TargetEntry

log = logging.getLogger("replaywatch")

REVERB_PORT = "reverb"
PROBE_PORT = "rw-probe"  # a port's name is at most 15 characters
TARGET_ANNOTATION = "replaywatch.io/reverb"
SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
# The API ends a watch after this and it is opened again at once from the last version seen:
# a stream that died without a word (a dropped connection, a restarted API server) is found
# within 1.5 x WATCH_TIMEOUT_S, its silence outlasting the socket's deadline.
WATCH_TIMEOUT_S = 60.0
BACKOFF_S = (1.0, 2.0, 5.0, 10.0, 30.0)


def kube_target(selector: str, namespace: str | None = None, api: str | None = None,
                token_file: str | None = None, ca_file: str | None = None,
                job_label: str = JOB_LABEL, ttl_s: float = POD_TTL_S,
                env: dict[str, str] | None = None,
                service_account: str = SERVICE_ACCOUNT) -> KubeTarget:
    """The flags, completed from the pod's service account where they are not given; a
    ConfigError (one line) where neither says where the API is."""
    env = dict(os.environ) if env is None else env
    text = selector.strip()
    if not text or any(c.isspace() and c != " " or ord(c) < 32 for c in text):
        raise ConfigError(f"--kubernetes ({selector!r}) must be a label selector, e.g. "
                          "app=rl-trainer")
    in_cluster = env.get("KUBERNETES_SERVICE_HOST")
    if api is None:
        if not in_cluster:
            raise ConfigError("--kubernetes: not in a pod (no KUBERNETES_SERVICE_HOST); give "
                              "the API's URL with --kube-api, e.g. http://127.0.0.1:8001 from "
                              "`kubectl proxy`")
        host = in_cluster if ":" not in in_cluster else f"[{in_cluster}]"
        api = f"https://{host}:{env.get('KUBERNETES_SERVICE_PORT', '443')}"
        token_file = token_file or f"{service_account}/token"
        ca_file = ca_file or f"{service_account}/ca.crt"
    parts = urllib.parse.urlsplit(api)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"--kube-api ({api!r}) must be the API's URL, e.g. "
                          "https://10.0.0.1:443 or http://127.0.0.1:8001")
    if namespace is None:
        try:
            with open(f"{service_account}/namespace", encoding="utf-8") as f:
                namespace = f.read().strip() or "default"
        except OSError:
            namespace = "default"
    if not namespace or "/" in namespace:
        raise ConfigError(f"--kube-namespace ({namespace!r}) must be a namespace, or "
                          f"{ALL_NAMESPACES!r}")
    if ttl_s <= 0:
        raise ConfigError(f"--kube-ttl must be positive, got {ttl_s:g}")
    return KubeTarget(text, namespace, api.rstrip("/"), token_file, ca_file, job_label, ttl_s)


# -- the pure part -----------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class PodPorts:
    """One pod as discovery reads it."""

    uid: str
    name: str
    namespace: str
    job: str
    ip: str | None
    phase: str
    deleting: bool
    reverb: tuple[int, ...]
    probes: tuple[int, ...]
    names_server: str | None  # its `replaywatch.io/reverb` annotation


def pod_ports(pod: Any, job_label: str = JOB_LABEL) -> PodPorts | None:
    """A pod object of the API as discovery reads it; None for one without a name."""
    if not isinstance(pod, dict):
        return None
    meta, spec, status = (_dict(pod.get(k)) for k in ("metadata", "spec", "status"))
    name = meta.get("name")
    if not isinstance(name, str):
        return None
    labels, annotations = _dict(meta.get("labels")), _dict(meta.get("annotations"))
    owners = meta.get("ownerReferences")
    owners = owners if isinstance(owners, list) else []
    controller = next((o.get("name") for o in owners
                       if isinstance(o, dict) and o.get("controller")), None)
    job = labels.get(job_label) or controller or name
    reverb, probes = [], []
    containers = spec.get("containers")
    for c in containers if isinstance(containers, list) else []:
        ports = _dict(c).get("ports")
        for p in ports if isinstance(ports, list) else []:
            if not isinstance(p, dict) or not isinstance(p.get("containerPort"), int):
                continue
            if p.get("name") == REVERB_PORT:
                reverb.append(p["containerPort"])
            elif p.get("name") == PROBE_PORT:
                probes.append(p["containerPort"])
    ip = status.get("podIP")
    return PodPorts(str(meta.get("uid") or f"{meta.get('namespace')}/{name}"), name,
                    str(meta.get("namespace") or ""), str(job),
                    ip if isinstance(ip, str) and ip else None, str(status.get("phase") or ""),
                    bool(meta.get("deletionTimestamp")), tuple(reverb), tuple(probes),
                    annotations.get(TARGET_ANNOTATION))


def _dict(x: Any) -> dict[str, Any]:
    return x if isinstance(x, dict) else {}


def _host(ip: str) -> str:
    return f"[{ip}]" if ":" in ip else ip


def watched(pod: PodPorts, failed_since: float | None, now: float, ttl_s: float) -> bool:
    """Whether the pod's ports are targets at `now` (the module's list of which pods)."""
    if pod.ip is None or pod.deleting:
        return False
    if pod.phase == "Running":
        return True
    return pod.phase == "Failed" and failed_since is not None and now - failed_since <= ttl_s


def parse_pods(pods: Iterable[tuple[PodPorts, float | None]], now: float,
               ttl_s: float = POD_TTL_S) -> ParsedTargets:
    """The targets of the pods (each with when it was first seen failed), their probes
    attached to their servers, and what could not be attached, one line each."""
    kept = sorted(((p, at) for p, at in pods if watched(p, at, now, ttl_s)),
                  key=lambda pa: (pa[0].namespace, pa[0].job, pa[0].name))
    servers: dict[str, list[str]] = {}  # address -> probe URLs
    labels: dict[str, tuple[tuple[str, str], ...]] = {}
    of_pod: dict[tuple[str, str], list[str]] = {}  # (namespace, pod) -> its servers
    of_job: dict[tuple[str, str], list[str]] = {}  # (namespace, job) -> its servers
    for pod, _ in kept:
        for port in pod.reverb:
            address = f"{_host(pod.ip or '')}:{port}"
            servers[address] = []
            labels[address] = (("job", pod.job), ("namespace", pod.namespace),
                               ("pod", pod.name))
            of_pod.setdefault((pod.namespace, pod.name), []).append(address)
            of_job.setdefault((pod.namespace, pod.job), []).append(address)
    errors: list[str] = []
    for pod, _ in kept:
        if not pod.probes:
            continue
        own = of_pod.get((pod.namespace, pod.name), [])
        mine = of_job.get((pod.namespace, pod.job), [])
        if len(own) == 1:
            server = own[0]
        elif pod.names_server:
            named = pod.names_server.strip()
            picked = of_pod.get((pod.namespace, named), [named] if named in servers else [])
            if len(picked) != 1:
                errors.append(f"pod {pod.namespace}/{pod.name}: its {TARGET_ANNOTATION} "
                              f"{named!r} is no watched pod with one Reverb server, nor one "
                              "server's HOST:PORT")
                continue
            server = picked[0]
        elif len(mine) == 1:
            server = mine[0]
        else:
            say = (f"its job {pod.job!r} has {len(mine)} Reverb servers" if mine
                   else f"its job {pod.job!r} has no Reverb server (a port named "
                        f"{REVERB_PORT!r})")
            errors.append(f"pod {pod.namespace}/{pod.name}: a probe port, but {say}; name its "
                          f"server with the annotation {TARGET_ANNOTATION}")
            continue
        servers[server] += [f"http://{_host(pod.ip or '')}:{port}" for port in pod.probes]
    return ParsedTargets(tuple(TargetEntry(a, labels[a], tuple(probes))
                               for a, probes in servers.items()), tuple(errors))


# -- the edge: list, then watch ----------------------------------------------------------------

class KubeApiError(Exception):
    """The API refused or could not be read; the message is one line."""


class KubePods:
    """The pods of one selector, listed once and then followed by the API's watch on a
    daemon thread (`start()`); `targets(now)` is asked each cycle and returns the targets
    when they changed, else None."""

    def __init__(self, target: KubeTarget, timeout_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic,
                 watch_s: float = WATCH_TIMEOUT_S):
        self.target = target
        self._timeout_s = timeout_s
        self._watch_s = watch_s
        self._clock = clock
        self._lock = threading.Lock()
        self._pods: dict[str, PodPorts] = {}
        self._failed_since: dict[str, float] = {}
        self._version = ""
        self._returned: ParsedTargets | None = None
        # Bumped by every change to the pods; `targets` parses again only after one, or once
        # a failed pod's TTL has run out (the next such moment in `_expires`).
        self._generation = 0
        self._parsed: tuple[int, float] | None = None  # (generation, next expiry) parsed at
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.last_error: str | None = None

    # The API's two calls. A token is read at each call: the kubelet rotates it.
    def _request(self, path: str, timeout_s: float) -> Any:
        headers = {"Accept": "application/json"}
        if self.target.token_file:
            try:
                with open(self.target.token_file, encoding="utf-8") as f:
                    headers["Authorization"] = f"Bearer {f.read().strip()}"
            except OSError as e:
                raise KubeApiError(f"token {self.target.token_file}: {e.strerror}") from None
        context = None
        if self.target.api.startswith("https:"):
            try:
                context = ssl.create_default_context(cafile=self.target.ca_file)
            except (OSError, ssl.SSLError) as e:
                raise KubeApiError(f"CA {self.target.ca_file}: {e}") from None
        request = urllib.request.Request(self.target.api + path, headers=headers)
        try:
            return urllib.request.urlopen(request, timeout=timeout_s, context=context)
        except urllib.error.HTTPError as e:
            raise KubeApiError(f"{e.code} {e.reason}: {_status_message(e)}") from None
        except (OSError, ValueError) as e:
            raise KubeApiError(str(getattr(e, "reason", None) or e)) from None

    def list_now(self) -> None:
        """Lists the pods (replacing what was known); raises KubeApiError."""
        with self._request(self.target.pods_path, self._timeout_s) as response:
            try:
                doc = json.loads(response.read(64 * 1024 * 1024))
            except ValueError as e:
                raise KubeApiError(f"the pod list is not JSON ({e})") from None
            except (OSError, http.client.HTTPException) as e:  # the body cut or too slow
                raise KubeApiError(f"reading the pod list: {e or type(e).__name__}") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("items"), list):
            raise KubeApiError("the answer is not a PodList (no 'items')")
        pods = [p for p in (pod_ports(i, self.target.job_label) for i in doc["items"]) if p]
        now = self._clock()
        with self._lock:
            self._pods = {p.uid: p for p in pods}
            self._failed_since = {p.uid: self._failed_since.get(p.uid, now)
                                  for p in pods if p.phase == "Failed"}
            self._version = str((doc.get("metadata") or {}).get("resourceVersion") or "")
            self._generation += 1

    def apply(self, event: Any) -> bool:
        """One watch event into what is known; False where the stream must be listed
        again (an ERROR event: the version is too old)."""
        if not isinstance(event, dict):
            return True
        kind, obj = event.get("type"), event.get("object")
        if kind == "ERROR":
            return False
        meta = obj.get("metadata") if isinstance(obj, dict) else None
        version = meta.get("resourceVersion") if isinstance(meta, dict) else None
        pod = pod_ports(obj, self.target.job_label) if kind != "BOOKMARK" else None
        now = self._clock()
        with self._lock:
            if version:
                self._version = str(version)
            if pod is not None and kind in ("ADDED", "MODIFIED", "DELETED"):
                if kind == "DELETED":
                    self._pods.pop(pod.uid, None)
                else:
                    self._pods[pod.uid] = pod
                if kind != "DELETED" and pod.phase == "Failed":
                    self._failed_since.setdefault(pod.uid, now)
                else:
                    self._failed_since.pop(pod.uid, None)
                self._generation += 1
        return True

    def _follow(self) -> None:
        query = urllib.parse.urlencode({"watch": "1", "resourceVersion": self._version,
                                        "allowWatchBookmarks": "true",
                                        "timeoutSeconds": str(max(1, round(self._watch_s)))})
        # The socket's deadline covers the silence between two events: the API closes the
        # stream at timeoutSeconds, so a longer silence is a stream that died.
        with self._request(f"{self.target.pods_path}&{query}", 1.5 * self._watch_s) as r:
            try:
                for line in r:
                    if self._stop.is_set():
                        return
                    try:
                        event = json.loads(line)
                    except ValueError:
                        continue
                    if not self.apply(event):
                        raise KubeApiError(f"watch: {_event_message(event)}; listing again")
            except (OSError, http.client.HTTPException) as e:
                # Raised by the read, not the request: a stream silent past its deadline or
                # cut mid-event. Listed again; left uncaught it ended discovery for good.
                raise KubeApiError(f"watch: {e or type(e).__name__}; listing again") from None

    def _run(self) -> None:
        failures = 0
        listed = True  # start() listed first
        while not self._stop.is_set():
            try:
                if not listed:
                    self.list_now()
                listed = False
                self._follow()
                self.last_error, failures, listed = None, 0, True  # a clean end: go on
            except KubeApiError as e:
                self.last_error = f"Kubernetes discovery ({self.target.describe()}): {e}"
                log.warning("%s", self.last_error)
                self._stop.wait(BACKOFF_S[min(failures, len(BACKOFF_S) - 1)])
                failures += 1

    def start(self) -> None:
        """Lists the pods once (a ConfigError where the API refuses: one line), then follows
        them on a daemon thread."""
        try:
            self.list_now()
        except KubeApiError as e:
            raise ConfigError(f"--kubernetes: {self.target.describe()}: {e}") from None
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="replaywatch-kubernetes")
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def errors(self) -> tuple[str, ...]:
        """What discovery says now: the pods it could not attach, the API's last error."""
        said = self._returned.errors if self._returned is not None else ()
        return (*said, *((self.last_error,) if self.last_error else ()))

    def targets(self, now_mono: float | None = None) -> ParsedTargets | None:
        """The targets at this cycle when they changed since the last call, else None."""
        now = self._clock() if now_mono is None else now_mono
        with self._lock:
            if (self._parsed is not None and self._parsed[0] == self._generation
                    and now <= self._parsed[1]):
                return None  # asked every cycle: nothing changed, no pod's TTL ran out
            pods = [(p, self._failed_since.get(uid)) for uid, p in self._pods.items()]
            expiries = [at + self.target.ttl_s for at in self._failed_since.values()
                        if at + self.target.ttl_s >= now]
            self._parsed = (self._generation, min(expiries, default=float("inf")))
        fresh = parse_pods(pods, now, self.target.ttl_s)
        if fresh == self._returned:
            return None
        self._returned = fresh
        return fresh


def _status_message(e: urllib.error.HTTPError) -> str:
    """The API's own words (a Status object's message), else the body's start."""
    try:
        body = e.read(4096).decode("utf-8", "replace")
    except OSError:
        return ""
    try:
        doc = json.loads(body)
        return str(doc.get("message") or body).splitlines()[0][:300]
    except (ValueError, AttributeError, IndexError):
        return body.splitlines()[0][:300] if body else ""


def _event_message(event: Any) -> str:
    obj = event.get("object") if isinstance(event, dict) else None
    return str(obj.get("message") if isinstance(obj, dict) else obj)[:300]
