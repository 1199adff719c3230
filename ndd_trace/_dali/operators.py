"""Operators and eager's call rules: backends, eager's split of a call's arguments, its instance
keys, dtypes, metadata inference.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import numpy as np
import nvidia.dali.experimental.dynamic as ndd
import nvidia.dali.types as types
from nvidia.dali.data_node import DataNode
from nvidia.dali.experimental.dynamic import (_call_site, _eval_context, _invocation,
                                              _op_builder, _ops, _source_analysis)

from ..core.ir import TensorMeta
from ..core.keys import freeze, freeze_arguments
from . import analysis
from .base import DType, Device, device


def resolve_backend(op_class: type, device: Any, inputs: tuple,
                    input_devices: tuple[str, ...] | None = None) -> tuple[str, str]:
    """(device type, backend) exactly as ndd resolves them: "gpu" decoders become "mixed".
    `input_devices`: the device type of every input where all are known (recorded values);
    ndd's resolution depends on nothing else then, and is remembered."""
    if input_devices is not None and (device is None or type(device) is str):
        return _resolve_backend_of(op_class, device, "gpu" in input_devices)
    resolved, backend_name = _op_builder._resolve_backend(op_class, device, inputs)
    return resolved.device_type, backend_name


@functools.lru_cache(maxsize=4096)
def _resolve_backend_of(op_class: type, device: str | None, gpu_input: bool
                        ) -> tuple[str, str]:
    # ndd infers the device from the first GPU input (else the CPU): a stand-in that ndd reads
    # as a GPU input tells it the same
    inputs = (_GpuInputStandIn(),) if gpu_input and device is None else ()
    resolved, backend_name = _op_builder._resolve_backend(op_class, device, inputs)
    return resolved.device_type, backend_name


class _GpuInputStandIn:
    """What ndd's `_get_input_device` reads as data on the GPU (it has the CUDA array
    interface), for `_resolve_backend_of`; never fed anywhere."""

    __cuda_array_interface__ = None


@functools.lru_cache(maxsize=4096)
def input_device(op_class: type, backend_name: str, index: int, actual: str) -> str:
    """Where input `index` must be for this op (ndd copies it there implicitly)."""
    device = Device("gpu", 0) if backend_name != "cpu" else Device.CPU
    actual_device = Device(actual) if actual else None
    resolved = op_class._input_device(backend_name, index, actual_device, device)
    return resolved.device_type if resolved is not None else actual


# How eager ndd splits a call's keyword arguments
#
# ndd's function wrapper reads the caller's source (DALI's source analysis, memoized per call
# site): a tensor argument given a value the site shows to be constant (a literal, a name bound
# once to one) is a construction argument of the operator instance, any other is a per-call
# argument, converted to a Tensor. For nearly every op both give the same; not for all (a list
# in a variable passed as `warp_affine(matrix=...)` is a 1-D tensor argument, which DALI
# rejects). Operator instances are kept per EvalContext, keyed by that split.

_FN_PARAMETERS = frozenset(("batch_size", "device", "_backend", "_caller_frame"))


class EagerSplit(NamedTuple):
    """An eager call's split: construction arguments (decayed as ndd decays them) and the names
    of the per-call arguments, in ndd's order (a random op's `_random_state` last)."""

    init_args: dict
    call_args: tuple


@functools.cache
def _argument_kinds(op_class: type) -> tuple[frozenset, frozenset]:
    """(construction-only, tensor) argument names, as ndd's function wrapper sorts them."""
    schema = op_class._schema
    fixed, tensor = set(), set()
    for name in schema.GetArgumentNames():
        if name not in _op_builder._unsupported_args:
            (tensor if schema.IsTensorArgument(name) else fixed).add(name)
    if op_class._has_random_state_arg:
        tensor.add("rng")
    return frozenset(fixed), frozenset(tensor)


def call_site_frame(start: Any, kwargs: dict) -> Any:
    """The frame eager ndd analyses for a call made below `start` (past DALI's plumbing and
    ndd_trace's hooks); None for code ndd_trace generated (eager runs the user's own)."""
    frame = kwargs.get("_caller_frame") or _call_site.resolve_callsite_frame(start)
    if frame is None or frame.f_code.co_filename.startswith("<ndd_trace"):
        return None
    return frame


