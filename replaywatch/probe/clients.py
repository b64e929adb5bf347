"""A reverb.Client proxy whose writers come wrapped by a probe: one for both probes.

Code that makes its own writers from a client (Acme's adders) is given the proxy; every
`trajectory_writer()` / `writer()` it makes goes through the owning probe's `wrap_writer`,
and `insert()` (the client's own one-shot insert) is reported to `on_insert` when given.
Everything else (sample, server_info, mutate_priorities, ...) passes through.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class ProbedClient:
    def __init__(self, inner: Any, owner: Any, wrap_writer: Callable[[Any], Any],
                 on_insert: Callable[[], None] | None = None,
                 on_keep_alive: Callable[[int], None] | None = None):
        self._inner = inner
        self._owner = owner  # the probe: wrapping the same client twice returns it as is
        self._wrap_writer = wrap_writer
        self._on_insert = on_insert
        self._on_keep_alive = on_keep_alive

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
