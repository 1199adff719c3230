"""The public API: `compile`, `explain`, and the compiled-function object with its cache.

    @ndd.compile                                  # or @ndd.compile(fullgraph=True, ...)
    def preprocess(jpegs, size=224):
        images = ndd.decoders.image(jpegs)
        return ndd.resize(images, size=[size, size])

    images = preprocess(jpegs)                    # 1st call traces and builds; then cache hits
    preprocess.cache_info()                       # CacheInfo(hits=..., misses=..., traces=...)
    print(ndd_trace.explain(preprocess, jpegs))   # graph, generated code, guards, breaks
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import random
import textwrap
import threading
import time
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

from . import _dali
from .ahead import readahead
from .codegen.lower import Lowered, lower
from .codegen.optimize import optimize as optimize_graph
from .core import logs, passes, trees
from .core.errors import GraphBreakError, NddTraceWarning, _GraphBreak
from .core.ir import Graph, NodeKind, Ref
from .core.source import SourceLoc, hide_own_frames, is_internal_file, raise_at, user_location
from .execution import waits
from .execution.runtime import Executable, LazyOutput, Options
from .modes import lazy
from .modes.loop import Split, StepCall, split_generator
from .modes.per_sample import PerSampleFunction
from .tracing import guards
from .tracing.stepcheck import Finding
from .tracing.trace import GraphBreakRecord, Tracer

DEFAULT_CACHE_LIMIT = 8
_CAPTURE_LOOP_TEXT = ("runs as written: DALI's capture mode records its loop body and runs it as "
                      "a pipeline, as it does without ndd_trace (iterate reader.next_epoch(...) "
                      "to have ndd_trace compile the body)")
_CHECKED_LOOP_TEXT = ("runs each step's Python as written, in transparent mode: the reader is read "
                      "ahead, and a step's ndd calls run ahead on its batches and are used when "
                      "they match what the step calls, with the same results")


class CacheInfo(NamedTuple):
    """Counters of a compiled function's cache (`fn.cache_info()`): hits, misses, traces,
    fallbacks (calls not compiled whole) and the entries held."""

    hits: int
    misses: int
    traces: int
    fallbacks: int
    entries: int


@dataclasses.dataclass
class Entry:
    """One cache entry: a compiled graph, or the decision to run eagerly (with the reason)."""

    key: tuple
    graph: Graph | None = None
    graph_text: str = ""
    lowered: Lowered | None = None
    executable: Executable | None = None
    output_tree: Any = None
    static_batch_size: int | None = None
    breaks: list[GraphBreakRecord] = dataclasses.field(default_factory=list)
    eager_reason: str | None = None
    num_ops: int = 0
    path: str = ""  # how calls run: "one pipeline", "compiled loop", "checked loop", ...
    optimizations: list = dataclasses.field(default_factory=list)  # optimize.Applied (optimize)

    @property
    def eager(self) -> bool:
        return self.eager_reason is not None


class _Counters:
    def __init__(self) -> None:
        self.hits = self.misses = self.traces = self.fallbacks = 0


def _is_data(value: Any) -> bool:
    return isinstance(value, (_dali.Batch, _dali.Tensor, _dali.RNG))


def _walk_data(value: Any, path: tuple, visit: Callable[[tuple, Any], Any]) -> Any:
    """Rebuild `value`, replacing Batches, Tensors and RNGs found in lists/tuples/dicts."""
    return trees.map_leaves(value, _is_data, visit, path)


def _user_loc_of(error: BaseException | None) -> SourceLoc | None:
    """The innermost user frame of an exception's traceback."""
    loc = None
    tb = error.__traceback__ if error is not None else None
    while tb is not None:
        code = tb.tb_frame.f_code
        if not is_internal_file(code.co_filename):
            loc = SourceLoc(code.co_filename, tb.tb_lineno, code.co_name)
        tb = tb.tb_next
    return loc


@contextmanager
def _noted(note: str | None) -> Iterator[None]:
    """An error of the block (the eager run after a failed trace) carries the trace's note."""
    try:
        yield
    except Exception as error:
        if note:
            error.add_note(note)
        raise


