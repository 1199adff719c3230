"""The one module that touches DALI internals. A DALI upgrade should be this file's work alone.

    for function in op_functions():            # every ndd operator function (ndd.resize, ...)
        ...
    with intercept(handler):                   # ndd calls go to handler(op, args, kwargs)
        ...
    meta = infer_metadata(op_class, "cpu", static, input_metas, arg_metas)

Tested with nvidia-dali-cuda120 2.4.x. What it relies on (private, may change between releases):
makefun-generated operator functions that call `_func_impl_` from their own globals;
`Operator._legacy_op`, `_schema`, `_has_random_state_arg`, `_is_stateful`,
`_argument_conversion_map`, `_input_device`; `_op_builder._resolve_backend`, `_scalar_decay`,
`_unsupported_args` and `_next_pow2`; `_ops._to_tensor`; `random._draw_state`; `Batch._storage`;
`TensorList._make_copy`; `_source_analysis.constant_kwargs` and
`_call_site.resolve_callsite_frame` (eager's call-site analysis); `EvalContext._instance_cache`
and the key format of `Operator._get`; `Operator._supported_backends`.
"""

from __future__ import annotations

import base64
import ctypes
import functools
import inspect
import re
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

import numpy as np

import nvidia.dali as dali
import nvidia.dali.backend as backend
import nvidia.dali.experimental.dynamic as ndd
import nvidia.dali.types as types
from nvidia.dali import fn
from nvidia.dali.data_node import DataNode
from nvidia.dali.experimental.dynamic import (_call_site, _capture, _eval_context, _exceptions,
                                              _op_builder, _ops, _source_analysis)
from nvidia.dali.experimental.dynamic import random as ndd_random
from nvidia.dali.pipeline import Pipeline

from .ir import TensorMeta, freeze
from .source import hide_own_frames

DALI_VERSION = dali.__version__
Batch = ndd.Batch
Tensor = ndd.Tensor
RNG = ndd_random.RNG
DType = ndd.DType
Device = ndd.Device
EvalMode = ndd.EvalMode
STATE_WORDS = ndd_random._STATE_WORDS

__all__ = ["Batch", "Tensor", "RNG", "Pipeline", "fn", "types", "ndd"]


# ---------------------------------------------------------------------------------------------
# Operator discovery and interception

_NAMESPACES = ("", "decoders", "random", "math", "reductions", "transforms", "noise",
               "segmentation", "experimental", "experimental.decoders", "experimental.inputs",
               "io", "plugin", "numba", "pytorch", "optical_flow", "audio", "image")


def _namespace_modules() -> Iterator[Any]:
    seen = set()
    for path in _NAMESPACES:
        module = ndd
        for part in filter(None, path.split(".")):
            module = getattr(module, part, None)
            if module is None:
                break
        if module is not None and id(module) not in seen:
            seen.add(id(module))
            yield module


_op_functions_found: tuple[tuple, list[Callable]] | None = None


def op_functions() -> list[Callable]:
    """Every ndd operator function (ndd.resize, ndd.decoders.image, ...), each once. Scanned
    again only when a namespace module gained or lost names (hooks are installed often)."""
    global _op_functions_found
    modules = list(_namespace_modules())
    fingerprint = tuple((id(module), len(vars(module))) for module in modules)
    if _op_functions_found is not None and _op_functions_found[0] == fingerprint:
        return _op_functions_found[1]
    found: dict[int, Callable] = {}
    for module in modules:
        for value in vars(module).values():
            if (callable(value) and getattr(value, "_generated", False)
                    and hasattr(value, "_op_class")
                    and "_func_impl_" in getattr(value, "__globals__", {})):
                found[id(value)] = value
    _op_functions_found = (fingerprint, list(found.values()))
    return _op_functions_found[1]


def op_path(op_class: type) -> str:
    """The pipeline-mode path of an op (`decoders.image`), usable as `fn.<path>`."""
    return op_class._fn_path


def is_random(op_class: type) -> bool:
    return bool(op_class._has_random_state_arg)


def is_stateful(op_class: type) -> bool:
    return bool(op_class._is_stateful) and not op_class._has_random_state_arg


def capture_running() -> bool:
    """Whether DALI's own capture mode (`next_epoch(capture=True)`, `source.captured()`) is
    running a loop body on this thread: its calls are DALI's to record, not ndd_trace's."""
    context = getattr(_capture.CaptureContext._tls, "current", None)
    return context is not None and context.state is not _capture.State.DISABLED


def _plumbing(function: Callable) -> Callable:
    """Mark a hook as plumbing, so DALI's capture mode resolves call sites past it (it keys
    captured calls by the user's frame)."""
    return _call_site.mark_transparent(function)


# Transparent mode's handlers sit between the user's call and the eager op call: marked, DALI's
# call-site analysis of an eager call (constant arguments, a libcst parse of the caller's module)
# looks at the user's line, as a plain eager call does, not at ndd_trace's module (1-2 s).
plumbing = _plumbing