def eager_split(op_class: type, frame: Any, kwargs: dict) -> EagerSplit:
    """How eager ndd, called from `frame` with `kwargs`, splits them (see above)."""
    raw = {name: value for name, value in kwargs.items() if name not in _FN_PARAMETERS}
    if frame is not None:
        analysis.prepare(frame.f_code)  # its module's parse, from the warm-start cache
    constant = _source_analysis.constant_kwargs(frame, raw)
    fixed, tensor = _argument_kinds(op_class)
    init_args, call_args = {}, []
    for name, value in raw.items():
        if name == "max_batch_size":
            continue
        if name in fixed or (constant is not None and name in constant):
            value = _op_builder._scalar_decay(value)
            if value is not None:
                init_args[name] = value
        elif name in tensor and name != "rng" and _ops.unwrap_invariant(value) is not None:
            call_args.append(name)
    if op_class._has_random_state_arg:
        call_args.append("_random_state")
    return EagerSplit(init_args, tuple(call_args))


def call_split(op_class: type, inputs: list, device: str, batch_size: int | None,
               init_args: dict, call_args: dict) -> Any:
    """Call an operator as its ndd function does, with its construction and per-call
    arguments given (as eager's reading of the user's call site split them) instead of read
    from the calling site: the interpreter replays recorded calls from a line of its own, where
    eager would see no argument as constant (`stddev=2.0` would be per-call there). The same
    steps as `_op_builder`'s function (its instance from eager's cache, `Operator._get`)."""
    resolved, backend = _op_builder._resolve_backend(op_class, device, inputs)
    if batch_size is None:
        batch_size = _ops._infer_batch_size(*inputs, **call_args)
    _op_builder._check_batch_size_available(op_class, batch_size)
    init = {}
    for name, value in init_args.items():
        value = _op_builder._scalar_decay(value)
        if value is not None:
            init[name] = value
    inputs, call = op_class._process_params(backend, resolved, batch_size, *inputs, **call_args)
    instance = op_class._get(max_batch_size=_op_builder._next_pow2(batch_size or 1), name=None,
                             device=resolved, num_inputs=len(inputs),
                             call_arg_names=tuple(call.keys()), _backend=backend, inputs=inputs,
                             init_args=init, call_args=call)
    return instance(*inputs, batch_size=batch_size, _process_params=False, **call)


def tensor_argument(op_class: type, name: str, value: Any, batch_size: int | None = None
                    ) -> Any:
    """A Python value passed as a per-call tensor argument, converted as ndd converts it: a
    Tensor, or for a call of `batch_size` samples the Batch ndd broadcasts it to."""
    dtype = op_class._argument_conversion_map.get(name)
    if batch_size is not None:
        return _ops._to_batch(value, batch_size, device=Device.CPU, dtype=dtype).evaluate()
    return _ops._to_tensor(value, device=Device.CPU, dtype=dtype)


def tensor_argument_meta(op_class: type, name: str, value: Any) -> TensorMeta:
    """`meta_of(tensor_argument(...))`, without making the tensor for a plain number passed to
    an argument of a known type."""
    dtype = op_class._argument_conversion_map.get(name)
    if dtype is not None and type(value) in (int, float, bool):
        return TensorMeta("cpu", dtype.type_id.name, 0, None)
    return meta_of(tensor_argument(op_class, name, value))


_RANDOM_STATE_META = (1, None, types.DALIDataType.UINT32)


