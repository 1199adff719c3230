"""Tracing: run the user's function on symbolic batches and record every ndd call into a Graph.

    tracer = Tracer("preprocess", device_id=None)
    jpegs = tracer.placeholder("jpegs", ("args", 0), concrete_batch)   # a TracedBatch
    with tracer.active():
        result = preprocess(jpegs)             # ndd calls are recorded, nothing runs
    tracer.set_outputs(result)
    print(tracer.graph)

The traced values (values.py) subclass ndd.Batch / ndd.Tensor: ndd's own Python code on them
ends in operator calls, which the interceptor in `_dali` routes here; what needs concrete data
raises `GraphBreakSignal` (a graph break, `GraphBreakRecord` here says what to try instead).
"""

from __future__ import annotations

import collections.abc
import dataclasses
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from .. import _dali
from ..core import trees
from ..core.errors import GraphBreakSignal
from ..core.ir import Graph, Node, NodeKind, Ref, TensorMeta
from ..core.keys import freeze_arguments
from ..core.source import SourceLoc, frames_within, raise_at, user_frame, user_location
from .values import (SymbolicBatchSize, TracedBatch, TracedTensor, graph_break,
                     is_concrete_data, is_traced, traced_meta, traced_ref, tracer_of)


@dataclasses.dataclass
class GraphBreakRecord:
    """Why a trace could not be completed, and where."""

    reason: str
    loc: SourceLoc | None
    captures: bool = False  # a generator's loop that DALI's capture mode drives

    @property
    def filename(self) -> str | None:
        return self.loc.filename if self.loc else None

    @property
    def lineno(self) -> int | None:
        return self.loc.lineno if self.loc else None

    def __str__(self) -> str:
        return f"{self.loc or '<unknown>'}: {self.reason}"

    @property
    def fix(self) -> str | None:
        """What to try instead (`explain` shows it under the break), or None where the reason
        already says."""
        return next((fix for part, fix in _FIXES if part in self.reason), None)


_MOVE_OUT = ("return the value and do that after the call (a compiled function's `.torch()` "
             "or `np.asarray` of its result costs nothing extra), or before it, on the input")
_PASS_SIZES = ("compute what needs the data's shapes outside the function and pass it in as an "
               "argument (a Batch of per-sample values stays one variant; see graph-breaks.md, "
               "Fixing a break)")
# a part of the reason -> the fix to try; one table for every break the tracer raises
_FIXES = (
    ("(or may be) 1-D", "give the samples a layout (`ndd.reshape(x, shape=..., "
     "layout=\"X\")`) or blur them in 2-D; as written, eager raises at the result's use"),
    ("reads `.shape`", _PASS_SIZES),
    ("reads `.size`", _PASS_SIZES),
    ("takes `len()`", _PASS_SIZES + "; `x.batch_size` is known while tracing"),
    ("iterates over a traced value", "work on the whole batch (ops take batches), or iterate "
     "over the result after the call"),
    ("selects samples", "select after the call, or pass the selection in as data"),
    ("accesses `.tensors`", _MOVE_OUT),
    ("evaluates a traced value", _MOVE_OUT),
    ("converts a traced value", _MOVE_OUT),
    ("exports a traced value", _MOVE_OUT),
    ("reads a traced value with", _MOVE_OUT),
    ("formats a traced value as text", _MOVE_OUT + "; a shape or dtype known while tracing "
     "(`x.dtype`, `x.layout`, `x.batch_size`) can be printed"),
    ("uses a traced value as a Python bool", "choose per sample with "
     "@ndd.compile(per_sample=True) (an `if` on one sample's values), or with arithmetic "
     "(`x * mask + y * (1 - mask)`); a choice for the whole batch can be a Python argument"),
    ("DALI cannot infer", "give the input what the code reads (a layout: `ndd.as_batch(..., "
     "layout=\"HWC\")`; a dtype: `ndd.cast`), or pass it in as an argument"),
    ("is given batches of different sizes", "give the op batches of one size (ndd rejects "
     "others at the call, eagerly too)"),
    ("calls stateful operator", "call it outside the function and pass its result in; a reader "
     "loop compiles as a generator over `reader.next_epoch(batch_size=...)`"),
    ("under a synchronous EvalMode", "call the compiled function outside the "
     "`with ndd.EvalMode...` block"),
    ("does not use its result", "use its result, or remove the call"),
    ("is given an iterator as", "pass what it gives this call (`list(it)`, or `next(it)` "
     "before the call) instead of the iterator"),
    ("returns a traced value of another compiled call", "return the other call's result from "
     "the caller, or call the other function's body (not its compiled form) here"),
)