class _Interceptor:
    """Swaps each operator function's implementation for a hook, reference-counted per process.

    The hook consults a thread-local handler, so threads that are not tracing run eagerly as if
    nothing were installed; so do the loop bodies DALI's capture mode is recording or replaying
    (ndd_trace steps aside there: results, warnings and errors are capture mode's own).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0
        self._originals: dict[int, tuple[Callable, Callable]] = {}
        self._local = threading.local()
        # hooks made once per patched place and reused: a checked loop installs them at every
        # epoch, and making ~1,500 hooks anew took 3-4 ms each time
        self._hooks: dict[Any, tuple[Callable, Callable]] = {}

    def handler(self) -> Callable | None:
        return getattr(self._local, "handler", None)

    def _make_hook(self, original: Callable, op_class: type) -> Callable:
        local = self._local

        def hook(*inputs: Any, **kwargs: Any) -> Any:
            handler = getattr(local, "handler", None)
            if handler is None or capture_running():
                return original(*inputs, **kwargs)
            try:
                return handler(op_class, original, inputs, kwargs)
            except Exception as error:  # the eager call's error, with the eager traceback
                hide_own_frames(error)
                raise

        hook._ndd_trace_original = original  # type: ignore[attr-defined]
        return _plumbing(hook)

    def _make_reader_hook(self, original: Callable) -> Callable:
        local = self._local

        def next_epoch(reader: Any, *args: Any, **kwargs: Any) -> Any:
            on_reader = getattr(local, "on_reader", None)
            if on_reader is not None:
                replacement = on_reader(reader, *args, **kwargs)
                if replacement is not None:
                    return replacement
            return original(reader, *args, **kwargs)

        next_epoch._ndd_trace_original = original  # type: ignore[attr-defined]
        return _plumbing(next_epoch)

    def _make_method_hook(self, original: Callable, kind: str) -> Callable:
        """Operator objects (`ndd.ops.X(...)(x)`, readers called directly) and ExternalSource
        pulls are not recorded: while tracing, `on_reader(kind, object)` decides (a trace
        breaks; transparent mode lets them run eagerly and counts them)."""
        local = self._local

        def method(obj: Any, *args: Any, **kwargs: Any) -> Any:
            on_reader = getattr(local, "on_reader", None)
            if on_reader is not None and not capture_running():
                replacement = on_reader(obj, *args, _ndd_trace_kind=kind, **kwargs)
                if replacement is not None:
                    return replacement
            try:
                return original(obj, *args, **kwargs)
            except Exception as error:  # as without the hook (below an op hook: done there)
                hide_own_frames(error)
                raise

        method._ndd_trace_original = original  # type: ignore[attr-defined]
        return _plumbing(method)

    def _patch(self, owner: type, name: str, hook: Callable) -> None:
        original = owner.__dict__.get(name)
        if original is None or hasattr(original, "_ndd_trace_original"):
            return
        made = self._hooks.get((owner, name))
        if made is not None and made[0] is original:
            patched = made[1]
        else:
            patched = hook(original)
            # help(), IDEs and DALI's own docs tests read these off the class while the hook is
            # in place; no `__wrapped__`: DALI's call-site marking would follow it to ndd's method
            for attribute in ("__module__", "__name__", "__qualname__", "__doc__"):
                if hasattr(original, attribute):
                    setattr(patched, attribute, getattr(original, attribute))
            try:  # inspect.signature() answers ndd's own (hooks are made once: ~0.1 ms each)
                patched.__signature__ = inspect.signature(original)
            except (TypeError, ValueError):
                pass
            self._hooks[(owner, name)] = (original, patched)
        setattr(owner, name, patched)
        self._patched.append((owner, name, original))

    def _install(self) -> None:
        self._patched = []
        self._patch(_ops.Reader, "next_epoch", self._make_reader_hook)
        for op_class in _ops._all_ops:
            self._patch(op_class, "__call__", lambda o: self._make_method_hook(o, "operator"))
        self._patch(ndd.ExternalSource, "__call__",
                    lambda o: self._make_method_hook(o, "external_source"))
        self._patch(ndd.ExternalSource, "captured",
                    lambda o: self._make_method_hook(o, "external_source.captured"))
        for function in op_functions():
            namespace = function.__globals__
            original = namespace["_func_impl_"]
            if hasattr(original, "_ndd_trace_original"):
                continue
            made = self._hooks.get(id(function))
            if made is None or made[0] is not original:
                made = self._hooks[id(function)] = (
                    original, self._make_hook(original, function._op_class))
            namespace["_func_impl_"] = made[1]
            self._originals[id(function)] = (function, original)

    def _uninstall(self) -> None:
        for owner, name, original in self._patched:
            setattr(owner, name, original)
        self._patched = []
        for function, original in self._originals.values():
            function.__globals__["_func_impl_"] = original
        self._originals.clear()

    @contextmanager
    def active(self, handler: Callable, on_reader: Callable | None = None) -> Iterator[None]:
        release = self.hold()
        previous = getattr(self._local, "handler", None), getattr(self._local, "on_reader", None)
        self._local.handler, self._local.on_reader = handler, on_reader
        try:
            yield
        finally:
            self._local.handler, self._local.on_reader = previous
            release()

    def hold(self) -> Callable[[], None]:
        """Keep the hooks installed, with no handler of its own, until the returned function is
        called: a loop that switches interception on and off at every step does not reinstall
        them each time (ops called in between run eagerly: their thread has no handler)."""
        with self._lock:
            if self._count == 0:
                self._install()
            self._count += 1
        released = False

        def release() -> None:
            nonlocal released
            if released:
                return
            released = True
            with self._lock:
                self._count -= 1
                if self._count == 0:
                    self._uninstall()

        return release

    @contextmanager
    def suspended(self) -> Iterator[None]:
        """Run eagerly inside a trace (used to evaluate constants the user computes)."""
        previous = getattr(self._local, "handler", None), getattr(self._local, "on_reader", None)
        self._local.handler, self._local.on_reader = None, None
        try:
            yield
        finally:
            self._local.handler, self._local.on_reader = previous


_interceptor = _Interceptor()


_WATCHED: dict[tuple[type, str], Callable] = {}  # (class, method) -> ndd's own function


def watch_method(owner: type, name: str, callback: Callable,
                 during_traces: bool = False) -> None:
    """From now on, `obj.name(*args, **kwargs)` (a method of `owner`) called outside any trace
    returns `callback(obj, original, args, kwargs)`, `original` being ndd's own function. The
    class gets one wrapper, installed once (user objects are never patched). Where the
    interceptor hooks the method too (it goes on top while tracing), the wrapper steps aside
    while a trace or transparent mode runs; `during_traces`: it never does (a method the
    interceptor leaves alone)."""
    with _interceptor._lock:
        if (owner, name) in _WATCHED:
            return
        current = owner.__dict__[name]
        original = getattr(current, "_ndd_trace_original", current)

        def watched(obj: Any, *args: Any, **kwargs: Any) -> Any:
            if not during_traces and _interceptor.handler() is not None:
                return original(obj, *args, **kwargs)
            return callback(obj, original, args, kwargs)

        for attribute in ("__module__", "__name__", "__qualname__", "__doc__"):
            setattr(watched, attribute, getattr(original, attribute, None))
        try:
            watched.__signature__ = inspect.signature(original)  # type: ignore[attr-defined]
        except (TypeError, ValueError):
            pass
        _WATCHED[(owner, name)] = original
        if current is original:
            setattr(owner, name, watched)
        else:  # the interceptor's hook is on top: it restores the watch when it goes
            _interceptor._patched = [
                (cls, attribute, watched if saved is original else saved)
                for cls, attribute, saved in _interceptor._patched]


def unwatched(owner: type, name: str) -> Callable:
    """ndd's own function of a method that `watch_method` (or the interceptor) wraps."""
    found = _WATCHED.get((owner, name))
    if found is not None:
        return found
    current = owner.__dict__[name]
    return getattr(current, "_ndd_trace_original", current)


