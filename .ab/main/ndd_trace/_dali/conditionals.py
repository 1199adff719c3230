"""Per-sample pipelines: DALI's conditionals (its AutoGraph fork) on pipeline-mode DataNodes."""

from __future__ import annotations

import dataclasses
import math
import threading
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

import nvidia.dali as dali
import nvidia.dali.backend as backend
import nvidia.dali.types as types
from nvidia.dali import fn
from nvidia.dali import ops
from nvidia.dali.data_node import DataNode
from nvidia.dali.pipeline import Pipeline

from .base import STATE_WORDS


def is_data_node(value: Any) -> bool:
    return isinstance(value, DataNode)


def conditional_pipeline(definition: Callable, **options: Any) -> Pipeline:
    """`@pipeline_def(enable_conditionals=True)` applied to `definition`, then instantiated."""
    return dali.pipeline_def(definition, enable_conditionals=True)(**options)


def do_not_convert(function: Callable) -> Callable:
    """Keep DALI's AutoGraph from rewriting one of our own helpers called from converted code."""
    return dali.pipeline.do_not_convert(function)


def fn_function(op_class: type, device: str | None) -> tuple[Callable, str | None]:
    """The pipeline-mode function of an ndd operator, and its device argument (ndd's "gpu"
    decoders are "mixed" in a pipeline)."""
    function: Any = fn
    for part in op_class._fn_path.split("."):
        function = getattr(function, part)
    if device == "gpu" and "mixed" in op_class._supported_backends:
        device = "mixed"
    return function, device


def float64_constant(value: float) -> Any:
    """`value` as float64 in a pipeline. A constant is kept as float32 by DALI's arithmetic,
    so one float32 cannot hold does not round: it is the float64 sum of three float32 parts
    (24 bits each: all of a float64's 53)."""
    value = float(value)
    whole = float(np.float32(value))
    if whole == value or not math.isfinite(value):
        return types.Constant(value, dtype=types.DALIDataType.FLOAT64)
    parts = [whole]
    rest = value - whole
    for _ in range(2):
        parts.append(float(np.float32(rest)))
        rest -= parts[-1]
    made = [fn.cast(fn.constant(fdata=[part], shape=[], dtype=types.FLOAT), dtype=types.FLOAT64)
            for part in parts]
    return (made[0] + made[1]) + made[2]


_PASS_THROUGH = ("_conditional__Split", "_conditional__ValidateLogical")
# DALI's conditional split and merge ops, as (fn path, schema): a coalesced run splits a batch
# into its calls' slices by sample index and merges them back (codegen/coalesce.py)
SPLIT_OP = ("_conditional.split", "_conditional__Split")
MERGE_OP = ("_conditional.merge", "_conditional__Merge")


def node_key(node: DataNode) -> str:
    """A hashable name of the value behind a DataNode, seen through the splits DALI's
    conditionals insert when a branch reads a value from an outer scope, and the checks of
    the operands of `and`/`or`."""
    source = node.source
    while source is not None and getattr(source._op, "schema_name", None) in _PASS_THROUGH:
        node = source._inputs[0]
        source = node.source
    return repr(node)


def condition_chain() -> list[tuple[str, bool | None]]:
    """The per-sample branches the pipeline definition is inside, outermost first: for each,
    the predicate's `node_key` and whether it is the true branch (None: neither, a merge)."""
    from nvidia.dali import _conditionals

    if not _conditionals.conditionals_enabled():
        return []
    chain = []
    for entry in _conditionals.this_condition_stack()._stack[1:]:
        branch = {_conditionals._Branch.TrueBranch: True,
                  _conditionals._Branch.FalseBranch: False}.get(entry.branch)
        chain.append((node_key(entry.predicate), branch))
    return chain


def in_this_branch(node: DataNode) -> DataNode:
    """`node` (produced in an outer scope) restricted to the samples of the current branch."""
    from nvidia.dali import _conditionals

    return _conditionals.apply_conditional_split(node)


def cast_node(node: DataNode, dtype_name: str) -> DataNode:
    """`fn.cast` to a DALIDataType by name ("FLOAT64", "BOOL")."""
    return fn.cast(node, dtype=getattr(types.DALIDataType, dtype_name))


def scalar_node(node: DataNode) -> DataNode:
    """A per-sample value as a 0-d one (`fn.reshape(shape=[])`)."""
    return fn.reshape(node, shape=[])


