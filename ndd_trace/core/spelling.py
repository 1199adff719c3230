"""One spelling per call: a function's arguments as its cache keys them, defaults applied and
parameters passed by position where they can be, so `f(b)`, `f(b, 16)` and `f(b, size=16)` are
one call.

    spelling = CallSpelling(preprocess)              # or a functools.partial of it
    args, kwargs = spelling.normalize(*spelling.with_bound(args, kwargs))
    spelling.positional_names          # ("jpegs", "size"): the guards' labels
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from .source import raise_at, user_location

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


class FunctionAttribute:
    """An attribute of a wrapper that is its wrapped function's (`__wrapped__`), read and set."""

    def __init__(self, name: str):
        self.name = name

    def __get__(self, wrapper: Any, owner: type | None = None) -> Any:
        return self if wrapper is None else getattr(wrapper.__wrapped__, self.name)

    def __set__(self, wrapper: Any, value: Any) -> None:
        setattr(wrapper.__wrapped__, self.name, value)


class CallSpelling:
    """The one spelling of `function`'s calls, following its defaults as they are now (of a
    functools.partial: its function's, the bound arguments added to each call; of a bound
    method or an object with `__call__`: its function's, the object the first argument, so
    that the guards read it as they read an argument)."""

    def __init__(self, function: Callable):
        self.bound_args: tuple = ()
        self.bound_kwargs: dict = {}
        while True:
            if isinstance(function, functools.partial):
                self.bound_args = function.args + self.bound_args
                self.bound_kwargs = {**function.keywords, **self.bound_kwargs}
                function = function.func
            elif inspect.ismethod(function):  # `obj.method`: obj is its first argument
                self.bound_args = (function.__self__,) + self.bound_args
                function = function.__func__
            elif not isinstance(function, type) and inspect.isfunction(
                    getattr(type(function), "__call__", None)):  # an object with `__call__`
                self.bound_args = (function,) + self.bound_args
                function = type(function).__call__
            else:
                break
        self.partial = bool(self.bound_args or self.bound_kwargs)
        self.function = function
        self.signature = inspect.signature(function, follow_wrapped=False)
        self._defaults = function.__defaults__  # (what the signature was made from)
        parameters = self.signature.parameters
        self.positional_names = tuple(name for name, parameter in parameters.items()
                                      if parameter.kind in _POSITIONAL)
        # the number of parameters when all are positional ones (else -1): a call passing
        # exactly that many positional arguments is already spelled so
        self._simple_arity = len(parameters) if len(self.positional_names) == len(parameters) \
            else -1

    def with_bound(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """A call of the partial as a call of its function."""
        return self.bound_args + args, {**self.bound_kwargs, **kwargs}

    def normalize(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """The call's arguments in the one spelling; where they do not bind, eager's TypeError
        (`f() missing 1 required positional argument`), raised at the call as eagerly (a
        generator's too, whose eager call raises before iterating)."""
        if not kwargs and len(args) == self._simple_arity:
            return args, kwargs
        bound = self._bound(args, kwargs)
        if bound is None:
            self._raise_as_called(args, kwargs)
            return args, kwargs
        return bound.args, bound.kwargs

    def _raise_as_called(self, args: tuple, kwargs: dict) -> None:
        """Python's own error of the call: the function called with arguments that do not
        bind raises before its body runs (not called where a `__signature__` of its own may
        say otherwise than its code)."""
        if "__signature__" in getattr(self.function, "__dict__", {}):
            return
        try:
            self.function(*args, **kwargs)
        except TypeError as error:
            raise_at(error.with_traceback(None), user_location())

    def arguments(self, args: tuple, kwargs: dict) -> dict | None:
        """The call's arguments by parameter name, defaults included (None: they do not bind,
        and the call raises eager's TypeError)."""
        bound = self._bound(args, kwargs)
        return None if bound is None else dict(bound.arguments)

    def _bound(self, args: tuple, kwargs: dict) -> inspect.BoundArguments | None:
        """The call bound to the function's signature as it is now, defaults applied (None:
        it does not bind)."""
        function = self.function
        if function.__defaults__ is not self._defaults:  # `f.__defaults__ = (...)`
            self.signature = inspect.signature(function, follow_wrapped=False)
            self._defaults = function.__defaults__
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError:
            return None
        kwdefaults: dict[str, Any] = function.__kwdefaults__ or {}
        passed = bound.arguments.keys() & kwdefaults.keys()
        bound.apply_defaults()
        for name, value in kwdefaults.items():
            if name not in passed:  # as eager: the keyword default as it is now
                bound.arguments[name] = value
        return bound
