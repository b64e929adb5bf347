"""The part of a Kubernetes API server that discovery reads, over real local HTTP: a
namespace's pods listed (`GET /api/v1/namespaces/NS/pods?labelSelector=...`, a PodList with
its resourceVersion) and watched (`&watch=1`: one JSON event per line, ADDED, MODIFIED,
DELETED, held open until the test ends it), behind a bearer token; a 403 as the API words
it where the token is wrong. No cluster runs here: the pods are the tests' own, every one
valid against the Pod schema (tests/test_kubernetes_sd.py checks them with
kubernetes-validate)."""

from __future__ import annotations

import http.server
import json
import queue
import threading
import urllib.parse
from typing import Any

TOKEN = "a-service-account-token"


def pod(name: str, ports: dict[str, int], ip: str = "127.0.0.1", phase: str = "Running",
        labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None,
        owner: str | None = None, namespace: str = "training") -> dict[str, Any]:
    """A pod as the API returns it: one container with the named ports."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": f"uid-{name}",
                            "labels": {"app": "rl", **(labels or {})}}
    if annotations:
        meta["annotations"] = annotations
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": "Job", "name": owner,
                                    "uid": f"uid-{owner}", "controller": True}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"containers": [{"name": "trainer", "image": "trainer:1",
                                     "ports": [{"name": n, "containerPort": p,
                                                "protocol": "TCP"}
                                               for n, p in ports.items()]}]},
            "status": {"phase": phase, "podIP": ip, "podIPs": [{"ip": ip}]}}


class KubeApi:
    """Serves its pods on 127.0.0.1; `add`, `modify`, `delete` change them and tell every
    open watch, as the API server does."""

    def __init__(self, pods: list[dict[str, Any]], token: str = TOKEN):
        self.token = token
        self.version = 1
        self.pods = {p["metadata"]["uid"]: p for p in pods}
        self.watches: list[queue.Queue[bytes | None]] = []
        self.lock = threading.Lock()
        self.requests: list[str] = []
        api = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"  # a watch ends when the server closes it

            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                api.requests.append(self.path)
                if self.headers.get("Authorization") != f"Bearer {api.token}":
                    return self._status(403, "Forbidden", 'pods is forbidden: User '
                                        '"system:serviceaccount:training:default" cannot list '
                                        'resource "pods" in API group "" in the namespace '
                                        '"training"')
                path, _, query = self.path.partition("?")
                args = dict(urllib.parse.parse_qsl(query))
                if not path.startswith("/api/v1/namespaces/") or not path.endswith("/pods"):
                    return self._status(404, "NotFound", "the server could not find the "
                                        "requested resource")
                namespace = path.split("/")[4]
                want = dict(kv.split("=", 1) for kv in args.get("labelSelector", "").split(",")
                            if "=" in kv)

                def picked(p: dict[str, Any]) -> bool:
                    m = p["metadata"]
                    return m["namespace"] == namespace and all(
                        m.get("labels", {}).get(k) == v for k, v in want.items())

                if args.get("watch") != "1":
                    with api.lock:
                        items = [p for p in api.pods.values() if picked(p)]
                        doc = {"apiVersion": "v1", "kind": "PodList", "items": items,
                               "metadata": {"resourceVersion": str(api.version)}}
                    body = json.dumps(doc).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return None
                events: queue.Queue[bytes | None] = queue.Queue()
                with api.lock:
                    api.watches.append(events)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.flush()
                try:
                    while (line := events.get()) is not None:
                        event = json.loads(line)
                        if picked(event["object"]):
                            self.wfile.write(line + b"\n")
                            self.wfile.flush()
                except OSError:
                    pass
                finally:
                    with api.lock:
                        api.watches.remove(events)
                return None

            def _status(self, code: int, reason: str, message: str) -> None:
                body = json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                   "message": message, "reason": reason, "code": code}).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def _tell(self, kind: str, obj: dict[str, Any]) -> None:
        with self.lock:
            self.version += 1
            obj["metadata"]["resourceVersion"] = str(self.version)
            line = json.dumps({"type": kind, "object": obj}).encode()
            for w in self.watches:
                w.put(line)

    def add(self, p: dict[str, Any]) -> None:
        with self.lock:
            self.pods[p["metadata"]["uid"]] = p
        self._tell("ADDED", p)

    def modify(self, name: str, **status: str) -> None:
        with self.lock:
            p = next(p for p in self.pods.values() if p["metadata"]["name"] == name)
            p["status"].update(status)
        self._tell("MODIFIED", p)

    def delete(self, name: str) -> None:
        with self.lock:
            p = next(p for p in self.pods.values() if p["metadata"]["name"] == name)
            del self.pods[p["metadata"]["uid"]]
        self._tell("DELETED", p)

    def end_watches(self) -> None:
        """Ends every open watch, as the API does at its timeout or a restart."""
        with self.lock:
            for w in self.watches:
                w.put(None)

    def watching(self) -> int:
        with self.lock:
            return len(self.watches)

    def close(self) -> None:
        with self.lock:
            for w in self.watches:
                w.put(None)
        self.server.shutdown()
        self.server.server_close()
