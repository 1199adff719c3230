"""The compiled-function object (`compile`: decorator.py; `explain`: explanation.py).

    @ndd.compile                                  # or @ndd.compile(fullgraph=True, ...)
    def preprocess(jpegs, size=224):
        images = ndd.decoders.image(jpegs)
        return ndd.resize(images, size=[size, size])

    images = preprocess(jpegs)                    # 1st call traces and builds; then cache hits
    preprocess.cache_info()                       # CacheInfo(hits=..., misses=..., traces=...)
    print(ndd_trace.explain(preprocess, jpegs))   # graph, generated code, guards, breaks

A compiled function dispatches its calls: its entries are held in a unit cache
(units/cache.py), a miss is traced by its trace stage (modes/stage.py).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import pickle
import sys
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, overload

from . import _dali
from .ahead import calls as ahead_calls
from .ahead.runahead import RUN_AHEAD
from .core import checks, logs, process_state
from .core.ledger import Ledger, Runs, Verdict
from .core.source import callers_stack, hide_own_frames, innermost_user_loc, user_location
from .core.files import path_argument
from .core.spelling import CallSpelling, FunctionAttribute
from .execution import tuning_store
from .execution.failures import RunEagerly
from .execution.runtime import Options
from .generator_epochs import GeneratorEpochs
from .modes import lazy
from .units.cache import LIVE_PIPELINES, CacheInfo, Found, UnitCache
from .units.unit import Entry, bind_data
from .modes.loop import Split
from .modes.stage import Notices, TraceStage
from .tracing.trace import GraphBreakRecord

__all__ = ["CacheInfo", "CompiledFunction", "Entry", "cache_dir", "set_cache_dir"]

DEFAULT_CACHE_LIMIT = 8

# A compiled function keeps its function's parameters and return type: CompiledFunction[P, R]
P = ParamSpec("P")
R = TypeVar("R")
_P2 = ParamSpec("_P2")  # (a method's, once bound to its instance: `_T` the instance)
_T = TypeVar("_T")


@contextmanager
def _noted(note: str | None) -> Iterator[None]:
    """An error of the block (the eager run after a failed trace) carries the trace's note."""
    try:
        yield
    except Exception as error:
        if note:
            error.add_note(note)
        raise