def watch_reader_methods(on_epoch: Callable, on_metadata: Callable) -> None:
    """`reader.next_epoch` (outside traces) and `reader.get_metadata` go to these callbacks
    (see `watch_method`); `reader.set_state` refuses ndd_trace 0.1's own checkpoint format
    clearly (`check_reader_state`)."""
    watch_method(_ops.Reader, "next_epoch", on_epoch)
    watch_method(_ops.Reader, "get_metadata", on_metadata, during_traces=True)
    watch_method(_ops.Reader, "set_state", _checked_set_state, during_traces=True)


def _checked_set_state(reader: Any, original: Callable, args: tuple, kwargs: dict) -> Any:
    if args:
        check_reader_state(args[0])
    elif "state" in kwargs:
        check_reader_state(kwargs["state"])
    return original(reader, *args, **kwargs)


def intercept(handler: Callable, on_reader: Callable | None = None) -> Any:
    """Context manager: while active, this thread's ndd operator calls go to `handler`, and
    `reader.next_epoch()` calls to `on_reader(reader)`."""
    return _interceptor.active(handler, on_reader)


def hold_interception() -> Callable[[], None]:
    """Keep the ndd hooks installed until the returned function is called (see `intercept`)."""
    return _interceptor.hold()


def eager_inside_trace() -> Any:
    return _interceptor.suspended()


def tracing_active() -> bool:
    """Whether this thread's ndd calls go to a handler (a trace or transparent mode)."""
    return _interceptor.handler() is not None


def schema_name(op_class: type) -> str:
    return op_class._schema_name


# ---------------------------------------------------------------------------------------------
# Operator facts

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


# ---------------------------------------------------------------------------------------------
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
    the same static argument to DALI, bit for bit: `ir.freeze`'s (`1`, `1.0`, `True`, `-0.0`
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
def device(kind: str, device_id: int | None) -> Device:
    """An ndd Device (shared: ndd never changes one)."""
    return Device(kind, device_id)


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
    `frozen`: `ir.freeze(static)`, where the caller made it already.
    """
    try:
        key = (op_class, backend_name, frozen if frozen is not None else freeze(static),
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
                                    desc[2], layout))
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


# ---------------------------------------------------------------------------------------------
# Random state

# ---------------------------------------------------------------------------------------------
# Readers owned by compiled loops

Reader = _ops.Reader


def reader_name(reader: Any) -> str:
    """The reader's instance name (its operator's name in a pipeline)."""
    return reader._name


def reader_shard_id(reader: Any) -> int:
    return reader._shard_id


def reader_transferred(reader: Any) -> bool:
    """Whether the reader's operator was moved into a pipeline (it cannot run eagerly)."""
    return bool(getattr(reader, "_transferred", False))


def reader_fn_path(reader: Any) -> str:
    """`readers.file` for an ndd.readers.File instance."""
    op_class = type(reader)
    return ".".join([*op_class._schema.ModulePath(), fn._to_snake_case(op_class._op_name)])


def reader_static_args(reader: Any) -> dict[str, Any]:
    """The pipeline-mode arguments of a reader, its instance name included (for the transfer)."""
    args = {k: v for k, v in reader._init_args.items() if v is not None and k != "num_inputs"}
    args["name"] = reader._name
    return args


def reader_has_tensor_args(reader: Any) -> bool:
    return bool(reader._raw_tensor_args)


