"""Transparent mode: unmodified ndd code is recorded lazily and runs as cached pipelines.

    with ndd_trace.enabled():              # or ndd_trace.enable() / python -m ndd_trace script.py
        images = ndd.decoders.image(jpegs)             # recorded, nothing runs
        images = ndd.resize(images, size=[64, 64]) * 2
        tensor = images.torch()                        # the pending region runs as one pipeline
    print(ndd_trace.report())

Each ndd call returns an ndd.Batch/Tensor whose data is deferred (proxies.py). Consuming one
(`.torch()`, `np.asarray`, `.shape`, iteration, printing) runs the pending calls it depends on
as one DALI pipeline, looked up by the region's structure (same ops, same static arguments, same
input kinds), so a loop body builds its pipeline once and reuses it every iteration. Random ops draw their state when they are
called, exactly as eagerly, so values and generator state match a plain run. A call that cannot
be recorded (a synchronous EvalMode, an argument DALI rejects, a stateful operator) runs eagerly
on the spot and is counted with its reason and `file:line`.
"""

from __future__ import annotations

import sys
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from .. import _dali
from ..ahead.calls import epoch_of, has_epoch_wrapper
from ..ahead.runahead import RUN_AHEAD
from ..ahead.speculator import Speculator
from ..ahead.streams import can_stream, reader_epoch, stream_of
from ..codegen.optimize import requested as optimize_requested
from ..core import checks, logs
from ..core.errors import PipelineError, GraphBreakSignal
from ..core.ledger import Verdict
from ..core.ir import Graph, Node, NodeKind, Ref, TensorMeta
from ..core.source import (SourceLoc, call_stack, site_of, user_frame, user_location,
                           without_call_stack)
from ..execution import waits
from ..execution.failures import unknown_inputs, validated_at_call
from ..execution.runtime import Options
from ..tracing.trace import Tracer, inference_metas
from ..units.cache import REGIONS
from .proxies import LazyValue, is_lazy, lazy_handle, lazy_value, node_of
from .regions import RegionRunner, checked_call_key
from .report import Region, Report, bookkeeping, report, reset_report, step_breakdown
from .sites import MAX_SITES, CallSites

__all__ = ["LazyTracer", "LazyValue",
           "Region", "Report", "Steps", "disable", "enable", "enabled", "is_enabled",
           "new_tracer", "report", "reset_report", "step_breakdown"]


class Pending:
    """A recorded call's state in transparent mode (its node's `state`): its outputs once its
    region ran, and the lazy values it handed out that have not got them yet."""

    __slots__ = ("results", "proxies", "deferred", "stack")

    def __init__(self) -> None:
        self.results: list | None = None
        self.proxies: list = []  # weak references to the LazyValues of its outputs
        self.deferred = False  # made in EvalMode.deferred: the mode eager's error text names
        self.stack: tuple = ()  # the frames its call was made from (source.call_stack)


class _UnlistedGraph(Graph):
    """A graph that numbers nodes but keeps no list: lazy nodes live as long as their users."""

    def _add(self, kind: NodeKind, name: str, **fields: Any) -> Node:
        node = Node(index=self._next_index, kind=kind, name=name, state=Pending(), **fields)
        self._next_index += 1
        return node

    _next_index = 0


def _runs_at_call(node: Node, inputs: tuple, kwargs: dict) -> bool:
    """Whether eager ndd runs this recorded call at once: an input or tensor argument it reads
    as it is wraps user data (DALI's `has_external_inputs`; under 1 us a call), or the op acts
    besides its result (dump_image: eager's starts at once, used or not)."""
    if _dali.has_side_effects(node.op_class):
        return True
    devices = node.input_devices
    index = 0
    for value in inputs:
        if value is None:
            continue
        if index < len(devices) and not is_lazy(value) and \
                _dali.eager_reads_as_is(value, node.is_batch) == devices[index]:
            return True
        index += 1
    for key in node.arg_inputs:
        value = kwargs.get(key)
        if value is not None and key not in node.arg_casts and not is_lazy(value) and \
                _dali.eager_reads_as_is(value, node.is_batch) == "cpu":
            return True
    return False


