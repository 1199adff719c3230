"""The trace stage of a compiled function: one call traced into a cache entry.

    stage = TraceStage(function, "preprocess", spelling, notices, options, optimize=False)
    entry = stage.trace(cache, args, kwargs)       # cache.py's Entry, or None: tracing raised

Tracing draws from no RNG (every state it moves is put back), records a graph break as an
entry that runs in transparent mode (or raises GraphBreakError under fullgraph=True), and
otherwise runs the passes, lowers the graph and makes the Executable. Nothing is stored: the
cache decides that.
"""

from __future__ import annotations

import inspect
import random
import time
from collections.abc import Callable
from typing import Any

from .. import _dali
from ..core import logs, passes, process_state
from ..core.ledger import Ledger, Runs, Verdict
from ..core.errors import GraphBreakError, GraphBreakSignal
from ..core.ir import NodeKind
from ..core.source import SourceLoc, innermost_user_loc, raise_at, user_location
from ..core.spelling import CallSpelling
from ..ahead.runahead import runs_ahead
from ..units.build import compile_graph
from ..execution.runtime import Options
from ..tracing.effects import find_effect
from ..tracing.trace import GraphBreakRecord, Tracer
from ..units.cache import UnitCache
from ..units.unit import Entry, batch_sizes, walk_data

CHECKED_LOOP_TEXT = ("runs each step's Python as written, in transparent mode: the reader is read "
                     "ahead, and a step's ndd calls run ahead on its batches and are used when "
                     "they match what the step calls, with the same results")
CAPTURE_LOOP_TEXT = ("runs as written: DALI's capture mode records its loop body and runs it as "
                     "a pipeline, as it does without ndd_trace (iterate reader.next_epoch(...) "
                     "to have ndd_trace compile the body)")


class Notices:
    """What a compiled function tells its user: warnings at the user's line (each once), and
    the text saying how a call that is not compiled whole runs instead."""

    def __init__(self, name: str, fallback: str, is_generator: bool):
        self._name = name
        self.fallback = fallback  # "lazy" or "eager": the one place it is kept
        self._is_generator = is_generator
        self.ledger = Ledger(name)  # every call not run as compiled, counted and said
        self.eager_not_made = 0  # calls run eagerly, their variant not made yet (not_made_yet)

    def warn(self, message: str, loc: SourceLoc | None) -> None:
        self.ledger.warn(message, loc, stacklevel=3)

    def warn_once(self, message: str, loc: SourceLoc | None) -> None:
        self.ledger.warn_once(message, loc, stacklevel=3)

    def capture_mode_call(self) -> None:
        """A call made in a loop DALI's capture mode records: its ndd calls run as written, for
        capture mode to record and run as a pipeline (as without ndd_trace); said once a site."""
        self.ledger.record(
            Verdict.eager_call("called in DALI's capture mode, whose pipeline runs its calls",
                               user_location(), Runs.CAPTURE_MODE),
            warning=f"ndd_trace: `{self._name}` is called in a loop DALI's capture mode "
                    "records (source.captured(...) or next_epoch(capture=True)): its ndd calls "
                    "run as written, and capture mode runs them as a pipeline", stacklevel=2)

    def runs(self) -> Runs:
        """How a call not compiled whole runs (fallback=)."""
        return Runs.TRANSPARENT if self.fallback == "lazy" else Runs.EAGER

    def past_limit(self, limit: int, reason: str | None) -> None:
        """Past cache_limit: recorded and logged each time, warned once."""
        self.ledger.record(
            Verdict.eager_variant(f"past cache_limit ({limit}): {reason}", user_location(),
                                  self.runs()),
            log=f"past cache_limit ({limit}), this variant is not compiled: {reason}",
            warning=(f"`{self._name}` was traced {limit} times (cache_limit); "
                     f"last change: {reason}. New variants are not compiled: "
                     f"each {self.fallback_text()}. Make the changing value an ndd Batch/Tensor "
                     "argument, or raise cache_limit."), key=("cache_limit",), stacklevel=2)

    def not_made_yet(self, cache: UnitCache, function: Callable, args: tuple,
                       kwargs: dict) -> Any:
        """A call whose variant is not compiled yet, past the first few (units/cache.FREE_UNITS):
        it runs eagerly, its variant compiled once its calls have taken about as long as
        compiling one does (units/cache.Sightings); recorded and logged each time, warned once
        cache_limit such calls ran (the function's variants do not repeat)."""
        limit, reason = cache.limit, cache.last_miss_reason
        self.eager_not_made += 1
        warning = None
        if self.eager_not_made == limit:
            warning = (f"ndd_trace: `{self._name}` made {limit} calls whose variant was not "
                       f"compiled yet (last change: {reason}): such a call runs eagerly (plain "
                       "ndd, with the same results), and a variant is compiled once its calls "
                       "have taken about as long as compiling it would. Make the changing "
                       "value an ndd Batch/Tensor argument to compile one variant for all.")
        self.ledger.record(
            Verdict.eager_call(f"a variant not compiled yet: {reason}", user_location(),
                               Runs.EAGER),
            log=f"this call runs eagerly, its variant not compiled yet: {reason}",
            warning=warning, key=("not made yet",), stacklevel=2)
        return function(*args, **kwargs)

    def fallback_text(self) -> str:
        if self.fallback == "lazy" and self._is_generator:
            return ("runs as a plain loop instead, each step in transparent mode: its reader "
                    "reads ahead and its ndd calls run as cached pipeline regions, with the "
                    "same results")
        if self.fallback == "lazy":
            return ("runs in transparent mode instead: its ndd calls run as cached pipeline "
                    "regions (split where Python needs data), with the same results")
        return "runs eagerly (plain ndd, fallback=\"eager\"), with the same results"


