"""DALI's data objects: Batch and Tensor (ndd_trace's proxies of them), data in and out of
pipelines.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import numpy as np

import nvidia.dali.backend as backend
import nvidia.dali.experimental.dynamic as ndd
from nvidia.dali.experimental.dynamic import _ops, _tensor

from .base import Batch, EvalMode, Tensor
from .interception import interceptor, op_functions


def storage_of(value: Any) -> Any:
    """The DALI TensorList behind a Batch (evaluating it), or a 1-sample list for a Tensor."""
    if isinstance(value, Batch):
        return value.evaluate()._storage
    storage = value.evaluate()._storage
    if isinstance(storage, backend.TensorGPU):
        return backend.TensorListGPU([storage])
    return backend.TensorListCPU([storage])


def owned_storage(value: Any) -> Any:
    """What a Batch argument is fed as to an external source that reads in place (no_copy):
    its TensorList where DALI owns it (an op's or a reader's output: nobody writes to it), a
    DALI-owned copy made now where it wraps user data (a caller may reuse that buffer, and eager
    ndd read it at the call)."""
    storage = value.evaluate()._storage
    if value._is_external() and isinstance(storage, backend.TensorListCPU):
        copy = storage._make_copy()
        return copy if copy.data_ptr() else storage
    return storage


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
    with interceptor.suspended():
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


def asks_as_python_data(frame: Any) -> bool:
    """Whether `frame` is ndd converting a value given as data (a Tensor made of it) through
    its `__array__`: eager ndd makes a Python int a 32-bit number, not numpy's 64-bit one."""
    return frame is not None and frame.f_code is _tensor._get_array_interface.__code__


def broadcast_state(words: np.ndarray, batch_size: int) -> Any:
    return backend.TensorListCPU.broadcast(backend.TensorCPU(words), batch_size)


def concatenated(storages: list) -> Any:
    """One TensorList of the samples of `storages`, TensorLists of one device, in order: K
    calls' data fed to one coalesced run (ahead/coalescing.py). Dense CPU lists of one sample
    shape (random states) are joined in one copy; others become views of their samples, which
    the run's external source copies as it copies user data."""
    first = storages[0]
    if isinstance(first, backend.TensorListCPU) and all(s.is_dense_tensor() for s in storages):
        arrays = [np.asarray(storage.as_tensor()) for storage in storages]
        if all(array.shape[1:] == arrays[0].shape[1:] for array in arrays):
            return backend.TensorListCPU(np.concatenate(arrays), first.layout())
    samples = [storage[i] for storage in storages for i in range(len(storage))]
    kind = backend.TensorListGPU if isinstance(first, backend.TensorListGPU) \
        else backend.TensorListCPU
    return kind(samples, first.layout(), False)


def sample_range(storage: Any, start: int, stop: int) -> Any:
    """Samples start .. stop - 1 of a TensorList as one without a copy: views of its samples,
    dense where `storage` is (a coalesced run's outputs handed to each call: ahead/coalescing.py);
    a GPU list keeps the stream its data is ordered on."""
    part = type(storage)([storage[i] for i in range(start, stop)], storage.layout(), False)
    if isinstance(storage, backend.TensorListGPU) and storage.stream is not None:
        part._set_stream(storage.stream)
    return part


def op_function_of(op_class: type) -> Callable:
    """The public ndd function (ndd.resize, ...) of an operator class."""
    global _function_by_class
    if _function_by_class is None:
        _function_by_class = {f._op_class: f for f in op_functions()}
    return _function_by_class[op_class]


_function_by_class: dict | None = None


@functools.lru_cache(maxsize=None)
def required_keywords(function: Callable) -> tuple[str, ...]:
    """An ndd op function's keyword-only parameters without a default: a recorded call holds
    no argument given None (as DALI reads it: not given), and its replay passes None for
    these again, as the user's call did (DALI raises its own error for it)."""
    return tuple(name for name, parameter in inspect.signature(function).parameters.items()
                 if parameter.kind is inspect.Parameter.KEYWORD_ONLY
                 and parameter.default is inspect.Parameter.empty)


# Proxies: ndd_trace's Batch/Tensor subclasses (the traced values of a compiled function)
#
# They are built without ndd's constructors, so they get the fields ndd's own methods read
# here; the rest of the package reads them through these functions.

_PROXY_FIELDS = {"_storage": None, "_tensors": None, "_invocation_result": None,
                 "_wraps_external_data": False, "_slice": None, "_shape": None,
                 "_batch": None, "_index_in_batch": None}


def init_proxy(proxy: Any, device: Any) -> None:
    """Give a proxy (an instance of a Batch/Tensor subclass) the fields ndd's methods read:
    no data, its `device`."""
    fields = proxy.__dict__
    fields.update(_PROXY_FIELDS)
    fields["_device"] = device


def proxy_device(proxy: Any) -> Any:
    return proxy._device


def invocation_result_of(value: Any) -> Any:
    """What a Batch or Tensor built lazily (`Batch(invocation_result=...)`: an ndd_trace
    result, transparent mode's values included) evaluates when first read; None for anything
    else. (ndd keeps it after the data came: it answers `.shape` from it.)"""
    if isinstance(value, (Batch, Tensor)):
        return value.__dict__.get("_invocation_result")
    return None


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
    return getattr(invocation_result_of(value), "_run", None)


def wrap_batch(tensor_list: Any) -> Batch:
    return Batch(tensor_list)


def wrap_tensor(tensor_list: Any) -> Tensor:
    return Tensor(tensor_list[0])


def host_array(value: Any) -> np.ndarray:
    """A host copy of a concrete Tensor's data (a constant written into generated code)."""
    storage = value.evaluate()._storage
    if isinstance(storage, backend.TensorGPU):
        storage = storage.as_cpu()
    return np.array(storage)


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


def failed_argument(bound: dict) -> bool:
    """Whether a Batch or Tensor among a call's data arguments (`bound`'s values) is a result
    whose own run fails when it is evaluated (evaluating each, as feeding it would)."""
    for value in bound.values():
        if type(value) is Batch or type(value) is Tensor:
            try:
                value.evaluate()
            except Exception:  # noqa: BLE001 (raised by eager where a result reads it)
                return True
    return False


def wraps_user_data(value: Any) -> bool:
    """Whether eager ndd reads `value` (a concrete Batch/Tensor) as external data: an op call
    given it runs at the call, and raises its run-time error there (`has_external_inputs`)."""
    return isinstance(value, (Batch, Tensor)) and value._is_external()