class LazyTracer(Tracer):
    """Records ndd calls of one thread for transparent mode; runs regions when consumed."""

    def __init__(self, device_id: int | None, num_threads: int):
        super().__init__("transparent", device_id)
        self.graph = _UnlistedGraph("transparent")
        self.options = Options(num_threads, device_id, RUN_AHEAD)
        self.speculator = Speculator()
        self.sites = CallSites(self)  # (op, code, instruction) -> its last call, replayed
        self.regions = RegionRunner(self.options, self.speculator)  # runs what is consumed
        self._converted: dict[tuple, Any] = {}  # numbers and lists made tensor arguments, kept
        self._owned: set[int] = set()  # ids of the values in _converted
        self._accepted: set[tuple] = set()  # checked_call_key of calls DALI accepted
        self._running = threading.RLock()
        self._thread = threading.get_ident()  # whose calls it records: the consumer's

    @property
    def optimize(self) -> bool:
        """Its regions get optimize.py's rewrites (enable(optimize=True))."""
        return self.regions.optimize

    @optimize.setter
    def optimize(self, value: bool) -> None:
        self.regions.optimize = bool(value)

    def materialize(self, ref: Ref) -> Any:
        """Run the pending region `ref` depends on; return that output's TensorList. (Its
        values are ndd's own Batch/Tensor: ndd code may read one in a worker thread of its
        own, `ndd.as_tensor(x)`, `x.torch()`; one region runs at a time.)"""
        with self._running, waits.on_behalf_of(self._thread):
            return self.regions.materialize(ref)

    # -- recording -----------------------------------------------------------------------------

    def proxy(self, ref: Ref, meta: TensorMeta, is_batch: bool) -> Any:
        """An ndd.Batch/Tensor whose data is `ref`'s, run when read (eager's own types)."""
        value, handle = lazy_value(self, ref, is_batch)
        ref.node.state.proxies.append(weakref.ref(handle))
        return value

    def recorded_device(self, value: Any) -> str | None:
        handle = lazy_handle(value)
        return handle.meta.device if handle is not None else super().recorded_device(value)

    def ref_of(self, value: Any, is_batch: bool, loc: SourceLoc | None) -> Ref:
        handle = lazy_handle(value)
        if handle is not None:
            if handle.pending and handle.tracer is self:
                return handle.ref
            data = handle.tracer.materialize(handle.ref)
            concrete = _dali.wrap_batch(data) if handle.is_batch else _dali.wrap_tensor(data)
            return super().constant_ref(concrete, is_batch, loc)
        return super().ref_of(value, is_batch, loc)

    def tensor_argument(self, op_class: type, key: str, value: Any, batch_size: Any) -> Any:
        """A number or list eager ndd passes as a per-call tensor argument, converted as ndd
        converts it (for a batch, the Batch ndd broadcasts it to). Kept per value and batch
        size: a loop passes the same value every step (`mean=MEAN`), and the conversion, the
        copy recording makes of user data and a broadcast at every run cost ~0.2 ms a call;
        these are ndd_trace's own, never written to, and fed in place."""
        token = _dali.argument_token(value)
        cache_key = (op_class, key, token, batch_size) if token is not None else None
        converted = self._converted.get(cache_key) if cache_key is not None else None
        if converted is None:
            with _dali.eager_inside_trace():
                converted = _dali.tensor_argument(op_class, key, value, batch_size)
            if cache_key is not None:
                if len(self._converted) >= MAX_SITES:
                    self._converted.clear()
                    self._owned.clear()
                self._converted[cache_key] = converted
                self._owned.add(id(converted))  # (alive while in _converted)
        return converted

    def constant_ref(self, value: Any, is_batch: bool, loc: SourceLoc | None) -> Ref:
        """User data is copied when the call is recorded, as eager ndd reads it then (a loop
        that refills one numpy buffer must not change pending results); batches handed out
        by a read-ahead reader are the pipeline's own and used as they are, and so are the
        tensor arguments converted here (`tensor_argument`)."""
        ref = super().constant_ref(value, is_batch, loc)
        if id(value) in self._owned:
            if ref.node.meta[0].device == "cpu":
                ref.node.feed_in_place = True
            return ref
        if not self.speculator.is_reader_batch(ref.node.payload):
            with _dali.eager_inside_trace():
                ref.node.payload = _dali.snapshot(ref.node.payload)
        elif ref.node.meta[0].device == "cpu":
            ref.node.feed_in_place = True  # nobody writes to it
        return ref

    def reader_used(self, obj: Any, *args: Any, **kwargs: Any) -> Any:
        """`reader.next_epoch(batch_size=...)` reads through a read-ahead pipeline (ahead/streams.py).
        Sample epochs, operator objects and ExternalSource pulls run eagerly (their lazy inputs
        are materialized by ndd itself when it evaluates them)."""
        kind = kwargs.get("_ndd_trace_kind")
        reason = None
        if kind is None:
            stream = stream_of(obj)
            reason = can_stream(obj)
            if reason is None:
                batch_size = (stream.request(args, kwargs) if stream is not None
                              else _dali.reader_epoch_request(obj, args, kwargs))
                if batch_size is not None:
                    loc = user_location()
                    with bookkeeping.lock:
                        bookkeeping.readers[(type(obj).__name__, site_of(loc))] += 1
                    logs.transparent.debug("%s.next_epoch(batch_size=%s) at %s: read ahead",
                                           type(obj).__name__, batch_size, loc or "?")
                    epoch = waits.timed(
                        reader_epoch(obj, batch_size, self.options, self.speculator.note_batch),
                        f"{type(obj).__name__}.next_epoch", site_of(loc))
                    return epoch_of(obj, epoch, args, kwargs)
                reason = ("DALI's capture mode runs this loop (capture=True)"
                          if _dali.reader_epoch_captures(args, kwargs) else
                          "reader epochs of single samples (or an explicit ctx) run eagerly")
        elif kind == "operator" and not isinstance(obj, _dali.Reader):
            reason = "operator object called directly"
        if reason is not None:
            name = f"{type(obj).__name__}.next_epoch" if kind is None else type(obj).__name__
            REGIONS.ledger.tally(name, Verdict.eager_call(reason, user_location()))
        if kind is None and has_epoch_wrapper(obj):  # an eager epoch, through its wrapper
            epoch = _dali.unwatched(_dali.Reader, "next_epoch")(obj, *args, **kwargs)
            return epoch_of(obj, epoch, args, kwargs)
        return None

    def rng_slot(self, rng: Any, loc: SourceLoc | None) -> tuple:
        return ("pending", _dali.resolve_rng(rng))

    @_dali.plumbing
    def handle(self, op_class: type, original: Any, inputs: tuple, kwargs: dict) -> Any:
        started = time.perf_counter()
        try:
            return self._handle(op_class, original, inputs, kwargs)
        finally:
            bookkeeping.times["record"] += time.perf_counter() - started

    @_dali.plumbing  # it calls ndd's own op when the call runs eagerly: DALI looks past it
    def _handle(self, op_class: type, original: Any, inputs: tuple, kwargs: dict) -> Any:
        name = _dali.op_path(op_class)
        if _dali.eval_mode_is_sync():
            return self._eager(original, inputs, kwargs, name, "a synchronous EvalMode is active")
        if _dali.eager_mode_entered():  # (started at once, on ndd's own threads)
            return self._eager(original, inputs, kwargs, name, "`with ndd.EvalMode.eager:` is "
                               "entered: its calls start at once")
        if _dali.process_params_replaced():
            return self._eager(original, inputs, kwargs, name,
                               "DALI's Operator._process_params is replaced")
        frame = user_frame(sys._getframe(1))
        site_key = (op_class, frame.f_code, frame.f_lasti) if frame is not None else None
        site = self.sites.get(site_key)
        reason = None
        try:
            result = self.sites.replay(site, op_class, inputs, kwargs) if site is not None else None
            replayed = result is not None
            if result is None:
                result = super().handle(op_class, original, inputs, dict(kwargs))
                instance = self.sites.keep_eager_instance(
                    op_class, node_of(result), kwargs,
                    _dali.call_site_frame(sys._getframe(1), kwargs))
                if site_key is not None:
                    self.sites.remember(site_key, result, inputs, kwargs, instance)
        except GraphBreakSignal as graph_break:
            reason = graph_break.reason
        except Exception as error:  # DALI rejects the call: eager raises its own error
            reason = f"could not be recorded ({type(error).__name__})"
        if reason is not None:  # run outside the handler: eager's error has no internal context
            return self._eager(original, inputs, kwargs, name, reason)
        node = node_of(result)
        if node.is_batch and node.batch_size is not None and int(node.batch_size) == 0:
            # eager ndd runs (and fails) such calls its own way; a pipeline runs no empty batch
            return self._eager(original, inputs, kwargs, name, "an empty batch")
        if validated_at_call(node) and not self._accepts(node):
            return self._eager(original, inputs, kwargs, name, "DALI rejects the call, given "
                               "the real metadata of its inputs")
        state = node.arg_inputs.get("_random_state")
        if state is not None:  # draw now, in call order, exactly as the eager call would
            _, rng = state.node.payload
            position = _dali.rng_position(rng)
            words = _dali.draw_state(rng)
            state.node.payload = ("drawn", words)
            self.speculator.note_draw(words, rng, position)
        if _dali.eval_mode_is_deferred():  # (its region may run in another mode: DALI's own)
            node.state.deferred = self.regions.calls_deferred = True
        if frame is not None:  # (a deferred error's traceback shows them, as eager's)
            node.state.stack = call_stack(frame.f_back)
        with bookkeeping.lock:
            bookkeeping.ops_recorded += 1
            bookkeeping.ops_replayed += replayed
        if _runs_at_call(node, inputs, kwargs):
            self._run_at_call(node)
        return result

    def _run_at_call(self, node: Node) -> None:
        """Run `node`'s region now, as eager ndd runs a call given user data as it is, so that
        its run-time error raises at this call (the calls after it never happen, nor draw):
        the op's own error, or eager's error for a result used if an op it reads failed."""
        self.regions.at_call = True
        try:
            self.materialize(Ref(node, 0))
            return
        except PipelineError as error:  # raised as at a result's first use
            own = error.__cause__
            at_call = without_call_stack(own) if isinstance(own, PipelineError) and \
                own.loc == node.loc and own.op_name == f"ndd.{node.name}" else error
        finally:
            self.regions.at_call = False
        try:  # (outside the handler: no internal context)
            raise at_call
        finally:  # (its traceback holds this frame: no cycle through it)
            del at_call, own

    def _accepts(self, node: Node) -> bool:
        """Whether DALI accepts `node`'s call given the real metadata of the inputs it cannot
        infer (`validated_at_call`), which run now, as eager ndd checks every call; if not
        (or if such an input fails), the call runs eagerly, raising eager's error."""
        key = checked_call_key(node)  # accepted once: accepted (no input runs again)
        if key is not None and key in self._accepted:
            return True
        try:
            self.refine_meta(Ref(node, 0), only_unknown=True)
        except Exception:  # noqa: BLE001 (raised again by the eager call, outside the handler)
            return False
        if key is not None:
            if len(self._accepted) >= MAX_SITES:
                self._accepted.clear()
            self._accepted.add(key)
        return True

    @_dali.plumbing
    def _eager(self, original: Any, inputs: tuple, kwargs: dict, name: str, reason: str) -> Any:
        loc = user_location()
        REGIONS.ledger.tally(name, Verdict.eager_call(reason, loc))
        logs.transparent.debug("ndd.%s at %s runs eagerly: %s", name, loc or "?", reason)
        for value in (*inputs, *kwargs.values()):
            if is_lazy(value):  # run here, not in the worker thread an eager call may use
                try:
                    value.evaluate()
                except Exception:  # noqa: BLE001 (the call raises as eager's: its arguments
                    break  # are checked first, then the failed input raises its error)
        with _dali.eager_inside_trace():
            return original(*inputs, **kwargs)

    # -- running -------------------------------------------------------------------------------

    def refine_meta(self, ref: Ref, only_unknown: bool = False) -> bool:
        """Infer a pending op's output metadata again from its inputs' real metadata, as eager
        ndd does to answer `.dtype`, `.ndim` or `.layout` before it runs an op (its inputs have
        run by then: ndd runs an op fed by user data at the call). The inputs' regions run, the
        op itself does not: its own run-time error still comes at first use, as eagerly. True
        if the node's metadata changed (its values then answer from it)."""
        node = ref.node
        if node.kind is not NodeKind.OP or node.state.results is not None or node.op_class is None:
            return False

        def real(value: Ref) -> TensorMeta:
            meta = value.node.meta[value.index]
            if value.node.kind is not NodeKind.OP or (  # `only_unknown`: run those eager runs
                    only_unknown and all(value.node is not read for read in unknown)):
                return meta
            return _dali.meta_of(_dali.wrap_batch(self.materialize(value)))

        unknown = unknown_inputs(node)
        input_metas, arg_metas = inference_metas(
            [real(value) for value in node.inputs], node.input_devices,
            {key: real(value) for key, value in node.arg_inputs.items()}, node.arg_casts)
        # with its inputs' metadata complete, DALI's verdict on the call is eager's: a call it
        # rejects raises here, as ndd's inference does when asked for the metadata
        _, _, metas = _dali.infer_metadata(node.op_class, node.backend, node.static,
                                           input_metas, arg_metas)
        if len(metas) != node.num_outputs or metas == node.meta:
            return False
        node.meta = list(metas)
        return True