def eager_instance_key(op_class: type, backend_name: str, device_id: int | None,
                       batch_size: int | None, split: EagerSplit, input_metas: list,
                       arg_metas: dict) -> tuple:
    """The key under which eager ndd keeps this call's operator instance in its EvalContext
    (`Operator._get`): metadata as ndd's `_make_meta` gives it, of the data after ndd's
    conversion (arguments in the type the argument takes). `arg_metas`: every per-call
    argument's TensorMeta (a Python value's: of `tensor_argument`)."""
    is_batch = batch_size is not None

    def meta(value: TensorMeta, cast: Any = None) -> tuple:
        dtype = cast if cast is not None or value.dtype is None else \
            getattr(types.DALIDataType, value.dtype)
        return (is_batch, value.ndim, value.layout or None, dtype)

    conversions = op_class._argument_conversion_map
    call_metas = {}
    for name in split.call_args:
        if name == "_random_state":
            call_metas[name] = (is_batch, *_RANDOM_STATE_META)
        else:
            cast = conversions.get(name)
            call_metas[name] = meta(arg_metas[name], cast.type_id if cast is not None else None)
    placed = device("gpu", device_id) if backend_name != "cpu" else Device.CPU
    return _InstanceKey((op_class, backend_name, placed, _op_builder._next_pow2(batch_size or 1),
                         len(input_metas), split.call_args, _frozen_args(split.init_args),
                         tuple(meta(value) for value in input_metas), _frozen_args(call_metas)))


class _InstanceKey(tuple):
    """An instance key that hashes once (its items' hashes run Python code: ~2 us a call);
    equal to, and hashed as, the plain tuple eager ndd makes."""

    def __init__(self, items: tuple) -> None:
        self._hash = tuple.__hash__(self)

    def __hash__(self) -> int:
        return self._hash


def eager_instance_key_for_batch(key: tuple, batch_size: int) -> tuple:
    """`key` (from `eager_instance_key`) for a call of the same site with this batch size."""
    max_batch_size = _op_builder._next_pow2(batch_size)
    if key[3] == max_batch_size:
        return key
    return _InstanceKey((*key[:3], max_batch_size, *key[4:]))


def _frozen_args(args: dict) -> tuple:
    return tuple((name, tuple(value) if isinstance(value, list) else value)
                 for name, value in sorted(args.items()))


_current_context = _eval_context.EvalContext.current


def keep_eager_instance(op_class: type, key: tuple, init_args: dict) -> None:
    """Put an operator instance under `key` in the current EvalContext's cache, as an eager
    call leaves one there (constructed as ndd constructs it, only where none is)."""
    cache = _current_context()._instance_cache
    if key in cache:  # (raises TypeError for an unhashable argument, as ndd's lookup does)
        return
    placed = key[2]
    with placed:
        instance = op_class(key[3], name=None, device=placed, _backend=key[1], **init_args)
    instance._cache = cache
    instance._key = key
    cache[key] = instance


class _HeldCalls(tuple):
    def __reduce__(self) -> tuple:  # (pickled as none: an error pickles as it was made)
        return tuple, ()


def invocations_held_by(error: BaseException) -> tuple:
    """The operator invocations the frames of `error`'s traceback hold: while one lives, its
    operator instance stays out of the EvalContext's cache (it goes back when the invocation
    is freed), so that an eager call's kept error keeps its failed instance from the next
    call."""
    held = []
    trace = error.__traceback__
    while trace is not None:
        held.extend(value for value in trace.tb_frame.f_locals.values()
                    if type(value) is _invocation.Invocation)
        trace = trace.tb_next
    return _HeldCalls(held)


def argument_dtype(op_class: type, name: str) -> str | None:
    dtype = op_class._argument_conversion_map.get(name)
    return dtype.type_id.name if dtype is not None else None


def op_class_at(path: str) -> type:
    """The ndd operator class of `fn.<path>` ("decoders.image_crop"), for rewrites that make a
    call the user did not write (optimize.py)."""
    function: Any = ndd
    for part in path.split("."):
        function = getattr(function, part)
    return function._op_class


@functools.cache
def argument_names(op_class: type) -> frozenset[str]:
    """Every argument the op's schema takes (its own and those all ops share)."""
    return frozenset(op_class._schema.GetArgumentNames())


def has_gpu_backend(op_class: type) -> bool:
    """Whether DALI has a "gpu" implementation of the op."""
    return "gpu" in op_class._supported_backends


# The Python values eager's split decides about (above): a construction argument where the call
# site shows the value to be constant, else a per-call tensor argument ndd converts (a number,
# numpy's scalars too, to a 0-d tensor, a list to a 1-d one; arrays and data are tensor
# arguments either way)
SPLIT_VALUES = frozenset((list, tuple, int, float, bool,
                          *(np.dtype(code).type for code in "?bhilqBHILQefd")))


