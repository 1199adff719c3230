"""The compiled per-sample function: one pipeline per guard key (a variant), run until its random
values agree with the paths the samples take, or the eager per-sample loop where it cannot.

    augment = PerSampleFunction(augment_one)   # what @ndd.compile(per_sample=True) makes
    out = augment(batch)
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import threading
from collections.abc import Callable
from typing import Any

from ... import _dali
from ...core import ledger, process_state
from ...core.ledger import Runs, Verdict
from ...core.source import SourceLoc, user_location
from ...core.spelling import CallSpelling
from ...codegen.lower import Lowered, lower
from ...core.ir import Graph
from ...execution.runtime import Options
from ...units.build import compile_graph
from ...units.cache import LIVE_PIPELINES, CacheInfo, Found, UnitCache
from ...units.unit import Unit
from ...tracing.code_writes import names_read
from ...tracing.effects import find_effect
from .definition import Definition, EagerLoop
from .gather import gather, rebuilt
from .graph import trace
from .random_stream import RandomStream
from .rewrite import convert

# A call whose paths are not settled after this many runs (see `RandomStream`) runs as the
# eager per-sample loop, and so does the function from then on: more runs would cost more than
# the loop.
_MAX_RUNS = 3


class _RunFailed(Exception):
    """Internal: a pipeline run raised `error`."""

    def __init__(self, error: Exception):
        super().__init__(str(error))
        self.error = error


class _EagerCall(Exception):
    """Internal: this call runs as the eager per-sample loop (`variant` says why)."""

    def __init__(self, variant: _Variant):
        super().__init__(variant.eager_reason)
        self.variant = variant


def _eager_loop(reason: str, loc: SourceLoc | None) -> Verdict:
    return Verdict.eager_variant(reason, loc, Runs.PER_SAMPLE_LOOP)


@dataclasses.dataclass(eq=False)
class _Variant(Unit):
    """A per-sample function's unit: one guard key's pipeline (or, with its verdict, the decision
    to run the eager per-sample loop)."""

    definition: Definition | None = None
    lowered: Lowered | None = None

    @property
    def eager_loc(self) -> SourceLoc | None:
        return self.verdict.loc


class PerSampleFunction:
    """A function written for one sample, run on every sample of a batch in one pipeline."""

    def __init__(self, function: Callable, *, num_threads: int | None = None,
                 device_id: Any = "current", warning: type = UserWarning,
                 cache_limit: int = 8):
        functools.update_wrapper(self, function)
        self._function = function
        self._num_threads = num_threads
        self._device_id = device_id
        self._converted = convert(function)
        self.converted_source = self._converted.source
        self._lock = threading.RLock()
        self.builds = 0
        # pipeline runs so far (more than calls where paths were guessed wrong), and the last
        # call's (`runs`, `last_runs`: their documented names before; `Runs` is how units run)
        self.run_count = 0
        self.last_run_count = 0
        # every call run as the eager per-sample loop, counted, kept and warned (once a site)
        self.ledger = ledger.Ledger(self.__qualname__, warning)
        process_state.compiled_objects.add(self)  # (ndd_trace.reset clears its cache)
        self._spelling = CallSpelling(function)  # (how its calls bind: keywords by position)
        self._parameters = list(self._spelling.signature.parameters)
        # The variants are keyed as compiled functions' entries are (guard keys): the Batches'
        # descriptions, the other arguments' values (baked into the pipeline), and the globals
        # and closure variables the function and its helpers read
        self._cache = UnitCache(
            self.__qualname__, cache_limit, self.ledger, function=function, baked=True,
            kind="variants", positional_names=self._spelling.positional_names)

    def __repr__(self) -> str:
        return f"<ndd_trace per-sample function {self.__qualname__}>"

    def _settings(self) -> dict[str, Any]:
        """Its pipelines' settings: threads, device (the current one unless given), depth 1
        (a call waits for its run)."""
        return {"num_threads": self._num_threads or _dali.current_num_threads(),
                "device_id": _dali.current_device_id() if self._device_id == "current"
                else self._device_id,
                "prefetch_queue_depth": 1}

    def _options(self, batch_size: int) -> dict[str, Any]:
        settings = self._settings()
        return _dali.pipeline_options(batch_size, settings["num_threads"],
                                      settings["device_id"], 1)

    @property
    def runs(self) -> int:
        """`run_count`, by its former (documented) name."""
        return self.run_count

    @property
    def last_runs(self) -> int:
        """`last_run_count`, by its former (documented) name."""
        return self.last_run_count

    @property
    def cache_limit(self) -> float:
        return self._cache.limit

    @cache_limit.setter
    def cache_limit(self, value: float) -> None:
        self._cache.limit = value

    @property
    def last_miss_reason(self) -> str | None:
        """Why the last call's guard key was not in the cache (None before any miss)."""
        return self._cache.last_miss_reason

    def cache_info(self) -> CacheInfo:
        """Its cache's counters: hits, misses, pipelines built (traces), calls run as the eager
        per-sample loop (fallbacks) and the variants held."""
        return self._cache.info()

    def cache_clear(self) -> None:
        """Forget every variant (its pipeline) and the counters."""
        with self._lock:
            self._cache.clear()

    @property
    def variants_held(self) -> int:
        """Pipelines (or eager-loop decisions) its cache holds, one per guard key."""
        return len(self._cache.units)

    def guard_key(self, args: tuple) -> tuple:
        return self._cache.key(args, {})

    def _batch_size(self, args: tuple) -> int:
        """The batch size of the Batch arguments (they must agree)."""
        sizes = {value.batch_size for value in args if isinstance(value, _dali.Batch)}
        if not sizes:
            raise TypeError(f"per-sample function `{self.__qualname__}` takes ndd Batches "
                            "(it runs once per sample of them)")
        if len(sizes) > 1:
            raise ValueError(f"per-sample function `{self.__qualname__}` got batches of "
                             f"different sizes ({sorted(sizes)})")
        return sizes.pop()

    def _traced(self, args: tuple, batch_size: int, num_threads: int | None = None,
                observe: bool = True) -> tuple[Graph, Definition]:
        """`_trace`, raising our own error where DALI's AutoGraph wrapped it."""
        process_state.per_sample_scope.raised = None
        try:
            options = self._options(batch_size)
            if num_threads:
                options["num_threads"] = num_threads
            return trace(self._function, self._converted, self._parameters, args, options,
                         observe)
        except Exception as error:
            scope = process_state.per_sample_scope
            raised, scope.raised = scope.raised, None
            if raised is not None and raised is not error:
                raise raised from None  # ours, wrapped by DALI's AutoGraph
            raise

    def graph_for_export(self, args: tuple, batch_size: int | None,
                         num_threads: int | None) -> tuple[Graph, list[str], dict[str, Any]]:
        """The graph for these example arguments (without the outputs that observe the
        samples' paths), its random-value inputs' names, and the pipeline's options."""
        size = batch_size or self._batch_size(args)
        graph, definition = self._traced(args, size, num_threads, observe=False)
        settings = self._settings()
        options = {"batch_size": int(size), "num_threads": num_threads or
                   settings["num_threads"], "device_id": settings["device_id"]}
        return graph, [site.source for site in definition.random_sites], options

    def describe(self, args: tuple) -> tuple[str, str, int, str | None]:
        """What a call with these arguments runs, defined now and run nothing: (its graph's
        text, its generated pipeline, its number of nodes, why it runs as the eager
        per-sample loop instead, or None: the held variant's verdict, where one is held, which a
        run may have decided)."""
        held = self._cache.get(self.guard_key(args))
        recorded = held.eager_reason if held is not None else None
        try:
            graph, _ = self._traced(args, self._batch_size(args), observe=True)
        except EagerLoop as reason:
            return "", "", 0, recorded or reason.reason
        return graph.format(), lower(graph).source, len(graph.nodes), recorded

    def _variant(self, args: tuple, batch_size: int) -> _Variant:
        """This call's variant: the last one if its fast guard matches, else its key's (built
        on a miss)."""
        cache = self._cache
        variant = cache.fast_hit(args, {})
        if variant is not None:
            return variant
        key = cache.key(args, {})

        def make() -> _Variant:
            # its helpers may have changed: then the key is another plan's
            made_key = cache.key(args, {}) if cache.replan() else key
            return cache.get(made_key) or self._build(made_key, args, batch_size)

        variant, found = cache.lookup(key, make)
        if found is Found.PAST_LIMIT:
            return _Variant(key=key, verdict=_eager_loop(
                f"was built {cache.limit} times (cache_limit), last change: "
                f"{cache.last_miss_reason}; new variants are not built. Make the changing "
                "value an ndd Batch argument, or raise cache_limit", user_location()))
        cache.remember_fast(args, {}, variant)
        return variant

    def _build(self, key: tuple, args: tuple, batch_size: int) -> _Variant:
        variant = _Variant(key=key)
        try:
            _check_python_runs_once(self._function)
            graph, definition = self._traced(args, max(batch_size, 1))
        except EagerLoop as reason:
            variant.verdict = _eager_loop(reason.reason, reason.loc)
            return variant
        program = compile_graph(graph, Options(**self._settings()))
        try:
            program.executable.ensure_built(max(batch_size, 1))
        except Exception:
            program.executable.close()
            raise
        variant.executable, variant.definition = program.executable, definition
        variant.lowered, variant.num_ops = program.lowered, len(graph.nodes)
        self.builds += 1
        return variant

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        args = self._by_position(args, kwargs)
        batch_size = self._batch_size(args)
        with self._lock:
            variant = self._variant(args, batch_size)
            if variant.eager_reason is not None:
                self._warn_eager(variant)
                return self.eager(*args)
            definition = variant.definition
            try:
                outputs = self._run(variant, args, batch_size)
            except _RunFailed as failure:
                return self._after_failed_run(variant.key, args, failure)
            except _EagerCall as call:  # the generators are untouched: the loop draws as it would
                self._warn_eager(call.variant)
                return self.eager(*args)
        return rebuilt(definition.output_tree, outputs, batch_size)

    def _run(self, variant: _Variant, args: tuple, batch_size: int) -> tuple:
        """Run the pipeline until the random values fed agree with the paths the samples take
        (see `RandomStream`), then advance the generators as the eager loop does."""
        executable, definition = variant.executable, variant.definition
        stream = RandomStream(definition, args, batch_size)
        bound: dict[tuple, Any] = {("args", index): value for index, value in enumerate(args)
                                   if isinstance(value, _dali.Batch)}
        if definition.index_node is not None:
            bound[("sample_index",)] = _dali.wrap_batch(_dali.sample_indices(batch_size))
        observed = None
        for run_count in itertools.count(1):
            values, guessed = stream.assign(observed)
            for index, batch in enumerate(values):
                bound[("random", index)] = _dali.wrap_batch(batch)
            try:
                run = executable.start(
                    batch_size, lambda: executable.feed.call_data(bound, {}, batch_size))
                outputs = run.result()
            except Exception as error:  # noqa: BLE001 (handed to the eager loop, see the caller)
                raise _RunFailed(error) from error
            LIVE_PIPELINES.note_run(variant)
            observed = stream.observe(outputs[definition.num_outputs:])
            if observed == guessed:
                break
            stream.settle(guessed, observed)
            if run_count == _MAX_RUNS:  # more runs would cost more than the eager loop
                self.run_count += run_count
                site = definition.random_sites[stream.last_settled]
                raise _EagerCall(self._retire(variant.key, _eager_loop(
                    f"did not find in {run_count} pipeline runs which samples call random op "
                    f"`ndd.{_dali.op_path(site.op_class)}` (a branch condition on random values "
                    "through pipeline ops, which cannot be evaluated before the run; each run "
                    "settles at least one more sample)", site.loc)))
        stream.commit()
        self.last_run_count = run_count
        self.run_count += run_count
        return outputs[:definition.num_outputs]

    def _after_failed_run(self, key: tuple, args: tuple, failure: _RunFailed) -> Any:
        """A run failed (its pipeline is unusable after that): the call runs as the eager loop,
        which raises the error where it is the function's own. Where the loop succeeds, the
        run failed on values fed for a wrong guess of the paths (stand-ins for random ops the
        guess skipped, or whose per-sample arguments were not known yet): the function runs
        as the eager loop from now on, and says so."""
        self._cache.drop(key)
        result = self.eager(*args)
        summary = _dali.pipeline_failure(_reported(failure.error)).summary()
        self._warn_eager(self._retire(key, _eager_loop(
            "ran its pipeline on values fed for a guess of its samples' paths (stand-ins for "
            "random ops not known before the run), and the run failed where the eager loop "
            f"does not ({summary})", user_location())))
        return result

    def _retire(self, key: tuple, verdict: Verdict) -> _Variant:
        """From now on `key`'s calls run as the eager per-sample loop, for `verdict`'s reason
        (its pipeline, if any, closed)."""
        self._cache.drop(key)
        variant = _Variant(key=key, verdict=verdict)
        self._cache.store(key, variant)
        return variant

    def eager(self, *args: Any, **kwargs: Any) -> Any:
        """The eager per-sample loop: the function on each sample, results gathered into
        Batches (what the compiled call gives, value for value)."""
        args = self._by_position(args, kwargs)
        batch_size = self._batch_size(args)
        results = []
        for index in range(batch_size):
            sample_args = [value.select(index) if isinstance(value, _dali.Batch) else value
                           for value in args]
            results.append(self._function(*sample_args))
        return gather(results, self.__qualname__)

    def _by_position(self, args: tuple, kwargs: dict) -> tuple:
        """The call's arguments by position (`f(batch, thr=3)`: `(batch, 3)`, defaults
        applied); eager's TypeError where they do not bind, ours where they bind only by
        keyword."""
        if not kwargs:
            return args
        args, kwargs = self._spelling.normalize(args, kwargs)
        if kwargs:
            raise TypeError(f"per-sample function `{self.__qualname__}`: keyword-only or "
                            f"**kwargs parameters are not supported ({', '.join(kwargs)}); "
                            "give them by position")
        return args

    def _warn_eager(self, variant: _Variant) -> None:
        loc = variant.eager_loc
        message = (f"ndd_trace: per-sample function `{self.__qualname__}` runs as the eager "
                   f"per-sample loop: it {variant.eager_reason}.")
        self.ledger.record(variant.verdict, warning=message, stacklevel=3,
                           key=(loc.filename, loc.lineno) if loc else ("no line",))


