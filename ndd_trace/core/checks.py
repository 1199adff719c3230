"""The options of ndd_trace's API checked where they are given: a wrong one raises at the user's
line, naming the option, what it got and what it takes (`optimize="no"` was True, a string
`cache_limit` failed at the first call, deep in the cache)."""

from __future__ import annotations

import inspect
import os
import types
from typing import Any

import numpy as np

from . import ledger
from .source import raise_at, user_location

ON = ("1", "true", "yes", "on")
OFF = ("0", "false", "no", "off")


def fail(error: BaseException) -> None:
    """Raise `error` at the user's line (the call or decorator that gave the bad value)."""
    raise_at(error, user_location())


def flag(where: str, name: str, value: Any) -> bool:
    """A True/False option (`optimize`, `fullgraph`): a string's truth is not what it says."""
    if not isinstance(value, (bool, np.bool_)):
        fail(TypeError(f"{where}: {name} must be True or False, got {value!r}"))
    return bool(value)


def is_int(value: Any) -> bool:
    """An int (numpy's too), not a bool: what a count, an index or a seed is given as."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def count(where: str, name: str, value: Any, none: bool = False) -> Any:
    """A positive int option (`cache_limit`, `num_threads`, `prefetch_queue_depth`); `none`:
    None is taken too (the default from ndd's settings)."""
    if value is None and none:
        return None
    if not is_int(value) or value < 1:
        takes = "a positive int" + (" or None" if none else "")
        fail((ValueError if isinstance(value, (int, np.integer)) else TypeError)(
            f"{where}: {name} must be {takes}, got {value!r}"))
    return int(value)


def device_id(where: str, value: Any) -> Any:
    """`device_id`: "current" (ndd's current device), None (CPU only) or a GPU's index."""
    if value in ("current", None):
        return value
    if not is_int(value) or value < 0:
        fail(TypeError(f"{where}: device_id must be \"current\", None or a GPU's index (an int "
                       f"from 0), got {value!r}"))
    return int(value)


def fallback(value: Any) -> str:
    if value not in ("lazy", "eager"):
        fail(ValueError(f"fallback must be 'lazy' or 'eager', got {value!r}"))
    return value


def compilable(function: Any) -> None:
    """What `ndd.compile` takes: a Python function (a generator function too), a method, a
    `functools.partial` of one, an object whose class defines `__call__`."""
    kind = type(function).__name__
    if isinstance(function, (staticmethod, classmethod, property)):
        fail(TypeError(f"ndd.compile expects a function, got a {kind} object: put "
                       f"@{kind} above @ndd.compile (it then compiles the function inside)"))
    if isinstance(function, type):
        fail(TypeError(f"ndd.compile expects a function, got the class {function.__name__}: "
                       "compile its method (`@ndd.compile` on `def __call__`), or pass an "
                       "instance"))
    if not callable(function):
        fail(TypeError(f"ndd.compile expects a function, got {kind}"))
    inner = getattr(function, "func", function)  # (a functools.partial's)
    inner = getattr(inner, "__func__", inner)  # (a bound method's)
    if inspect.iscoroutinefunction(inner) or inspect.isasyncgenfunction(inner):
        fail(TypeError(f"ndd.compile cannot compile the async function "
                       f"{getattr(inner, '__qualname__', kind)}: compile a plain `def` that "
                       "calls the ndd operators, and call it from the async code"))
    if isinstance(inner, (types.BuiltinFunctionType, types.MethodDescriptorType,
                          types.WrapperDescriptorType, types.MethodWrapperType)) or \
            (not isinstance(inner, types.FunctionType) and not inspect.isfunction(
                getattr(type(inner), "__call__", None))):
        fail(TypeError(f"ndd.compile expects a Python function, got {kind} "
                       f"{getattr(inner, '__qualname__', '')}".rstrip() +
                       ": compile a function of yours that calls it"))


def env_switch(name: str, default: bool) -> bool:
    """An on/off environment variable: 1/true/yes/on or 0/false/no/off (any case); unset or
    empty: `default`; anything else (`disabled`, `maybe`) warns and is `default`."""
    value = os.environ.get(name, "").strip().lower()
    if value in ON or value in OFF:
        return value in ON
    if value:
        ledger.warn(f"ndd_trace: {name}={os.environ[name]!r} is not understood (1, true, yes "
                    f"or on; 0, false, no or off): taken as {'on' if default else 'off'}",
                    user_location())
    return default