# ---------------------------------------------------------------------------------------------
# Public switches

def _local() -> Any:
    return bookkeeping.local


def enable(optimize: bool | None = None) -> None:
    """Record ndd calls of this thread lazily and run them as cached pipelines; `optimize`:
    with optimize.py's rewrites (None: as NDD_TRACE_OPTIMIZE says, off by default)."""
    optimize = _checked_optimize("ndd_trace.enable", optimize)
    if not is_enabled():
        _switch_on(new_tracer(optimize))
    elif optimize is not None:
        _local().tracer.optimize = bool(optimize)


def _switch_on(tracer: LazyTracer) -> None:
    """This thread's ndd calls go to `tracer` from now on (until `disable()`)."""
    context = _dali.intercept(tracer.handle, tracer.reader_used)
    context.__enter__()
    local = _local()
    local.context, local.tracer = context, tracer


def new_tracer(optimize: bool | None = None) -> LazyTracer:
    """A transparent-mode tracer set up for this thread's device and thread count (and
    `optimize`, as `enable` takes it)."""
    tracer = LazyTracer(_dali.current_device_id(), _dali.current_num_threads())
    tracer.optimize = optimize_requested(optimize)
    return tracer


def disable() -> None:
    """Back to plain eager ndd for this thread (values already recorded stay usable)."""
    local = _local()
    context = getattr(local, "context", None)
    if context is not None:
        local.context = None
        context.__exit__(None, None, None)


