"""What each batch the learner takes says about its replay, read from the batch's SampleInfo.

Reverb hands every sample its `info`: the item's key, the probability it was sampled with,
the table's size, its priority and how often it was sampled before (reverb/replay_sample.py).
The trainer probe passes each batch's `info` (a reference, no data copied) to a daemon thread,
which reads it in O(batch) off the learner's hot path:

    keys repeated in a batch      keys - distinct keys (in the batches read in full, one in
                                  SAMPLE_EVERY; the other statistics below too)
    batches repeated              a batch whose keys (4 or more) are exactly those of one of
                                  the last RECENT batches: a cached batch yielded again
                                  (acme#293: a prefetch that replays a batch)
    effective sample size         1 / mean(probability) over the recent batches: a sample's
                                  probability averages sum(p^2) over the table, so this is
                                  Kish's effective number of items the sampler draws from
    largest importance weight     1 / (table_size x the smallest probability in a batch)
    infinite priorities           +inf priorities seen (accepted by Reverb; they take over)
    times sampled                 the mean and the largest in the newest batch

A batch without a SampleInfo (a pipeline that dropped it), or whose fields are not arrays, is
not counted. Standard library only: the arrays' own methods (NumPy's, through TensorFlow's
`.numpy()`) do the arithmetic.
"""

from __future__ import annotations

import collections
import math
import threading
import time
from typing import Any

from replaywatch.probe.protocol import Batches

RECENT = 16  # batches remembered for exact repeats and the effective sample size
MIN_REPEAT_KEYS = 4  # below, an exact repeat happens by chance on a small table
_QUEUE = 256  # batches waiting for the thread; beyond, the oldest is dropped and counted
READ_EVERY_S = 0.25  # the thread reads what came in since, this often
# Every batch's keys are compared with the recent ones; the rest (probabilities, priorities,
# times sampled, repeats within a batch) is read from one batch in SAMPLE_EVERY: estimates
# of the same distributions, at a quarter of the cost (measured: 52 us for a whole batch of
# 256 read in full).
SAMPLE_EVERY = 4
YIELD_EVERY = 8  # batches read between two hand-backs of the GIL


def sample_info(item: Any) -> Any | None:
    """The SampleInfo of a batch: `item.info` (reverb.ReplaySample, Acme), or the second of a
    pair (TF-Agents' `as_dataset`: (trajectory, info)); None when there is none."""
    info = getattr(item, "info", None)
    if info is not None and hasattr(info, "key"):
        return info
    if isinstance(item, tuple) and len(item) == 2 and hasattr(item[1], "key"):
        return item[1]
    return None


def _array(x: Any) -> Any | None:
    """An array's own methods do the arithmetic (NumPy's, reached through TensorFlow's
    `.numpy()` or a JAX array's), not a Python loop over every value. None for anything
    else."""
    if x is None:
        return None
    if hasattr(x, "numpy"):
        x = x.numpy()
    return x if hasattr(x, "ravel") and hasattr(x, "tobytes") else None


