"""An RLlib job's result rows: result.json (one `algo.train()` result a line, as Tune's
JsonLoggerCallback writes it, or a job that writes it itself) tailed poll by poll, and each
line read into a `ResultRow`.

Ray 2.60 writes no result.json in a plain `algo.train()` loop (docs/research/
rllib-observables.md): the rows are an optional source, read where a Tune run or the job
keeps them.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from replaywatch.errors import SourceError
from replaywatch.probe.protocol import (
    BufferKeys,
    ConfigKeys,
    Doc,
    QueueKeys,
    ResultKeys,
    Rllib,
    Role,
)
from replaywatch.ray_model import ResultRow, RllibLive
from replaywatch.sources.probe_http import get_json

_TEXT = 300


def _one_line(text: Any) -> str:
    return " ".join(str(text).split())[:_TEXT]


# ResultRow field -> the row's key (nested dicts, written with "/"), declared with the RLlib
# probe's `row`, which carries the same keys.
R, C = ResultKeys, ConfigKeys
ROW_KEYS = {
    "replay_env_steps_added": R.REPLAY_ENV_STEPS_ADDED,
    "replay_env_steps_added_lifetime": R.REPLAY_ENV_STEPS_ADDED_LIFETIME,
    "replay_env_steps_sampled": R.REPLAY_ENV_STEPS_SAMPLED,
    "replay_env_steps_sampled_lifetime": R.REPLAY_ENV_STEPS_SAMPLED_LIFETIME,
    "replay_env_steps_evicted": R.REPLAY_ENV_STEPS_EVICTED,
    "replay_env_steps_evicted_lifetime": R.REPLAY_ENV_STEPS_EVICTED_LIFETIME,
    "replay_env_steps_stored": R.REPLAY_ENV_STEPS_STORED,
    "replay_episodes_stored": R.REPLAY_EPISODES_STORED,
    "replay_episodes_added": R.REPLAY_EPISODES_ADDED,
    "replay_episodes_evicted": R.REPLAY_EPISODES_EVICTED,
    "replay_env_step_utilization": R.REPLAY_ENV_STEP_UTILIZATION,
    "replay_num_resamples": R.REPLAY_NUM_RESAMPLES,
    "env_steps_sampled": R.ENV_STEPS_SAMPLED,
    "env_steps_sampled_lifetime": R.ENV_STEPS_SAMPLED_LIFETIME,
    "env_steps_trained": R.ENV_STEPS_TRAINED,
    "env_steps_trained_lifetime": R.ENV_STEPS_TRAINED_LIFETIME,
    "learner_group_ts_dropped_lifetime": R.LEARNER_GROUP_TS_DROPPED_LIFETIME,
    "learner_thread_in_queue_wait_timer": R.LEARNER_THREAD_IN_QUEUE_WAIT_TIMER,
    "learner_thread_out_queue_size": R.LEARNER_THREAD_OUT_QUEUE_SIZE,
    "aggregator_env_steps_dropped_lifetime": R.AGGREGATOR_ENV_STEPS_DROPPED_LIFETIME,
    "num_healthy_workers": R.NUM_HEALTHY_WORKERS,
    "num_remote_worker_restarts": R.NUM_REMOTE_WORKER_RESTARTS,
}
# ResultRow field -> the key of the row's `config` (AlgorithmConfig.to_dict's names).
CONFIG_INTS = {
    "train_batch_size": C.TRAIN_BATCH_SIZE,
    "num_learners": C.NUM_LEARNERS,
    "replay_capacity": C.REPLAY_CAPACITY,
    "num_steps_sampled_before_learning_starts": C.LEARNING_STARTS,
    "num_env_runners": C.NUM_ENV_RUNNERS,
    "num_envs_per_env_runner": C.NUM_ENVS_PER_ENV_RUNNER,
    "n_step": C.N_STEP,
}
# to_dict() copies the attributes, and this one is a property over `_train_batch_size_...`.
PER_LEARNER = (C.TRAIN_BATCH_SIZE_PER_LEARNER, C.TRAIN_BATCH_SIZE_PER_LEARNER_ATTR)


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
    config = obj.get(R.CONFIG)
    config = config if isinstance(config, dict) else {}
    fragment = _at(config, C.ROLLOUT_FRAGMENT_LENGTH)
    per_learner = next((v for k in PER_LEARNER if (v := config.get(k)) is not None), None)
    read: dict[str, Any] = {field: _number(_at(obj, key)) for field, key in ROW_KEYS.items()}
    read |= {field: _int(_number(_at(config, key))) for field, key in CONFIG_INTS.items()}
    return ResultRow(
        iteration=_int(_number(obj.get(R.ITERATION))),
        timestamp=_number(obj.get(R.TIMESTAMP)),
        time_this_iter_s=_number(obj.get(R.TIME_THIS_ITER_S)),
        time_total_s=_number(obj.get(R.TIME_TOTAL_S)),
        pid=_int(_number(obj.get(R.PID))),
        training_intensity=_number(config.get(C.TRAINING_INTENSITY)),
        train_batch_size_per_learner=_int(_number(per_learner)),
        rollout_fragment_length=_int(_number(fragment)),
        rollout_fragment_length_auto=None if fragment is None else fragment == "auto",
        **read)


@dataclasses.dataclass(frozen=True)
class JobOwner:
    """Whose rows a tail reads on a cluster of several jobs: the job, its processes' pids
    (the driver's, its actors'), and when it started (seconds since the epoch)."""

    job_id: str
    pids: frozenset[int]
    since: float

    def says(self) -> str:
        return f"job {self.job_id} (pids {', '.join(map(str, sorted(self.pids)))})"


class ResultTail:
    """A result.json read incrementally: each poll parses the lines added since the last.

    `path` is the file, or a directory searched for the newest result.json (Tune's layout:
    the experiment, then the trial; or a job's own logdir). A partial last line is left for
    the next poll; a file that shrank or was replaced (another inode, another newest file)
    is read again from its start, as a new run. Only the last `KEEP` rows are kept, so a long
    file is read from its last `MAX_READ` bytes.

    With `owner` (one job of several on a cluster, `--ray-job all`), the newest is the newest
    file of that job's: one whose first row's `pid` (Trainable's, in every row) is the job's
    driver or one of its actors (a Tune trial), written since the job started."""

    KEEP = 8
    MAX_READ = 4 * 1024 * 1024  # rows are ~20 KB, most of it the config

    def __init__(self, path: Path):
        self._path = path
        self._file: Path | None = None
        self._inode = -1
        self._offset = 0
        self._rows: collections.deque[ResultRow] = collections.deque(maxlen=self.KEEP)
        self._first_pid: dict[tuple[str, int], int | None] = {}  # (file, inode) -> its pid

    def read(self, owner: JobOwner | None = None
             ) -> tuple[tuple[ResultRow, ...], str | None, tuple[str, ...]]:
        """The latest rows (oldest first), the file read, and what could not be read;
        `owner`: only a file of that job's (see the class)."""
        file = self._find(owner)
        if file is None:
            where = "under" if self._path.is_dir() else "at"
            whose = "" if owner is None else f" of {owner.says()}"
            return tuple(self._rows), None, (
                f"results: no result.json{whose} {where} {self._path}",)
        try:
            errors = self._read(file)
        except OSError as e:
            errors = (f"results: {file}: {_one_line(e.strerror or e)}",)
        return tuple(self._rows), str(file), errors

    def _find(self, owner: JobOwner | None) -> Path | None:
        if not self._path.is_dir():
            return self._path if self._path.is_file() else None
        found = []
        for pattern in ("result.json", "*/result.json", "*/*/result.json"):
            for p in self._path.glob(pattern):
                try:
                    st = p.stat()
                except OSError:
                    continue  # gone between the listing and the stat
                if owner is not None and not (
                        st.st_mtime >= owner.since and self._pid_of(p, st.st_ino) in owner.pids):
                    continue
                found.append((st.st_mtime, str(p), p))
        return max(found)[2] if found else None

    def _pid_of(self, file: Path, inode: int) -> int | None:
        """The `pid` of the file's first row, read once per file; None until a whole first
        line is written (asked again then), or where it names none."""
        key = (str(file), inode)
        if key in self._first_pid:
            return self._first_pid[key]
        try:
            with file.open("rb") as f:
                line = f.readline(self.MAX_READ)
        except OSError:
            return None
        if not line.endswith(b"\n"):
            return None
        try:
            pid = parse_result_row(json.loads(line)).pid
        except ValueError:
            pid = None
        self._first_pid[key] = pid
        return pid

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


class ResultProbe:
    """The rows and the live reading of an RLlib probe in the driver (`--ray-results URL`,
    replaywatch.probe.rllib): its newest `train()` row is kept when its iteration is new,
    as a result.json line is, so the rules read the same rows either way; its buffer and
    learner queue now are `live`."""

    KEEP = ResultTail.KEEP

    def __init__(self, url: str, timeout_s: float = 1.0):
        self._url = url.rstrip("/")
        self._timeout_s = timeout_s
        self._rows: collections.deque[ResultRow] = collections.deque(maxlen=self.KEEP)
        self.live: RllibLive | None = None

    def read(self) -> tuple[tuple[ResultRow, ...], str | None, tuple[str, ...]]:
        """The latest rows (oldest first), the URL read, and what could not be read; `live`
        is the reading of this read (None when it failed)."""
        self.live = None
        try:
            doc = get_json(f"{self._url}/probe", self._timeout_s)
        except SourceError as e:
            return tuple(self._rows), self._url, (f"results: {_one_line(e)}",)
        if doc.get(Doc.ROLE) != Role.RLLIB:
            return tuple(self._rows), self._url, (
                f"results: {self._url} is not an RLlib probe (role "
                f"{_one_line(doc.get(Doc.ROLE))!r}): --ray-results takes RLlibProbe's URL",)
        said: tuple[str, ...] = ()
        row = doc.get(Rllib.ROW)
        if isinstance(row, dict):
            try:
                read = parse_result_row(row)
            except ValueError:
                read = None
            if read is not None and (not self._rows or read.iteration != self._rows[-1].iteration
                                     or read.timestamp != self._rows[-1].timestamp):
                self._rows.append(read)
        elif row is not None:
            said = (f"results: {self._url}: its row is not a JSON object",)
        self.live = live_from_probe(doc)
        return tuple(self._rows), self._url, said


def live_from_probe(doc: dict[str, Any]) -> RllibLive:
    """An RLlib probe's buffer and learner queue, each value kept only where it has its type."""
    buffer = doc.get(Rllib.BUFFER)
    buffer = buffer if isinstance(buffer, dict) else {}
    queue = doc.get(Rllib.LEARNER_QUEUE)
    queue = queue if isinstance(queue, dict) else {}
    now = _number(doc.get(Doc.NOW))
    kind, algorithm = buffer.get(BufferKeys.KIND), doc.get(Rllib.ALGORITHM)
    return RllibLive(
        observed_at=now if now is not None else 0.0,
        algorithm=_one_line(algorithm) if isinstance(algorithm, str) else None,
        buffer_kind=_one_line(kind) if isinstance(kind, str) else None,
        capacity=_int(_number(buffer.get(BufferKeys.CAPACITY))),
        env_steps_stored=_int(_number(buffer.get(BufferKeys.STORED))),
        env_steps_added=_int(_number(buffer.get(BufferKeys.ADDED))),
        env_steps_sampled=_int(_number(buffer.get(BufferKeys.SAMPLED))),
        episodes_stored=_int(_number(buffer.get(BufferKeys.EPISODES_STORED))),
        episodes_evicted=_int(_number(buffer.get(BufferKeys.EPISODES_EVICTED))),
        max_priority=_number(buffer.get(BufferKeys.MAX_PRIORITY)),
        queue_depth=_int(_number(queue.get(QueueKeys.DEPTH))),
        queue_maxsize=_int(_number(queue.get(QueueKeys.MAXSIZE))),
        learner_thread_alive=_bool(queue.get(QueueKeys.THREAD_ALIVE)),
        learner_waiting=_bool(queue.get(QueueKeys.WAITING)),
        learner_waited_s=_number(queue.get(QueueKeys.WAITED_S)),
        learner_watched_s=_number(queue.get(QueueKeys.WATCHED_S)),
        rss_bytes=_int(_number(doc.get(Rllib.RSS_BYTES))),
        limit_bytes=_int(_number(doc.get(Rllib.LIMIT_BYTES))),
        limit_from=_one_line(source) if isinstance(source := doc.get(Rllib.LIMIT_FROM), str)
        else None,
        cgroup_usage_bytes=_int(_number(doc.get(Rllib.CGROUP_USAGE_BYTES))),
        cgroup_anon_bytes=_int(_number(doc.get(Rllib.CGROUP_ANON_BYTES))),
        oom_kills=_int(_number(doc.get(Rllib.OOM_KILLS))))


def _bool(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None