def is_enabled() -> bool:
    """Whether this thread's ndd calls are recorded by transparent mode."""
    return getattr(_local(), "context", None) is not None


class Steps:
    """Transparent mode around each step of a generator, and not in between (a compiled
    generator's checked mode): the consumer's code between steps runs as it would without
    ndd_trace.

        steps = Steps(tracer)        # one tracer for every step: the reader batches it saw and
        with steps.step():           # the run-ahead patterns it learned carry from step to step
            item = next(generator)
        steps.close()                # the hooks, kept installed between steps, go

    A fresh tracer per step would forget which batches came from a read-ahead reader (copying
    them) and never see three steps of a pattern (running nothing ahead)."""

    def __init__(self, tracer: LazyTracer):
        self.tracer = tracer
        self._release = _dali.hold_interception()

    @contextmanager
    def step(self) -> Iterator[None]:
        if is_enabled():  # transparent mode already records
            yield
            return
        _switch_on(self.tracer)
        try:
            yield
        finally:
            disable()

    def close(self) -> None:
        self._release()


def _checked_optimize(where: str, optimize: Any) -> bool | None:
    if callable(optimize):  # `@ndd_trace.enabled` without its parentheses
        checks.fail(TypeError("ndd_trace.enabled is used with parentheses: "
                              "`@ndd_trace.enabled()` or `with ndd_trace.enabled():`"))
    return None if optimize is None else checks.flag(where, "optimize", optimize)


def enabled(optimize: bool | None = None) -> AbstractContextManager[None]:
    """`with ndd_trace.enabled(): ...` runs the block in transparent mode (`optimize`: as
    `enable` takes it); also a decorator, `@ndd_trace.enabled()`."""
    return _enabled(_checked_optimize("ndd_trace.enabled", optimize))


@contextmanager
def _enabled(optimize: bool | None) -> Iterator[None]:
    was_enabled = is_enabled()
    previous = _local().tracer.optimize if was_enabled else None
    enable(optimize)
    try:
        yield
    finally:
        if not was_enabled:
            disable()
        elif optimize is not None:
            _local().tracer.optimize = previous
