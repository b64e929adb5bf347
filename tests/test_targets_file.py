"""Targets from a file_sd file: validated per entry, reloaded without a restart."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from harness.procs import Proc, get_json, wait_until
from replaywatch.errors import ConfigError
from replaywatch.targets_file import TargetsFile, parse_targets


@pytest.mark.parametrize(
    "doc, addresses, error",
    [
        # A plain group with labels.
        ([{"targets": ["a:1", "b:2"], "labels": {"job": "x"}}], ["a:1", "b:2"], None),
        # The probe meta label attaches a probe to a single target.
        ([{"targets": ["a:1"], "labels": {"__probe_url__": "http://a:9"}}], ["a:1"], None),
        # A duplicate across groups is rejected, naming the group and the target.
        ([{"targets": ["a:1"]}, {"targets": ["a:1", "c:3"]}], ["a:1", "c:3"],
         "group 1 target 0: duplicate target a:1"),
        # A malformed address is rejected; its neighbours stay.
        ([{"targets": ["nope", "d:4"]}], ["d:4"], "group 0 target 0 ('nope')"),
        # Unknown keys name the group.
        ([{"targets": ["a:1"], "scrape": 1}], [], "group 0: unknown key 'scrape'"),
        # A probe label on a group of two is ambiguous.
        ([{"targets": ["a:1", "b:2"], "labels": {"__probe_url__": "http://p:1"}}], [],
         "exactly one target"),
        # Labels must be strings.
        ([{"targets": ["a:1"], "labels": {"n": 1}}], [], "'labels' must map strings"),
        # A group that is not an object.
        (["a:1"], [], "group 0: must be an object"),
    ],
)
def test_entries_are_validated_one_by_one(doc: list, addresses: list[str],
                                          error: str | None) -> None:
    parsed = parse_targets(json.dumps(doc), "t.json")
    assert [e.address for e in parsed.entries] == addresses
    if error is None:
        assert parsed.errors == ()
    else:
        assert any(error in e for e in parsed.errors), parsed.errors


def test_yaml_is_read_by_extension() -> None:
    parsed = parse_targets("- targets: ['a:1']\n  labels: {job: x}\n", "t.yml")
    assert parsed.entries[0].address == "a:1" and parsed.entries[0].labels == (("job", "x"),)


@pytest.mark.parametrize("text, path", [("{", "t.json"), ("{}", "t.json"), ("- [", "t.yaml")])
def test_a_shapeless_file_is_a_config_error(text: str, path: str) -> None:
    with pytest.raises(ConfigError):
        parse_targets(text, path)


def test_a_broken_edit_keeps_the_last_good_targets(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_text(json.dumps([{"targets": ["a:1"]}]))
    tf = TargetsFile(str(path))
    assert tf.read_if_changed() is not None
    assert tf.read_if_changed() is None  # unchanged
    path.write_text("[{")
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 1_000_000))
    assert tf.read_if_changed() is None and "not valid JSON" in (tf.last_error or "")


def test_the_sidecar_reloads_the_file_without_a_restart(
    reverb_servers: Callable[[int], list[str]], sidecar: Callable[..., tuple[Proc, str]],
    tmp_path: Path,
) -> None:
    first, second = reverb_servers(2)
    path = tmp_path / "targets.json"
    path.write_text(json.dumps([{"targets": [first], "labels": {"job": "one"}}]))
    _, base = sidecar("--targets-file", str(path), "--interval", "0.5", "--db",
                      str(tmp_path / "i.db"))

    def names() -> set[str]:
        return {t["name"] for t in get_json(f"{base}/api/v1/targets")[1]["targets"]}

    wait_until(lambda: names() == {first}, 15)
    labels = get_json(f"{base}/api/v1/targets")[1]["targets"][0]["labels"]
    assert labels == {"job": "one"}
    # Add the second target and a malformed one: the valid ones run, the bad is named.
    path.write_text(json.dumps([{"targets": [first, second, "bad address"]}]))
    wait_until(lambda: names() == {first, second}, 15)
    errors = get_json(f"{base}/api/v1/targets")[1]["config_errors"]
    assert any("'bad address'" in e for e in errors), errors
    wait_until(lambda: all(t["up"] for t in get_json(f"{base}/api/v1/targets")[1]["targets"]),
               15)
    # Remove the first target.
    path.write_text(json.dumps([{"targets": [second]}]))
    wait_until(lambda: names() == {second}, 15)


@pytest.mark.slow  # runs replaywatch as a process
def test_an_unreadable_targets_file_at_start_is_exit_2(tmp_path: Path) -> None:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "replaywatch", "watch", "--targets-file",
                           str(tmp_path / "missing.json")], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 2 and "targets file" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