def shape_node(node: DataNode) -> DataNode:
    """Each sample's shape, as INT64 numbers."""
    return node.shape(dtype=types.DALIDataType.INT64)


def input_node(name: str, device: str, dtype_name: str | None = None, ndim: int | None = None,
               layout: str | None = None) -> DataNode:
    """An external source the pipeline is fed by `name` (typed where `dtype_name` is given;
    else by what it is fed)."""
    if dtype_name is None:
        return fn.external_source(name=name, device=device)
    return fn.external_source(name=name, device=device,
                              dtype=getattr(types.DALIDataType, dtype_name), ndim=ndim,
                              layout=layout or None)


def sample_index_source(name: str) -> DataNode:
    return fn.external_source(name=name, device="cpu", dtype=types.DALIDataType.INT32, ndim=0)


def sample_indices(batch_size: int) -> Any:
    """The TensorList a `sample_index_source` is fed: 0, 1, ..., batch_size - 1."""
    return backend.TensorListCPU(np.arange(batch_size, dtype=np.int32))


def host_ints(tensor_list: Any) -> list[int]:
    """The scalars of a CPU TensorList (possibly empty), as Python ints."""
    return [int(np.asarray(sample)) for sample in tensor_list]


def python_numbers(tensor_list: Any) -> list:
    """Each sample of a pipeline output (CPU or GPU) as the Python number eager's `.item()`
    gives (`np.array(storage).item()`, as ndd's `Tensor.item` computes it)."""
    if isinstance(tensor_list, backend.TensorListGPU):
        tensor_list = tensor_list.as_cpu()
    return [np.array(sample).item() for sample in tensor_list]


def zero_state() -> np.ndarray:
    """An all-zero random state (a stand-in that draws nothing from any generator)."""
    return np.zeros(STATE_WORDS, dtype=np.uint32)


def autograph_origin(filename: str, lineno: int) -> tuple[str, int] | None:
    """The (file, line) that DALI's AutoGraph generated this line of code from, while that
    converted code runs (None: not generated code)."""
    from nvidia.dali._autograph.utils import tf_stack

    stack = tf_stack._source_mapper_stacks.get(threading.get_ident())
    if not stack:
        return None
    origin = stack[-1].internal_map.get((filename, lineno))
    return (origin[0], origin[1]) if origin is not None else None


def definition_error(error: BaseException) -> tuple[str, list[tuple[str, int]]]:
    """An error raised while a conditional pipeline was defined, as DALI's AutoGraph reports it:
    the original error's text ("RuntimeError: ...", not its "in user code" dump) and the frames
    it came through, innermost first, lines of generated code mapped to what they came from."""
    metadata = getattr(error, "ag_error_metadata", None)
    if metadata is None or not getattr(metadata, "cause_message", None):
        frames = traceback.extract_tb(error.__traceback__)
        return (f"{type(error).__name__}: {error}",
                [(frame.filename, frame.lineno or 0) for frame in reversed(frames)])
    return (metadata.cause_message.strip(),
            [(frame.filename, frame.lineno) for frame in metadata.translated_stack])


class HostSample:
    """One sample of a pipeline output, copied to the host: compared by dtype, shape and bytes
    (a per-sample argument the run gave a random op)."""

    __slots__ = ("array", "_key")

    def __init__(self, array: np.ndarray):
        self.array = array
        self._key = (array.dtype.str, array.shape, array.tobytes())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, HostSample) and self._key == other._key

    def __hash__(self) -> int:
        return hash(self._key)


def host_samples(tensor_list: Any) -> list[HostSample]:
    """The samples of a pipeline output (CPU or GPU), as host copies."""
    if isinstance(tensor_list, backend.TensorListGPU):
        tensor_list = tensor_list.as_cpu()
    return [HostSample(np.array(sample)) for sample in tensor_list]


def array_of(sample: HostSample) -> np.ndarray:
    return sample.array


