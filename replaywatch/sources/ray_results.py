"""An RLlib job's result rows: result.json (one `algo.train()` result a line, as Tune's
JsonLoggerCallback writes it, or a job that writes it itself) tailed poll by poll, and each
line read into a `ResultRow`.

Ray 2.60 writes no result.json in a plain `algo.train()` loop (docs/research/
rllib-observables.md): the rows are an optional source, read where a Tune run or the job
keeps them.
"""

from __future__ import annotations

import collections
import json
import math
from pathlib import Path
from typing import Any

from replaywatch.ray_model import ResultRow

_TEXT = 300


def _one_line(text: Any) -> str:
    return " ".join(str(text).split())[:_TEXT]


# ResultRow field -> the row's key (nested dicts, written with "/").
ROW_KEYS = {
    "replay_env_steps_added": "replay_buffer/num_env_steps_added",
    "replay_env_steps_added_lifetime": "replay_buffer/num_env_steps_added_lifetime",
    "replay_env_steps_sampled": "replay_buffer/num_env_steps_sampled",
    "replay_env_steps_sampled_lifetime": "replay_buffer/num_env_steps_sampled_lifetime",
    "replay_env_steps_evicted": "replay_buffer/num_env_steps_evicted",
    "replay_env_steps_evicted_lifetime": "replay_buffer/num_env_steps_evicted_lifetime",
    "replay_env_steps_stored": "replay_buffer/num_env_steps_stored",
    "replay_episodes_stored": "replay_buffer/num_episodes_stored",
    "replay_episodes_added": "replay_buffer/num_episodes_added",
    "replay_episodes_evicted": "replay_buffer/num_episodes_evicted",
    "replay_env_step_utilization": "replay_buffer/env_step_utilization",
    "replay_num_resamples": "replay_buffer/num_resamples",
    "env_steps_sampled": "env_runners/num_env_steps_sampled",
    "env_steps_sampled_lifetime": "env_runners/num_env_steps_sampled_lifetime",
    "env_steps_trained": "learners/__all_modules__/num_env_steps_trained",
    "env_steps_trained_lifetime": "learners/__all_modules__/num_env_steps_trained_lifetime",
    "learner_group_ts_dropped_lifetime": "learner_group/learner_group_ts_dropped_lifetime",
    "learner_thread_in_queue_wait_timer":
        "learners/__all_modules__/learner_thread_in_queue_wait_timer",
    "learner_thread_out_queue_size": "learners/__all_modules__/learner_thread_out_queue_size",
    "aggregator_env_steps_dropped_lifetime": "aggregator_actors/num_env_steps_dropped_lifetime",
    "num_healthy_workers": "fault_tolerance/num_healthy_workers",
    "num_remote_worker_restarts": "fault_tolerance/num_remote_worker_restarts",
}
# ResultRow field -> the key of the row's `config` (AlgorithmConfig.to_dict's names).
CONFIG_INTS = {
    "train_batch_size": "train_batch_size",
    "num_learners": "num_learners",
    "replay_capacity": "replay_buffer_config/capacity",
    "num_steps_sampled_before_learning_starts": "num_steps_sampled_before_learning_starts",
    "num_env_runners": "num_env_runners",
    "num_envs_per_env_runner": "num_envs_per_env_runner",
    "n_step": "n_step",
}
# to_dict() copies the attributes, and this one is a property over `_train_batch_size_...`.
PER_LEARNER = ("train_batch_size_per_learner", "_train_batch_size_per_learner")


def _at(obj: dict[str, Any], path: str) -> Any:
    """The value at `a/b/c` of nested dicts, or under the flat key `a/b/c` (a flattened row)."""
    node: Any = obj
    for part in path.split("/"):
        if not isinstance(node, dict) or part not in node:
            return obj.get(path)
        node = node[part]
    return node


