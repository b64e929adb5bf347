"""Is the training loop inside an iterator's next()? Read from `py-spy dump --json` alone.

Without any probe, a synchronous loop (it inserts, then samples) that is blocked in the
iterator's next() is the circular wait of worker starvation, while a loop that died or hangs
elsewhere is not. Two dumps about a second apart that both show the loop thread inside
next() settle it (one could catch a healthy loop waiting a moment for its batch):

    verdict = stack_verdict(first_dump, second_dump, requested_at=now)
    verdict.in_next        # True: the loop thread sits in next() in both

py-spy's JSON is a list of threads, each with `thread_name`, `os_thread_id` and `frames`,
innermost first; each frame has `name` ("OwnedIterator._next_internal" on Python 3.11,
"_next_internal" before), `filename`, `short_filename` and `line`. The loop thread is the
main thread: Acme's LocalLayout and a plain tf.data loop both run it there.

Pure and stdlib only: the keeper does the dumping and passes the documents in.
"""

from __future__ import annotations

import dataclasses
from typing import Any

FRAMES_KEPT = 12


@dataclasses.dataclass(frozen=True)
class InNext:
    """Where the loop thread sits inside next()."""

    thread: str
    where: str  # "tf.data IteratorGetNext", "tf.data iterator", "prefetch queue.get", ...
    frames: tuple[str, ...]  # innermost first, "function (file:line)"


@dataclasses.dataclass(frozen=True)
class StackVerdict:
    """Two dumps of the trainer and what they say about its loop thread."""

    requested_at: float  # the diagnosis time that asked for the dumps (sidecar clock)
    first: InNext | None
    second: InNext | None
    error: str | None = None  # a failed dump, or no main thread in it

    @property
    def in_next(self) -> bool:
        return self.first is not None and self.second is not None

    def evidence(self) -> dict[str, Any]:
        return {"from_stacks": True, "stacks_at": self.requested_at,
                "loop_thread": self.second.thread if self.second else None,
                "loop_in": self.second.where if self.second else None,
                "first_dump": list(self.first.frames) if self.first else None,
                "second_dump": list(self.second.frames) if self.second else None}


def _base(name: str) -> str:
    """`OwnedIterator.__next__` -> `__next__` (py-spy adds the class on 3.11+)."""
    return name.rsplit(".", 1)[-1]


def _file(frame: dict[str, Any]) -> str:
    return str(frame.get("short_filename") or frame.get("filename") or "").rsplit("/", 1)[-1]


def _where(frames: list[dict[str, Any]]) -> str | None:
    """What kind of next() the frames are inside, or None."""
    names = [_base(str(f.get("name", ""))) for f in frames]
    files = [_file(f) for f in frames]
    for name, file in zip(names, files, strict=True):
        if name in ("iterator_get_next", "IteratorGetNext"):
            return "tf.data IteratorGetNext"
        if file == "iterator_ops.py" and name in ("_next_internal", "__next__", "get_next"):
            return "tf.data iterator"
    for i, (name, file) in enumerate(zip(names, files, strict=True)):
        # A prefetching iterator (acme.jax.utils.prefetch) waits on its buffer's queue.
        if file == "queue.py" and name == "get" and "__next__" in names[i + 1:]:
            return "prefetch queue.get"
    return None


def _describe(frame: dict[str, Any]) -> str:
    return f"{frame.get('name', '?')} ({_file(frame)}:{frame.get('line', '?')})"


def main_thread(dump: Any) -> dict[str, Any] | None:
    """The main thread of a py-spy document (`{"threads": [...]}` or the bare list)."""
    threads = dump.get("threads") if isinstance(dump, dict) else dump
    if not isinstance(threads, list):
        return None
    candidates = [t for t in threads if isinstance(t, dict)]
    for t in candidates:
        if t.get("thread_name") == "MainThread":
            return t
    return next((t for t in candidates
                 if t.get("os_thread_id") is not None and t.get("os_thread_id") == t.get("pid")),
                None)


def loop_in_next(dump: Any) -> InNext | None:
    """Where the loop (main) thread sits inside an iterator's next(); None if it does not."""
    thread = main_thread(dump)
    if thread is None or not isinstance(thread.get("frames"), list):
        return None
    frames = [f for f in thread["frames"] if isinstance(f, dict)]
    where = _where(frames)
    if where is None:
        return None
    return InNext(str(thread.get("thread_name") or thread.get("os_thread_id")), where,
                  tuple(_describe(f) for f in frames[:FRAMES_KEPT]))


def stack_verdict(first: Any, second: Any, requested_at: float) -> StackVerdict:
    """The verdict of two dumps; an error when either is one or has no main thread."""
    for dump in (first, second):
        if isinstance(dump, dict) and "error" in dump:
            return StackVerdict(requested_at, None, None, str(dump["error"]))
        if main_thread(dump) is None:
            return StackVerdict(requested_at, None, None, "no main thread in the dump")
    return StackVerdict(requested_at, loop_in_next(first), loop_in_next(second))