class CompiledFunction(GeneratorEpochs, Generic[P, R]):
    """A function whose ndd calls run as one cached DALI pipeline per guard set: this object
    dispatches each call (a cache hit runs, a miss traces, a call that cannot be compiled
    runs in transparent mode). Its cache of entries is a UnitCache (units/cache.py); its trace
    stage (modes/stage.py) traces a miss; `ledger` records every call not run as compiled."""

    # the function's own: `f.__defaults__ = (6,)` changes what its calls bind, as eagerly
    __defaults__ = FunctionAttribute("__defaults__")
    __kwdefaults__ = FunctionAttribute("__kwdefaults__")

    @property
    def _ndd_trace_inlined(self) -> Callable:
        """What a trace calling it records: its function, inlined (its ops join the caller's)."""
        return self._function

    def __init__(self, function: Callable, *, fullgraph: bool = False,
                 num_threads: int | None = None, device_id: Any = "current",
                 prefetch_queue_depth: int = 2, cache_limit: int = DEFAULT_CACHE_LIMIT,
                 fallback: str = "lazy", optimize: bool = False):
        checks.compilable(function)
        fullgraph, optimize = (checks.flag("ndd.compile", "fullgraph", fullgraph),
                               checks.flag("ndd.compile", "optimize", optimize))
        num_threads = checks.count("ndd.compile", "num_threads", num_threads, none=True)
        cache_limit = checks.count("ndd.compile", "cache_limit", cache_limit)
        self._spelling = CallSpelling(function)  # (a partial: its function is compiled)
        function = self._spelling.function
        functools.update_wrapper(self, function)
        self._function = function
        self._num_threads = num_threads
        self._device_id = checks.device_id("ndd.compile", device_id)
        self.prefetch_queue_depth = checks.count("ndd.compile", "prefetch_queue_depth",
                                                 prefetch_queue_depth)
        checks.fallback(fallback)
        self.is_generator = inspect.isgeneratorfunction(function)
        _dali.parse_ahead(getattr(function, "__code__", None))  # (its first call's parse)
        self._notices = Notices(self.__qualname__, fallback, self.is_generator)
        self._ledger = self._notices.ledger
        self._cache = UnitCache(self.__qualname__, cache_limit, self._ledger, function=function,
                                positional_names=self._spelling.positional_names,
                                worth_making=True)
        self._stage = TraceStage(function, self.__qualname__, self._spelling, self._notices,
                                 self._options, fullgraph=fullgraph, optimize=bool(optimize),
                                 threads_given=num_threads is not None)
        self._init_epochs()  # (a compiled generator's loop body, once taken apart)
        process_state.compiled_objects.add(self)
        if not self.is_generator:
            ahead_calls.watch_reader_epochs(self)  # see calls.run_call

    # -- public --------------------------------------------------------------------------------

    # The options, settable after compiling (`fast.cache_limit = 16`), each kept where it is read

    @property
    def fullgraph(self) -> bool:
        """A graph break raises GraphBreakError instead of running in transparent mode."""
        return self._stage.fullgraph

    @fullgraph.setter
    def fullgraph(self, value: bool) -> None:
        self._stage.fullgraph = bool(value)

    @property
    def optimize(self) -> bool:
        """optimize.py's rewrites apply (values may differ from eager where one says so)."""
        return self._stage.optimize

    @optimize.setter
    def optimize(self, value: bool) -> None:
        self._stage.optimize = checks.flag("optimize", "the value", value)

    @property
    def cache_limit(self) -> int:
        """Variants traced before new ones run in transparent mode (or eagerly)."""
        return self._cache.limit

    @cache_limit.setter
    def cache_limit(self, value: int) -> None:
        self._cache.limit = checks.count("cache_limit", "the value", value)

    @property
    def fallback(self) -> str:
        """How a call that cannot be compiled whole runs: "lazy" (transparent) or "eager"."""
        return self._notices.fallback

    @fallback.setter
    def fallback(self, value: str) -> None:
        self._notices.fallback = checks.fallback(value)

    @property
    def ledger(self) -> Ledger:
        """Its record of calls not run as compiled (`ledger.verdicts`: the latest, each with
        its reason and the user's line), its counters (a compiled generator: its body's)."""
        if self._step is not None:
            return self._step.ledger
        return self._ledger

    def cache_info(self) -> CacheInfo:
        """Its cache's counters: hits, misses, traces, fallbacks and the entries held."""
        if self._step is not None:  # a compiled generator: its loop body's cache
            return self._step.cache_info()
        return self._cache.info()

    @property
    def last_miss_reason(self) -> str | None:
        """What changed at the last cache miss (a compiled generator: of its loop body)."""
        if self._step is not None:
            return self._step.last_miss_reason
        return self._cache.last_miss_reason

    def cache_clear(self) -> None:
        """Forget every entry (their pipelines closed) and the counters."""
        if self._step is not None:
            self._step.cache_clear()
        self._cache.clear()

    @property
    def entries(self) -> list[Entry]:
        """The entries its cache holds: each a traced graph and its pipeline, or a verdict."""
        if self._step is not None:
            return self._step.entries
        return list(self._cache.units.values())

    def trace(self, args: tuple, kwargs: dict, raise_errors: bool = False) -> Entry | None:
        """Trace one call into a cache entry, not stored (None: tracing raised, see
        `take_trace_error`). Draws nothing from any RNG."""
        return self._stage.trace(self._cache, args, kwargs, raise_errors)

    def take_trace_error(self) -> BaseException | None:
        """The exception of the last trace that raised, handed over once."""
        return self._stage.take_failure()[1]

    def normalize(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """A call's arguments in one spelling (defaults applied, by position where they can
        be): the spelling keys and traces see."""
        return self._spelling.normalize(args, kwargs)

    def guard_key(self, args: tuple, kwargs: dict) -> tuple:
        """The guard key of a call with these (normalized) arguments."""
        return self._cache.key(args, kwargs)

    def held_entry(self, key: tuple) -> tuple[Entry | None, Found]:
        """The entry the cache holds for `key` (None: none) and how a call would find it."""
        return self._cache.get(key), self._cache.next_lookup(key)

    def last_entry(self) -> Entry | None:
        """The entry of the last call that found or made one."""
        return self._cache.last()

    def options(self) -> Options:
        """The pipeline options its calls run with now (threads, device, queue depth)."""
        return self._options()

    def loop(self) -> Split | None:
        """A compiled generator taken apart (None: its loop body cannot be compiled, see
        `loop_break`)."""
        return self._loop()

    @property
    def loop_break(self) -> GraphBreakRecord | None:
        """Why a compiled generator's loop body is not compiled (None: it is)."""
        return self._loop_break

    @property
    def step(self) -> CompiledFunction | None:
        """A compiled generator's loop body, compiled (None before its first call)."""
        return self._step

    @overload
    def __get__(self, instance: None, owner: Any) -> CompiledFunction[P, R]: ...

    @overload
    def __get__(self: CompiledFunction[Concatenate[_T, _P2], R], instance: _T,
                owner: Any) -> Callable[_P2, R]: ...

    def __get__(self, instance: Any, owner: Any) -> Any:
        """A method: bound to its instance as a function is (its cache is the class's; equal
        to another binding to the same instance, as `a.run == a.run` is)."""
        if instance is None:
            return self
        return types.MethodType(self, instance)

    def __repr__(self) -> str:
        return f"<ndd_trace compiled function {self.__qualname__}>"

    def __reduce__(self) -> tuple:
        """Pickled by reference, as a function is (and as torch.compile's result is): its module
        and qualified name, found again where it is unpickled (spawn workers, multiprocessing)."""
        return _reference_to(self)

    def _options(self) -> Options:
        num_threads = self._num_threads or _dali.current_num_threads()
        device_id = _dali.current_device_id() if self._device_id == "current" else self._device_id
        # fed once per call; fed reader batches, RUN_AHEAD calls ahead (ahead/calls.run_call)
        return Options(num_threads, device_id, 1 + RUN_AHEAD)

    # -- calling -------------------------------------------------------------------------------

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        if _dali.tracing_active():
            # Called from inside another trace: inline, so its ops join the outer graph.
            return self._function(*args, **kwargs)
        if self._spelling.partial:  # (compiled from a functools.partial)
            args, kwargs = self._spelling.with_bound(args, kwargs)
        if _dali.capture_running():  # DALI's capture mode records the calls: they are its own
            self._notices.capture_mode_call()
            return self._function(*args, **kwargs)
        args, kwargs = self._spelling.normalize(args, kwargs)
        if self.is_generator:
            return self._epoch(args, kwargs)
        cache = self._cache
        entry = cache.fast_hit(args, kwargs)  # the last call's entry, without building its key
        if entry is None:
            key = cache.key(args, kwargs)
            entry, found = cache.lookup(
                key, lambda: self._stage.trace(cache, args, kwargs, key=key))
            if found is Found.PAST_LIMIT:
                self._notices.past_limit(cache.limit, cache.last_miss_reason)
                return self._fallback(args, kwargs)
            if found is Found.NOT_MADE_YET:  # compiled once worth it (units/cache.Sightings)
                return self._notices.not_made_yet(cache, self._function, args, kwargs)
            if found is Found.TRACE_FAILED:  # run eagerly, which raises the same way
                return self._eager_after_failed_trace(key, args, kwargs)
            cache.remember_fast(args, kwargs, entry)
        if entry.eager:
            self._ledger.count(entry.verdict)
            return self._fallback(args, kwargs)
        try:
            return self._run(entry, args, kwargs)
        except Exception as error:  # an op's error at the call: the traceback of eager's
            hide_own_frames(error)
            raise

    def _fallback(self, args: tuple, kwargs: dict) -> Any:
        """Run a call that cannot be compiled whole: in transparent mode by default (its ndd
        calls still run as cached pipeline regions, split where Python needs data, with the
        same results as eager), or plainly eagerly with fallback="eager"."""
        logs.fallbacks.debug("`%s`: this call %s", self.__qualname__,
                             self._notices.fallback_text())
        if self.fallback != "lazy" or lazy.is_enabled():
            return self._function(*args, **kwargs)
        with lazy.enabled(optimize=self.optimize):
            return self._function(*args, **kwargs)

    def _eagerly(self, args: tuple, kwargs: dict) -> Any:
        return self._function(*args, **kwargs)

    def _eager_after_failed_trace(self, key: tuple, args: tuple, kwargs: dict) -> Any:
        note, error = self._stage.take_failure()
        self._ledger.count(Verdict.eager_call(f"tracing raised {type(error).__name__}: {error}",
                                              innermost_user_loc(error), self._notices.runs()))
        with _noted(note):
            result = self._function(*args, **kwargs)
        # Eager succeeded where tracing failed: this variant runs eagerly from now on, and says so.
        self._cache.store(key, self._stage.failed_entry(key, error))
        return result

    # -- running -------------------------------------------------------------------------------

    def _run(self, entry: Entry, args: tuple, kwargs: dict) -> Any:
        bound, sizes = bind_data(args, kwargs)
        batch_size, reason, why = entry.call_batch_size(bound, sizes)
        if reason is not None:
            return self._eager_for_this_call(reason, args, kwargs, why)
        executable = entry.executable
        if (after_failure := executable.eager_after_failure()) is not None:  # (not warned)
            return self._eager_for_this_call(after_failure, args, kwargs, warn=False)
        at_call = executable.failures.ops_run_at_call(bound)  # ops eager runs at once (user data)
        snapshots = executable.failures.rng_snapshots(bound) if at_call and executable.draws else []
        LIVE_PIPELINES.note_run(entry)
        try:
            run = ahead_calls.run_call(executable, entry.key, bound, batch_size) \
                if ahead_calls.watching() else executable.run(bound, batch_size)
            instead = None
        except Exception as error:
            instead = _instead_of_a_failed_run(self, entry, error)
            if instead is None:
                raise
        if instead is not None:  # (outside the handler: the failure is no context of its errors)
            return instead(args, kwargs)
        logs.runtime.debug("`%s`: pipeline run scheduled (batch size %d)", self.__qualname__,
                           batch_size)
        if run is not None:  # (the user's frames: a deferred error's traceback, as eager's)
            run.call_stack = callers_stack()
        if at_call and run is not None:  # their run-time errors raise here, as eagerly
            try:
                executable.failures.raise_at_call(run, at_call, bound, snapshots)
            except RunEagerly as reason:
                return self._eager_for_this_call(str(reason), args, kwargs)
        return entry.results(run, bound, batch_size, args, kwargs)

    def _eager_for_this_call(self, reason: str, args: tuple, kwargs: dict, why: str = "",
                             warn: bool = True) -> Any:
        """This one call runs eagerly (the variant stays compiled): warned once at the user's
        line (`warn`), counted as a fallback and logged."""
        self._ledger.record(
            Verdict.eager_call(reason, user_location(), Runs.EAGER), stacklevel=2,
            log=f"this call runs eagerly: {reason}",
            warning=f"ndd_trace: `{self.__qualname__}` ran eagerly for this call: {reason}{why}"
            if warn else None)
        return self._function(*args, **kwargs)


def _instead_of_a_failed_run(compiled: CompiledFunction, entry: Entry,
                             error: Exception) -> Callable | None:
    """How a call whose run raised `error` runs instead, its verdict recorded (the variant's
    pipelines retired: as a fallback; none could be built: eagerly); None: the error is the
    call's own. (Called outside the handler: the failure is no context of its errors.)"""
    if isinstance(error, RunEagerly):  # this call: an argument's own run failed
        reason = str(error)
        return lambda args, kwargs: compiled._eager_for_this_call(reason, args, kwargs)
    executable = entry.executable
    if executable.retired is not None:  # its failed pipelines cannot be freed: no new ones
        entry.verdict = Verdict.eager_variant(executable.retired, user_location(),
                                              compiled._notices.runs())
        compiled._ledger.record(
            entry.verdict, once=False, stacklevel=3,
            log=f"not compiled whole from now on: {executable.retired}",
            warning=f"ndd_trace: `{compiled.__qualname__}` is no longer compiled whole: "
                    f"{executable.retired}. It {compiled._notices.fallback_text()}.")
        return compiled._fallback
    if executable.builds == 0:  # the pipeline could not be built: this variant runs eagerly
        entry.verdict = Verdict.eager_variant(f"pipeline build failed: {error}",
                                              getattr(error, "loc", None) or user_location(),
                                              Runs.EAGER)
        compiled._ledger.record(
            entry.verdict, once=False, stacklevel=3,
            log=f"pipeline build failed, runs eagerly: {error}",
            warning=f"ndd_trace: `{compiled.__qualname__}` runs eagerly: the pipeline could "
                    f"not be built ({error}).")
        return compiled._eagerly
    return None


def _reference_to(compiled: CompiledFunction) -> tuple:
    """How `compiled` pickles: by its module and qualified name, or by the module-level name it
    is bound to (`augment = ndd.compile(preprocess)`: `augment`, as `augment = preprocess`
    pickles its function); PicklingError where neither names it."""
    if _by_reference(compiled.__module__, compiled.__qualname__) is compiled:
        return _by_reference, (compiled.__module__, compiled.__qualname__)
    module = sys.modules.get(compiled.__module__)
    for name, value in list(vars(module).items()) if module is not None else ():
        if value is compiled:
            return _by_reference, (compiled.__module__, name)
    raise pickle.PicklingError(
        f"cannot pickle {compiled!r}: it is not the object at {compiled.__module__}."
        f"{compiled.__qualname__}, nor bound to a name of that module (compile it where it is "
        "defined, at module level, or pass the plain function and compile it in the worker)")


def _by_reference(module: str, qualname: str) -> Any:
    """The object at `module.qualname` (None where there is none)."""
    try:
        found: Any = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError):
        return None
    return found


