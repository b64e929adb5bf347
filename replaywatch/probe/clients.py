"""A reverb.Client proxy whose writers come wrapped by a probe: one for both probes.

Code that makes its own writers from a client (Acme's adders) is given the proxy; every
`trajectory_writer()` / `writer()` it makes goes through the owning probe's `wrap_writer`,
and `insert()` (the client's own one-shot insert) is reported to `on_insert` when given, and
`mutate_priorities()` to `on_priorities` (its table, its priorities, seconds, the error).
Everything else (sample, server_info, ...) passes through.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

# (table, the priorities sent, seconds the call took, its error or None)
Priorities = Callable[[str, Sequence[Any], float, "str | None"], None]


class ProbedClient:
    def __init__(self, inner: Any, owner: Any, wrap_writer: Callable[[Any], Any],
                 on_insert: Callable[[], None] | None = None,
                 on_keep_alive: Callable[[int], None] | None = None,
                 on_priorities: Priorities | None = None):
        self._inner = inner
        self._owner = owner  # the probe: wrapping the same client twice returns it as is
        self._wrap_writer = wrap_writer
        self._on_insert = on_insert
        self._on_keep_alive = on_keep_alive
        self._on_priorities = on_priorities

    def trajectory_writer(self, *args: Any, **kwargs: Any) -> Any:
        writer = self._wrap_writer(self._inner.trajectory_writer(*args, **kwargs))
        self._kept(args, kwargs, "num_keep_alive_refs")
        return writer

    def writer(self, *args: Any, **kwargs: Any) -> Any:
        writer = self._wrap_writer(self._inner.writer(*args, **kwargs))
        self._kept(args, kwargs, "max_sequence_length")
        return writer

    def _kept(self, args: tuple, kwargs: dict, name: str) -> None:
        """The steps whose chunks the writer keeps alive in the server: its first argument."""
        refs = args[0] if args else kwargs.get(name)
        if self._on_keep_alive is not None and isinstance(refs, int) and refs > 0:
            self._on_keep_alive(refs)

    def mutate_priorities(self, table: str, updates: Any = None, deletes: Any = None,
                          *args: Any, **kwargs: Any) -> Any:
        """Reverb's priority updates, timed and reported with their values; raised errors too
        (a NaN or negative priority makes the server refuse the request)."""
        if self._on_priorities is None:
            return self._inner.mutate_priorities(table, updates, deletes, *args, **kwargs)
        start, error = time.monotonic(), None
        try:
            return self._inner.mutate_priorities(table, updates, deletes, *args, **kwargs)
        except Exception as e:
            error = f"{type(e).__name__}: {e}"
            raise
        finally:
            values = list(updates.values()) if isinstance(updates, dict) else []
            self._on_priorities(str(table), values, time.monotonic() - start, error)

    def insert(self, *args: Any, **kwargs: Any) -> Any:
        result = self._inner.insert(*args, **kwargs)
        if self._on_insert is not None:
            self._on_insert()
        return result

    def __getattr__(self, name: str) -> Any:
        if name == "_inner":  # not set yet (copy, unpickling): no endless recursion
            raise AttributeError(name)
        return getattr(self._inner, name)


def wrapped_by(client: Any, owner: Any) -> bool:
    return isinstance(client, ProbedClient) and client._owner is owner