def _resolve_symbols(value: Any, reason: str) -> Any:
    """Replace batch-size symbols inside a static value by their (specialized) values."""
    if isinstance(value, SymbolicBatchSize):
        return value.specialized(reason)
    if isinstance(value, (list, tuple)):
        return type(value)(_resolve_symbols(v, reason) for v in value)
    if isinstance(value, dict):
        return {k: _resolve_symbols(v, reason) for k, v in value.items()}
    return value


def _is_array_like(value: Any) -> bool:
    return isinstance(value, np.ndarray) or type(value).__module__.startswith("torch")


def inference_metas(input_metas: list[TensorMeta], input_devices: list[str],
                    arg_metas: dict[str, TensorMeta], arg_casts: dict[str, str]
                    ) -> tuple[list[TensorMeta], dict[str, TensorMeta]]:
    """How an op call's data is described to DALI's inference: each input where the op reads
    it (ndd moves it there), each argument input on the CPU, in the type the argument takes."""
    inputs = [meta if meta.device == device else meta._replace(device=device)
              for meta, device in zip(input_metas, input_devices)]
    args = {key: meta._replace(device="cpu", dtype=arg_casts.get(key, meta.dtype))
            for key, meta in arg_metas.items()}
    return inputs, args


def _find_culprit(op_class: type, backend: str, static: dict, input_metas: list,
                  arg_metas: dict) -> str | None:
    """The static argument whose removal makes DALI accept the call, if there is one."""
    for key in static:
        reduced = {k: v for k, v in static.items() if k != key}
        try:
            _dali.infer_metadata(op_class, backend, reduced, input_metas, arg_metas)
        except Exception:
            continue
        return key
    return None


