"""Where the distributed agent's processes run: joining a Ray cluster, custom resources.

Two things went wrong for a user joining a cluster with `--ray-address`, both fixed here:

- A head bound to loopback (`ray start --head --node-ip-address 127.0.0.1`, or Ray's own
  multi-node test cluster) was unreachable: Ray rewrites a loopback address to the
  machine's outward IP before connecting (`resolve_ip_for_localhost`), where nothing
  listens, and the driver waited on the GCS for good, so the start line never came.
  `prepare_ray_environment` keeps loopback (Ray resolves "this node" to 127.0.0.1 when
  `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`, which in the driver changes nothing else: it
  starts no node).
- `ray start --head` turns on token authentication when it finds a token (`RAY_AUTH_TOKEN`,
  the file `RAY_AUTH_TOKEN_PATH` names, or `~/.ray/auth_token`, which a local `ray.init()`
  writes), but a driver given an explicit address sends none unless `RAY_AUTH_MODE=token`:
  the GCS answered `InvalidAuthToken` for 15 s and Ray raised `ConnectionError`. With
  `RAY_AUTH_MODE` unset, `prepare_ray_environment` asks the GCS once (`gcs_auth`, one RPC
  without a token): if it wants one, the driver sends the token Ray would read on this
  machine (`find_auth_token`), checked first; with no token, or one it refuses, the agent
  exits 2 with one line at once. A cluster that asks for none gets none: a driver in token
  mode on it had its actors cancelled before they ran. `join_failure` names the same cause
  when `ray.init` fails anyway (`RAY_AUTH_MODE` set by the user).

No Ray import at module level: the environment must be set before Ray is imported.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, MutableMapping
from pathlib import Path
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
    """Before `import ray`: loopback kept on loopback, the token sent where the GCS asks for
    one; exits 2 with one line when it asks and this machine has none it accepts."""
    if not ray_address:
        return
    if ray_address_host(ray_address) in _LOOPBACK:
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    # A user's RAY_AUTH_MODE is theirs; `ray://` is Ray Client's server, not the GCS.
    if "RAY_AUTH_MODE" in os.environ or "://" in ray_address or ":" not in ray_address:
        return
    failure = use_token_if_asked(ray_address, os.environ, Path.home(), gcs_auth)
    if failure:
        sys.stderr.write(f"python -m agents.run: error: {failure}\n")
        sys.exit(2)


def find_auth_token(environ: MutableMapping[str, str], home: Path) -> tuple[str, str] | None:
    """The token a driver in token mode sends, and where it is, looked up as Ray's loader does.

    A non-empty `RAY_AUTH_TOKEN` is the token; else a non-empty `RAY_AUTH_TOKEN_PATH` names
    the file (no fallback when it is missing); else `~/.ray/auth_token`, where `ray start
    --head` reads it. Blank tokens count as none.
    """
    if environ.get("RAY_AUTH_TOKEN"):
        found: tuple[str, str] = (environ["RAY_AUTH_TOKEN"].strip(), "RAY_AUTH_TOKEN")
    else:
        path = Path(environ.get("RAY_AUTH_TOKEN_PATH") or home / ".ray" / "auth_token")
        try:
            found = (path.read_text().strip(), str(path))
        except (OSError, UnicodeDecodeError):
            return None
    return found if found[0] else None


def gcs_auth(address: str, token: str | None, timeout_s: float = 3.0) -> str:
    """What the GCS at `address` says to one request carrying `token` (None: no token).

    "refused" (UNAUTHENTICATED: it wants a token, or another one), "open" (it answered),
    or "unknown" (not up within `timeout_s`, or not a GCS): ray.init then says what is wrong.
    `GetClusterId` is the first call Ray's own GCS client makes; its request is empty.
    """
    import grpc

    channel = grpc.insecure_channel(address)
    call = channel.unary_unary("/ray.rpc.NodeInfoGcsService/GetClusterId")
    metadata = (("authorization", f"Bearer {token}"),) if token else None
    try:
        call(b"", timeout=timeout_s, metadata=metadata, wait_for_ready=True)
    except grpc.RpcError as error:
        return "refused" if error.code() == grpc.StatusCode.UNAUTHENTICATED else "unknown"
    finally:
        channel.close()
    return "open"


def use_token_if_asked(address: str, environ: MutableMapping[str, str], home: Path,
                       gcs: Callable[[str, str | None], str]) -> str | None:
    """Sets `RAY_AUTH_MODE=token` when the GCS wants a token and accepts this machine's.

    None when the driver can go on (token mode set, or not needed); the one-line reason it
    cannot join otherwise. Token mode only when asked: on a cluster without authentication
    the driver's own RPC server would then refuse the cluster's calls, and Ray cancels its
    actors before they run.
    """
    if gcs(address, None) != "refused":
        return None
    found = find_auth_token(environ, home)
    if found is None:
        return (f"cannot join the Ray cluster at {address}: it requires token authentication "
                "and this machine has no token (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or "
                "~/.ray/auth_token); set RAY_AUTH_TOKEN to the head's (`ray get-auth-token` "
                "there prints it)")
    token, source = found
    if gcs(address, token) == "refused":
        return (f"cannot join the Ray cluster at {address}: it refused the token from {source}; "
                "set RAY_AUTH_TOKEN to the head's (`ray get-auth-token` there prints it)")
    environ["RAY_AUTH_MODE"] = "token"
    return None


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
