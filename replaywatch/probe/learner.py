"""Where an Acme user attaches the trainer probe: the learner's own iterator.

Acme's layouts wrap the builder's dataset in `utils.prefetch` before the
learner sees it (and many learners prefetch again in their constructor:
`self._iterator = utils.prefetch(iterator)`). The builder's
`make_dataset_iterator` is below all of that: a probe there counts the
prefetch thread's `next()`, never sees `ready()`, and no learner step. The
learner's `_iterator` attribute is above it: its `step()` calls
`next(self._iterator)`, so wrapping that attribute and the learner's `step`
sees exactly what the training loop waits on.

The one place a LocalLayout or `run_experiment` user can reach is the builder
(both take it as an argument and call `builder.make_learner(...)`), so
`wrap_builder` patches that one method. Nothing here imports Acme.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any, Protocol


class Wrapping(Protocol):
    """What this module asks of the probe it attaches (TrainerProbe has it): the path is
    builder.make_learner -> probe.wrap_learner -> wrap_learner here -> probe.wrap, and
    builder.make_adder -> probe.wrap_client."""

    def wrap(self, iterator: Iterator[Any]) -> Iterator[Any]: ...
    def step(self) -> None: ...
    def wrap_client(self, client: Any) -> Any: ...
    def wrap_learner(self, learner: Any, iterator_attr: str | None = None) -> Any: ...

# Where Acme's learners keep the iterator `step()` consumes: DQN, TD3, D4PG and
# most JAX learners use `_iterator`; the generic SGD learner `_data_iterator`.
ITERATOR_ATTRS = ("_iterator", "_data_iterator")


def _find_iterator_attr(learner: Any) -> str:
    own = getattr(learner, "__dict__", {})
    for attr in ITERATOR_ATTRS:
        if hasattr(own.get(attr), "__next__"):
            return attr
    raise ValueError(
        f"{type(learner).__name__} has no iterator in {', '.join(ITERATOR_ATTRS)}; "
        "pass iterator_attr= the attribute its step() calls next() on"
    )


def wrap_learner(probe: Wrapping, learner: Any, iterator_attr: str | None = None
                 ) -> tuple[Any, str]:
    """Wraps `learner.<iterator_attr>` with the probe and counts `learner.step()`.

    Patches the learner object in place (instance attributes shadow the
    class's) and returns it with the attribute used. Idempotent per probe.
    """
    attr = iterator_attr or _find_iterator_attr(learner)
    iterator: Any = getattr(learner, attr, None)
    if not hasattr(iterator, "__next__"):
        raise ValueError(f"{type(learner).__name__}.{attr} ({iterator!r}) is not an iterator")
    setattr(learner, attr, probe.wrap(iterator))
    step = learner.step
    if getattr(step, "_replaywatch_probe", None) is not probe:

        @functools.wraps(step)
        def counted_step(*args: Any, **kwargs: Any) -> Any:
            result = step(*args, **kwargs)
            probe.step()  # only a step that returned: a hung step is not progress
            return result

        counted_step._replaywatch_probe = probe  # type: ignore[attr-defined]
        learner.step = counted_step
    return learner, attr


def wrap_builder(probe: Wrapping, builder: Any) -> Any:
    """Patches `builder.make_learner` so the learner it returns is probe-wrapped, and
    `builder.make_adder` so the adder it makes inserts through the probe's client.

    The adder's writers tell the probe which thread inserts: in a LocalLayout that is
    the thread that waits in next(), which proves a synchronous loop whatever the
    limiter's max_diff. Returns the same builder object: Acme checks builders' types
    in places, so a proxy would not do.
    """
    make_learner = builder.make_learner
    if getattr(make_learner, "_replaywatch_probe", None) is probe:
        return builder
    _wrap_make_adder(probe, builder)

    @functools.wraps(make_learner)
    def make_probed_learner(*args: Any, **kwargs: Any) -> Any:
        return probe.wrap_learner(make_learner(*args, **kwargs))

    make_probed_learner._replaywatch_probe = probe  # type: ignore[attr-defined]
    builder.make_learner = make_probed_learner
    return builder


def _wrap_make_adder(probe: Wrapping, builder: Any) -> None:
    """`make_adder(replay_client, environment_spec, policy)`: its client goes through
    `probe.wrap_client`. A builder without one (or with a renamed argument) is left alone."""
    make_adder = getattr(builder, "make_adder", None)
    if not callable(make_adder):
        return

    @functools.wraps(make_adder)
    def make_probed_adder(*args: Any, **kwargs: Any) -> Any:
        if args:
            args = (probe.wrap_client(args[0]), *args[1:])
        elif kwargs.get("replay_client") is not None:
            kwargs["replay_client"] = probe.wrap_client(kwargs["replay_client"])
        return make_adder(*args, **kwargs)

    make_probed_adder._replaywatch_probe = probe  # type: ignore[attr-defined]
    builder.make_adder = make_probed_adder
