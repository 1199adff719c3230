"""Runtime: builds a lowered graph into a DALI Pipeline, feeds it per call, wraps outputs lazily.

    executable = Executable(graph, lowered, draws, options)
    run = executable.run(bound_values, batch_size=64)     # feeds inputs, schedules, returns
    batch = run.batch(0)                                  # an ndd.Batch, evaluated when consumed

Outputs are real ndd.Batch / ndd.Tensor objects backed by a lazy result (the same protocol as
ndd's own `InvocationResult`), so `.torch()`, `np.asarray`, `.shape` or iteration fetch the
pipeline's outputs at the first use, with no copy. Errors met while building or running are
reported at the user's line that created the failing op.
"""

from __future__ import annotations

import collections
import dataclasses
import re
import threading
import time
from collections.abc import Callable
from typing import Any

from .. import _dali
from ..codegen.lower import Lowered
from ..core import logs
from ..core.errors import PipelineError, pipeline_error_type
from ..core.ir import Graph, Node, NodeKind
from ..core.source import SourceLoc, hide_own_frames, raise_at
from . import waits
from .interpret import interpret


_FROM_ARGUMENT, _DRAWN_PER_CALL, _OTHER = "argument", "drawn per call", "other"
# failed pipelines an Executable may leave set aside before its calls run eagerly instead
MAX_FAILED_PIPELINES = 3


@dataclasses.dataclass(frozen=True)
class Options:
    """Pipeline settings of a compiled function."""

    num_threads: int
    device_id: int | None
    prefetch_queue_depth: int


_GENERATED_LINE = re.compile(r'File "(<ndd_trace:[^>]*>)", line (\d+)')


def surfacing(error: BaseException, deferred: bool = False) -> BaseException:
    """The exception a run's error is raised as at the first use of a result, as eager ndd's: a
    new "An error happened during asynchronous execution" (`deferred`: "... deferred
    evaluation", as for a call in EvalMode.deferred) of the operator error's type, caused by it
    (its traceback at the user's line), with its notes; other errors are raised as they are."""
    if not isinstance(error, PipelineError):
        return error
    wrapper = type(error)(_dali.deferred_error_text(deferred), error.loc, error.op_name)
    wrapper.__cause__ = error
    for note in getattr(error, "__notes__", ()):
        wrapper.add_note(note)
    return wrapper


def _cone(node: Node) -> set[Node]:
    """The ops `node` reads, directly or not."""
    seen: dict[int, Node] = {}
    stack = [ref.node for ref in (*node.inputs, *node.arg_inputs.values())]
    while stack:
        other = stack.pop()
        if other.kind is NodeKind.OP and id(other) not in seen:
            seen[id(other)] = other
            stack.extend(ref.node for ref in (*other.inputs, *other.arg_inputs.values()))
    return set(seen.values())


class PendingRun:
    """One scheduled pipeline iteration whose outputs are fetched on first use."""

    def __init__(self, executable: Executable, batch_size: int):
        self._executable = executable
        self.batch_size = batch_size
        self.outputs: tuple | None = None
        self.error: BaseException | None = None
        self.replay: Any = None  # () -> the exception eager ndd raises on this run's data
        self.data: list | None = None  # what it was fed (to run it again, see `lost`)
        # an earlier run of the same pipeline failed while this one was scheduled: the pipeline
        # is gone, and this run is run again from its data when its outputs are asked for (an
        # eager call fails alone; the next ones give their own results)
        self.lost = False
        self.failed: Node | None = None  # the op whose failure `error` is, where DALI names it
        self.deferred = _dali.eval_mode_is_deferred()  # the EvalMode eager's error text names
        self.as_is = False  # `error` raised as it is (a reader's: eager raises it at once)
        # the recorded op calls the run stands for, in the graph's op order (a transparent-mode
        # region's calls this time): its errors name their lines; None: the graph's own
        self.calls: list[Node] | None = None
        self.fetched: tuple | None = None  # (seconds waited, when, thread) once fetched

    def result(self) -> tuple:
        """The run's outputs; its error (the operator's own, as eager raises it at the call)
        raised as eager raises it at the first use of a result."""
        if self.outputs is None and self.error is None:
            started = time.perf_counter()
            self._executable.fetch(self)
            waits.note_fetched(self, started)  # the consumer's wait, for the loader verdict
        if self.error is not None:
            raise self.error if self.as_is else surfacing(self.error, self.deferred)
        return self.outputs  # type: ignore[return-value]