@functools.lru_cache(maxsize=8192)
def is_tensor_argument(op_class: type, name: str) -> bool:
    schema = op_class._schema
    try:
        return name in schema.GetArgumentNames(include_hidden=True) and \
            schema.IsTensorArgument(name)
    except RuntimeError:
        return False


_PLAIN_SCALARS = frozenset((int, float, bool, str, type(None)))


NOT_PLAIN = object()


def decay_plain(value: Any) -> Any:
    """`decay_static(value)` for what ndd leaves as it is: a plain number, string or None, or
    a list or tuple of them (copied); NOT_PLAIN for anything else."""
    kind = type(value)
    if kind in _PLAIN_SCALARS:
        return value
    if (kind is list or kind is tuple) and all(type(v) in _PLAIN_SCALARS for v in value):
        return kind(value)
    return NOT_PLAIN


def decay_static(value: Any) -> Any:
    """ndd's conversion of Python-side arguments (DType -> DALIDataType, Device -> "gpu")."""
    plain = decay_plain(value)
    if plain is not NOT_PLAIN:
        return plain
    if isinstance(value, (list, tuple)):
        return type(value)(decay_static(v) for v in value)
    return _op_builder._scalar_decay(value)


def argument_token(value: Any) -> Any:
    """A hashable description of a Python-side operator argument such that equal tokens give
    the same static argument to DALI, bit for bit: `keys.freeze`'s (`1`, `1.0`, `True`, `-0.0`
    and `0.0` all differ, and so do NaNs of another sign), for what it describes cheaply (plain
    values and lists of them, dtypes, devices, DALI's enums); None for anything else (data,
    numpy values, user objects)."""
    kind = type(value)
    if kind in _PLAIN_SCALARS or kind is float:
        return freeze(value)
    if kind is list or kind is tuple:
        for item in value:
            if type(item) not in _PLAIN_SCALARS and type(item) is not float:
                return None
        return freeze(value)
    if kind is DType:
        return (kind, value.type_id)
    if kind is Device:
        return (kind, value.device_type, value.device_id)
    if kind.__module__ == "nvidia.dali.backend_impl.types":  # DALI's enums (interp types...)
        return (kind, int(value))
    return None


@functools.lru_cache(maxsize=64)
def dtype_of(name: str) -> DType:
    """The ndd DType of a DALIDataType name ("UINT8")."""
    return DType.from_type_id(getattr(types.DALIDataType, name))


@functools.cache
def _public_dtypes() -> dict[Any, str]:
    return {value.type_id: name for name, value in vars(ndd).items()
            if isinstance(value, DType) and not name.startswith("_")}


def dtype_public_name(dtype: DType) -> str:
    """How a user writes this dtype (`ndd.float32`)."""
    name = _public_dtypes().get(dtype.type_id)
    return f"ndd.{name}" if name else str(dtype)


def dtype_name(dtype: Any) -> str | None:
    if dtype is None:
        return None
    if isinstance(dtype, DType):
        return dtype.type_id.name
    if isinstance(dtype, types.DALIDataType):
        return dtype.name
    return ndd.dtype(dtype).type_id.name


def meta_of(value: Any) -> TensorMeta:
    """Static metadata of a concrete Batch or Tensor (evaluates nothing new for DALI data)."""
    device, dtype, ndim, layout = data_signature(value)
    return TensorMeta(device, dtype_name(dtype), ndim, layout or None)


def data_signature(value: Any) -> tuple:
    """What `meta_of` reads from a concrete Batch or Tensor, unconverted: equal signatures give
    equal metadata (a cheap check of a call's data against the last call's)."""
    return value.device.device_type, value.dtype, value.ndim, value.layout


def _fake_node(name: str, meta: TensorMeta, device: str) -> DataNode:
    return DataNode(name=name, device=device, source=None,
                    ndim=meta.ndim if meta.ndim is not None else None,
                    dtype=getattr(types.DALIDataType, meta.dtype) if meta.dtype else None,
                    layout=meta.layout or "")


_metadata_cache: dict[Any, tuple] = {}
_METADATA_CACHE_SIZE = 4096


