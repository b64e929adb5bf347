"""Where the distributed agent's processes run: joining a Ray cluster, custom resources.

Two things went wrong for a user joining a cluster with `--ray-address`, both fixed here:

- A head bound to loopback (`ray start --head --node-ip-address 127.0.0.1`, or Ray's own
  multi-node test cluster) was unreachable: Ray rewrites a loopback address to the
  machine's outward IP before connecting (`resolve_ip_for_localhost`), where nothing
  listens, and the driver waited on the GCS for good, so the start line never came.
  `prepare_ray_environment` keeps loopback (Ray resolves "this node" to 127.0.0.1 when
  `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`, which in the driver changes nothing else: it
  starts no node).
- A head started by `ray start --head` turns on token authentication (the token in
  `~/.ray/auth_token`), but a driver given an explicit address does not send it unless
  `RAY_AUTH_MODE=token`: Ray's `ConnectionError` hid the GCS's `InvalidAuthToken`.
  `join_failure` turns that into one line that says what to set.

No Ray import at module level: the environment must be set before Ray is imported.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from agents.config import RunConfig

# A fraction: any number of a role's processes fit on a node offering one unit.
_RESOURCE_SHARE = 0.01
_LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")


def ray_address_host(address: str) -> str:
    """The host of `HOST:PORT` or `ray://HOST:PORT`."""
    address = address.split("://", 1)[-1]
    return address.rpartition(":")[0] or address


def prepare_ray_environment(ray_address: str | None) -> None:
    """Before `import ray`: keep a loopback `--ray-address` on loopback (see module doc)."""
    if ray_address and ray_address_host(ray_address) in _LOOPBACK:
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


def join_failure(address: str, error: BaseException) -> str:
    """One line for a failed `ray.init(address=...)`, naming the cause Ray buried."""
    causes = []
    while error is not None and len(causes) < 5:
        causes.append(f"{type(error).__name__}: {error}")
        error = error.__cause__ or error.__context__  # type: ignore[assignment]
    text = " ".join(causes)
    if "InvalidAuthToken" in text or "AuthenticationError" in text:
        return (f"cannot join the Ray cluster at {address}: it requires token authentication; "
                "set RAY_AUTH_MODE=token (the token from ~/.ray/auth_token, RAY_AUTH_TOKEN or "
                "RAY_AUTH_TOKEN_PATH)")
    first = causes[0].splitlines()[0] if causes else "unknown error"
    return f"cannot join the Ray cluster at {address}: {first[:300]}"


def role_options(resource: str | None) -> dict[str, Any]:
    """Ray `.options()` that place a role on nodes offering `resource` (None: anywhere)."""
    return {"resources": {resource: _RESOURCE_SHARE}} if resource else {}


def init_ray(run: RunConfig) -> None:
    """A local Ray for this run, or the cluster at `--ray-address` (one line if it fails)."""
    import ray

    # Workers import `agents` by name: put this checkout on their path.
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (root, os.environ.get("PYTHONPATH", "")) if p
    )
    if not run.ray_address:
        # "local": a new Ray for this run even when another cluster runs on this machine
        # (without it, ray.init() joins the one in /tmp/ray/ray_current_cluster, and
        # refuses num_cpus there).
        ray.init(address="local", num_cpus=run.num_actors + 2, include_dashboard=False,
                 log_to_driver=True)
        return
    try:
        ray.init(address=run.ray_address, runtime_env={"env_vars": {"PYTHONPATH": root}})
    except (ConnectionError, RuntimeError) as error:
        sys.stderr.write(f"python -m agents.run: error: "
                         f"{join_failure(run.ray_address, error)}\n")
        sys.exit(2)