def _number(value: Any) -> float | None:
    """A JSON number as a float; NaN (RLlib's mean of nothing), text and bools as None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return None if math.isnan(value) else float(value)


def _int(value: float | None) -> int | None:
    return None if value is None or not math.isfinite(value) else int(value)


def parse_result_row(obj: Any) -> ResultRow:
    """One result.json line (one `algo.train()` result) as a row; ValueError if it is not a
    JSON object."""
    if not isinstance(obj, dict):
        raise ValueError("a result row is a JSON object")
    config = obj.get("config")
    config = config if isinstance(config, dict) else {}
    fragment = _at(config, "rollout_fragment_length")
    per_learner = next((v for k in PER_LEARNER if (v := config.get(k)) is not None), None)
    read: dict[str, Any] = {field: _number(_at(obj, key)) for field, key in ROW_KEYS.items()}
    read |= {field: _int(_number(_at(config, key))) for field, key in CONFIG_INTS.items()}
    return ResultRow(
        iteration=_int(_number(obj.get("training_iteration"))),
        timestamp=_number(obj.get("timestamp")),
        time_this_iter_s=_number(obj.get("time_this_iter_s")),
        time_total_s=_number(obj.get("time_total_s")),
        pid=_int(_number(obj.get("pid"))),
        training_intensity=_number(config.get("training_intensity")),
        train_batch_size_per_learner=_int(_number(per_learner)),
        rollout_fragment_length=_int(_number(fragment)),
        rollout_fragment_length_auto=None if fragment is None else fragment == "auto",
        **read)


class ResultTail:
    """A result.json read incrementally: each poll parses the lines added since the last.

    `path` is the file, or a directory searched for the newest result.json (Tune's layout:
    the experiment, then the trial; or a job's own logdir). A partial last line is left for
    the next poll; a file that shrank or was replaced (another inode, another newest file)
    is read again from its start, as a new run. Only the last `KEEP` rows are kept, so a long
    file is read from its last `MAX_READ` bytes."""

    KEEP = 8
    MAX_READ = 4 * 1024 * 1024  # rows are ~20 KB, most of it the config

    def __init__(self, path: Path):
        self._path = path
        self._file: Path | None = None
        self._inode = -1
        self._offset = 0
        self._rows: collections.deque[ResultRow] = collections.deque(maxlen=self.KEEP)

    def read(self) -> tuple[tuple[ResultRow, ...], str | None, tuple[str, ...]]:
        """The latest rows (oldest first), the file read, and what could not be read."""
        file = self._find()
        if file is None:
            where = "under" if self._path.is_dir() else "at"
            return tuple(self._rows), None, (f"results: no result.json {where} {self._path}",)
        try:
            errors = self._read(file)
        except OSError as e:
            errors = (f"results: {file}: {_one_line(e.strerror or e)}",)
        return tuple(self._rows), str(file), errors

    def _find(self) -> Path | None:
        if not self._path.is_dir():
            return self._path if self._path.is_file() else None
        found = []
        for pattern in ("result.json", "*/result.json", "*/*/result.json"):
            for p in self._path.glob(pattern):
                try:
                    found.append((p.stat().st_mtime, str(p), p))
                except OSError:
                    continue  # gone between the listing and the stat
        return max(found)[2] if found else None

    def _read(self, file: Path) -> tuple[str, ...]:
        size, inode = file.stat().st_size, file.stat().st_ino
        if file != self._file or inode != self._inode or size < self._offset:
            self._file, self._inode, self._offset = file, inode, 0
            self._rows.clear()
        if size == self._offset:
            return ()
        start = max(self._offset, size - self.MAX_READ)
        with file.open("rb") as f:
            f.seek(start)
            data = f.read(self.MAX_READ)
        end = data.rfind(b"\n")
        if end < 0:  # a partial line only: the rest comes with a later poll
            if len(data) < self.MAX_READ:
                return ()
            self._offset = start + len(data)
            return (f"results: {file}: a line longer than {self.MAX_READ} bytes, skipped",)
        lines = data[:end].split(b"\n")
        if start > self._offset:
            lines = lines[1:]  # began mid-line
        self._offset = start + end + 1
        bad = 0
        for line in filter(bytes.strip, lines):
            try:
                self._rows.append(parse_result_row(json.loads(line)))
            except ValueError:
                bad += 1
        return (f"results: {file}: {bad} lines not a JSON object, skipped",) if bad else ()