class TraceStage:
    """Traces calls of one function into cache entries (see the module's docstring)."""

    def __init__(self, function: Callable, name: str, spelling: CallSpelling,
                 notices: Notices, options: Callable[[], Options], *, fullgraph: bool,
                 optimize: bool, runs: Runs = Runs.ONE_PIPELINE, threads_given: bool = False):
        self._function = function
        self._name = name
        self._spelling = spelling  # (its signature names a traced argument's input)
        self._notices = notices
        self._options = options
        self.fullgraph = fullgraph
        self.optimize = optimize
        self.threads_given = threads_given  # num_threads given to ndd.compile: not tuned
        self.runs = runs  # how its compiled entries run (COMPILED_LOOP: a loop body)
        self._failure_note: str | None = None
        self._trace_exception: BaseException | None = None

    def definition_loc(self) -> SourceLoc:
        code = self._function.__code__
        return SourceLoc(code.co_filename, code.co_firstlineno, code.co_name)

    # -- failures and breaks -------------------------------------------------------------------

    def take_failure(self) -> tuple[str | None, BaseException | None]:
        """The failed trace's note and exception, handed over once."""
        note, self._failure_note = self._failure_note, None
        error, self._trace_exception = self._trace_exception, None
        return note, error

    def failed_entry(self, key: tuple, error: BaseException | None) -> Entry:
        """The entry of a variant whose trace raised where eager did not: not compiled, and
        warned about at the user's line."""
        record = GraphBreakRecord(f"could not be traced ({type(error).__name__}: {error})",
                                  innermost_user_loc(error))
        logs.fallbacks.info("`%s`: %s", self._name, record)
        return self.break_entry(Entry(key=key), record)

    def break_entry(self, entry: Entry, record: GraphBreakRecord, runs: Runs | None = None
                    ) -> Entry:
        """`entry`, made one that runs as `runs` says (transparent mode by default) for the
        graph break `record`; under fullgraph=True, GraphBreakError at the break instead."""
        entry.breaks.append(record)
        entry.verdict = Verdict.graph_break(str(record), record.loc, runs or self._notices.runs())
        logs.breaks.info("`%s`: graph break at %s: %s", self._name, record.loc or "?",
                         record.reason)
        if self.fullgraph:
            error = GraphBreakError(record.reason, record.loc, self._name)
            error.filename, error.lineno = record.filename, record.lineno
            raise_at(error, record.loc)
        then = (CHECKED_LOOP_TEXT if runs is Runs.CHECKED_LOOP else CAPTURE_LOOP_TEXT
                if runs is Runs.CAPTURE_MODE else self._notices.fallback_text())
        self._notices.warn_once(f"ndd_trace: `{self._name}` cannot be compiled whole: "
                                f"{record.reason}. It {then}. See ndd_trace.explain().",
                                record.loc)
        return entry

    # -- tracing -------------------------------------------------------------------------------

    def _rng_objects(self, cache: UnitCache) -> list[Any]:
        found = []
        for _, name, namespace in cache.plan.globals_read:
            value = namespace.get(name)
            if isinstance(value, _dali.RNG):
                found.append(value)
        for _, cell in cache.plan.closure:
            try:
                if isinstance(cell.cell_contents, _dali.RNG):
                    found.append(cell.cell_contents)
            except ValueError:
                pass
        return found

    def _argument_name(self, path: tuple) -> str:
        if path[0] == "kwargs":
            return "_".join(str(p) for p in path[1:])
        parameters = self._spelling.signature.parameters
        params = list(parameters)
        index = path[1]
        base = params[index] if index < len(params) and \
            parameters[params[index]].kind != inspect.Parameter.VAR_POSITIONAL else f"arg{index}"
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

    def trace(self, cache: UnitCache, args: tuple, kwargs: dict,
              raise_errors: bool = False, key: tuple | None = None) -> Entry | None:
        """Trace one call into an entry (not stored; None: tracing raised, see take_failure).
        Draws nothing from any RNG. `key`: the call's key, made again only where the guards'
        plan changed (the helpers the function calls may have changed since the last trace)."""
        if cache.replan() or key is None:
            key = cache.key(args, kwargs)
        if self.runs is not Runs.COMPILED_LOOP:  # (a loop body was checked as a loop)
            found = find_effect(self._function, self._spelling.arguments(args, kwargs))
            if found is not None:  # before the trace: its Python runs once on this call too
                record = GraphBreakRecord(f"{found.reason}: {found.why}", found.loc)
                return self.break_entry(Entry(key=key), record)
        tracer = Tracer(self._function.__name__, self._options().device_id)
        sizes = batch_sizes(args, kwargs)
        batch_size, consistent = (max(sizes), len(sizes) == 1) if sizes else (None, True)
        tracer.batch_size = batch_size or 1
        if cache.plan is not None and cache.plan.reads_builtin("type"):
            tracer.batch_size_as_int = "calls type() (`type(x.batch_size)` is int, as eagerly)"
        # the default generator only if ndd has made it: making it here would draw its seed
        # from Python's `random` where eager does not (yet); one the trace makes is undone
        default = _dali.existing_default_rng()
        rngs: list[Any] = [default] if default is not None else []
        python_random = random.getstate() if default is None else None

        placeholders: dict[int, Any] = {}  # (one object given twice is one proxy: `a is b`)

        def visit(path: tuple, value: Any) -> Any:
            if isinstance(value, _dali.RNG):
                tracer.register_rng(value, ("arg", path))
                rngs.append(value)
                return value
            if id(value) not in placeholders:
                placeholders[id(value)] = tracer.placeholder(self._argument_name(path), path,
                                                             value)
            return placeholders[id(value)]

        traced_args = walk_data(args, ("args",), visit)
        traced_kwargs = walk_data(kwargs, ("kwargs",), visit)
        for rng in self._rng_objects(cache):
            tracer.allow_rng_object(rng)
            rngs.append(rng)
        before = [(rng, _dali.rng_snapshot(rng)) for rng in rngs]
        entry = Entry(key=key)
        process_state.graph_breaks_raised.breaks = swallowed = []
        try:
            with tracer.active():
                result = self._function(*traced_args, **traced_kwargs)
            given = {id(value): ("args", index) for index, value in enumerate(traced_args)}
            given.update((id(value), ("kwargs", name)) for name, value in traced_kwargs.items())
            tracer.set_outputs(result, _reachable_ids(self._function, args, kwargs), given)
            if swallowed:  # a bare `except:` in user code caught a graph break: still a break
                raise swallowed[0]
        except GraphBreakSignal as graph_break:
            self._restore(before, python_random)
            record = GraphBreakRecord(graph_break.reason, graph_break.loc)
            return self.break_entry(entry, record)
        except BaseException as error:
            self._restore(before, python_random)
            self._failure_note = tracer.failure_note
            self._trace_exception = error
            if raise_errors:
                raise
            return None
        finally:
            process_state.graph_breaks_raised.breaks = None
        if any(_dali.rng_snapshot(rng) != snapshot for rng, snapshot in before) or (
                python_random is not None and _dali.existing_default_rng() is not None):
            self._restore(before, python_random)
            record = GraphBreakRecord(
                "draws from or reseeds an RNG in Python (RNG(), set_seed, .state=); do that "
                "outside the compiled function", self.definition_loc())
            return self.break_entry(entry, record)
        has_batches = batch_size is not None or tracer.static_batch_sizes
        if tracer.sample_random_ops and has_batches:
            record = GraphBreakRecord(
                "calls a random op without batch_size (one value for the whole call) in a "
                "function that works on batches: a pipeline would draw per sample; pass "
                "batch_size=x.batch_size or draw it outside", tracer.sample_random_ops[0])
            return self.break_entry(entry, record)
        sizes = set(tracer.static_batch_sizes)
        if batch_size is not None:
            sizes.add(batch_size)
        if not consistent or len(sizes) > 1:
            sizes |= batch_sizes(args, kwargs)
            record = GraphBreakRecord(
                f"batches of different sizes meet in one call ({sorted(sizes)}); a pipeline "
                "runs one batch size per iteration", self.definition_loc())
            return self.break_entry(entry, record)
        if tracer.specialized_on_batch_size is not None and not cache.specialized_on_batch_size:
            cache.specialize_on_batch_size()
            entry.key = cache.key(args, kwargs)
        entry.static_batch_size = next(iter(tracer.static_batch_sizes), None)
        unused = _unused_at_call(tracer.graph)
        if unused is not None:  # (dead code in a pipeline: it would never run, nor raise)
            record = GraphBreakRecord(
                f"calls `ndd.{unused.name}` on data given to it and does not use its result: "
                "eager runs such a call at once (and raises its errors there)", unused.loc)
            return self.break_entry(entry, record)
        return self._finish(entry, tracer)

    def _finish(self, entry: Entry, tracer: Tracer) -> Entry:
        graph = tracer.graph
        traced_at = time.perf_counter()
        traced = graph.format()
        entry.num_ops = tracer.num_ops
        draws = [(node.payload, node) for node in graph.nodes_of(NodeKind.RANDOM_STATE)]
        passes.eliminate_common_subexpressions(graph)
        passes.eliminate_dead_code(graph)
        # optimize after the passes: a value's users are then all the users it has
        program = compile_graph(graph, self._options(), draws=draws,
                                rng_objects=tracer.rng_objects, optimize=self.optimize,
                                inline_constants=True, threads_given=self.threads_given,
                                runs_ahead=runs_ahead)
        entry.optimizations = program.optimizations
        for applied in entry.optimizations:
            logs.trace.info("`%s`: optimization applied at %s", self._name, applied)
        entry.graph = graph
        # what explain shows is what runs: the graph after the passes (and, where they changed
        # it, the graph as traced)
        entry.graph_text = graph.format()
        if traced != entry.graph_text:
            removed = ("common subexpressions and dead code were removed" if not
                       entry.optimizations else "the passes and optimizations")
            entry.graph_text += f"\n\nas traced, before {removed}:\n" + traced
        entry.output_tree = tracer.output_tree
        entry.lowered = program.lowered
        entry.verdict = Verdict.compiled(self.runs)
        # the times a cache of traces kept across processes could save (the build it cannot)
        times = {"trace": (traced_at - tracer.started) * 1000,
                 "code": (time.perf_counter() - traced_at) * 1000}
        logs.trace.info("`%s` traced: %d ndd calls -> %s (%d ops after passes); traced in %.1f ms,"
                        " passes and code in %.1f ms", self._name, entry.num_ops,
                        entry.lowered.filename, len(graph.nodes_of(NodeKind.OP)), times["trace"],
                        times["code"], extra={"ndd_trace_ms": times})
        entry.executable = program.executable
        return entry


