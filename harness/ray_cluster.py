"""A multi-node Ray cluster on this machine, bound to loopback, for tests and benchmarks.

    with RayCluster(roles=("replay", "learner", "actor")) as cluster:
        cluster.address                  # "127.0.0.1:PORT", for --ray-address
        cluster.node_ids["actor"]        # the Ray node id of the node offering "actor"
        cluster.kill("actor")            # its raylet and every worker on it, at once
        cluster.add("actor")             # a fresh node offering the same resource

Ray's own multi-node test cluster (`ray.cluster_utils.Cluster`): a head and one
raylet per role, each offering one unit of a custom resource named after its role
(the agent's `--replay-resource replay` etc.). It runs in this process, so kill()
can take a node away as a lost machine would.

Why loopback and no token: nothing outside this machine needs it, and a head on
the machine's outward address was reachable from the network. The agent sends a token only
to a head that asks for one (agents/placement.py); a head started by `ray start --head`,
which does ask, is tests/test_ray_cluster.py's first case. The agent
keeps a loopback `--ray-address` on loopback; a local `ray.init()` beside this
cluster starts its own (the agent passes address="local"), so two clusters coexist.

Starting one costs seconds (Ray's GCS and a raylet per node): a test module shares
one (`ray_cluster` below is module-scoped) and every run joins it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import pytest

# The cluster's processes inherit this process's environment when they start.
ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
       "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
_NODE = {"node_ip_address": "127.0.0.1", "num_cpus": 1, "object_store_memory": 150 << 20}


class RayCluster:
    def __init__(self, roles: tuple[str, ...] = ("replay", "learner", "actor")):
        self.roles = roles
        self.node_ids: dict[str, str] = {}
        self.startup_s: float | None = None
        self._nodes: dict[str, Any] = {}
        self._cluster: Any = None
        self._saved_env: dict[str, str | None] = {}
        self._temp = tempfile.mkdtemp(prefix="ray-cluster-")

    def __enter__(self) -> RayCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> RayCluster:
        began = time.monotonic()
        for key, value in ENV.items():
            self._saved_env[key] = os.environ.get(key)
            os.environ[key] = value
        from ray.cluster_utils import Cluster  # after ENV: Ray reads it on import

        self._cluster = Cluster(initialize_head=True, head_node_args={
            **_NODE, "include_dashboard": False, "temp_dir": self._temp})
        self.node_ids["head"] = self._cluster.head_node.node_id
        for role in self.roles:
            self.add(role)
        self.startup_s = time.monotonic() - began
        return self

    @property
    def address(self) -> str:
        return str(self._cluster.address)

    def add(self, role: str) -> str:
        """A new node offering one unit of `role`; its Ray node id."""
        node = self._cluster.add_node(**_NODE, resources={role: 1})
        self._nodes[role] = node
        self.node_ids[role] = node.node_id
        return node.node_id

    def kill(self, role: str) -> str:
        """Kills the node offering `role` (raylet and workers, no grace); its node id."""
        node = self._nodes.pop(role)
        self._cluster.remove_node(node, allow_graceful=False)
        return self.node_ids.pop(role)

    def stop(self) -> None:
        if self._cluster is not None:
            self._cluster.shutdown()
            self._cluster = None
        for key, value in self._saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        shutil.rmtree(self._temp, ignore_errors=True)  # Ray's session logs, per cluster


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[RayCluster]:
    """One warm cluster for a test module: import it into the module (or a conftest)."""
    with RayCluster() as cluster:
        yield cluster