class BatchStats:
    """Counts over the batches offered; `offer` runs on the learner's thread, the rest on one
    daemon thread started with the first batch."""

    def __init__(self) -> None:
        self._queue: collections.deque[Any] = collections.deque()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._recent_keys: collections.deque[bytes] = collections.deque(maxlen=RECENT)
        self._recent_p: collections.deque[tuple[float, int]] = collections.deque(maxlen=RECENT)
        self._seen = -1
        self._doc: dict[str, Any] = {
            Batches.BATCHES: 0, Batches.BATCHES_READ: 0, Batches.KEYS: 0,
            Batches.KEYS_REPEATED_IN_BATCH: 0, Batches.BATCHES_REPEATED: 0,
            Batches.INFINITE_PRIORITIES: 0, Batches.DROPPED: 0,
            Batches.EFFECTIVE_SAMPLE_SIZE: None, Batches.TABLE_SIZE: None,
            Batches.MAX_IMPORTANCE_WEIGHT: None, Batches.TIMES_SAMPLED_MEAN: None,
            Batches.TIMES_SAMPLED_MAX: None,
            Batches.CPU_SECONDS: 0.0}  # the reading thread's own CPU time: what it costs

    def offer(self, item: Any) -> None:
        """One batch, as the learner got it: its info is queued for the thread."""
        info = sample_info(item)
        if info is None:
            return
        if len(self._queue) >= _QUEUE:
            self._queue.popleft()
            with self._lock:
                self._doc = {**self._doc, Batches.DROPPED: self._doc[Batches.DROPPED] + 1}
        self._queue.append(info)
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, daemon=True,
                                            name="replaywatch-batch-stats")
            self._thread.start()

    def doc(self) -> dict[str, Any]:
        with self._lock:
            return dict(self._doc)

    def _run(self) -> None:
        # Woken by a clock, not by each batch: no wake-up (a futex, a thread switch) is added
        # to the learner's every next().
        while True:
            time.sleep(READ_EVERY_S)
            if not self._queue:
                continue
            started = time.thread_time()  # this thread's CPU only, the sleeps left out
            read = 0
            while self._queue:
                try:
                    self._read(self._queue.popleft())
                except Exception:  # a batch we cannot read is not the learner's problem
                    pass
                read += 1
                if read % YIELD_EVERY == 0:
                    # Hands the GIL back: a learner thread back from its C code waits for
                    # YIELD_EVERY batches' reading at most (~0.2 ms), not for the whole
                    # backlog. After every batch it cost the thread twice the CPU (a switch
                    # each; make bench-batch-stats: 66 us a batch against 34).
                    time.sleep(0)
            spent = time.thread_time() - started
            with self._lock:
                d = self._doc
                self._doc = {**d, Batches.CPU_SECONDS: d[Batches.CPU_SECONDS] + spent}

    def _read(self, info: Any) -> None:
        keys = _array(getattr(info, "key", None))
        if keys is None or keys.size == 0:
            return
        # Every batch's keys, for the exact repeats; the rest from one batch in SAMPLE_EVERY.
        n, signature = int(keys.size), keys.tobytes()
        repeated = n >= MIN_REPEAT_KEYS and signature in self._recent_keys
        self._recent_keys.append(signature)
        self._seen += 1
        if self._seen % SAMPLE_EVERY:
            with self._lock:
                d = self._doc
                self._doc = {**d, Batches.BATCHES: d[Batches.BATCHES] + 1,
                             Batches.KEYS: d[Batches.KEYS] + n,
                             Batches.BATCHES_REPEATED: d[Batches.BATCHES_REPEATED] + int(repeated)}
            return
        probs = _array(getattr(info, "probability", None))
        sizes = _array(getattr(info, "table_size", None))
        prios = _array(getattr(info, "priority", None))
        times = _array(getattr(info, "times_sampled", None))
        distinct = len(set(keys.ravel().tolist()))
        if probs is not None and probs.size:
            self._recent_p.append((float(probs.sum()), int(probs.size)))
        total, count = (sum(s for s, _ in self._recent_p), sum(c for _, c in self._recent_p))
        size = int(sizes.max()) if sizes is not None and sizes.size else None
        smallest = float(probs.min()) if probs is not None and probs.size else None
        infinite = (int((prios == math.inf).sum())
                    if prios is not None and prios.size and float(prios.max()) == math.inf
                    else 0)
        with self._lock:
            d = self._doc
            self._doc = {
                **d, Batches.BATCHES: d[Batches.BATCHES] + 1, Batches.KEYS: d[Batches.KEYS] + n,
                Batches.BATCHES_READ: d[Batches.BATCHES_READ] + 1,
                Batches.KEYS_REPEATED_IN_BATCH: d[Batches.KEYS_REPEATED_IN_BATCH] + n - distinct,
                Batches.BATCHES_REPEATED: d[Batches.BATCHES_REPEATED] + int(repeated),
                Batches.INFINITE_PRIORITIES: d[Batches.INFINITE_PRIORITIES] + infinite,
                Batches.EFFECTIVE_SAMPLE_SIZE: (count / total if total > 0
                                                else d[Batches.EFFECTIVE_SAMPLE_SIZE]),
                Batches.TABLE_SIZE: size or d[Batches.TABLE_SIZE],
                Batches.MAX_IMPORTANCE_WEIGHT: (1.0 / (size * smallest) if size and smallest
                                                else d[Batches.MAX_IMPORTANCE_WEIGHT]),
                Batches.TIMES_SAMPLED_MEAN: (float(times.mean())
                                             if times is not None and times.size else None),
                Batches.TIMES_SAMPLED_MAX: (int(times.max())
                                            if times is not None and times.size else None)}