def _reachable_ids(function: Any, args: tuple, kwargs: dict) -> frozenset[int]:
    """Ids of what a function can return without making it: its arguments, defaults, closure
    cells and the globals it names, and their attributes and items one level down (a
    returned `MEAN` or `CFG.mean` is eager's own object at every call)."""
    code = getattr(function, "__code__", None)
    roots: list[Any] = [*args, *kwargs.values(), *(getattr(function, "__defaults__", None) or ()),
                        *(getattr(function, "__kwdefaults__", None) or {}).values()]
    if code is not None:
        names = set(code.co_names)
        for constant in code.co_consts:  # (names read in comprehensions and lambdas)
            names.update(getattr(constant, "co_names", ()))
        spaces = getattr(function, "__globals__", {})
        roots += [spaces[name] for name in names if name in spaces]
        for cell in getattr(function, "__closure__", None) or ():
            try:
                roots.append(cell.cell_contents)
            except ValueError:  # an empty cell
                pass
    found = set()
    for root in roots:
        found.add(id(root))
        if isinstance(root, (list, tuple)):
            found.update(id(item) for item in root)
        elif isinstance(root, dict):
            found.update(id(item) for item in root.values())
        elif hasattr(root, "__dict__") and not isinstance(root, type):
            found.update(id(item) for item in vars(root).values())
    return frozenset(found)


def _unused_at_call(graph: Any) -> Any:
    """The first op no output needs whose input is an argument or a constant (user data:
    eager runs it at the call), and that is no repeat of a needed call (which raises where it
    raises), or None."""
    live = passes.live_nodes(graph)
    dead = [node for node in graph.nodes_of(NodeKind.OP) if id(node) not in live and any(
        ref.node.kind in (NodeKind.INPUT, NodeKind.CONSTANT) for ref in node.inputs)]
    if not dead:
        return None
    needed = {passes.call_key(node) for node in graph.nodes_of(NodeKind.OP) if id(node) in live}
    return next((node for node in dead if passes.call_key(node) not in needed), None)
