"""Joining a Ray cluster and placing roles on it, without starting Ray.

The two failures a user met joining a cluster with `--ray-address` (a loopback head
Ray rewrote to the machine's address; a token-authenticated head whose refusal Ray
hid behind `ConnectionError`) and the flags that place each role on its nodes.
"""

from __future__ import annotations

import os

import pytest

from agents import placement
from agents.config import RunConfig
from agents.run import configs_from_args


@pytest.mark.parametrize("address, host", [
    ("127.0.0.1:6379", "127.0.0.1"), ("ray://10.0.0.5:10001", "10.0.0.5"),
    ("localhost:1", "localhost"), ("[::1]:6379", "[::1]")])
def test_ray_address_host(address: str, host: str) -> None:
    assert placement.ray_address_host(address) == host


def test_a_loopback_address_keeps_ray_on_loopback_and_others_change_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", raising=False)
    placement.prepare_ray_environment("10.0.0.5:6379")
    placement.prepare_ray_environment(None)
    assert "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER" not in os.environ
    placement.prepare_ray_environment("127.0.0.1:6379")
    assert os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"


def test_an_auth_refusal_buried_in_connection_error_is_named_with_the_fix() -> None:
    try:
        try:
            raise RuntimeError("RPC error: InvalidAuthToken: Authentication token is missing")
        except RuntimeError as inner:
            raise ConnectionError("Failed to connect to Ray cluster at 192.0.2.2:6390") from inner
    except ConnectionError as error:
        line = placement.join_failure("127.0.0.1:6390", error)
    assert line.startswith("cannot join the Ray cluster at 127.0.0.1:6390: ")
    assert "RAY_AUTH_MODE=token" in line and "\n" not in line
    other = placement.join_failure("h:1", ConnectionError("refused\nsecond line"))
    assert other == "cannot join the Ray cluster at h:1: ConnectionError: refused"


def test_role_options_ask_for_a_share_of_the_resource_or_nothing() -> None:
    assert placement.role_options(None) == {}
    assert placement.role_options("actor") == {"resources": {"actor": 0.01}}


def test_placement_and_policy_lag_flags_reach_the_run_config() -> None:
    _, _, run = configs_from_args([
        "--mode", "distributed", "--ray-address", "127.0.0.1:1", "--replay-resource", "replay",
        "--learner-resource", "learner", "--actor-resource", "actor", "--max-policy-lag", "50",
        "--no-actor-probes"])
    assert (run.replay_resource, run.learner_resource, run.actor_resource) == (
        "replay", "learner", "actor")
    assert run.max_policy_lag == 50 and run.actor_probes is False
    assert configs_from_args([])[2].actor_probes is True


@pytest.mark.parametrize("kwargs, message", [
    ({"max_policy_lag": -1}, "max_policy_lag (-1) must be >= 0"),
    ({"max_policy_lag": 5}, "max_policy_lag (5) needs --mode distributed"),
    ({"actor_resource": "actor"}, "actor_resource ('actor') needs --mode distributed"),
    ({"mode": "distributed", "replay_resource": " "}, "must be a Ray resource name"),
])
def test_bad_placement_and_lag_values_name_the_value(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError) as error:
        RunConfig(**kwargs)
    assert message in str(error.value)