def reader_metadata(reader: Any) -> tuple[int, tuple[str, ...] | None, list[TensorMeta]]:
    static = {k: v for k, v in reader_static_args(reader).items() if k != "name"}
    return infer_metadata(type(reader), "cpu", static, [], {})


def _raise_as_eager_epoch(reader: Any, batch_size: int) -> None:
    """Raise the error eager ndd's `next_epoch(batch_size=...)` raises at its first step for
    this reader (its own type and text: the checks come before it reads anything)."""
    next(_ops.Reader._batches(reader, batch_size, None))
    raise RuntimeError(f"ndd_trace: eager ndd accepted batch_size {batch_size} for reader "
                       f"{reader._name}, where ndd_trace expected an error")  # another DALI?


def claim_reader(reader: Any, batch_size: int) -> Any:
    """Create the reader's operator as eager ndd would (same seed and state), and return it to
    be moved into a pipeline with `transfer_reader`; the checks, and their errors, are eager's
    (`next_epoch(batch_size=...)` at its first step)."""
    reader._check_not_disabled()
    if reader._capture_mode is True:
        raise RuntimeError(f"reader {reader._name} is used by DALI's capture mode")
    if reader._op_backend is None:
        reader._require_api_type("batches")
        if reader._max_batch_size and reader._max_batch_size < batch_size:
            _raise_as_eager_epoch(reader, batch_size)
        reader._max_batch_size = batch_size
        reader._init_backend(ndd.EvalContext.current(), (),
                             reader._process_tensor_args(batch_size))
    else:
        reader._require_api_type("batches")
        reader_uses_batch_size(reader, batch_size)
    return reader._op_backend


def transfer_reader(pipe: Pipeline, reader: Any, backend_op: Any) -> None:
    pipe._transfer_operator(reader._name, backend_op)
    reader._transferred = True


def reader_epoch_request(reader: Any, args: tuple, kwargs: dict,
                         any_context: bool = False, check: bool = True) -> int | None:
    """`reader.next_epoch(*args, **kwargs)` as eager ndd starts it (checks, capture-mode flag);
    the batch size of a batch epoch, or None where eager ndd must run it itself (samples,
    capture=True, a reader in capture mode, and unless `any_context`, an explicit EvalContext:
    a reader already in a pipeline gives its batches whatever the context)."""
    bound = dict(zip(("batch_size", "ctx", "capture"), args), **kwargs)
    if set(bound) - {"batch_size", "ctx", "capture"} or (
            bound.get("ctx") is not None and not any_context) or \
            bound.get("capture") or reader._capture_mode is True:
        return None
    batch_size = reader._get_batch_size(_ops.unwrap_invariant(bound.get("batch_size")))
    if batch_size is None:
        return None
    if check:  # (what eager's next_epoch does first: `check=False` leaves the reader as it is)
        reader._check_not_disabled()
        reader._capture_mode = False
    return int(batch_size)


def stand_in_batch(meta: TensorMeta, batch_size: int) -> Batch:
    """A Batch of `batch_size` empty samples with this metadata: what a trace needs of a reader
    output it does not read (export describes a compiled loop so)."""
    dtype = np.dtype(types.to_numpy_type(getattr(types.DALIDataType, meta.dtype)))
    sample = np.zeros((0,) * (meta.ndim or 1), dtype=dtype)
    return ndd.as_batch([sample] * batch_size, layout=meta.layout or None)


def reader_epoch_captures(args: tuple, kwargs: dict) -> bool:
    """Whether `next_epoch(*args, **kwargs)` asks for DALI's capture mode."""
    return bool(dict(zip(("batch_size", "ctx", "capture"), args), **kwargs).get("capture"))


def reader_epoch_as_eager(reader: Any, args: tuple, kwargs: dict) -> None:
    """Start `reader.next_epoch(*args, **kwargs)` the way eager ndd does on a reader that gave
    batch epochs, for its checks alone: a `capture=True` request raises DALI's own error
    ("cannot switch to capture mode"). Returns if eager ndd would accept the request."""
    method = unwatched(_ops.Reader, "next_epoch")
    if reader_epoch_captures(args, kwargs):
        method(reader, *args, **kwargs)  # raises for a reader no longer in capture mode


def reader_uses_batch_size(reader: Any, batch_size: int) -> None:
    """Eager ndd's check of a later epoch's batch size against the reader's operator (its own
    error where it fails)."""
    if reader._max_batch_size and reader._max_batch_size != batch_size:
        _raise_as_eager_epoch(reader, batch_size)


def reader_metadata_of(pipe: Pipeline, reader: Any) -> dict:
    return pipe.reader_meta(reader._name)