def set_cache_dir(path: Any) -> None:
    """Keep, in the directory `path`, what a later process can reuse of this one's traces (the
    warm start; `NDD_TRACE_CACHE_DIR=path` sets it at start-up; None turns it off): DALI's
    parse of each module whose ndd calls are traced, the bulk of a first trace. Keyed by the
    module's exact text and the DALI, libcst and Python versions; exact (what is asked of the
    parse is still answered against the live call). It holds pickles: a directory another
    user could write to, or a file there that is not yours, turns the cache off with one
    NddTraceWarning (docs/warm-start.md, "What the cache trusts"). `optimize=True`'s
    per-machine tuning keeps its settings there too (docs/optimize.md)."""
    if path is not None:
        path = path_argument(path, "path", "set_cache_dir")
        if not path or (os.path.exists(path) and not os.path.isdir(path)):
            checks.fail((ValueError if not path else NotADirectoryError)(
                f"set_cache_dir: `path` must name a directory (made if missing; None turns the "
                f"cache off), got {'an empty name' if not path else 'the file ' + repr(path)}"))
    _dali.set_analysis_cache_dir(path)
    tuning_store.forget()  # the tuning read from another directory


def cache_dir() -> str | None:
    """The warm-start cache directory (`set_cache_dir`), or None."""
    return _dali.analysis_cache_dir()
