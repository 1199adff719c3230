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

from . import _dali, logs, waits
from .errors import PipelineError, pipeline_error_type
from .interpret import interpret
from .ir import Graph, Node, NodeKind
from .lower import Lowered
from .source import SourceLoc, raise_at


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


def _dali_message(error: BaseException) -> str:
    """The part of a DALI pipeline error that says what went wrong (not where: we say that)."""
    text = str(error).strip()
    if "encountered:" in text:
        text = text.split("encountered:", 1)[1]
    lines = [line.strip() for line in text.splitlines()
             if line.strip() and "pipeline object is no longer valid" not in line
             and not line.startswith("Critical error in pipeline")]
    return " ".join(lines[:3]) or repr(error)


def _operator_error(error: BaseException) -> BaseException | None:
    """The operator's own error inside a pipeline's report, as eager ndd raises it for the
    same call (same text, without the pipeline's framing and C++ context); None if the report
    holds none."""
    text = str(error)
    if "encountered:" not in text:
        return None
    text = text.split("encountered:", 1)[1].split("\nC++ context:", 1)[0]
    text = text.split("\nCurrent pipeline object is no longer valid.", 1)[0].strip()
    return RuntimeError(text) if text else None


class _PendingRun:
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
        self.fetched: tuple | None = None  # (seconds waited, when, thread) once fetched

    def result(self) -> tuple:
        if self.outputs is None and self.error is None:
            started = time.perf_counter()
            self._executable.fetch(self)
            waits.note_fetched(self, started)  # the consumer's wait, for the loader verdict
        if self.error is not None:
            raise self.error
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

    def __init__(self, run: _PendingRun, index: int, is_batch: bool, device: Any):
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
        self._pending: list[_PendingRun] = []
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

    def _eager_error(self, leaves: dict) -> BaseException | None:
        """What eager ndd raises for a failed run: its graph run op by op on the same data,
        each call synchronous (a pipeline reports every failure as a RuntimeError; eager ndd
        raises the operator's own type, a ValueError for a layout it rejects)."""
        try:
            with _dali.synchronous():
                for value in interpret(self.graph, leaves).values():
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

    def _pipeline_error(self, error: BaseException, stage: str,
                        eager: BaseException | None = None) -> PipelineError:
        node = self._node_for_error(error)
        loc: SourceLoc | None = node.loc if node is not None else None
        name = f"ndd.{node.name}" if node is not None else None
        message = _dali_message(error)
        cause = eager if eager is not None else _operator_error(error)
        kind = type(cause) if cause is not None else RuntimeError
        wrapped = pipeline_error_type(kind)(
            f"{message} (while {stage} the compiled pipeline)", loc, name)
        if cause is None:
            wrapped.__cause__ = error
            return wrapped
        # as eager ndd: the cause is the operator's own error, its traceback at the user's call
        cause.__cause__ = error
        cause.__traceback__ = None
        try:
            raise_at(cause, loc)
        except BaseException as raised:  # noqa: BLE001 (it is `cause`, with its traceback)
            wrapped.__cause__ = raised
        return wrapped

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
        logs.builds.info("built %s for batch size %d in %.1f ms", self.lowered.filename,
                         batch_size, (time.perf_counter() - started) * 1000)

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

    def _resolve_rng(self, slot: tuple, bound: dict) -> Any:
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
            states[id(node)] = _dali.draw_state(self._resolve_rng(slot, bound))
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

    def run(self, bound: dict, batch_size: int) -> _PendingRun | None:
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

        run = self._start(batch_size, data)
        run.replay = lambda: self._eager_error(self._leaves_of(bound, drawn["states"]))
        return run

    def run_leaves(self, leaves: list[Node], batch_size: int) -> _PendingRun:
        """Run with the data of `leaves` (a structurally equal graph's leaves, in order)."""
        run = self._start(batch_size,
                          lambda: [self.leaf_data(leaf, batch_size) for leaf in leaves])

        def replay() -> BaseException | None:
            values = self._leaves_of({}, {})
            for node, leaf in zip(self.lowered.external_sources, leaves):
                values[id(node)] = leaf.payload[1] if leaf.kind is NodeKind.RANDOM_STATE \
                    else leaf.payload
            return self._eager_error(values)

        run.replay = replay
        return run

    def _start(self, batch_size: int, data: Any) -> _PendingRun:
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
                raise self._pipeline_error(error, "building") from error
            run = _PendingRun(self, batch_size)
            try:
                run.data = data()
                self._feed(run.data)
                started = time.perf_counter()
                _dali.schedule_one(self.pipeline)
                self.run_s += time.perf_counter() - started
            except Exception as error:
                self.pipeline = None
                wrapped = self._pipeline_error(error, "feeding")
                raise_at(wrapped, wrapped.loc)
            self._pending.append(run)
            return run

    def launch(self, data: list, batch_size: int) -> _PendingRun | None:
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
            run = _PendingRun(self, batch_size)
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

    def fetch(self, run: _PendingRun) -> None:
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
            wrapped = self._pipeline_error(error, "running", eager)
            try:
                raise_at(wrapped, wrapped.loc)
            except PipelineError as raised:
                oldest.error = raised
            for other in self._pending:
                if self.before_build is None and other.data is not None:
                    other.lost = True  # run again when asked for: it did not fail itself
                else:
                    other.error = oldest.error
            self._pending.clear()

    def _run_again(self, run: _PendingRun) -> None:
        """Run a lost run (see `_PendingRun.lost`) on its own, from the data it was fed."""
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
