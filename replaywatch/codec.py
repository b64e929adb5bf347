"""Plain data to the project's frozen dataclasses and back, driven by their type hints.

A bundle carries the diagnosis's inputs (snapshots, polls, stack verdicts, baselines) as
JSON; `replaywatch analyze` must rebuild them exactly, or its verdict is not the one the
sidecar gave. Decoding by the dataclasses' own annotations keeps one definition of each
shape: a field added to a snapshot is carried without a second list to keep true.

    doc = encode(snapshot)                      # dicts, lists, numbers, strings
    same = decode(TableSnapshot, doc)           # == snapshot

Python's json writes floats as their shortest repr and reads them back to the same value, so
a snapshot survives the round trip bit for bit. A document that does not fit the type raises
DecodeError naming the field's path.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import types
import typing
from typing import Any


class DecodeError(ValueError):
    """A document that does not have the shape its type declares."""


def encode(value: Any) -> Any:
    """dataclasses.asdict-style plain data in one order: enums by their value, tuples as
    lists, sets sorted (their order is a process's hash seed: two processes must write the
    same bytes), anything JSON has no type for by its repr."""
    if isinstance(value, enum.Enum):
        return value.value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): encode(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [encode(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((encode(v) for v in value), key=repr)
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return repr(value)


def decode(tp: Any, value: Any, path: str = "$") -> Any:
    """`value` (plain data) as an instance of `tp`."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        arms = typing.get_args(tp)
        if value is None and type(None) in arms:
            return None
        errors = []
        for arm in arms:
            if arm is type(None):
                continue
            try:
                return decode(arm, value, path)
            except DecodeError as e:
                errors.append(str(e))
        raise DecodeError(errors[0] if len(errors) == 1 else f"{path}: fits none of {tp}")
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return _decode_dataclass(tp, value, path)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(value)
        except ValueError:
            raise DecodeError(f"{path}: {value!r} is not a {tp.__name__}") from None
    if origin is tuple:
        args = typing.get_args(tp)
        items = _sequence(value, path)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(decode(args[0], v, f"{path}[{i}]") for i, v in enumerate(items))
        if len(args) != len(items):
            raise DecodeError(f"{path}: {len(items)} items, expected {len(args)}")
        return tuple(decode(a, v, f"{path}[{i}]") for i, (a, v) in enumerate(zip(args, items)))
    if origin is list:
        (arg,) = typing.get_args(tp)
        return [decode(arg, v, f"{path}[{i}]") for i, v in enumerate(_sequence(value, path))]
    if origin is dict:
        key, val = typing.get_args(tp)
        if not isinstance(value, dict):
            raise DecodeError(f"{path}: expected an object, got {type(value).__name__}")
        return {decode(key, k, path): decode(val, v, f"{path}.{k}") for k, v in value.items()}
    return _scalar(tp, value, path)


def _decode_dataclass(tp: type, value: Any, path: str) -> Any:
    if not isinstance(value, dict):
        raise DecodeError(f"{path}: expected an object, got {type(value).__name__}")
    hints = _hints(tp)
    kwargs = {}
    for f in dataclasses.fields(tp):
        if not f.init:
            continue
        if f.name not in value:
            if (f.default is dataclasses.MISSING
                    and f.default_factory is dataclasses.MISSING):
                raise DecodeError(f"{path}.{f.name}: missing")
            continue
        kwargs[f.name] = decode(hints[f.name], value[f.name], f"{path}.{f.name}")
    return tp(**kwargs)


@functools.cache
def _hints(tp: type) -> dict[str, Any]:
    return typing.get_type_hints(tp)


def _sequence(value: Any, path: str) -> list[Any]:
    if not isinstance(value, (list, tuple)):
        raise DecodeError(f"{path}: expected a list, got {type(value).__name__}")
    return list(value)


def _scalar(tp: Any, value: Any, path: str) -> Any:
    if tp is float:
        # JSON has one number type: a float that happens to be whole is written as 3.0 by
        # Python, but another writer may say 3.
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is bool or tp is str:
        if isinstance(value, tp):
            return value
    elif tp is type(None):
        if value is None:
            return None
    else:
        raise DecodeError(f"{path}: cannot decode type {tp!r}")
    raise DecodeError(f"{path}: expected {getattr(tp, '__name__', tp)}, got {value!r}")