class Tracer:
    """Records ndd operator calls of one function call into a Graph."""

    def __init__(self, name: str, device_id: int | None):
        self.started = time.perf_counter()  # for the trace log's time
        self.graph = Graph(name)
        self.device_id = device_id
        self.batch_size: int = 1
        self.static_batch_sizes: set[int] = set()
        self.specialized_on_batch_size: str | None = None
        self.batch_size_as_int: str | None = None  # why batch_size is an int (type() called)
        self.rng_slots: dict[int, tuple] = {}  # id(rng) -> slot, for RNGs the caller passes
        self.rng_objects: dict[int, Any] = {}  # RNGs reached from globals and closures
        self.output_tree: Any = None
        self.num_ops = 0
        self.failure_note: str | None = None  # why recording an op failed, for the eager error
        # random ops called in sample mode (one value): a batch pipeline draws one per sample
        self.sample_random_ops: list[SourceLoc | None] = []
        self.entered_deferred = _dali.eval_mode_is_deferred()  # the caller's EvalMode

    # -- inputs --------------------------------------------------------------------------------

    def placeholder(self, name: str, path: tuple, value: Any) -> TracedBatch | TracedTensor:
        meta = _dali.meta_of(value)
        is_batch = isinstance(value, _dali.Batch)
        node = self.graph.add_input(name, path, meta, is_batch)
        cls = TracedBatch if is_batch else TracedTensor
        return cls(self, Ref(node, 0), meta)

    def register_rng(self, rng: Any, slot: tuple) -> None:
        self.rng_slots[id(rng)] = slot

    def allow_rng_object(self, rng: Any) -> None:
        self.rng_objects[id(rng)] = rng

    def specialize_batch_size(self, reason: str) -> None:
        if self.specialized_on_batch_size is None:
            self.specialized_on_batch_size = f"{reason} at {user_location()}"

    @contextmanager
    def active(self) -> Iterator[Tracer]:
        with _dali.intercept(self.handle, self.reader_used):
            yield self

    def reader_used(self, reader: Any, batch_size: Any = None, *args: Any,
                    **kwargs: Any) -> Iterator:
        """A reader, an operator object or an ExternalSource used while tracing: a graph break
        (a reader keeps its position, and what these give would be frozen into the graph as
        constants). A compiled generator's loop is not traced: its body is (loop.py)."""
        loc = user_location()
        kind = kwargs.pop("_ndd_trace_kind", None)
        if kind == "operator":
            raise GraphBreakSignal(f"calls operator object `{type(reader).__name__}` (class API "
                                   "or a reader called directly); use the ndd.<op> function, or "
                                   "call it outside", loc)
        if kind in ("external_source", "external_source.captured"):
            raise GraphBreakSignal("pulls data from an ndd.ExternalSource (its next batch would "
                                   "be frozen into the graph); pass the batch as an argument, or "
                                   "iterate source.captured(batch_size=...) in a compiled "
                                   "generator", loc)
        raise GraphBreakSignal(
            f"reads from reader `{type(reader).__name__}` in a plain function (a reader keeps "
            "its position); write the loop in a generator function decorated with "
            "@ndd.compile to compile it", loc)

    # -- recording: hooks a subclass overrides (LazyTracer, transparent mode's) ---------------

    def constant_ref(self, value: Any, is_batch: bool, loc: SourceLoc | None) -> Ref:
        """Concrete data met while tracing becomes a constant fed to the pipeline every call."""
        with _dali.eager_inside_trace():
            if not is_concrete_data(value):
                value = _dali.to_tensor(value)
            value = value.evaluate()
            meta = _dali.meta_of(value)
        if isinstance(value, _dali.Batch):
            self.static_batch_sizes.add(int(value.batch_size))
        node = self.graph.add_constant(value, meta, isinstance(value, _dali.Batch), loc)
        return Ref(node, 0)

    def ref_of(self, value: Any, is_batch: bool, loc: SourceLoc | None) -> Ref:
        """The edge a call reads for an input or data argument: a value this tracer recorded,
        or concrete data as a constant."""
        if is_traced(value):
            if tracer_of(value) is not self:
                raise_at(ValueError(
                    "a traced value from another compiled call is used here; traced values "
                    "cannot escape their function (return them instead)"), loc)
            return traced_ref(value)
        return self.constant_ref(value, is_batch, loc)

    def tensor_argument(self, op_class: type, key: str, value: Any, batch_size: Any) -> Any:
        """A number or list eager ndd passes as a per-call tensor argument, converted as it
        converts it (a sample; the pipeline broadcasts it over a batch of any size)."""
        with _dali.eager_inside_trace():
            return _dali.tensor_argument(op_class, key, value)

    def rng_slot(self, rng: Any, loc: SourceLoc | None) -> tuple:
        """Where a random op's generator comes from, as its random-state node records it."""
        if rng is None:
            return ("default",)
        _dali.resolve_rng(rng)  # validates the type, with ndd's own message
        slot = self.rng_slots.get(id(rng))
        if slot is not None:
            return slot
        if id(rng) in self.rng_objects:
            return ("object", id(rng))
        raise GraphBreakSignal(
            "a random op uses an RNG that is neither an argument of the function, a module "
            "global or closure value, nor the default generator (an RNG created inside the "
            "function restarts every call); pass it as an argument", loc)

    def recorded_device(self, value: Any) -> str | None:
        """The device type of a value this trace recorded (None for any other)."""
        return traced_meta(value).device if is_traced(value) else None

    def proxy(self, ref: Ref, meta: TensorMeta, is_batch: bool) -> Any:
        """The value the traced code holds for output `ref` of a recorded call."""
        cls = TracedBatch if is_batch else TracedTensor
        return cls(self, ref, meta)

    # -- recording -----------------------------------------------------------------------------

    def note_call_mode(self, batch_size: Any, is_random: bool, loc: SourceLoc | None) -> None:
        """Note a recorded call's mode: its batch size where it is a number, and a random op
        called in sample mode (`batch_size` None), which a graph of batches cannot use."""
        if batch_size is not None and not isinstance(batch_size, SymbolicBatchSize):
            self.static_batch_sizes.add(int(batch_size))
        if is_random and batch_size is None:
            self.sample_random_ops.append(loc)

    def record_op(self, **fields: Any) -> Any:
        """Add an op node (`Graph.add_op`'s fields) and count it; its outputs as proxies shaped
        like ndd's own result: one value, a tuple, or a dict by output name."""
        node = self.graph.add_op(**fields)
        self.num_ops += 1
        results = [self.proxy(Ref(node, i), node.meta[i], node.is_batch)
                   for i in range(node.num_outputs)]
        if node.num_outputs == 1:
            return results[0]
        if node.output_names is None:
            return tuple(results)
        return dict(zip(node.output_names, results))

    def _metas(self, refs: list[Ref]) -> list[TensorMeta]:
        return [ref.node.meta[ref.index] for ref in refs]

    def handle(self, op_class: type, original: Any, inputs: tuple, kwargs: dict) -> Any:
        """Record one ndd operator call; return proxies shaped like ndd's own result."""
        op_frame = user_frame(sys._getframe(1))
        loc = user_location(op_frame)
        name = _dali.op_path(op_class)
        call_frame = _dali.call_site_frame(sys._getframe(1), kwargs)
        raw_kwargs = dict(kwargs)
        if _dali.is_stateful(op_class):
            raise GraphBreakSignal(f"calls stateful operator `{name}` (readers and other stateful "
                                   "ops keep their own state; create them outside)", loc)
        if _dali.eval_mode_is_sync():
            # the user asked for each call to run, and fail, on the spot
            raise GraphBreakSignal(f"calls `ndd.{name}` under a synchronous EvalMode (sync_cpu / "
                                   "sync_full), which runs each call and raises its errors at the "
                                   "call", loc)
        batch_size = kwargs.pop("batch_size", None)
        device = kwargs.pop("device", None)
        kwargs.pop("_backend", None)
        kwargs.pop("_caller_frame", None)
        is_random = _dali.is_random(op_class)
        rng = kwargs.pop("rng", None) if is_random else None
        kwargs = {key: value for key, value in kwargs.items() if value is not None}
        inputs = tuple(value for value in inputs if value is not None)

        # Batch or sample mode, exactly as ndd decides it: the first batch's size, and ndd
        # rejects batches of different sizes at the call
        if batch_size is None:
            sizes = [value.batch_size for value in (*inputs, *kwargs.values())
                     if isinstance(value, _dali.Batch)]
            if sizes:
                batch_size = sizes[0]
                if len({size for size in sizes if type(size) is int}) > 1:
                    raise GraphBreakSignal(f"`ndd.{name}` is given batches of different sizes "
                                           f"({', '.join(map(str, sizes))}), which ndd rejects at "
                                           "the call", loc)
        is_batch = batch_size is not None
        self.note_call_mode(batch_size, is_random, loc)

        known_devices = tuple(self.recorded_device(value) for value in inputs)
        if None in known_devices:
            known_devices = None
        try:
            device_type, backend = _dali.resolve_backend(op_class, device, inputs, known_devices)
        except Exception as error:  # an invalid device: report at the user's line
            error.add_note(f"in ndd.{name}(...) called at {loc}")
            raise_at(error, loc)

        refs = [self.ref_of(value, is_batch, loc) for value in inputs]
        input_devices = []
        for index, ref in enumerate(refs):
            actual = ref.node.meta[ref.index].device
            input_devices.append(_dali.input_device(op_class, backend, index, actual))

        arg_inputs: dict[str, Ref] = {}
        arg_casts: dict[str, str] = {}
        static: dict[str, Any] = {}
        split = None
        for key, value in kwargs.items():
            if type(value) in _dali.SPLIT_VALUES and call_frame is not None and \
                    _dali.is_tensor_argument(op_class, key):
                # eager ndd passes a number or list the call site does not show to be constant
                # (a variable's, a parameter's) as a per-call tensor argument: so does recording
                split = split or _dali.eager_split(op_class, call_frame, raw_kwargs)
                if key in split.call_args:
                    value = self.tensor_argument(op_class, key, value, batch_size)
            plain = _dali.decay_plain(value)
            if plain is not _dali.NOT_PLAIN:  # numbers and strings: the fast path
                static[key] = plain
                continue
            # a shape or count made of the batch size: the trace depends on its value
            value = _resolve_symbols(value, f"passes the batch size as `{key}=`")
            if is_traced(value) or is_concrete_data(value) or (
                    _is_array_like(value) and _dali.is_tensor_argument(op_class, key)):
                ref = self.ref_of(value, is_batch, loc)
                arg_inputs[key] = ref
                expected = _dali.argument_dtype(op_class, key)
                if expected is not None and ref.node.meta[ref.index].dtype != expected:
                    arg_casts[key] = expected
            elif _is_array_like(value):
                # eager keys its operator instance by every fixed argument: a numpy array
                # raises TypeError ("unhashable type") at the call there, and so here
                hash(value)
                static[key] = np.asarray(value).tolist()
            else:
                static[key] = _dali.decay_static(value)

        random_state = None
        if is_random:
            random_state = self.graph.add_random_state(self.rng_slot(rng, loc), loc)

        input_metas, arg_metas = inference_metas(
            self._metas(refs), input_devices,
            {key: ref.node.meta[ref.index] for key, ref in arg_inputs.items()}, arg_casts)
        if random_state is not None:
            arg_metas["_random_state"] = random_state.meta[0]
        try:
            frozen = freeze_arguments(static)
        except TypeError:  # an unhashable value (an array DALI takes as it is)
            frozen = None
        try:
            num_outputs, output_names, metas = _dali.infer_metadata(
                op_class, backend, static, input_metas, arg_metas, frozen)
        except Exception as error:
            culprit = _find_culprit(op_class, backend, static, input_metas, arg_metas)
            named = f"argument `{culprit}`={static[culprit]!r} of " if culprit else ""
            self.failure_note = (f"ndd_trace: DALI rejects {named}ndd.{name}(...) "
                                 f"called at {loc} ({type(error).__name__}: {error})")
            raise

        if _dali.eager_rejects_output_layout(_dali.schema_name(op_class), input_metas):
            raise GraphBreakSignal(f"calls `ndd.{name}` on samples without a layout that are "
                                   "(or may be) 1-D, whose output eager rejects when it runs "
                                   "the call (a check a pipeline does not make)", loc)
        if random_state is not None:
            arg_inputs["_random_state"] = Ref(random_state, 0)
        return self.record_op(
            name=name, schema=_dali.schema_name(op_class), op_class=op_class,
            batch_size=batch_size, backend=backend, inputs=refs, input_devices=input_devices,
            arg_inputs=arg_inputs, arg_casts=arg_casts, static=static, frozen_static=frozen,
            num_outputs=num_outputs, output_names=output_names, meta=metas, is_batch=is_batch,
            loc=loc, frames=frames_within(op_frame),
            deferred=None if _dali.eval_mode_is_deferred() == self.entered_deferred
            else not self.entered_deferred)

    # -- outputs -------------------------------------------------------------------------------

    def set_outputs(self, result: Any, held: frozenset[int] = frozenset(),
                    given: dict[int, tuple] | None = None) -> None:
        """Flatten the returned structure; traced leaves become graph outputs. A numpy array the
        function made (not one of `held`: the ids of what it could reach before it ran) comes
        back as a copy at each call, as eager makes a new one; an argument returned as it was
        given (`given`: id -> ("args", index) or ("kwargs", name)), as each call's own."""
        outputs: list[Ref] = []
        taken_apart: set[int] = set()

        def leaf(value: Any) -> tuple | None:
            if is_traced(value):
                if tracer_of(value) is not self:
                    raise graph_break("returns a traced value of another compiled call")
                outputs.append(traced_ref(value))
                return ("out", len(outputs) - 1, isinstance(value, _dali.Batch))
            return _returned_leaf(value, held, given, taken_apart)

        self.output_tree = trees.flatten(result, leaf)
        # an op acting besides its result (dump_image) runs at every call, used or not, as
        # eagerly: an output of the pipeline too, which the call does not hand back
        self.graph.outputs = outputs + [
            Ref(node, 0) for node in self.graph.nodes_of(NodeKind.OP)
            if _dali.has_side_effects(node.op_class) and Ref(node, 0) not in outputs]