class CompiledFunction:
    """A function whose ndd calls run as one cached DALI pipeline per guard set."""

    @property
    def _ndd_trace_inlined(self) -> Callable:
        """What a trace that calls this function records: its own function, inlined (its ops
        join the caller's graph; stepcheck.py and guards.py look into it)."""
        return self._function

    def __init__(self, function: Callable, *, fullgraph: bool = False,
                 num_threads: int | None = None, device_id: Any = "current",
                 prefetch_queue_depth: int = 2, cache_limit: int = DEFAULT_CACHE_LIMIT,
                 fallback: str = "lazy", optimize: bool = False):
        if not callable(function):
            raise TypeError(f"ndd.compile expects a function, got {type(function).__name__}")
        # a functools.partial: its function is compiled, its bound arguments passed each call
        self._bound_args: tuple = ()
        self._bound_kwargs: dict = {}
        while isinstance(function, functools.partial):
            self._bound_args = function.args + self._bound_args
            self._bound_kwargs = {**function.keywords, **self._bound_kwargs}
            function = function.func
        functools.update_wrapper(self, function)
        self._function = function
        self.fullgraph = fullgraph
        self._num_threads = num_threads
        self._device_id = device_id
        self.prefetch_queue_depth = prefetch_queue_depth
        self.cache_limit = cache_limit
        if fallback not in ("lazy", "eager"):
            raise ValueError(f"fallback must be 'lazy' or 'eager', got {fallback!r}")
        self.fallback = fallback
        self.optimize = bool(optimize)  # optimize.py's rewrites (values may differ from eager)
        self._plan = guards.plan_for(function)
        self._signature = inspect.signature(function)
        self.is_generator = inspect.isgeneratorfunction(function)
        self._positional_names = tuple(
            name for name, parameter in self._signature.parameters.items()
            if parameter.kind in (inspect.Parameter.POSITIONAL_ONLY,
                                  inspect.Parameter.POSITIONAL_OR_KEYWORD))
        # the number of parameters when all are positional ones (else -1): a call passing
        # exactly that many positional arguments needs no normalizing
        kinds = [p.kind for p in self._signature.parameters.values()]
        self._simple_arity = len(kinds) if all(
            kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
            for kind in kinds) else -1
        self._entries: OrderedDict[tuple, Entry] = OrderedDict()
        self._counters = _Counters()
        self._lock = threading.RLock()
        self._step_tracers = threading.local()  # .held: (device and threads, checked-mode tracer)
        self._specialize_batch_size = False
        self._warned: set[tuple] = set()
        self._storm_warned = False
        self._last_key: tuple | None = None
        self._fast: guards.FastGuard | None = None  # the last entry's guard, checked first
        self._last_miss_reason: str | None = None
        self._failure_note: str | None = None
        self._trace_exception: BaseException | None = None
        # a generator, taken apart at its first call (loop.py): False until then, None where
        # its loop body cannot be compiled (it runs in checked mode)
        self._split: Split | None | bool = False
        self._step: CompiledFunction | None = None  # its loop body, compiled
        self._loop_break: GraphBreakRecord | None = None
        self._path = "one pipeline"  # how a compiled entry runs ("compiled loop": a loop body)
        if not self.is_generator:
            readahead.watch_reader_epochs(self)  # see readahead.run_call

    # -- public --------------------------------------------------------------------------------

    def cache_info(self) -> CacheInfo:
        if self._step is not None:  # a compiled generator: its loop body's cache
            return self._step.cache_info()
        c = self._counters
        return CacheInfo(c.hits, c.misses, c.traces, c.fallbacks, len(self._entries))

    @property
    def last_miss_reason(self) -> str | None:
        """What changed at the last cache miss (a compiled generator: of its loop body)."""
        if self._step is not None:
            return self._step.last_miss_reason
        return self._last_miss_reason

    def cache_clear(self) -> None:
        if self._step is not None:
            self._step.cache_clear()
        with self._lock:
            for entry in self._entries.values():
                if entry.executable is not None:
                    entry.executable.close()
            self._entries.clear()
            self._fast = None
            self._counters = _Counters()

    @property
    def entries(self) -> list[Entry]:
        if self._step is not None:
            return self._step.entries
        return list(self._entries.values())

    def __get__(self, instance: Any, owner: Any) -> Any:
        if instance is None:
            return self
        return functools.partial(self, instance)

    def __repr__(self) -> str:
        return f"<ndd_trace compiled function {self.__qualname__}>"

    def _options(self) -> Options:
        num_threads = self._num_threads or _dali.current_num_threads()
        device_id = _dali.current_device_id() if self._device_id == "current" else self._device_id
        # A per-call pipeline is fed once per call; fed reader batches, it also runs
        # readahead.RUN_AHEAD calls ahead of the caller (readahead.run_call).
        return Options(num_threads, device_id, 1 + readahead.RUN_AHEAD)

    # -- calling -------------------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if _dali.tracing_active():
            # Called from inside another trace: inline, so its ops join the outer graph.
            return self._function(*args, **kwargs)
        if self._bound_args or self._bound_kwargs:  # (compiled from a functools.partial)
            args, kwargs = self._bound_args + args, {**self._bound_kwargs, **kwargs}
        if _dali.capture_running():  # DALI's capture mode records the calls: they are its own
            return self._in_capture_mode(args, kwargs)
        args, kwargs = self._normalize(args, kwargs)
        if self.is_generator:
            return self._epoch(args, kwargs)
        fast = self._fast
        if fast is not None and not kwargs and fast.plan is self._plan and \
                fast.matches(args):  # the last call's entry, without building its key
            entry = fast.entry
            with self._lock:
                self._counters.hits += 1
                self._last_key = entry.key
        else:
            key = self._guard_key(args, kwargs)
            entry, status = self._lookup(key, args, kwargs)
            if status == "storm":
                return self._fallback(args, kwargs)
            if status == "failed":  # tracing raised: run eagerly, which raises the same way
                return self._eager_after_failed_trace(key, args, kwargs)
            if not kwargs and not self._specialize_batch_size:
                self._fast = guards.FastGuard.of(args, self._plan, entry)
        if entry.eager:
            self._counters.fallbacks += 1
            return self._fallback(args, kwargs)
        try:
            return self._run(entry, args, kwargs)
        except Exception as error:  # an op's error at the call: the traceback of eager's
            hide_own_frames(error)
            raise

    def _in_capture_mode(self, args: tuple, kwargs: dict) -> Any:
        """A call made in a loop DALI's capture mode records: its ndd calls run as written, for
        capture mode to record and run as a pipeline (as without ndd_trace)."""
        self._counters.fallbacks += 1
        logs.fallbacks.info("`%s`: called in DALI's capture mode, whose pipeline runs its calls",
                            self.__qualname__)
        self._warn_once(f"ndd_trace: `{self.__qualname__}` is called in a loop DALI's capture "
                        "mode records (source.captured(...) or next_epoch(capture=True)): its "
                        "ndd calls run as written, and capture mode runs them as a pipeline",
                        user_location())
        return self._function(*args, **kwargs)

    def _fallback(self, args: tuple, kwargs: dict) -> Any:
        """Run a call that cannot be compiled whole: in transparent mode by default (its ndd
        calls still run as cached pipeline regions, split where Python needs data, with the
        same results as eager), or plainly eagerly with fallback="eager"."""
        logs.fallbacks.debug("`%s`: this call %s", self.__qualname__, self._fallback_text())
        if self.fallback != "lazy" or lazy.is_enabled():
            return self._function(*args, **kwargs)
        with lazy.enabled(optimize=self.optimize):
            return self._function(*args, **kwargs)

    def _fallback_epoch(self, args: tuple, kwargs: dict) -> Iterator[Any]:
        """The generator version: transparent mode around each step only, so the consumer's own
        code between steps runs as it would without ndd_trace."""
        generator = self._function(*args, **kwargs)
        if self.fallback != "lazy" or lazy.is_enabled():
            yield from generator
            return
        steps = lazy.Steps(self._step_tracer())
        try:  # each resumption in transparent mode; send() and throw() reach its own `yield`
            return (yield from trees.relay(generator, steps.step))
        finally:
            steps.close()
            generator.close()

    def _step_tracer(self) -> lazy.LazyTracer:
        """This thread's tracer for the function's checked epochs: kept from epoch to epoch,
        so that its run-ahead patterns carry over (a new one if the device or threads moved)."""
        setting = (_dali.current_device_id(), _dali.current_num_threads())
        held = getattr(self._step_tracers, "held", None)
        if held is None or held[0] != setting:
            held = self._step_tracers.held = (setting, lazy.new_tracer(self.optimize))
        return held[1]

    def _lookup(self, key: tuple, args: tuple, kwargs: dict) -> tuple[Entry | None, str]:
        """The entry for this call, traced on a miss; the status says "hit", "new", "storm"
        (past cache_limit: run eagerly) or "failed" (tracing raised)."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._counters.hits += 1
                self._last_key = key
                return entry, "hit"
            self._counters.misses += 1
            self._last_miss_reason = guards.explain_miss(key, self._last_key)
            (logs.recompiles if self._entries else logs.trace).info(
                "`%s`: cache miss (%d of cache_limit %d entries held): %s", self.__qualname__,
                len(self._entries), self.cache_limit, self.last_miss_reason)
            if len(self._entries) >= self.cache_limit:
                self._warn_storm()
                self._counters.fallbacks += 1
                return None, "storm"
            entry = self._trace(key, args, kwargs)
            if entry is None:
                self._counters.fallbacks += 1
                return None, "failed"
            self._entries[entry.key] = entry
            self._last_key = key
            return entry, "new"

    def _take_failure(self) -> tuple[str | None, BaseException | None]:
        """The failed trace's note and exception, handed over once."""
        note, self._failure_note = self._failure_note, None
        error, self._trace_exception = self._trace_exception, None
        return note, error

    def _eager_after_failed_trace(self, key: tuple, args: tuple, kwargs: dict) -> Any:
        note, error = self._take_failure()
        with _noted(note):
            result = self._function(*args, **kwargs)
        # Eager succeeded where tracing failed: this variant runs eagerly from now on, and says so.
        self._record_failed_trace(key, error)
        return result

    def _eager_epoch_after_failed_trace(self, key: tuple, args: tuple, kwargs: dict
                                        ) -> Iterator[Any]:
        """The generator version: an error of the user's own (a typo, a KeyError) surfaces as
        itself from the eager epoch; only an epoch that runs eagerly where tracing failed is
        recorded as not compiled (and warned about), at its first step."""
        note, error = self._take_failure()
        generator = self._function(*args, **kwargs)
        try:
            try:
                with _noted(note):
                    first = next(generator)
            except StopIteration:
                return
            self._record_failed_trace(key, error)
            yield first
            yield from generator
        finally:
            generator.close()

    def _record_failed_trace(self, key: tuple, error: BaseException | None) -> None:
        """Cache a variant whose trace raised as not compiled, and warn at the user's line."""
        record = GraphBreakRecord(f"could not be traced ({type(error).__name__}: {error})",
                                  _user_loc_of(error))
        logs.fallbacks.info("`%s`: %s", self.__qualname__, record)
        self._entries[key] = self._break_entry(Entry(key=key), record)

    def _normalize(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """One spelling per call: defaults applied, parameters passed by position where they can
        be, so `f(b)`, `f(b, 16)` and `f(b, size=16)` share a cache entry."""
        if not kwargs and len(args) == self._simple_arity:
            return args, kwargs  # every parameter passed by position: already one spelling
        try:
            bound = self._signature.bind(*args, **kwargs)
        except TypeError:
            return args, kwargs  # the call itself raises the usual TypeError
        bound.apply_defaults()
        return bound.args, bound.kwargs

    def _epoch(self, args: tuple, kwargs: dict) -> Iterator[Any]:
        """A compiled generator call: the generator's own Python, its loop body compiled
        (loop.py); or, where the body cannot be compiled, each step in checked mode."""
        split = self._loop()
        if split is None:
            self._counters.fallbacks += 1
            if self._loop_break is not None and self._loop_break.captures:
                epoch = self._function(*args, **kwargs)  # DALI's capture mode runs its loop
            else:
                epoch = self._fallback_epoch(args, kwargs)
        else:
            epoch = split.generator(*args, **kwargs)
        # the report's loader verdict: the consumer's wait for each item vs its own step
        return waits.timed(epoch, self.__qualname__, str(self._definition_loc()))

    def _loop(self) -> Split | None:
        """The generator taken apart (None: its loop body runs in checked mode), at its first
        call; a graph break under fullgraph=True raises GraphBreakError there."""
        if self._split is False:
            started = time.perf_counter()
            found = split_generator(self._function)
            apart = (time.perf_counter() - started) * 1000
            logs.trace.info("`%s`: generator taken apart in %.1f ms", self.__qualname__, apart,
                            extra={"ndd_trace_ms": {"apart": apart}})
            if isinstance(found, Finding) and found.captures:
                self._split = None
                self._loop_break = GraphBreakRecord(found.reason, found.loc, captures=True)
                self._entries[("capture mode",)] = self._break_entry(
                    Entry(key=("capture mode",)), self._loop_break, path="DALI's capture mode")
            elif isinstance(found, Finding):
                self._split = None
                self._loop_break = GraphBreakRecord(
                    f"its loop body's Python may not do the same at every step ({found.reason});"
                    " each step runs its Python in checked mode", found.loc)
                self._entries[("checked loop",)] = self._break_entry(
                    Entry(key=("checked loop",)), self._loop_break, path="checked loop")
            else:
                self._step = CompiledFunction(
                    found.step, fullgraph=self.fullgraph, num_threads=self._num_threads,
                    device_id=self._device_id, prefetch_queue_depth=self.prefetch_queue_depth,
                    cache_limit=self.cache_limit, fallback=self.fallback,
                    optimize=self.optimize)
                self._step._path = "compiled loop"
                found.step_cell.cell_contents = StepCall(self._step)
                self._split = found
        return self._split

    def _batch_sizes(self, args: tuple, kwargs: dict) -> set[int]:
        sizes = set()

        def visit(path: tuple, value: Any) -> Any:
            if isinstance(value, _dali.Batch):
                sizes.add(value.batch_size)
            return value

        _walk_data(args, ("args",), visit)
        _walk_data(kwargs, ("kwargs",), visit)
        return sizes

    def _batch_size_of(self, args: tuple, kwargs: dict) -> tuple[int | None, bool]:
        """The batch size of the Batch arguments, and whether they all agree."""
        sizes = self._batch_sizes(args, kwargs)
        if not sizes:
            return None, True
        return max(sizes), len(sizes) == 1

    def _definition_loc(self) -> SourceLoc:
        code = self._function.__code__
        return SourceLoc(code.co_filename, code.co_firstlineno, code.co_name)

    def _guard_key(self, args: tuple, kwargs: dict) -> tuple:
        sizes = None
        if self._specialize_batch_size:
            sizes = self._batch_size_of(args, kwargs)[0]
        return guards.build_key(args, kwargs, self._plan, (sizes,) if sizes else None,
                                self._positional_names)

    def _warn_storm(self) -> None:
        logs.fallbacks.info("`%s`: past cache_limit (%d), this variant is not compiled: %s",
                            self.__qualname__, self.cache_limit, self.last_miss_reason)
        if not self._storm_warned:
            self._storm_warned = True
            loc = user_location()
            self._warn(
                f"`{self.__qualname__}` was traced {self.cache_limit} times (cache_limit); "
                f"last change: {self.last_miss_reason}. New variants are not compiled: "
                f"each {self._fallback_text()}. Make the changing value an ndd Batch/Tensor "
                "argument, or raise cache_limit.", loc)

    def _warn_once(self, message: str, loc: SourceLoc | None) -> None:
        site = (loc.filename if loc else None, loc.lineno if loc else None, message)
        if site not in self._warned:
            self._warned.add(site)
            self._warn(message, loc)

    def _warn(self, message: str, loc: SourceLoc | None) -> None:
        if loc is None:
            warnings.warn(message, NddTraceWarning, stacklevel=3)
        else:
            warnings.warn_explicit(message, NddTraceWarning, loc.filename, loc.lineno)

    # -- tracing -------------------------------------------------------------------------------

    def _rng_objects(self) -> list[Any]:
        found = []
        for _, name, namespace in self._plan.globals_read:
            value = namespace.get(name)
            if isinstance(value, _dali.RNG):
                found.append(value)
        for _, cell in self._plan.closure:
            try:
                if isinstance(cell.cell_contents, _dali.RNG):
                    found.append(cell.cell_contents)
            except ValueError:
                pass
        return found

    def trace(self, args: tuple, kwargs: dict, key: tuple | None = None,
              raise_errors: bool = False) -> Entry | None:
        """Trace one call into a cache entry (not stored). Draws nothing from any RNG."""
        # Re-plan: the helpers the function calls may have changed since the last trace.
        self._plan = guards.plan_for(self._function)
        key = self._guard_key(args, kwargs)
        device_id = self._options().device_id
        tracer = Tracer(self.__name__, device_id)
        batch_size, consistent = self._batch_size_of(args, kwargs)
        tracer.batch_size = batch_size or 1
        # the default generator only if ndd has made it: making it here would draw its seed
        # from Python's `random` where eager does not (yet); one the trace makes is undone
        default = _dali.existing_default_rng()
        rngs: list[Any] = [default] if default is not None else []
        python_random = random.getstate() if default is None else None

        def visit(path: tuple, value: Any) -> Any:
            if isinstance(value, _dali.RNG):
                tracer.register_rng(value, ("arg", path))
                rngs.append(value)
                return value
            name = self._argument_name(path)
            return tracer.placeholder(name, path, value)

        traced_args = _walk_data(args, ("args",), visit)
        traced_kwargs = _walk_data(kwargs, ("kwargs",), visit)
        for rng in self._rng_objects():
            tracer.allow_rng_object(rng)
            rngs.append(rng)
        before = [(rng, _dali.rng_snapshot(rng)) for rng in rngs]
        entry = Entry(key=key)
        self._counters.traces += 1
        _GraphBreak.raised.breaks = swallowed = []
        try:
            with tracer.active():
                result = self._function(*traced_args, **traced_kwargs)
            tracer.set_outputs(result)
            if swallowed:  # a bare `except:` in user code caught a graph break: still a break
                raise swallowed[0]
        except _GraphBreak as graph_break:
            self._restore(before, python_random)
            record = GraphBreakRecord(graph_break.reason, graph_break.loc)
            return self._break_entry(entry, record)
        except BaseException as error:
            self._restore(before, python_random)
            self._failure_note = tracer.failure_note
            self._trace_exception = error
            if raise_errors:
                raise
            return None
        finally:
            _GraphBreak.raised.breaks = None
        if any(_dali.rng_snapshot(rng) != snapshot for rng, snapshot in before) or (
                python_random is not None and _dali.existing_default_rng() is not None):
            self._restore(before, python_random)
            record = GraphBreakRecord(
                "draws from or reseeds an RNG in Python (RNG(), set_seed, .state=); do that "
                "outside the compiled function", self._definition_loc())
            return self._break_entry(entry, record)
        has_batches = batch_size is not None or tracer.static_batch_sizes
        if tracer.sample_random_ops and has_batches:
            record = GraphBreakRecord(
                "calls a random op without batch_size (one value for the whole call) in a "
                "function that works on batches: a pipeline would draw per sample; pass "
                "batch_size=x.batch_size or draw it outside", tracer.sample_random_ops[0])
            return self._break_entry(entry, record)
        sizes = set(tracer.static_batch_sizes)
        if batch_size is not None:
            sizes.add(batch_size)
        if not consistent or len(sizes) > 1:
            sizes |= set(self._batch_sizes(args, kwargs))
            record = GraphBreakRecord(
                f"batches of different sizes meet in one call ({sorted(sizes)}); a pipeline "
                "runs one batch size per iteration", self._definition_loc())
            return self._break_entry(entry, record)
        if tracer.specialized_on_batch_size is not None and not self._specialize_batch_size:
            self._specialize_batch_size = True
            self._fast = None  # keys hold the batch size from now on
            entry.key = self._guard_key(args, kwargs)
        entry.static_batch_size = next(iter(tracer.static_batch_sizes), None)
        return self._finish(entry, tracer)

    def _argument_name(self, path: tuple) -> str:
        if path[0] == "kwargs":
            return "_".join(str(p) for p in path[1:])
        params = list(self._signature.parameters)
        index = path[1]
        base = params[index] if index < len(params) and \
            self._signature.parameters[params[index]].kind != inspect.Parameter.VAR_POSITIONAL \
            else f"arg{index}"
        return "_".join([base, *(str(p) for p in path[2:])])

    @staticmethod
    def _restore(before: list, python_random: Any = None) -> None:
        for rng, snapshot in before:
            if _dali.rng_snapshot(rng) != snapshot:
                _dali.rng_restore(rng, snapshot)
        if python_random is not None and _dali.existing_default_rng() is not None:
            # made during the trace, it drew its seed from Python's `random`: both as before
            _dali.forget_default_rng()
            random.setstate(python_random)

    def _break_entry(self, entry: Entry, record: GraphBreakRecord, path: str = "") -> Entry:
        entry.breaks.append(record)
        entry.eager_reason = f"graph break: {record}"
        entry.path = path or ("transparent mode" if self.fallback == "lazy" else "eager")
        logs.breaks.info("`%s`: graph break at %s: %s", self.__qualname__, record.loc or "?",
                         record.reason)
        if self.fullgraph:
            error = GraphBreakError(record.reason, record.loc, self.__qualname__)
            error.filename, error.lineno = record.filename, record.lineno
            raise_at(error, record.loc)
        then = (_CHECKED_LOOP_TEXT if path == "checked loop" else _CAPTURE_LOOP_TEXT
                if path == "DALI's capture mode" else self._fallback_text())
        self._warn_once(f"ndd_trace: `{self.__qualname__}` cannot be compiled whole: "
                        f"{record.reason}. It {then}. See ndd_trace.explain().", record.loc)
        return entry

    def _fallback_text(self) -> str:
        if self.fallback == "lazy" and self.is_generator:
            return ("runs as a plain loop instead, each step in transparent mode: its reader "
                    "reads ahead and its ndd calls run as cached pipeline regions, with the "
                    "same results")
        if self.fallback == "lazy":
            return ("runs in transparent mode instead: its ndd calls run as cached pipeline "
                    "regions (split where Python needs data), with the same results")
        return "runs eagerly (plain ndd, fallback=\"eager\"), with the same results"

    def _finish(self, entry: Entry, tracer: Tracer) -> Entry:
        graph = tracer.graph
        traced_at = time.perf_counter()
        traced = graph.format()
        entry.num_ops = tracer.num_ops
        draws = [(node.payload, node) for node in graph.nodes_of(NodeKind.RANDOM_STATE)]
        passes.eliminate_common_subexpressions(graph)
        passes.eliminate_dead_code(graph)
        if self.optimize:  # after the passes: a value's users are then all the users it has
            entry.optimizations = optimize_graph(graph)
            for applied in entry.optimizations:
                logs.trace.info("`%s`: optimization applied at %s", self.__qualname__, applied)
        entry.graph = graph
        # what explain shows is what runs: the graph after the passes (and, where they changed
        # it, the graph as traced)
        entry.graph_text = graph.format()
        if traced != entry.graph_text:
            removed = ("common subexpressions and dead code were removed" if not
                       entry.optimizations else "the passes and optimizations")
            entry.graph_text += f"\n\nas traced, before {removed}:\n" + traced
        entry.output_tree = tracer.output_tree
        entry.lowered = lower(graph, inline_constants=True)
        entry.path = self._path
        # the times a cache of traces kept across processes could save (the build it cannot)
        times = {"trace": (traced_at - tracer.started) * 1000,
                 "code": (time.perf_counter() - traced_at) * 1000}
        logs.trace.info("`%s` traced: %d ndd calls -> %s (%d ops after passes); traced in %.1f ms,"
                        " passes and code in %.1f ms", self.__qualname__, entry.num_ops,
                        entry.lowered.filename, len(graph.nodes_of(NodeKind.OP)), times["trace"],
                        times["code"], extra={"ndd_trace_ms": times})
        entry.executable = Executable(graph, entry.lowered, draws, self._options(),
                                      tracer.rng_objects)
        return entry

    def _trace(self, key: tuple, args: tuple, kwargs: dict) -> Entry | None:
        return self.trace(args, kwargs, key)

    # -- running -------------------------------------------------------------------------------

    def _run(self, entry: Entry, args: tuple, kwargs: dict) -> Any:
        bound, sizes = self._bind_sizes(args, kwargs)
        batch_size = max(sizes) if sizes else None
        consistent = len(sizes) <= 1
        if batch_size is None:
            batch_size = entry.static_batch_size or 1
        elif entry.static_batch_size is not None and entry.static_batch_size != batch_size:
            consistent = False
        if not consistent or batch_size == 0:  # a pipeline cannot run an empty batch
            reason = ("an empty batch" if batch_size == 0 and consistent else
                      f"batches of different sizes ({sorted(sizes)}, "
                      f"traced with {entry.static_batch_size})")
            return self._eager_for_this_call(
                reason, args, kwargs, why=" (a pipeline runs one batch size per iteration)")
        executable = entry.executable
        if executable.feed.empty_sample_unsafe and executable.feed.feeds_empty_sample(bound):
            return self._eager_for_this_call(executable.feed.empty_sample_reason, args, kwargs)
        at_call = executable.failures.ops_run_at_call(bound)  # ops eager runs at once (user data)
        snapshots = executable.failures.rng_snapshots(bound) if at_call and executable.draws else []
        try:
            run = readahead.run_call(executable, entry.key, bound, batch_size)
        except Exception as error:
            retired = executable.retired
            if retired is not None:
                # its failed pipelines cannot be freed: it stops making new ones
                entry.eager_reason = retired
                self._warn(f"ndd_trace: `{self.__qualname__}` is no longer compiled whole: "
                           f"{retired}. It {self._fallback_text()}.", user_location())
                self._counters.fallbacks += 1
                logs.fallbacks.info("`%s`: not compiled whole from now on: %s",
                                    self.__qualname__, retired)
                return self._fallback(args, kwargs)
            if executable.builds == 0:
                # The pipeline could not be built: this variant runs eagerly from now on.
                entry.eager_reason = f"pipeline build failed: {error}"
                loc = getattr(error, "loc", None)
                self._warn(f"ndd_trace: `{self.__qualname__}` runs eagerly: the pipeline could "
                           f"not be built ({error}).", loc)
                self._counters.fallbacks += 1
                logs.fallbacks.info("`%s`: pipeline build failed, runs eagerly: %s",
                                    self.__qualname__, error)
                return self._function(*args, **kwargs)
            raise
        logs.runtime.debug("`%s`: pipeline run scheduled (batch size %d)", self.__qualname__,
                           batch_size)
        if at_call and run is not None:  # their run-time errors raise here, as eagerly
            executable.failures.raise_at_call(run, at_call, bound, snapshots)
        return self._unflatten(entry.output_tree, run, entry, bound, batch_size)

    def _eager_for_this_call(self, reason: str, args: tuple, kwargs: dict, why: str = "") -> Any:
        """This one call runs eagerly (the variant stays compiled): warned once at the user's
        line, counted as a fallback and logged."""
        self._warn_once(f"ndd_trace: `{self.__qualname__}` ran eagerly for this call: "
                        f"{reason}{why}", user_location())
        self._counters.fallbacks += 1
        logs.fallbacks.info("`%s`: this call runs eagerly: %s", self.__qualname__, reason)
        return self._function(*args, **kwargs)

    @staticmethod
    def _bind_sizes(args: tuple, kwargs: dict) -> tuple[dict[tuple, Any], set[int]]:
        """`_bind` and the batch sizes of the Batch arguments, in one walk (the common case of
        plain Batch/Tensor positional arguments without nesting is walked inline)."""
        bound: dict[tuple, Any] = {}
        sizes: set[int] = set()
        batch, tensor, rng = _dali.Batch, _dali.Tensor, _dali.RNG
        for index, value in enumerate(args):
            kind = type(value)
            if kind is batch:
                bound[("args", index)] = value
                sizes.add(value.batch_size)
            elif kind is tensor or kind is rng:
                bound[("args", index)] = value
            elif isinstance(value, (list, tuple, dict, batch, tensor, rng)):
                break
        else:
            if not kwargs:
                return bound, sizes
        bound.clear()
        sizes.clear()

        def visit(path: tuple, value: Any) -> Any:
            bound[path] = value
            if isinstance(value, _dali.Batch):
                sizes.add(value.batch_size)
            return value

        _walk_data(args, ("args",), visit)
        _walk_data(kwargs, ("kwargs",), visit)
        return bound, sizes

    def _unflatten(self, tree: Any, run: Any, entry: Entry, bound: dict, batch_size: int) -> Any:
        def leaf(node: tuple) -> Any:
            if node[0] == "batch_size":
                return batch_size
            index, is_batch = node[1], node[2]
            ref: Ref = entry.graph.outputs[index]
            if ref.node.kind is NodeKind.INPUT:
                return bound[ref.node.payload]
            lazy = LazyOutput(run, index, is_batch, entry.executable.output_device(index))
            if is_batch:
                return _dali.lazy_batch(lazy)
            return _dali.Tensor(invocation_result=lazy)

        return trees.unflatten(tree, leaf)


def compile(function: Callable | None = None, *, fullgraph: bool = False,
            num_threads: int | None = None, device_id: Any = "current",
            prefetch_queue_depth: int = 2, cache_limit: int = DEFAULT_CACHE_LIMIT,
            fallback: str = "lazy", per_sample: bool = False, optimize: bool = False) -> Any:
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
    if per_sample:
        if optimize:
            raise ValueError("ndd.compile: optimize=True is not available with per_sample=True "
                             "(a per-sample function runs its own rewritten Python)")
        return _per_sample_compile(function, num_threads, device_id, cache_limit)
    options = dict(fullgraph=fullgraph, num_threads=num_threads, device_id=device_id,
                   prefetch_queue_depth=prefetch_queue_depth, cache_limit=cache_limit,
                   fallback=fallback, optimize=optimize)
    if function is None:
        return lambda f: CompiledFunction(f, **options)
    if isinstance(function, CompiledFunction):
        function = function.__wrapped__  # compiling again applies the new options
    return CompiledFunction(function, **options)


def _per_sample_compile(function: Callable | None, num_threads: int | None,
                        device_id: Any, cache_limit: int) -> Any:
    def make(f: Callable) -> PerSampleFunction:
        return PerSampleFunction(getattr(f, "__wrapped__", f), num_threads=num_threads,
                                 device_id=device_id, warning=NddTraceWarning,
                                 cache_limit=cache_limit)

    return make if function is None else make(function)


@dataclasses.dataclass
class Explanation:
    """What ndd_trace does with one call: graph, generated code, guards, breaks, cache state."""

    function_name: str
    graph: str
    code: str
    guards: list[str]
    breaks: list[GraphBreakRecord]
    eager_reason: str | None
    cache: CacheInfo
    num_ops: int
    miss_reason: str | None
    path: str = ""
    loop: str = ""  # a compiled generator: its Python as it runs, and its loop body
    optimize: bool = False  # compiled with optimize=True
    optimizations: list[str] = dataclasses.field(default_factory=list)  # what was rewritten

    @property
    def optimizations_text(self) -> list[str]:
        """The "optimizations applied:" section (empty without optimize=True)."""
        if not self.optimize:
            return []
        return [f"  optimizations applied: {len(self.optimizations) or 'none'}",
                *(f"    - {applied}" for applied in self.optimizations)]

    def __str__(self) -> str:
        lines = [f"ndd_trace.explain: `{self.function_name}`"]
        status = f"not compiled whole ({self.eager_reason})" if self.eager_reason else \
            f"compiled: {self.num_ops} ndd calls -> one DALI pipeline"
        lines.append(f"  status: {status}")
        if self.path:
            lines.append(f"  runs as: {self.path}")
        lines.append(f"  cache: {self.cache}")
        if self.miss_reason:
            lines.append(f"  last cache miss: {self.miss_reason}")
        lines.append(f"  graph breaks: {len(self.breaks)}")
        for record in self.breaks:
            lines.append(f"    - {record}")
            if record.fix:
                lines.append(f"      try: {record.fix}")
        lines += self.optimizations_text
        lines.append("  guards (a change in any of these re-traces):")
        lines += [f"    - {guard}" for guard in self.guards]
        if self.loop:
            lines.append("")
            lines.append(self.loop)
        if self.graph:
            lines.append("")
            lines.append(self.graph)
        if self.code:
            lines.append("")
            lines.append("generated pipeline:")
            lines.append(self.code)
        return "\n".join(lines)


def explain(function: Callable, *args: Any, **kwargs: Any) -> Explanation:
    """Trace `function` for these arguments (running nothing) and report what would happen."""
    if isinstance(function, PerSampleFunction):  # its rewritten source is what runs
        guard_lines = guards.describe(function._guard_key(args))
        return Explanation(function.__qualname__, "", function.converted_source, guard_lines,
                           [], None, CacheInfo(0, 0, 0, 0, len(function._variants)), 0,
                           function.last_miss_reason)
    compiled = function if isinstance(function, CompiledFunction) else compile(function)
    if compiled.is_generator:
        return _explain_generator(compiled)
    args, kwargs = compiled._normalize(args, kwargs)
    counters = compiled._counters
    saved = (counters.hits, counters.misses, counters.traces, counters.fallbacks)
    try:
        entry = compiled.trace(args, kwargs)
    except GraphBreakError:
        raise
    finally:
        counters.hits, counters.misses, counters.traces, counters.fallbacks = saved
    key = compiled._guard_key(args, kwargs)
    guard_lines = guards.describe(key)
    if entry is None:
        _, error = compiled._take_failure()
        return Explanation(compiled.__qualname__, "", "", guard_lines, [],
                           f"tracing raised {error!r}; the eager call runs instead",
                           compiled.cache_info(), 0, compiled.last_miss_reason)
    return Explanation(
        function_name=compiled.__qualname__,
        graph=entry.graph_text,
        code=entry.lowered.source if entry.lowered else "",
        guards=guard_lines,
        breaks=list(entry.breaks),
        eager_reason=entry.eager_reason,
        cache=compiled.cache_info(),
        num_ops=entry.num_ops,
        miss_reason=compiled.last_miss_reason,
        path=entry.path,
        optimize=compiled.optimize,
        optimizations=[str(applied) for applied in entry.optimizations],
    )


_LOOP_PATH = ("compiled loop: the generator's Python runs as written, its loop body as one "
              "compiled call per step, run ahead on the batches its readers read ahead")


def _explain_generator(compiled: CompiledFunction) -> Explanation:
    """A compiled generator: how it runs, and its loop body's latest variant (traced at the
    first step of an epoch: nothing runs here)."""
    split = compiled._loop()
    if split is None:
        record = compiled._loop_break
        return Explanation(compiled.__qualname__, "", "", [], [record], f"graph break: {record}",
                           compiled.cache_info(), 0, None,
                           path="DALI's capture mode" if record.captures else "checked loop")
    loop = "\n".join([
        "the generator, as it runs:", textwrap.indent(split.generator_source, "    "), "",
        f"its loop body ({split.body_loc}), compiled:",
        textwrap.indent(split.step_source, "    ")])
    step = compiled._step
    entry = step._entries.get(step._last_key) if step._last_key is not None else None
    if entry is None:
        return Explanation(compiled.__qualname__, "(not traced yet: the loop body is traced at "
                           "its first step)", "", [], [], None, compiled.cache_info(), 0,
                           None, path=_LOOP_PATH, loop=loop)
    guard_lines = guards.describe(entry.key)
    return Explanation(
        function_name=compiled.__qualname__, graph=entry.graph_text,
        code=entry.lowered.source if entry.lowered else "", guards=guard_lines,
        breaks=list(entry.breaks), eager_reason=entry.eager_reason,
        cache=compiled.cache_info(), num_ops=entry.num_ops,
        miss_reason=compiled.last_miss_reason,
        path=_LOOP_PATH if not entry.eager else f"checked loop ({entry.path})", loop=loop,
        optimize=compiled.optimize,
        optimizations=[str(applied) for applied in entry.optimizations])