# names whose use makes or reseeds a generator (`ndd.random.RNG(seed=3)`, `set_seed(3)`)
_RESEEDS = frozenset({"RNG", "set_seed", "seed"})


def _check_python_runs_once(function: Callable) -> None:
    """EagerLoop where the function's Python does what eager does once per sample: an effect
    (`print`, a global list's `append`, Python's `random`; effects.find_effect) or an RNG made
    or reseeded, which the pipeline's one definition run would do once per call."""
    found = find_effect(function)
    if found is not None:
        raise EagerLoop(f"{found.reason}: its Python runs once per call when compiled, eager's "
                        "once per sample", found.loc)
    code = getattr(function, "__code__", None)
    names = names_read(code) if code is not None else set()
    if names & _RESEEDS:
        raise EagerLoop(f"makes or reseeds a generator (`{sorted(names & _RESEEDS)[0]}`), once "
                        "per call when compiled, eager's once per sample",
                        SourceLoc(code.co_filename, code.co_firstlineno, function.__name__))


def _reported(error: BaseException) -> BaseException:
    """DALI's own report of a failed run (kept on the error the runtime raises)."""
    cause = error.__cause__ if error.__cause__ is not None else error
    return getattr(cause, "dali_error", None) or getattr(error, "dali_error", None) or error
