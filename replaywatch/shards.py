"""Several sidecars over one list of targets: `--shard I/N` keeps the targets whose stable hash
is I modulo N, so N sidecars given the same list (flags or a targets file) poll every target
exactly once between them, each with 1/N of the work.

The hash is MD5 of the target's job where it has one (its `job` label: the servers a job
shards its experience over are judged against each other, so one sidecar owns them all), else
of its name (a Reverb target's HOST:PORT as written, a Ray target's dashboard URL), read as a
big-endian integer: the same on every host and every Python, with no seed (Python's hash()
changes per process). A probe follows its target, so a job's servers and their probes are
judged by the one sidecar that owns them. Each sidecar exports how many
targets of the list it owns and how many it leaves to the others (`replaywatch_targets`), and
its shard (`replaywatch_shard_index`, `replaywatch_shard_count`): summed over the shards,
the owned count equals the list's size only when every shard runs with the same N and the
same list (the alert ReplaywatchShardsDisagree).
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Mapping

from replaywatch.errors import ConfigError

_SPEC = re.compile(r"\s*(\d+)\s*/\s*(\d+)\s*")


@dataclasses.dataclass(frozen=True)
class Shard:
    index: int
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def owns(self, key: str) -> bool:
        """Whether this shard polls the targets hashed by `key` (a job, else a target)."""
        return owner(key, self.count) == self.index


def parse_shard(spec: str) -> Shard:
    """`I/N` with 0 <= I < N; a ConfigError (one line) otherwise."""
    found = _SPEC.fullmatch(spec)
    if found is None:
        raise ConfigError(f"--shard {spec!r} must be I/N, e.g. 0/2 (shards 0 to N-1 of N)")
    index, count = int(found.group(1)), int(found.group(2))
    if count < 1 or index >= count:
        raise ConfigError(f"--shard {spec!r}: the index must be 0 to {max(count, 1) - 1} "
                          f"of {count} shard(s)")
    return Shard(index, count)


def owner(key: str, count: int) -> int:
    """The shard (0 to count-1) that polls the targets hashed by `key`."""
    digest = hashlib.md5(key.encode(), usedforsecurity=False).digest()
    return int.from_bytes(digest[:8], "big") % count


@dataclasses.dataclass(frozen=True)
class ShardCounts:
    """This sidecar's shard and the list's targets it owns and leaves to the others."""

    shard: Shard
    owned: int
    others: int


class Sharding:
    """Keeps the owned targets of every list the sidecar is handed (at start, and each reload
    of a targets file), and counts both sides for /metrics."""

    def __init__(self, shard: Shard):
        self.shard = shard
        self.counts = ShardCounts(shard, 0, 0)

    def keep(self, targets: Mapping[str, str]) -> set[str]:
        """The targets of the list (each with the key it is hashed by: its job, else
        itself) this shard owns; counts both sides."""
        owned = {t for t, key in targets.items() if self.shard.owns(key)}
        self.counts = ShardCounts(self.shard, len(owned), len(targets) - len(owned))
        return owned
