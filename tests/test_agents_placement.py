"""Joining a Ray cluster and placing roles on it, without starting Ray.

The two failures a user met joining a cluster with `--ray-address` (a loopback head
Ray rewrote to the machine's address; a token-authenticated head whose refusal Ray
hid behind `ConnectionError`) and the flags that place each role on its nodes. Which token
the agent sends: `find_auth_token` looks where Ray's token loader looks; `use_token_if_asked`
turns token mode on only when the GCS refuses a request without one and accepts this
machine's token (here the GCS is a fake answering as `gcs_auth` does). The real
`ray start --head`: tests/test_ray_cluster.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agents import placement
from agents.config import RunConfig
from agents.run import configs_from_args
from harness.procs import free_port


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


ADDRESS = "127.0.0.1:6390"


def home_with_token(tmp_path: Path, text: str) -> Path:
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text(text)
    return tmp_path


def test_the_token_is_found_where_ray_start_reads_it_in_rays_order(tmp_path: Path) -> None:
    home = home_with_token(tmp_path, "written-by-ray\n")
    named = tmp_path / "named"
    named.write_text(" from-path ")
    find = placement.find_auth_token
    assert find({}, home) == ("written-by-ray", str(home / ".ray" / "auth_token"))
    assert find({"RAY_AUTH_TOKEN_PATH": str(named)}, home) == ("from-path", str(named))
    assert find({"RAY_AUTH_TOKEN": "env", "RAY_AUTH_TOKEN_PATH": str(named)}, home) == (
        "env", "RAY_AUTH_TOKEN")
    # Empty variables count as unset, as in Ray.
    assert find({"RAY_AUTH_TOKEN": "", "RAY_AUTH_TOKEN_PATH": ""}, home)[0] == "written-by-ray"


@pytest.mark.parametrize("environ, default", [
    ({}, None),                                          # nothing written anywhere
    ({}, " \n"),                                         # a blank file
    ({"RAY_AUTH_TOKEN": "  "}, "written-by-ray"),        # set, blank: Ray does not fall back
    ({"RAY_AUTH_TOKEN_PATH": "/nonexistent"}, "written-by-ray"),  # nor from a missing file
])
def test_no_token_where_ray_would_find_none(tmp_path: Path, environ: dict[str, str],
                                            default: str | None) -> None:
    home = home_with_token(tmp_path, default) if default is not None else tmp_path
    assert placement.find_auth_token(environ, home) is None


class FakeGcs:
    """Answers as `gcs_auth` does: `accepts` the tokens it takes (None: no token needed)."""

    def __init__(self, *accepts: str | None, answer: str = "refused"):
        self.accepts, self.answer, self.sent = set(accepts), answer, []

    def __call__(self, address: str, token: str | None) -> str:
        assert address == ADDRESS
        self.sent.append(token)
        return "open" if token in self.accepts else self.answer


def test_a_cluster_that_wants_a_token_gets_this_machines_and_token_mode(tmp_path: Path) -> None:
    environ: dict[str, str] = {}
    gcs = FakeGcs("written-by-ray")
    failure = placement.use_token_if_asked(
        ADDRESS, environ, home_with_token(tmp_path, "written-by-ray\n"), gcs)
    assert failure is None and environ == {"RAY_AUTH_MODE": "token"}
    assert gcs.sent == [None, "written-by-ray"]  # asked without, then checked with it


@pytest.mark.parametrize("gcs", [FakeGcs(None), FakeGcs(answer="unknown")],
                         ids=["without-auth", "not-answering"])
def test_a_cluster_that_does_not_refuse_gets_no_token(tmp_path: Path, gcs: FakeGcs) -> None:
    # Token mode on a cluster without auth gets the driver's actors cancelled; one that does
    # not answer is left to ray.init to report.
    environ: dict[str, str] = {}
    home = home_with_token(tmp_path, "written-by-ray")
    assert placement.use_token_if_asked(ADDRESS, environ, home, gcs) is None
    assert environ == {} and gcs.sent == [None]


def test_no_token_or_a_refused_one_is_one_line_and_no_token_mode(tmp_path: Path) -> None:
    environ: dict[str, str] = {}
    none = placement.use_token_if_asked(ADDRESS, environ, tmp_path, FakeGcs("the-heads"))
    assert none is not None and none.startswith(f"cannot join the Ray cluster at {ADDRESS}: ")
    assert "requires token authentication" in none and "\n" not in none
    environ["RAY_AUTH_TOKEN"] = "stale"
    refused = placement.use_token_if_asked(ADDRESS, environ, tmp_path, FakeGcs("the-heads"))
    assert refused is not None and "refused the token from RAY_AUTH_TOKEN" in refused
    assert "RAY_AUTH_MODE" not in environ


def test_a_users_auth_mode_and_ray_client_addresses_are_left_alone(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def no_call(address: str, token: str | None) -> str:
        raise AssertionError(f"asked the GCS at {address}")

    monkeypatch.setattr(placement, "gcs_auth", no_call)
    monkeypatch.delenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", raising=False)
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    placement.prepare_ray_environment("127.0.0.1:6390")
    monkeypatch.delenv("RAY_AUTH_MODE")
    placement.prepare_ray_environment("ray://127.0.0.1:10001")
    placement.prepare_ray_environment("auto")
    assert "RAY_AUTH_MODE" not in os.environ


def test_prepare_exits_2_with_the_line_when_the_cluster_refuses(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH",
                 "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(placement, "gcs_auth", FakeGcs("the-heads"))
    with pytest.raises(SystemExit) as exited:
        placement.prepare_ray_environment(ADDRESS)
    assert exited.value.code == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("python -m agents.run: error: cannot join the Ray cluster at ")


def test_a_port_nobody_answers_on_is_unknown_not_refused() -> None:
    assert placement.gcs_auth(f"127.0.0.1:{free_port()}", None, timeout_s=0.3) == "unknown"