class LazyResult:
    """ndd's InvocationResult protocol for a value computed later: a Batch/Tensor built on it
    (`ndd.Batch(invocation_result=...)`) evaluates it on first use. `_data()` returns the
    TensorList; subclasses say where it comes from."""

    def __init__(self, is_batch: bool, device: Any):
        self.is_batch = is_batch
        self.device = device

    def _data(self) -> Any:
        raise NotImplementedError

    def _batch_size(self) -> int:
        raise NotImplementedError

    def value(self, ctx: Any = None) -> Any:
        data = self._data()
        return data if self.is_batch else data[0]

    @property
    def batch_size(self) -> int | None:
        return self._batch_size() if self.is_batch else None

    @property
    def shape(self) -> Any:
        value = self.value()
        return value.shape() if self.is_batch else tuple(value.shape())

    @property
    def ndim(self) -> int:
        value = self.value()
        return value.ndim() if self.is_batch else len(value.shape())

    @property
    def dtype(self) -> Any:
        return _dali.DType.from_type_id(self.value().dtype)

    @property
    def layout(self) -> str | None:
        return self.value().layout() or None


class LazyOutput(LazyResult):
    """One output of a scheduled pipeline run."""

    def __init__(self, run: PendingRun, index: int, is_batch: bool, device: Any):
        self.is_batch = is_batch  # (LazyResult's fields, set here: one per call's output)
        self.device = device
        self._run = run
        self._index = index

    def _data(self) -> Any:
        return self._run.result()[self._index]

    def _batch_size(self) -> int:
        return self._run.batch_size

    @property
    def invocation(self) -> Any:
        return self._run

    @property
    def index(self) -> int:
        return self._index