def shard_steps(reader: Any, epoch_size_padded: int, batch_size: int) -> int:
    """Batches in this reader's next epoch, exactly as ndd's `next_epoch` counts them."""
    shard = _ops._shard_size(epoch_size_padded, reader._shard_id, reader._num_shards)
    return -(-shard // batch_size)


def advance_shard(reader: Any) -> None:
    reader._advance_shard()


def feed(pipe: Pipeline, name: str, data: Any) -> None:
    """`pipe.feed_input(name, data)` for a TensorList, without its per-call search of the graph
    for a source callback (our external sources never have one) or its argument checks (the
    data is a TensorList already, fed without a layout, as `_feed_input` would pass it on)."""
    if type(data) is backend.TensorListCPU:
        pipe._pipe.SetExternalTLInput(name, data, None, False)
    elif type(data) is backend.TensorListGPU:
        stream = data.stream
        pointer = types._raw_cuda_stream_ptr(stream) if stream is not None else None
        pipe._pipe.SetExternalTLInput(name, data, pointer, False)
    else:
        pipe._feed_input(name, data)


def schedule_one(pipe: Pipeline) -> None:
    """Schedule exactly one iteration (Pipeline.schedule_run prefetches a whole queue at first).
    Our pipelines have no source callbacks and no `iter_setup`, and run asynchronously: this is
    `Pipeline._run_once` without its per-call API-scope object and callback scan."""
    if pipe._input_callbacks or not pipe._exec_async or type(pipe).iter_setup is not \
            Pipeline.iter_setup:
        pipe._run_once()
        return
    pipe._batches_to_consume += 1
    pipe._pipe.Run()


def pipeline_outputs(pipe: Pipeline) -> tuple:
    """`pipe.outputs()` (the oldest scheduled iteration's outputs, synchronized with the host)
    without the per-call API-scope object."""
    if pipe._batches_to_consume == 0:
        raise StopIteration
    pipe._consumer_iter += 1
    pipe._batches_to_consume -= 1
    return tuple(pipe._pipe.Outputs(None))


# Operators that kill the process (SIGSEGV) on samples with a zero-size dimension (1x0) whose
# data pointer is null, as DALI allocates them (a pipeline's copy of fed data has one; eager ndd
# given the user's numpy data does not): DALI 2.4's separable convolutions. A sweep of the
# common CPU image ops in a pipeline (blurs, resize, rotate, warps, crops, color ops, normalize,
# pad, slice, transpose, paste, erase, reductions, ...) on 1x0, 0x2 and 2x2x0 samples found
# only these.
_EMPTY_SAMPLE_UNSAFE = frozenset(("GaussianBlur", "Laplacian"))


def crashes_on_empty_samples(schema: str | None) -> bool:
    """Whether a pipeline running this operator crashes on a sample with no elements."""
    return schema in _EMPTY_SAMPLE_UNSAFE


def has_empty_sample(value: Any) -> bool:
    """Whether a Batch, Tensor or TensorList holds a sample with no elements."""
    if isinstance(value, (Batch, Tensor)):
        value = value.evaluate()._storage
    if isinstance(value, (backend.TensorCPU, backend.TensorGPU)):
        return 0 in value.shape()
    if isinstance(value, (backend.TensorListCPU, backend.TensorListGPU)):
        return any(0 in shape for shape in value.shape())
    return False


def park_failed_pipeline(pipe: Pipeline) -> None:
    """Set aside, for good, a pipeline whose run failed. An operator that fails part-way through
    a batch can leave work queued in DALI's (old) thread pool that never starts, and the
    pool's destructor then waits for it forever: freeing such a pipeline hangs the process,
    where it is freed or at exit, in DALI's own shutdown hook (a hand-written @pipeline_def
    too). It is shut down (its executor's threads stop), taken off that hook's list, and its
    backend object is never freed (its pool's few idle threads and memory stay)."""
    held = pipe._pipe
    if held is None:
        return
    try:
        held.Shutdown()
    except Exception:  # noqa: BLE001 (a failed pipeline may refuse; it is set aside anyway)
        pass
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(held))  # not freed by the interpreter's exit
    pipe._pipe = None
    Pipeline._pipes.discard(weakref.ref(pipe))


def frees_after_failure(schema: str | None) -> bool:
    """Whether a pipeline whose run failed in this operator can be freed: a decoder fails (a
    corrupt file) in the codec's own threads, leaving DALI's thread pool idle; any other op may
    leave work queued there (park_failed_pipeline)."""
    return schema is not None and "decoders__" in schema


ExternalSource = ndd.ExternalSource


def external_source_pull(source: Any, batch_size: int) -> tuple:
    """One item of an ndd.ExternalSource, converted exactly as `source(batch_size=...)` does
    (raises StopIteration at its end); a tuple of Batches (or Tensors), one per output."""
    data = source._callback()
    return tuple(source._convert_outputs(data, batch_size))


def default_rng() -> RNG:
    return ndd_random.get_default_rng()


def existing_default_rng() -> RNG | None:
    """This thread's default generator if ndd has made it yet, else None (making one draws its
    seed from Python's `random`: eager ndd does that at its first random op, not before)."""
    return getattr(ndd_random._thread_local, "default_rng", None)


def forget_default_rng() -> None:
    """Drop this thread's default generator: the next random op makes a new one, as ndd does."""
    vars(ndd_random._thread_local).pop("default_rng", None)


def resolve_rng(rng: Any) -> RNG:
    return ndd_random._resolve_rng(rng)


def draw_state(rng: RNG) -> np.ndarray:
    """Draw one op call's Philox state exactly as an eager ndd random op does (its
    `_STATE_WORDS` calls of `rng()`, done here in one go for a plain RNG)."""
    if type(rng) is not RNG or STATE_WORDS != 7:
        return np.array(ndd_random._draw_state(rng), dtype=np.uint32)
    rng._on_draw()  # what each rng() call does first: idempotent (capture mode's hook)
    if rng._pending_draws:
        rng._flush_pending()
    word = rng._rng.next
    words = np.array((word(), word(), word(), word(), word(), word(), word()), dtype=np.uint32)
    rng._draws += 7
    return words


def rng_snapshot(rng: RNG) -> Any:
    return str(rng.get_state()), rng._draws, rng._version