def infer_metadata(op_class: type, backend_name: str, static: dict[str, Any],
                   input_metas: list[TensorMeta], arg_metas: dict[str, TensorMeta],
                   frozen: Any = None,
                   ) -> tuple[int, tuple[str, ...] | None, list[TensorMeta]]:
    """Validate the arguments and infer outputs, as ndd's `_init_spec` does, without running.

    Raises DALI's own error when an argument is invalid. Memoized: building the legacy operator
    costs far more than a dictionary look-up, and transparent mode records every iteration.
    `frozen`: `keys.freeze_arguments(static)`, where the caller made it already.
    """
    try:
        if frozen is None:
            frozen = freeze_arguments(static)
        key = (op_class, backend_name, frozen,
               tuple(input_metas), tuple(sorted(arg_metas.items())) if arg_metas else ())
    except TypeError:  # an unhashable static value: no memo
        return _infer_metadata(op_class, backend_name, static, input_metas, arg_metas)
    cached = _metadata_cache.get(key)
    if cached is None:
        cached = _infer_metadata(op_class, backend_name, static, input_metas, arg_metas)
        if len(_metadata_cache) >= _METADATA_CACHE_SIZE:
            _metadata_cache.clear()
        _metadata_cache[key] = cached
    return cached


def _infer_metadata(op_class: type, backend_name: str, static: dict[str, Any],
                    input_metas: list[TensorMeta], arg_metas: dict[str, TensorMeta],
                    ) -> tuple[int, tuple[str, ...] | None, list[TensorMeta]]:
    inputs = [_fake_node(f"input_{i}", meta, meta.device) for i, meta in enumerate(input_metas)]
    args = {name: _fake_node(f"arg_{name}", meta, "cpu") for name, meta in arg_metas.items()}
    device_id = 0 if backend_name != "cpu" else None
    with Device("gpu", device_id) if device_id is not None else Device.CPU:
        op = op_class._legacy_op(device=backend_name, **static)
        out = op(*inputs, **args)
    names = None
    if isinstance(out, dict):
        names = tuple(out.keys())
        nodes = list(out.values())
    elif isinstance(out, (list, tuple)):
        nodes = list(out)
    else:
        nodes = [out]
    spec = nodes[0].source.spec
    metas = []
    try:
        spec.InferOutputMetadata()
        descs = [spec.OutputDesc(i) for i in range(len(nodes))]
    except Exception:
        # ndd runs this very inference at the call (`Operator._init_spec`) with the inputs'
        # real metadata and raises what it raises (a 2-D image to resize: ValueError). Where
        # ours is as complete as eager's, so is the verdict; otherwise outputs are unknown.
        if all(meta.ndim is not None and meta.dtype is not None
               for meta in (*input_metas, *arg_metas.values())):
            raise
        descs = [None] * len(nodes)
    for node, desc in zip(nodes, descs):
        if desc:
            layout = str(desc[4]) if desc[4] is not None else None
            if desc[2] is not None:
                layout = layout or None  # a known ndim: a known layout, None if it has none
            # else "" stays: a known layout (none) of an unknown ndim, which ndd answers
            # without running the op (a random op given its shape as data)
            dtype = desc[3]
            metas.append(TensorMeta(node.device, dtype.name if dtype is not None else None,
                                    desc[2], layout, desc[4] is not None))
        else:
            metas.append(TensorMeta(node.device))
    if op_class._schema_name == "PerFrame" and descs[0] and descs[0][4] is None and input_metas:
        metas[0] = TensorMeta(metas[0].device, metas[0].dtype, metas[0].ndim,
                              _per_frame_layout(input_metas[0], static))
    return len(nodes), names, metas


def _per_frame_layout(meta: TensorMeta, static: dict[str, Any]) -> str | None:
    """The layout `ndd.per_frame` gives its input. DALI's inference leaves it open (eager ndd
    runs the op to learn it, at the first read or at the call of an op it feeds), and an op fed
    by a per-frame value infers from it (warp_affine with per-frame matrices: FHWC), so a
    recorded call must know it: PerFrame only relabels the outer dimension as frames."""
    layout = meta.layout or ""
    if not layout:
        return "F" + "*" * (meta.ndim - 1) if meta.ndim else None
    if layout[0] == "F":
        return layout
    if static.get("replace"):
        return "F" + layout[1:]
    return None  # DALI rejects it when the op runs