class Executable:
    """One cache entry's pipeline: built lazily, rebuilt for a larger batch or after a failure."""

    def __init__(self, graph: Graph, lowered: Lowered, draws: list, options: Options,
                 rng_objects: dict[int, Any],
                 before_build: Callable[[Any, int], None] | None = None):
        self.graph = graph
        self.lowered = lowered
        self.draws = draws
        self.options = options
        self.rng_objects = rng_objects
        self.pipeline: Any = None
        self.max_batch_size = 0
        self.builds = 0
        self._pending: list[PendingRun] = []
        self._lock = threading.RLock()
        self._constants: dict[tuple, Any] = {}
        self.cache_constants = True  # off where each run brings new constant nodes
        # Fed with no_copy: DALI reads the buffers in place until the iteration's outputs are
        # consumed and `prefetch_queue_depth` more iterations have run; keep them alive so long.
        self._fed: collections.deque = collections.deque(
            maxlen=2 * options.prefetch_queue_depth + 2)
        # per call, in lowering order: (external source name, how its data is found)
        self._names = list(lowered.feed_names)
        # per external source, in lowering order: what a call feeds it, found without
        # re-reading the node (an argument's path, a state drawn per call, or anything else)
        self._sources = [self._source_kind(node) for node in lowered.external_sources]
        self._devices: dict[int, Any] = {}  # output index -> ndd Device (cached per entry)
        # called with the pipeline and its batch size before it is built (a reader stream moves
        # its reader's operator in); such a pipeline's runs are not run again after a failure
        self.before_build = before_build
        self._fed_as_they_are: list[tuple[Node, tuple]] | None = None  # see ops_run_at_call
        self._op_positions: dict[int, int] | None = None  # id(op node) -> its position
        self.ahead = 0  # calls served by a run launched ahead (readahead.run_call)
        self.run_s = 0.0  # seconds in DALI's Run (scheduling) so far, for step breakdowns
        self.failed_pipelines = 0  # pipelines whose run failed (set aside: see _park)
        # an op that crashes the process in a pipeline on a sample with no elements: each
        # call's data is checked for one (feeds_empty_sample), and such calls run eagerly
        self.empty_sample_unsafe = any(
            node.kind is NodeKind.OP and _dali.crashes_on_empty_samples(node.schema)
            for node in graph.nodes)

    # -- errors --------------------------------------------------------------------------------

    def _node_for_error(self, error: BaseException) -> Node | None:
        match = None
        for match in _GENERATED_LINE.finditer(str(error)):
            if match.group(1) == self.lowered.filename:
                node = self.lowered.line_map.get(int(match.group(2)))
                if node is not None:
                    return node
        return None

    def _eager_error(self, leaves: dict, batch_size: int) -> BaseException | None:
        """What eager ndd raises for a failed run: its graph run op by op on the same data (the
        run's batch size), each call synchronous (a pipeline reports every failure as a
        RuntimeError; eager ndd raises the operator's own type, a ValueError for a layout it
        rejects)."""
        try:
            with _dali.synchronous():
                for value in interpret(self.graph, leaves, batch_size).values():
                    value.evaluate()
        except Exception as error:  # noqa: BLE001 (returned as the run's error)
            return error
        return None

    def _leaves_of(self, bound: dict, states: dict) -> dict:
        leaves: dict = {}
        for node in self.graph.nodes:
            if node.kind is NodeKind.RANDOM_STATE:
                drawn = isinstance(node.payload, tuple) and node.payload[0] == "drawn"
                leaves[id(node)] = node.payload[1] if drawn else states.get(id(node))
            elif node.kind is NodeKind.CONSTANT:
                leaves[id(node)] = node.payload
            elif node.kind is NodeKind.INPUT:
                leaves[id(node)] = bound[node.payload]
        return leaves

    def _call_of(self, node: Node | None, calls: list[Node] | None) -> Node | None:
        """The recorded call `node` (an op of the graph) stands for in a run of `calls`."""
        if node is None or calls is None:
            return node
        if self._op_positions is None:
            self._op_positions = {id(op): position for position, op in
                                  enumerate(self.graph.nodes_of(NodeKind.OP))}
        position = self._op_positions.get(id(node))
        return calls[position] if position is not None and position < len(calls) else node

    def _pipeline_error(self, error: BaseException, stage: str,
                        eager: BaseException | None = None,
                        calls: list[Node] | None = None) -> PipelineError:
        """The operator's error as eager ndd raises it at the call: eager's type and text (from
        the eager re-run `eager`, else the operator's message in DALI's report, a RuntimeError),
        its traceback at the user's line that made the call (of `calls`, where the run stands
        for other calls than the graph's own); what ndd_trace adds (the op, the line, the
        pipeline) is a note. DALI's own report stays on it as `dali_error`."""
        node = self._call_of(self._node_for_error(error), calls)
        loc: SourceLoc | None = node.loc if node is not None else None
        failure = _dali.pipeline_failure(error)
        name = f"ndd.{node.name}" if node is not None else failure.ndd_name
        kind = type(eager) if eager is not None else RuntimeError
        wrapped = pipeline_error_type(kind)(str(eager) if eager is not None else failure.message,
                                            loc, name)
        wrapped.dali_error = error
        what = f"`{name}`" if name else "an operator"
        where = f" (created at {loc})" if loc else ""
        wrapped.add_note(f"ndd_trace: raised by {what}{where} while {stage} pipeline "
                         f"{self.lowered.filename}")
        if loc is None:
            return wrapped
        try:
            raise_at(wrapped, loc)
        except PipelineError as raised:  # (it is `wrapped`, with its traceback at `loc`)
            wrapped = raised
        wrapped.__context__ = None  # the pipeline's report is `dali_error`, not a context
        hide_own_frames(wrapped)
        return wrapped

    # -- errors at the call --------------------------------------------------------------------
    #
    # Eager ndd runs an op call at once where an input or tensor argument wraps user data as it
    # is (`ndd.as_batch(arrays)`, `ndd.as_tensor(torch_tensor)`: DALI's `has_external_inputs`),
    # with the pending calls it reads; their run-time errors raise at that call, and the calls
    # after it never happen (nor draw random states). A compiled call given such data waits for
    # its run, so that such an error raises at the call too, with the generators where eager's
    # stand; any other failure stays for the first use of a result, as eagerly.

    def ops_run_at_call(self, bound: dict) -> list[Node]:
        """The ops eager ndd would run at the call, given these arguments (usually none)."""
        fed = self._fed_as_they_are
        if fed is None:
            fed = self._fed_as_they_are = self._ops_fed_as_they_are()
        if not fed:
            return []
        return [node for node, path in fed if _dali.wraps_user_data(bound.get(path))]

    def _ops_fed_as_they_are(self) -> list[tuple[Node, tuple]]:
        """(op, argument path) where the op reads a call argument without converting it (same
        device, batch or sample as the call, no cast): what eager hands the op as it is."""
        fed = []
        for node in self.graph.nodes_of(NodeKind.OP):
            for index, ref in enumerate(node.inputs):
                leaf = ref.node
                if leaf.kind is NodeKind.INPUT and leaf.is_batch == node.is_batch and \
                        leaf.meta[ref.index].device == node.input_devices[index]:
                    fed.append((node, leaf.payload))
            for key, ref in node.arg_inputs.items():
                leaf = ref.node
                if leaf.kind is NodeKind.INPUT and key not in node.arg_casts and \
                        leaf.is_batch == node.is_batch and leaf.meta[ref.index].device == "cpu":
                    fed.append((node, leaf.payload))
        return fed

    def rng_snapshots(self, bound: dict) -> list[tuple[Any, Any]]:
        """The generators this call draws from, as they are before it draws."""
        seen: dict[int, tuple[Any, Any]] = {}
        for slot, _ in self.draws:
            rng = self.rng_for(slot, bound)
            if id(rng) not in seen:
                seen[id(rng)] = (rng, _dali.rng_snapshot(rng))
        return list(seen.values())

    def raise_at_call(self, run: PendingRun, at_call: list[Node], bound: dict,
                      snapshots: list[tuple[Any, Any]]) -> None:
        """Wait for `run`; if an op of `at_call` failed (or an op it reads), raise as eager
        does at the call: the op's own error (an op it reads: eager's error for a result used),
        after putting back the draws of the random ops called after it."""
        try:
            run.result()
            return
        except Exception:  # noqa: BLE001 (kept in the run, for the first use of a result)
            pass
        failed = run.failed
        if failed is None or run.error is None:
            return
        first = next((node for node in sorted(at_call, key=lambda n: n.index)
                      if node is failed or failed in _cone(node)), None)
        if first is None:
            return
        for rng, snapshot in snapshots:
            _dali.rng_restore(rng, snapshot)
        for slot, state in self.draws:  # eager called the ops before `first`, and drew
            if state.index < first.index:
                _dali.draw_state(self.rng_for(slot, bound))
        raise run.error if failed is first else surfacing(run.error, run.deferred)

    # -- building ------------------------------------------------------------------------------

    def _build(self, batch_size: int) -> None:
        started = time.perf_counter()
        self.pipeline = None
        options = self.options
        # the generated @pipeline_def itself (what `explain` shows is what runs)
        pipe = self.lowered.function(**_dali.pipeline_options(
            batch_size, options.num_threads, options.device_id, options.prefetch_queue_depth))
        if self.before_build is not None:
            self.before_build(pipe, batch_size)
        pipe.build()
        self.pipeline = pipe
        self.max_batch_size = batch_size
        self.builds += 1
        built = (time.perf_counter() - started) * 1000
        logs.builds.info("built %s for batch size %d in %.1f ms", self.lowered.filename,
                         batch_size, built, extra={"ndd_trace_ms": {"build": built}})

    def ensure_built(self, batch_size: int) -> None:
        """Build for `batch_size` (a smaller batch later reuses it; a larger one rebuilds)."""
        if self.pipeline is None or batch_size > self.max_batch_size:
            self._drain()
            self._build(max(batch_size, self.max_batch_size))
        elif batch_size != self.max_batch_size and not self._names:
            # nothing is fed (`ndd.zeros(batch_size=x.batch_size)`): the pipeline runs its
            # maximum batch size, so it is built for this one
            self._drain()
            self._build(batch_size)

    # -- feeding -------------------------------------------------------------------------------

    def rng_for(self, slot: tuple, bound: dict) -> Any:
        kind = slot[0]
        if kind == "default":
            return _dali.default_rng()
        if kind == "arg":
            return bound[slot[1]]
        return self.rng_objects[slot[1]]

    def _data_for(self, node: Node, bound: dict, states: dict[int, Any], batch_size: int) -> Any:
        if node.kind is NodeKind.RANDOM_STATE:
            if isinstance(node.payload, tuple) and node.payload[0] == "drawn":
                return _dali.broadcast_state(node.payload[1], batch_size)
            return _dali.broadcast_state(states[id(node)], batch_size)
        if node.kind is NodeKind.INPUT:
            value = bound[node.payload]
        else:
            value = node.payload
        if isinstance(value, _dali.Batch):
            return _dali.storage_of(value)
        key: tuple = (id(node), batch_size)
        cache = self.cache_constants and node.kind is NodeKind.CONSTANT
        if not cache and type(value) in (int, float, bool):
            # a Python scalar (a fresh constant node per run in transparent mode): the same
            # value gives the same data; repr tells -0.0 from 0.0 and keeps nan equal to nan
            key, cache = (type(value), repr(value), batch_size), True
        cached = self._constants.get(key) if cache else None
        if cached is not None:
            return cached
        data = _dali.storage_of(_dali.to_batch(value, batch_size))
        if cache:
            if len(self._constants) >= 256:  # scalars that change every run: keep it bounded
                self._constants.clear()
            self._constants[key] = data
        return data

    @staticmethod
    def _source_kind(node: Node) -> tuple:
        if node.kind is NodeKind.INPUT:
            return _FROM_ARGUMENT, node.payload, node
        if node.kind is NodeKind.RANDOM_STATE and not (
                isinstance(node.payload, tuple) and node.payload[0] == "drawn"):
            return _DRAWN_PER_CALL, id(node), node
        return _OTHER, None, node

    def draw_states(self, bound: dict) -> dict[int, Any]:
        """Draw every random op's state, in eager call order, from the caller's generators."""
        states: dict[int, Any] = {}
        for slot, node in self.draws:
            states[id(node)] = _dali.draw_state(self.rng_for(slot, bound))
        return states

    def call_data(self, bound: dict, states: dict[int, Any], batch_size: int) -> list:
        """What one call feeds, one item per external source in lowering order."""
        data = []
        batch_type = _dali.Batch
        for kind, where, node in self._sources:
            if kind is _FROM_ARGUMENT:
                value = bound[where]
                if type(value) is batch_type:
                    data.append(_dali.storage_of(value))
                    continue
            elif kind is _DRAWN_PER_CALL:
                data.append(_dali.broadcast_state(states[where], batch_size))
                continue
            data.append(self._data_for(node, bound, states, batch_size))
        return data

    def feeds_empty_sample(self, bound: dict | None = None, leaves: list | None = None) -> bool:
        """Whether a call with these arguments (or a region with these fed leaves) would feed
        a sample with no elements to a pipeline that crashes on one (empty_sample_unsafe)."""
        if not self.empty_sample_unsafe:
            return False
        if leaves is not None:
            return any(leaf.kind is NodeKind.CONSTANT and _dali.has_empty_sample(leaf.payload)
                       for leaf in leaves)
        return any(kind is _FROM_ARGUMENT and _dali.has_empty_sample(bound[where])
                   for kind, where, _ in self._sources)

    @property
    def empty_sample_reason(self) -> str:
        """Why a call that feeds a sample with no elements runs eagerly, naming the op."""
        node = next(node for node in self.graph.nodes if node.kind is NodeKind.OP
                    and _dali.crashes_on_empty_samples(node.schema))
        return (f"a sample with no elements (a zero-size dimension) is fed to ndd.{node.name} "
                f"(called at {node.loc or '?'}), which crashes a DALI pipeline on one; eager ndd "
                "runs it")

    def output_device(self, index: int) -> Any:
        """The ndd Device of output `index` (one object per entry, made once)."""
        device = self._devices.get(index)
        if device is None:
            meta = self.graph.outputs[index].node.meta[self.graph.outputs[index].index]
            device = self._devices[index] = _dali.device(
                meta.device, self.options.device_id if meta.device == "gpu" else None)
        return device

    def run(self, bound: dict, batch_size: int) -> PendingRun | None:
        """Draw, feed and schedule one iteration; outputs are fetched when first used."""
        if not self.graph.outputs:
            with self._lock:
                self.draw_states(bound)  # nothing to run, but the generators advance as eagerly
            return None

        drawn: dict = {}

        def data() -> list:
            # drawn after the build: a failed one draws nothing
            states = drawn["states"] = self.draw_states(bound)
            return self.call_data(bound, states, batch_size)

        run = self.start(batch_size, data)
        run.replay = lambda: self.eager_error_of(bound, drawn["states"], batch_size)
        return run

    def eager_error_of(self, bound: dict, states: dict, batch_size: int) -> BaseException | None:
        """What eager ndd raises for a call with these arguments and random states (a failed
        run's replay)."""
        return self._eager_error(self._leaves_of(bound, states), batch_size)

    def run_leaves(self, leaves: list[Node], batch_size: int,
                   calls: list[Node] | None = None) -> PendingRun:
        """Run with the data of `leaves` (a structurally equal graph's leaves, in order), for
        the op calls `calls` (in order; their lines are the ones errors name)."""
        run = self.start(batch_size,
                          lambda: [self.leaf_data(leaf, batch_size) for leaf in leaves])
        run.calls = calls

        def replay() -> BaseException | None:
            values = self._leaves_of({}, {})
            for node, leaf in zip(self.lowered.external_sources, leaves):
                values[id(node)] = leaf.payload[1] if leaf.kind is NodeKind.RANDOM_STATE \
                    else leaf.payload
            return self._eager_error(values, batch_size)

        run.replay = replay
        return run

    def start(self, batch_size: int, data: Any) -> PendingRun:
        """Build if needed, then feed `data()` and schedule one iteration."""
        with self._lock:
            # earlier runs first: one that failed (kept for whoever consumes it) drops the
            # pipeline, which is then rebuilt for this run
            self._drain()
            try:
                if self.pipeline is None and self.retired is not None:
                    raise RuntimeError(f"ndd_trace: not rebuilt: {self.retired}")
                self.ensure_built(batch_size)
            except Exception as error:
                self.pipeline = None
                building_error = self._pipeline_error(error, "building")
            else:
                building_error = None
            if building_error is not None:
                raise building_error  # (outside the handler: DALI's report is its dali_error)
            run = PendingRun(self, batch_size)
            try:
                run.data = data()
                self._feed(run.data)
                started = time.perf_counter()
                _dali.schedule_one(self.pipeline)
                self.run_s += time.perf_counter() - started
            except Exception as error:
                self.pipeline = None
                feeding_error = self._pipeline_error(error, "feeding")
            else:
                feeding_error = None
            if feeding_error is not None:
                raise feeding_error
            self._pending.append(run)
            return run

    def launch(self, data: list, batch_size: int) -> PendingRun | None:
        """Feed `data` (one item per fed leaf, in lowering order) and schedule one iteration
        ahead of the previous ones, without waiting for them; None where the pipeline is not
        built for this batch, its queue is full, or it refuses the data."""
        with self._lock:
            if self.pipeline is None or batch_size > self.max_batch_size or \
                    len(self._pending) >= self.options.prefetch_queue_depth or \
                    (batch_size != self.max_batch_size and not self._names) or \
                    (self.empty_sample_unsafe and any(map(_dali.has_empty_sample, data))):
                return None
            try:
                self._feed(data)
                _dali.schedule_one(self.pipeline)
            except Exception:
                self._pending.clear()
                self.pipeline = None  # rebuilt by the next run, which reports any real error
                return None
            run = PendingRun(self, batch_size)
            run.data = data
            self._pending.append(run)
            return run

    def leaf_data(self, leaf: Node, batch_size: int) -> Any:
        """What a fed leaf (constant or drawn random state) gives the pipeline."""
        return self._data_for(leaf, {}, {}, batch_size)

    def _feed(self, data: list) -> None:
        """Feed one iteration's external sources (in lowering order), keeping the data alive."""
        pipeline = self.pipeline
        for name, item in zip(self._names, data):
            _dali.feed(pipeline, name, item)
        self._fed.append(data)

    def fetch(self, run: PendingRun) -> None:
        with self._lock:
            if run.lost:
                self._run_again(run)
                return
            while run.outputs is None and run.error is None and self._pending:
                self._fetch_oldest()
            if run.outputs is None and run.error is None:
                run.error = RuntimeError("ndd_trace: this result's pipeline run was discarded")

    def _fetch_oldest(self) -> None:
        oldest = self._pending.pop(0)
        try:
            oldest.outputs = _dali.pipeline_outputs(self.pipeline)
        except Exception as error:
            self._park(error)  # a failed pipeline is rebuilt on the next call
            eager = oldest.replay() if oldest.replay is not None else None
            oldest.error = self._pipeline_error(error, "running", eager, oldest.calls)
            oldest.failed = self._node_for_error(error)
            oldest.as_is = _dali.pipeline_failure(error).from_reader
            for other in self._pending:
                if self.before_build is None and other.data is not None:
                    other.lost = True  # run again when asked for: it did not fail itself
                else:
                    other.error, other.failed, other.as_is = \
                        oldest.error, oldest.failed, oldest.as_is
            self._pending.clear()

    def _run_again(self, run: PendingRun) -> None:
        """Run a lost run (see `PendingRun.lost`) on its own, from the data it was fed."""
        run.lost = False
        self._drain()
        try:
            self.ensure_built(run.batch_size)
            self._feed(run.data)
            _dali.schedule_one(self.pipeline)
        except Exception as error:  # noqa: BLE001 (the run's error, raised where it is used)
            self._park(error)
            run.error = self._pipeline_error(error, "running")
            return
        self._pending.append(run)
        while run.outputs is None and run.error is None and self._pending:
            self._fetch_oldest()

    def _park(self, error: BaseException) -> None:
        """Drop the pipeline after a failed run, set aside for good where freeing it can hang
        the process (_dali.park_failed_pipeline)."""
        node = self._node_for_error(error)
        if self.pipeline is not None and not (
                node is not None and _dali.frees_after_failure(node.schema)):
            _dali.park_failed_pipeline(self.pipeline)
            self.failed_pipelines += 1
        self.pipeline = None

    @property
    def retired(self) -> str | None:
        """Why this variant no longer builds pipelines (then it runs eagerly), or None."""
        if self.failed_pipelines < MAX_FAILED_PIPELINES:
            return None
        return (f"its pipeline failed {self.failed_pipelines} times; DALI cannot free a "
                "pipeline that failed part-way through a batch (each one is kept until exit)")

    def _drain(self) -> None:
        while self._pending:
            self._fetch_oldest()

    def release(self) -> bool:
        """Free the pipeline once the runs in flight are done (built again if run again);
        whether there was one."""
        with self._lock:
            self._drain()
            had = self.pipeline is not None
            self.pipeline = None
            self._fed.clear()  # what DALI read in place: nothing reads it any more
            return had

    def close(self) -> None:
        with self._lock:
            self._pending.clear()
            self.pipeline = None