def _returned_leaf(value: Any, held: frozenset[int], given: dict[int, tuple] | None,
                   taken_apart: set[int]) -> tuple | None:
    """The output tree's node of a returned value that is not traced (None: taken apart, or
    returned as the trace saw it); see Tracer.set_outputs."""
    if isinstance(value, SymbolicBatchSize):
        return ("batch_size",)
    if isinstance(value, collections.abc.Iterator):
        # a generator's items are made as it is iterated, after the call: a cached
        # entry would hand back one and the same (exhausted) object every call
        raise graph_break("returns a generator or iterator (its items are made when it is "
                          "iterated, after the call); make the function a generator itself "
                          "(`yield from ...`) to compile its loop")
    if isinstance(value, np.ndarray) and value.dtype == object and \
            any(is_traced(item) for item in value.flat):
        # numpy wraps a Batch it cannot convert (`np.asarray(batch)`), as eagerly: the
        # wrapped values are the call's results, which a pipeline cannot hand back so
        raise graph_break("converts a traced value to numpy inside the function (an object "
                          "array holding it is returned)")
    if given and id(value) in given and not is_traced(value):
        return ("argument", given[id(value)])  # (a list of Batches given: the list)
    if isinstance(value, np.ndarray) and id(value) not in held:
        return ("copied", value)
    if id(value) in held and not trees.holds_any(value, is_traced):
        return ("static", value)  # eager's own object (`self.stats`, a list given)
    if trees.is_container(type(value)) and not isinstance(value, tuple):  # (mutable ones)
        if id(value) in taken_apart:  # (each place would get a container of its own)
            raise graph_break("returns one container in two places (`return d, [d]`): a "
                              "compiled call makes its result's containers anew, one per "
                              "place; use the container in one place to compile the function")
        taken_apart.add(id(value))
    return None  # concrete data and Python values come back as they are


def add_reader_node(graph: Graph, reader: Any, loc: SourceLoc | None) -> Node:
    """The node of a reader whose operator a pipeline runs (raises where DALI cannot describe
    the reader to a pipeline)."""
    num_outputs, names, metas = _dali.reader_metadata(reader)
    return graph.add_reader(_dali.reader_fn_path(reader), _dali.schema_name(type(reader)), reader,
                            _dali.reader_static_args(reader), num_outputs, names, metas, loc)
