"""Targets from a file in Prometheus `file_sd` format, reloaded when it changes.

    [
      {"targets": ["10.0.0.5:8000", "10.0.0.6:8000"], "labels": {"job": "pong"}},
      {"targets": ["learner-0:8000"], "labels": {"__probe_url__": "http://learner-0:8001"}},
      {"targets": ["r1:8000"], "labels": {"__probe_url__": "http://l:8001,http://a0:8002"}}
    ]

JSON or YAML (by extension: .yml/.yaml is YAML). Each group has `targets` (a list
of HOST:PORT) and optional `labels` (string to string). The meta label
`__probe_url__` attaches probes to the group's only target: one URL, or several
separated by commas (a label value is one string), trainer and actor probes alike
(each probe's document says its role). A bad group or target is rejected with a
message naming it, and the valid ones keep running: one typo must not stop the
watch of every other job.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from replaywatch.config import parse_address, parse_probe
from replaywatch.errors import ConfigError

PROBE_LABEL = "__probe_url__"
_GROUP_KEYS = {"targets", "labels"}


@dataclasses.dataclass(frozen=True)
class TargetEntry:
    address: str
    labels: tuple[tuple[str, str], ...] = ()
    probe_urls: tuple[str, ...] = ()  # trainer and actor probes of this target


@dataclasses.dataclass(frozen=True)
class ParsedTargets:
    entries: tuple[TargetEntry, ...]
    errors: tuple[str, ...]


def _load(text: str, path: str) -> Any:
    if path.endswith((".yml", ".yaml")):
        import yaml

        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ConfigError(f"targets file {path}: not valid YAML ({str(e).splitlines()[0]})"
                              ) from None
    try:
        return json.loads(text)
    except ValueError as e:
        raise ConfigError(f"targets file {path}: not valid JSON ({e})") from None


def _group(group: Any, where: str, seen: set[str]) -> tuple[list[TargetEntry], list[str]]:
    if not isinstance(group, dict):
        return [], [f"{where}: must be an object with 'targets' and 'labels'"]
    unknown = sorted(set(group) - _GROUP_KEYS)
    if unknown:
        return [], [f"{where}: unknown key {unknown[0]!r} (known: labels, targets)"]
    targets, labels = group.get("targets"), group.get("labels", {}) or {}
    if not isinstance(targets, list) or not targets:
        return [], [f"{where}: 'targets' must be a non-empty list of HOST:PORT"]
    if not isinstance(labels, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
    ):
        return [], [f"{where}: 'labels' must map strings to strings"]
    probes: tuple[str, ...] = ()
    if PROBE_LABEL in labels:
        if len(targets) != 1:
            return [], [f"{where}: {PROBE_LABEL} needs a group with exactly one target"]
        try:
            probes = tuple(parse_probe(p.strip()).url for p in labels[PROBE_LABEL].split(","))
        except ConfigError as e:
            return [], [f"{where}: {e}"]
        again = sorted(p for p in set(probes) if probes.count(p) > 1 or p in seen)
        if again:
            return [], [f"{where}: probe {again[0]} is listed twice"]
    kept = tuple(sorted((k, v) for k, v in labels.items() if not k.startswith("__")))
    entries, errors = [], []
    for j, raw in enumerate(targets):
        try:
            address = parse_address(str(raw), "target")
        except ConfigError as e:
            errors.append(f"{where} target {j} ({str(raw)[:100]!r}): {e}")
            continue
        if address in seen:
            errors.append(f"{where} target {j}: duplicate target {address}")
            continue
        seen.add(address)
        seen.update(probes)
        entries.append(TargetEntry(address, kept, probes))
    return entries, errors


def parse_targets(text: str, path: str, reserved: frozenset[str] = frozenset()) -> ParsedTargets:
    """Parses a whole file; a file that isn't a list at all is a ConfigError."""
    doc = _load(text, path)
    if doc is None:
        doc = []
    if not isinstance(doc, list):
        raise ConfigError(f"targets file {path}: must be a list of target groups")
    seen, entries, errors = set(reserved), [], []
    for i, group in enumerate(doc):
        got, bad = _group(group, f"targets file {path} group {i}", seen)
        entries += got
        errors += bad
    return ParsedTargets(tuple(entries), tuple(errors))


class TargetsFile:
    """Re-reads the file when its modification time, size or inode changes."""

    def __init__(self, path: str, reserved: frozenset[str] = frozenset()):
        self.path = path
        self._reserved = reserved
        self._stamp: tuple[int, int, int] | None = None
        self.last_error: str | None = None

    def read_if_changed(self) -> ParsedTargets | None:
        """The new targets, or None if the file is unchanged or unreadable now."""
        try:
            st = os.stat(self.path)
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
            if stamp == self._stamp:
                return None
            with open(self.path, encoding="utf-8") as f:
                text = f.read(16 * 1024 * 1024)
        except OSError as e:
            # Keep watching what we had: a file being replaced is briefly missing.
            self.last_error = f"targets file {self.path}: {e.strerror or e}"
            return None
        try:
            parsed = parse_targets(text, self.path, self._reserved)
        except ConfigError as e:
            self.last_error = str(e)
            self._stamp = stamp  # don't re-parse the same broken content every cycle
            return None
        self._stamp = stamp
        self.last_error = "; ".join(parsed.errors) or None
        return parsed