@contextmanager
def logical_hooks(on_result: Callable[[str, list, Any], None]) -> Iterator[None]:
    """While a conditional pipeline is defined, report each `not`, `and`, `or` that DALI's
    AutoGraph turns into operators: `on_result(kind, operands, result)` (the right operand of
    `and`/`or` as its branch produced it)."""
    from nvidia.dali import _conditionals

    dispatch = _conditionals._OVERLOADS
    _logical_hooks_lock.acquire()  # the dispatch object is DALI's, shared by all threads
    names = ("not_", "lazy_and", "lazy_or")
    previous = {name: dispatch.__dict__.get(name) for name in names}
    original_not, original_and, original_or = dispatch.not_, dispatch.lazy_and, dispatch.lazy_or

    def not_(a: Any) -> Any:
        result = original_not(a)
        on_result("not", [a], result)
        return result

    def lazy(kind: str, original: Callable) -> Callable:
        def logical(a_value: Any, b: Callable) -> Any:
            right: list = []

            def b_recorded() -> Any:
                right.append(b())
                return right[-1]

            result = original(a_value, b_recorded)
            on_result(kind, [a_value, *right], result)
            return result

        return logical

    dispatch.not_ = not_
    dispatch.lazy_and = lazy("and", original_and)
    dispatch.lazy_or = lazy("or", original_or)
    try:
        yield
    finally:
        for name, value in previous.items():  # what was there: DALI's methods, or outer hooks
            if value is None:
                dispatch.__dict__.pop(name, None)
            else:
                setattr(dispatch, name, value)
        _logical_hooks_lock.release()


_logical_hooks_lock = threading.RLock()


@dataclasses.dataclass
class DefinedOp:
    """One operator a pipeline definition made, as the IR records an op: its fn path
    ("reductions.sum", "_conditional.split"), schema, backend, inputs and tensor arguments (the
    DataNodes it reads, after the splits DALI's conditionals inserted), scalar arguments and
    outputs; `feed_name` is an external source's name (None for any other op)."""

    fn_path: str
    schema: str
    backend: str
    inputs: list
    arg_inputs: dict
    static: dict
    outputs: list
    feed_name: str | None = None


# DALI's bookkeeping among an op's arguments (its API module and name, its instance name; the
# `_origin_stack_*` trace of the definition's stack is left out too): none of them the op's own
_BOOKKEEPING = ("_module", "_display_name", "name")


def _plain(value: Any) -> Any:
    """A scalar argument as DALI adds it to the op's spec: a `types.Constant` (a per-sample
    comparison's float64 operand) by its value, a double exactly."""
    if isinstance(value, types.ScalarConstant):
        return value.value
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value


def _defined_op(instance: Any, arg_inputs: dict, arguments: dict, init_args: dict,
                op: Any) -> DefinedOp:
    schema = op.schema_name if hasattr(op, "schema_name") else "ExternalSource"
    module = init_args.get("_module", "")
    if schema == "_ArithmeticGenericOp":
        path = "_arithmetic_generic_op"  # (fn's own name for DataNode arithmetic)
    else:
        prefix = module[len("nvidia.dali.fn"):].lstrip(".") if module.startswith(
            "nvidia.dali.fn") else ""
        path = ".".join(filter(None, (prefix, init_args["_display_name"])))
    names = sorted(key for key, value in arg_inputs.items() if value is not None)
    data = list(instance._inputs)
    positional = data[:len(data) - len(names)]
    static = {key: _plain(value) for key, value in {**init_args, **arguments}.items()
              if key not in _BOOKKEEPING and not key.startswith("_origin_stack")}
    outputs = list(instance.outputs)
    feed_name = outputs[0].name if schema == "ExternalSource" else None
    return DefinedOp(path, schema, op.device, positional,
                     dict(zip(names, data[len(positional):])), static, outputs, feed_name)


@contextmanager
def defined_ops(on_op: Callable[[DefinedOp], None]) -> Iterator[None]:
    """While a pipeline is defined on this thread, report each operator it makes (splits and
    merges of DALI's conditionals, DataNode arithmetic and external sources included), in the
    order they are made: `on_op(DefinedOp)`. Other threads' definitions are not reported."""
    thread = threading.get_ident()
    _defined_ops_lock.acquire()  # the class is DALI's, shared by all threads
    original = ops._OperatorInstance.__init__

    def init(self: Any, inputs: Any, arg_inputs: dict, arguments: dict, init_args: dict,
             op: Any) -> None:
        original(self, inputs, arg_inputs, arguments, init_args, op)
        if threading.get_ident() == thread:  # (arg_inputs: split in place by DALI)
            on_op(_defined_op(self, arg_inputs, arguments, init_args, op))

    ops._OperatorInstance.__init__ = init
    try:
        yield
    finally:
        ops._OperatorInstance.__init__ = original
        _defined_ops_lock.release()


_defined_ops_lock = threading.RLock()