def rng_restore(rng: RNG, snapshot: Any) -> None:
    state, draws, version = snapshot
    rng.set_state(state)
    rng._draws = draws
    rng._version = version


def rng_position(rng: RNG) -> tuple[int, int]:
    return rng._draws, rng._version


def rng_clone(rng: RNG) -> RNG:
    return rng.clone()


def rng_advance(rng: RNG, words: int) -> None:
    rng.advance(words)


# ---------------------------------------------------------------------------------------------
# Data in and out of pipelines

def storage_of(value: Any) -> Any:
    """The DALI TensorList behind a Batch (evaluating it), or a 1-sample list for a Tensor."""
    if isinstance(value, Batch):
        return value.evaluate()._storage
    storage = value.evaluate()._storage
    if isinstance(storage, backend.TensorGPU):
        return backend.TensorListGPU([storage])
    return backend.TensorListCPU([storage])


def snapshot(value: Any) -> Any:
    """A private copy of a concrete Batch/Tensor's data: eager ndd reads its inputs at the call,
    so a caller that mutates (or reuses) its buffers afterwards must not change the result."""
    storage = value.evaluate()._storage
    if isinstance(storage, (backend.TensorListCPU, backend.TensorCPU)):
        # DALI-owned memory (numpy copies would not be kept alive by a TensorList that wraps
        # them). Data of no bytes at all has nothing to copy: its copy's null data pointer
        # crashes ops (GaussianBlur on 1x0 samples) that eager, given the original, runs.
        copy = storage._make_copy()
        if not copy.data_ptr():
            return value
        return Batch(copy) if isinstance(storage, backend.TensorListCPU) else Tensor(copy)
    with _interceptor.suspended():
        return ndd.copy(value).evaluate()  # GPU data: a device copy, made now


def same_data(a: Any, b: Any) -> bool:
    """Whether two concrete Batches/Tensors hold the same data (type, layout, shapes, bytes);
    False for data in GPU memory (not compared)."""
    if a is b:
        return True
    if isinstance(a, Batch) != isinstance(b, Batch) or a.device != b.device or \
            a.device.device_type != "cpu":
        return False
    a, b = storage_of(a), storage_of(b)
    if a.dtype != b.dtype or a.layout() != b.layout() or len(a) != len(b):
        return False
    for x, y in zip(a, b):
        x, y = np.asarray(x), np.asarray(y)
        if x.shape != y.shape or x.tobytes() != y.tobytes():
            return False
    return True


def to_batch(value: Any, batch_size: int | None) -> Any:
    """Convert any tensor-like (numpy, list, Tensor) as ndd would for a batch input."""
    return _ops._to_batch(value, batch_size)


def to_tensor(value: Any) -> Any:
    return _ops._to_tensor(value)


def broadcast_state(words: np.ndarray, batch_size: int) -> Any:
    return backend.TensorListCPU.broadcast(backend.TensorCPU(words), batch_size)


def op_function_of(op_class: type) -> Callable:
    """The public ndd function (ndd.resize, ...) of an operator class."""
    global _function_by_class
    if _function_by_class is None:
        _function_by_class = {f._op_class: f for f in op_functions()}
    return _function_by_class[op_class]


_function_by_class: dict | None = None


class ReplayRNG(RNG):
    """A generator that hands out random words drawn earlier: replays one op call's state."""

    def __init__(self, words: np.ndarray):
        super().__init__(seed=0)
        self._words = [int(w) for w in words]

    def __call__(self) -> int:
        return self._words.pop(0)


def synchronous() -> Any:
    """Context manager: ndd calls run, and raise, at the call (EvalMode.sync_full)."""
    return EvalMode.sync_full


def synchronous_cpu() -> Any:
    """Context manager: CPU ndd calls run at the call, on the calling thread
    (EvalMode.sync_cpu): for many small calls, cheaper than handing each to a worker thread."""
    return EvalMode.sync_cpu


def eval_mode_is_sync() -> bool:
    return EvalMode.current().value >= EvalMode.sync_cpu.value


_OPERATOR_ATTRIBUTES = _ops.Operator.__dict__
_PROCESS_PARAMS = _OPERATOR_ATTRIBUTES["_process_params"]


def process_params_replaced() -> bool:
    """Whether `Operator._process_params` (ndd's per-call argument processing, which a recorded
    call does not go through) has been replaced, by a test's spy for example: transparent mode
    then runs calls eagerly, so that the replacement sees each call at the call, as in ndd."""
    return _OPERATOR_ATTRIBUTES.get("_process_params") is not _PROCESS_PARAMS


# ---------------------------------------------------------------------------------------------
# Proxies: ndd_trace's Batch/Tensor subclasses (traced values, transparent mode's lazy ones)
#
# They are built without ndd's constructors, so they get the fields ndd's own methods read
# here; the rest of the package reads and writes them through these functions.

_PROXY_FIELDS = {"_storage": None, "_tensors": None, "_invocation_result": None,
                 "_wraps_external_data": False, "_slice": None, "_shape": None,
                 "_batch": None, "_index_in_batch": None}


def init_proxy(proxy: Any, device: Any, dtype: Any = None, result: Any = None) -> None:
    """Give a proxy (an instance of a Batch/Tensor subclass) the fields ndd's methods read:
    no data, its `device`; a lazy one its known `dtype` and the `result` handle ndd code copies
    (`ndd.as_tensor(x)`, `ndd.batch([...])` keep it, and it runs the value when read)."""
    fields = proxy.__dict__
    fields.update(_PROXY_FIELDS)
    fields["_device"] = device
    if result is not None:
        fields["_dtype"] = dtype
        fields["_layout"] = None
        fields["_ndim"] = None
        fields["_invocation_result"] = result


