"""`compile`, the decorator, with the types it keeps: `@ndd.compile` (or `ndd_trace.compile`)
turns a function `(images: Batch, size: int = 224) -> Batch` into a
`CompiledFunction[(images: Batch, size: int = 224), Batch]`, so mypy and pyright check its calls
as they check the function's (`augment(batch, sise=3)` is an error) and know its own methods
(`cache_info()`, `cache_clear()`, `entries`, ...). docs/typing.md shows the spellings.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, ParamSpec, Protocol, TypeVar, overload

from .api import DEFAULT_CACHE_LIMIT, CompiledFunction
from .core import checks
from .core.errors import NddTraceWarning
from .modes.per_sample import PerSampleFunction

__all__ = ["Decorator", "Fallback", "compile"]

P = ParamSpec("P")
R = TypeVar("R")
Fallback = Literal["lazy", "eager"]


class Decorator(Protocol):
    """What `compile(...)` returns given options only: a decorator keeping each function's
    types (`@ndd.compile(fullgraph=True)`)."""

    def __call__(self, function: Callable[P, R], /) -> CompiledFunction[P, R]: ...


@overload
def compile(function: Callable[P, R], *, fullgraph: bool = ..., num_threads: int | None = ...,
            device_id: Any = ..., prefetch_queue_depth: int = ..., cache_limit: int = ...,
            fallback: Fallback = ..., per_sample: Literal[False] = ...,
            optimize: bool = ...) -> CompiledFunction[P, R]: ...


@overload
def compile(function: None = ..., *, fullgraph: bool = ..., num_threads: int | None = ...,
            device_id: Any = ..., prefetch_queue_depth: int = ..., cache_limit: int = ...,
            fallback: Fallback = ..., per_sample: Literal[False] = ...,
            optimize: bool = ...) -> Decorator: ...


@overload
def compile(function: Callable[..., Any], *, num_threads: int | None = ...,
            device_id: Any = ..., cache_limit: int = ...,
            per_sample: Literal[True]) -> PerSampleFunction: ...


@overload
def compile(function: None = ..., *, num_threads: int | None = ..., device_id: Any = ...,
            cache_limit: int = ...,
            per_sample: Literal[True]) -> Callable[[Callable[..., Any]], PerSampleFunction]: ...


def compile(function: Callable | None = None, *, fullgraph: bool = False,
            num_threads: int | None = None, device_id: Any = "current",
            prefetch_queue_depth: int = 2, cache_limit: int = DEFAULT_CACHE_LIMIT,
            fallback: Fallback = "lazy", per_sample: bool = False,
            optimize: bool = False) -> Any:
    """Compile a function that calls ndd operators into cached DALI pipelines.

    Use as `@ndd.compile` or `@ndd.compile(fullgraph=True, num_threads=4, ...)`. Defaults come
    from ndd's current settings (`ndd.set_num_threads`, the current device). A call that cannot
    be compiled whole runs in transparent mode (`fallback="lazy"`) or eagerly
    (`fallback="eager"`), with a warning either way. `per_sample=True`: the function is
    written for one sample and runs on each sample of a batch (see ndd_trace.modes.per_sample).
    `optimize=True`: the rewrites a DALI expert makes by hand (ROI decoding, placement, ...;
    see docs/optimize.md), each listed by `explain`; values may then differ from eager's where
    a rewrite says so (a fused random crop), and stay exact everywhere else.
    """
    if checks.flag("ndd.compile", "per_sample", per_sample):
        given = [f"{name}={value!r}" for name, value, default in (
            ("optimize", optimize, False), ("fullgraph", fullgraph, False),
            ("fallback", fallback, "lazy"), ("prefetch_queue_depth", prefetch_queue_depth, 2))
            if value is not default and value != default]
        if given:
            checks.fail(ValueError(
                f"ndd.compile: {', '.join(given)} {'is' if len(given) == 1 else 'are'} not "
                "available with per_sample=True (a "
                "per-sample function runs its own rewritten Python in one pipeline per call)"))
        return _per_sample_compile(function, num_threads, device_id, cache_limit)
    options = dict(fullgraph=fullgraph, num_threads=num_threads, device_id=device_id,
                   prefetch_queue_depth=prefetch_queue_depth, cache_limit=cache_limit,
                   fallback=fallback, optimize=optimize)

    def make(f: Callable) -> CompiledFunction:
        if isinstance(f, CompiledFunction):
            f = f.__wrapped__  # compiling again compiles its function with these options
        return CompiledFunction(f, **options)

    return make if function is None else make(function)


def _per_sample_compile(function: Callable | None, num_threads: int | None,
                        device_id: Any, cache_limit: int) -> Any:
    def make(f: Callable) -> PerSampleFunction:
        checks.compilable(f)
        if isinstance(f, (CompiledFunction, PerSampleFunction)):
            f = f.__wrapped__  # compiling again applies the new options (a user's wrapper runs)
        return PerSampleFunction(
            f, num_threads=checks.count("ndd.compile", "num_threads", num_threads, none=True),
            device_id=checks.device_id("ndd.compile", device_id), warning=NddTraceWarning,
            cache_limit=checks.count("ndd.compile", "cache_limit", cache_limit))

    return make if function is None else make(function)
