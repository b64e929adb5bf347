"""Shims that let dm-acme 0.4.0 (the newest on PyPI, Feb 2022) import on our pinned stack.

Installed `--no-deps` (Makefile, constraints.txt) with one more package, dm-env 1.6
(needs only absl-py, dm-tree and numpy, all pinned already). Acme's other dependencies
are not installed: only the modules the test uses are imported (acme.datasets.reverb,
acme.adders.reverb, acme.agents.agent, acme.environment_loop, acme.jax.utils), and those
need four shims, both here and nowhere else:

- `launchpad`: `acme/utils/signals.py` line 22 imports it at module level (reached from
  `import acme` through `acme.environment_loop`); dm-launchpad 0.5.0 has no Python 3.11
  wheel. `EnvironmentLoop.run` registers a stop handler with it and nothing else is used:
  a module whose two functions do nothing, as no launchpad program ever stops us.
- `jax.xla`: `acme/jax/utils.py` lines 190 and 273 annotate `Sequence[jax.xla.Device]` and
  line 99 tests `isinstance(x, jax.xla.DeviceArray)`; jax removed `jax.xla` (0.4.x): the
  names it had are `jax.Device` and `jax.Array` now.
- `jax.numpy.DeviceArray`: `acme/jax/utils.py` line 308 annotates
  `Callable[[jnp.DeviceArray], jnp.DeviceArray]`; removed in jax 0.4.x for `jax.Array`.

- `reverb.Client.trajectory_writer(get_signature_timeout_ms=...)`: `acme/adders/reverb/base.py`
  line 138 passes it; dm-reverb 0.14 dropped the argument (the writer reads the table's
  signature itself). Dropped here, everything else passed through.

`apply()` is idempotent and must run before the first `import acme`.
"""

from __future__ import annotations

import functools
import sys
import types
from typing import Any


def _launchpad_stub() -> types.ModuleType:
    module = types.ModuleType("launchpad")
    module.__doc__ = "replaywatch test stub: acme.utils.signals' two calls, doing nothing"
    module.register_stop_handler = lambda handler: None  # type: ignore[attr-defined]
    module.unregister_stop_handler = lambda handler: None  # type: ignore[attr-defined]
    return module


def _drop_signature_timeout(trajectory_writer: Any) -> Any:
    @functools.wraps(trajectory_writer)
    def patched(self: Any, *args: Any, get_signature_timeout_ms: Any = None, **kwargs: Any
                ) -> Any:
        return trajectory_writer(self, *args, **kwargs)

    patched._acme_compat = True  # type: ignore[attr-defined]
    return patched


def apply() -> None:
    import jax
    import reverb

    sys.modules.setdefault("launchpad", _launchpad_stub())
    if "xla" not in vars(jax):
        jax.xla = types.SimpleNamespace(  # type: ignore[attr-defined]
            Device=jax.Device, DeviceArray=jax.Array)
    if "DeviceArray" not in vars(jax.numpy):
        jax.numpy.DeviceArray = jax.Array  # type: ignore[attr-defined]
    if not getattr(reverb.Client.trajectory_writer, "_acme_compat", False):
        reverb.Client.trajectory_writer = _drop_signature_timeout(  # type: ignore[method-assign]
            reverb.Client.trajectory_writer)


def main() -> None:
    """`python -m tests.support.acme_compat SCRIPT [ARGS]`: SCRIPT as __main__ after apply()."""
    import runpy

    apply()
    script, *args = sys.argv[1:]
    sys.argv = [script, *args]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