def proxy_device(proxy: Any) -> Any:
    return proxy._device


def proxy_storage(proxy: Any) -> Any:
    """A proxy's data once it ran (a TensorList, or a Tensor's one sample), else None."""
    return proxy._storage


def set_proxy_storage(proxy: Any, storage: Any) -> None:
    """A proxy's data, from its value's TensorList (a Tensor keeps its one sample)."""
    proxy._storage = storage if isinstance(proxy, Batch) else storage[0]


def tensor_subscript(value: Any, **ranges: Any) -> Any:
    """`tensor[...]` as ndd records it (its `_tensor_subscript` op), for a traced Tensor."""
    return ndd._tensor_subscript(value, **ranges)


_LAZY_BATCH_FIELDS = {"_wraps_external_data": False, "_tensors": None, "_storage": None,
                      "_dtype": None, "_device": None, "_layout": None, "_ndim": None}
_lazy_batch_checked: bool | None = None


def lazy_batch(invocation_result: Any) -> Batch:
    """`Batch(invocation_result=...)` without its argument normalization (the constructor's
    cost dominates a small compiled call): the same fields, checked once against the real
    constructor; the real one is used if they differ (another DALI release) or in a
    synchronous EvalMode (where the constructor evaluates)."""
    global _lazy_batch_checked
    if EvalMode.current().value > EvalMode.eager.value:
        return Batch(invocation_result=invocation_result)
    if _lazy_batch_checked is None:
        reference = Batch(invocation_result=invocation_result)
        fields = dict(_LAZY_BATCH_FIELDS, _invocation_result=invocation_result)
        _lazy_batch_checked = vars(reference) == fields
        return reference
    if not _lazy_batch_checked:
        return Batch(invocation_result=invocation_result)
    batch = Batch.__new__(Batch)
    batch.__dict__.update(_LAZY_BATCH_FIELDS)
    batch._invocation_result = invocation_result
    return batch


def pending_run_of(value: Any) -> Any:
    """The ndd_trace pipeline run behind a Batch or Tensor made by `lazy_batch` (a compiled
    call's output), else None."""
    if isinstance(value, (Batch, Tensor)):
        return getattr(vars(value).get("_invocation_result"), "_run", None)
    return None


def wrap_batch(tensor_list: Any) -> Batch:
    return Batch(tensor_list)


def wrap_tensor(tensor_list: Any) -> Tensor:
    return Tensor(tensor_list[0])


def current_num_threads() -> int:
    return ndd.EvalContext.current().num_threads


def current_device_id() -> int | None:
    return ndd.EvalContext.current().device_id


def pipeline_options(batch_size: int, num_threads: int, device_id: int | None,
                     prefetch_queue_depth: int, checkpointing: bool = False,
                     checkpoint: bytes | None = None) -> dict[str, Any]:
    """The Pipeline arguments of a compiled function's pipeline (for a `@pipeline_def`)."""
    extra = {"enable_checkpointing": True, "checkpoint": checkpoint} if checkpointing else {}
    return dict(batch_size=batch_size, num_threads=num_threads, device_id=device_id,
                prefetch_queue_depth=prefetch_queue_depth, exec_dynamic=True, **extra)


def host_array(value: Any) -> np.ndarray:
    """A host copy of a concrete Tensor's data (a constant written into generated code)."""
    storage = value.evaluate()._storage
    if isinstance(storage, backend.TensorGPU):
        storage = storage.as_cpu()
    return np.array(storage)


# ---------------------------------------------------------------------------------------------
# Checkpoints of readers owned by compiled loops

_LOOP_STATE_MAGIC = b"NDDTRACE-LOOP1\n"


def reader_checkpointing(reader: Any) -> bool:
    return bool(reader._checkpointing_enabled)


def enable_reader_checkpointing(reader: Any) -> None:
    """What `ndd.checkpoint.Checkpoint.register(reader)` does to a reader (DALI's own error for
    one that already read without checkpointing)."""
    reader._enable_checkpointing()


def reader_started(reader: Any) -> bool:
    """Whether the reader made its operator (it has a position: `get_state()` answers, and
    `set_state()` no longer does)."""
    return reader._op_backend is not None


def set_reader_shard_id(reader: Any, shard_id: int) -> None:
    """The shard the reader's next epoch reads (ndd keeps it in Python, not in the reader's
    checkpoint)."""
    reader._shard_id = int(shard_id)


def eager_epoch_steps(reader: Any, batch_size: int) -> int:
    """Batches in the reader's open eager epoch, as ndd counted them at its first step."""
    return -(-reader._shard_epoch_size() // batch_size)


def cuda_node_meta() -> type:
    """The metaclass of DALI's own torchdata nodes (`ndd.pytorch.nodes`): `next` runs on the
    CUDA device `reset` saw, whichever thread calls it."""
    from nvidia.dali.experimental.dynamic.pytorch import nodes

    return type(nodes.Reader)


def check_reader_state(state: Any) -> None:
    """Refuse, with a clear error, a reader state saved by the compiled loops of ndd_trace
    0.1 (a pipeline's checkpoint of their own format, which eager ndd's reader cannot read);
    today's compiled loops save and restore eager ndd's own reader states."""
    text = str(state) if not isinstance(state, bytes) else state.decode("ascii", "replace")
    try:
        raw = base64.b64decode(text, validate=False)[:len(_LOOP_STATE_MAGIC)]
    except (ValueError, TypeError):
        return
    if raw == _LOOP_STATE_MAGIC:
        raise ValueError(
            "this reader state was saved by a compiled loop of ndd_trace 0.1 (its own format, "
            "which eager ndd's reader cannot restore); save it again with this version, whose "
            "compiled loops, transparent mode and eager code save and restore eager ndd's own "
            "reader states")


# ---------------------------------------------------------------------------------------------
# Per-sample pipelines: DALI's conditionals (its AutoGraph fork) on pipeline-mode DataNodes

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
    return types.Constant(float(value), dtype=types.DALIDataType.FLOAT64)


_PASS_THROUGH = ("_conditional__Split", "_conditional__ValidateLogical")


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


def sample_index_source(name: str) -> DataNode:
    return fn.external_source(name=name, device="cpu", dtype=types.DALIDataType.INT32, ndim=0)


def sample_indices(batch_size: int) -> Any:
    """The TensorList a `sample_index_source` is fed: 0, 1, ..., batch_size - 1."""
    return backend.TensorListCPU(np.arange(batch_size, dtype=np.int32))


def host_ints(tensor_list: Any) -> list[int]:
    """The scalars of a CPU TensorList (possibly empty), as Python ints."""
    return [int(np.asarray(sample)) for sample in tensor_list]


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


class PipelineFailure(NamedTuple):
    """What a DALI pipeline's error report says: the failing operator (DALI's name for it, as
    `nvidia.dali.fn.decoders.image`; None where it names none) and the operator's own message,
    as eager ndd raises it for the same call (without the pipeline's framing and C++ context)."""

    operator: str | None
    message: str

    @property
    def ndd_name(self) -> str | None:
        """The operator as ndd spells it (`ndd.readers.File`, `ndd.decoders.image`)."""
        if self.operator is None:
            return None
        for prefix in ("nvidia.dali.ops.", "nvidia.dali.fn."):
            if self.operator.startswith(prefix):
                return "ndd." + self.operator[len(prefix):]
        return self.operator

    @property
    def from_reader(self) -> bool:
        """Whether a reader failed: eager ndd reads a batch at the loop's iteration, at once,
        and raises the reader's own error there."""
        return self.operator is not None and "readers" in self.operator.split(".")

    def summary(self) -> str:
        """Both on one line (the message's first)."""
        first = self.message.splitlines()[0] if self.message else ""
        return f"{self.operator}: {first}" if self.operator else first


_FAILED_OPERATOR = re.compile(r"Error in \w+ operator `([^`]+)`")
_PIPELINE_FRAMING = ("Critical error in pipeline", "Current pipeline object is no longer valid")


def pipeline_failure(error: BaseException) -> PipelineFailure:
    """Read a pipeline's error report (the one parser of DALI's report text): "Critical error in
    pipeline: Error in CPU operator `...`, which was used ... encountered: <message> C++ context:
    [...]". An error that is no such report gives its own text."""
    text = str(error)
    match = _FAILED_OPERATOR.search(text)
    if "encountered:" in text:
        text = text.split("encountered:", 1)[1].split("\nC++ context:", 1)[0]
    lines = [line for line in text.strip().splitlines()
             if not line.strip().startswith(_PIPELINE_FRAMING)]
    message = "\n".join(lines).strip() or repr(error)
    return PipelineFailure(match.group(1) if match else None, message)


@functools.cache
def _deferred_error_text(mode: Any) -> str:
    try:
        _exceptions.rethrow_exception(RuntimeError(), (), mode)
    except RuntimeError as error:
        return str(error)
    return "An error happened during asynchronous execution"


def deferred_error_text(deferred: bool) -> str:
    """What eager ndd's error says when an operator's run-time error surfaces at the first use of
    its result (`rethrow_exception`'s text for the EvalMode of the call: `deferred` or eager),
    the operator's own error being its cause."""
    return _deferred_error_text(EvalMode.deferred if deferred else EvalMode.eager)


def eval_mode_is_deferred() -> bool:
    """Whether this thread's ndd calls are in EvalMode.deferred (~0.1 us)."""
    return EvalMode.current() is EvalMode.deferred


def eager_reads_as_is(value: Any, is_batch: bool) -> str | None:
    """The device type ("cpu", "gpu") of user data an eager op call reads as it is, without a
    copy (so it runs the call at once): a Batch or Tensor, as the call's mode, that wraps user
    data; an array (numpy, torch, DLPack) given to a call on samples. None for anything else
    (results, copies, data an op call converts)."""
    kind = type(value)
    if kind is Batch or kind is Tensor:
        if (kind is Batch) != is_batch or not value._is_external():
            return None
        return value.device.device_type
    if is_batch or value is None or isinstance(value, (Batch, Tensor, list, tuple, int, float,
                                                       str, bool)):
        return None
    if hasattr(value, "__dlpack_device__"):
        return "gpu" if int(value.__dlpack_device__()[0]) == 2 else "cpu"
    if hasattr(value, "__array_interface__"):
        return "cpu"
    return None


def wraps_user_data(value: Any) -> bool:
    """Whether eager ndd reads `value` (a concrete Batch/Tensor) as external data: an op call
    given it runs at the call, and raises its run-time error there (`has_external_inputs`)."""
    return isinstance(value, (Batch, Tensor)) and value._is_external()
