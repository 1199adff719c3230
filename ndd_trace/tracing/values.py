"""The traced values: what a traced function's code holds in place of its batches and tensors.

    batch = TracedBatch(tracer, Ref(node, 0), meta)   # made by Tracer.placeholder and its ops
    batch.batch_size                                  # a SymbolicBatchSize

They subclass ndd.Batch / ndd.Tensor, so ndd's own Python code (arithmetic, `.slice[...]`,
`.gpu()`) runs on them unchanged and ends in operator calls, which the interceptor in `_dali`
routes to the tracer (trace.py). Anything that needs concrete data (`.shape`, `np.asarray`,
`.torch()`, iteration, `bool()`) raises `GraphBreakSignal`, which the compiler turns into an
eager run with a warning.
"""

from __future__ import annotations

import operator
import sys
import types
from collections.abc import Iterator
from typing import Any

import numpy as np

from .. import _dali
from ..core.errors import GraphBreakSignal
from ..core.ir import Ref, TensorMeta
from ..core.source import user_location


def graph_break(reason: str) -> GraphBreakSignal:
    """The break for `reason`, at the user's line."""
    return GraphBreakSignal(reason, user_location())


# the reflected operators, by the operator module's function that applies them swapped
_REFLECTED = types.MappingProxyType({
    "__radd__": operator.add, "__rsub__": operator.sub, "__rmul__": operator.mul,
    "__rfloordiv__": operator.floordiv, "__rtruediv__": operator.truediv,
    "__rmod__": operator.mod, "__rpow__": operator.pow, "__rand__": operator.and_,
    "__ror__": operator.or_, "__rxor__": operator.xor, "__rlshift__": operator.lshift,
    "__rrshift__": operator.rshift})


def _specializing(name: str):
    reflected = _REFLECTED.get(name)
    # the operator module's function for the others (`__and__`: operator.and_); None where it
    # has none (`__int__`, `__format__`...): the int's own method
    bare = name.strip("_")
    forward = getattr(operator, bare, None) or getattr(operator, f"{bare}_", None)

    def method(self, *args):
        self._tracer.specialize_batch_size(f"uses the batch size in Python (`{name}`)")
        args = [int(a._value) if isinstance(a, SymbolicBatchSize) else a for a in args]
        # as the operator module applies them to eager's int, so that a numpy scalar on either
        # side is promoted as it is with an int (np.int32(1) + n)
        if reflected is not None:
            return reflected(args[0], self._value)
        if forward is not None:
            return forward(self._value, *args)
        return getattr(self._value, name)(*args)

    method.__name__ = name
    return method


class SymbolicBatchSize:
    """The batch size of a traced batch: a number that notices when Python code depends on it.

    Passed on as an operator's `batch_size=`, it stays symbolic (the pipeline takes any batch size
    up to its maximum). Any other use (arithmetic, comparisons, `range()`, formatting, an op's
    shape argument) specializes the trace to this exact batch size (a guard), as torch.compile
    does with dynamic shapes. It is deliberately not an `int` subclass: CPython reads the value of
    an int subclass directly in `range()`, slicing or numpy, without asking.
    """

    __slots__ = ("_value", "_tracer")

    def __init__(self, value: int, tracer: Any):  # a trace.Tracer
        self._value = int(value)
        self._tracer = tracer

    def specialized(self, reason: str) -> int:
        self._tracer.specialize_batch_size(reason)
        return self._value

    for _name in ("__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__add__",
                  "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__floordiv__",
                  "__rfloordiv__", "__truediv__", "__rtruediv__", "__mod__", "__rmod__",
                  "__divmod__", "__rdivmod__", "__pow__", "__rpow__", "__index__", "__int__",
                  "__float__", "__bool__", "__str__", "__repr__", "__format__", "__neg__",
                  "__pos__", "__abs__", "__invert__", "__round__", "__floor__", "__ceil__",
                  "__trunc__", "__and__", "__rand__", "__or__", "__ror__", "__xor__", "__rxor__",
                  "__lshift__", "__rlshift__", "__rshift__", "__rrshift__", "__hash__",
                  "__complex__"):
        locals()[_name] = _specializing(_name)
    del _name

    @property  # type: ignore[misc]
    def __class__(self):  # `isinstance(n, int)` and `case int():` hold, as for eager's int
        return int

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        # numpy makes of it what it makes of eager's int (np.array([n, 7]): int64, not object);
        # ndd, given it as data (`x * n`, `ndd.as_tensor(n)`), a 32-bit number, as of an int
        if dtype is None and _dali.asks_as_python_data(sys._getframe(1)):
            dtype = np.int32
        return np.asarray(self.specialized("uses the batch size in numpy"), dtype=dtype)

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        # a ufunc (np.uint8(255) + n, np.maximum(n, 1)) given eager's int: promoted as an int
        inputs = tuple(value.specialized(f"uses the batch size in numpy (`{ufunc.__name__}`)")
                       if isinstance(value, SymbolicBatchSize) else value for value in inputs)
        return getattr(ufunc, method)(*inputs, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self.specialized(f"uses the batch size in Python (`.{name}`)"), name)


class _TracedMixin:
    """Behaviour shared by TracedBatch and TracedTensor."""

    _tracer: Any  # trace.Tracer
    _ref: Ref
    _meta: TensorMeta

    def _init_traced(self, tracer: Any, ref: Ref, meta: TensorMeta) -> None:
        self._tracer = tracer
        self._ref = ref
        self._meta = meta
        device = _dali.device(meta.device, tracer.device_id if meta.device == "gpu" else None)
        _dali.init_proxy(self, device)

    def _known(self, what: str, value: Any) -> Any:
        if value is None:
            raise graph_break(f"reads `.{what}` of a traced value whose {what} DALI cannot infer "
                              "without running")
        return value

    @property
    def device(self):
        return _dali.proxy_device(self)

    @property
    def dtype(self):
        name = self._known("dtype", self._meta.dtype)
        return _dali.dtype_of(name)

    @property
    def ndim(self) -> int:
        return self._known("ndim", self._meta.ndim)

    @property
    def layout(self) -> str | None:
        if not self._meta.layout_known or self._meta.ndim is None and self._meta.layout is None:
            raise graph_break("reads `.layout` of a traced value whose layout DALI cannot infer")
        return self._meta.layout or None

    @property
    def shape(self):
        raise graph_break("reads `.shape` of a traced value (shapes are known only when it runs)")

    def evaluate(self):
        raise graph_break("evaluates a traced value (`.evaluate()`)")

    def torch(self, *args: Any, **kwargs: Any):
        raise graph_break("converts a traced value to PyTorch (`.torch()`) inside the function")

    def __array__(self, *args: Any, **kwargs: Any):
        raise graph_break("converts a traced value to numpy inside the function")

    def __dlpack__(self, *args: Any, **kwargs: Any):
        raise graph_break("exports a traced value through DLPack inside the function")

    def __dlpack_device__(self):
        raise graph_break("exports a traced value through DLPack inside the function")

    @property
    def __cuda_array_interface__(self):
        raise graph_break("exports a traced value through __cuda_array_interface__")

    def __bool__(self) -> bool:
        raise graph_break("uses a traced value as a Python bool (`if`, `and`, `or`, `not`)")

    def __len__(self) -> int:
        raise graph_break("takes `len()` of a traced value")

    def __iter__(self) -> Iterator:
        raise graph_break("iterates over a traced value")

    def __repr__(self) -> str:  # (eager's text shows the values: at the trace it would freeze)
        raise graph_break("formats a traced value as text (`str`, `repr`, an f-string, `print`)")

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        raise graph_break("formats a traced value as text (`str`, `repr`, an f-string, `print`)")

    def item(self):
        raise graph_break("reads a traced value with `.item()`")

    def tolist(self):
        raise graph_break("reads a traced value with `.tolist()`")

    def cpu(self):
        return self.to_device(_dali.Device.CPU)

    def gpu(self, index: int | None = None):
        return self.to_device(_dali.Device("gpu", index))


def _absent(name: str) -> property:
    """An attribute ndd.Batch does not have, absent from a batch proxy too (`hasattr` says
    False): numpy, seeing no array protocol, leaves `np.float32(k) * batch` to Batch.__rmul__."""

    def getter(self: Any) -> Any:
        raise AttributeError(f"'Batch' object has no attribute '{name}'")

    return property(getter)


# what the proxies' shared mixin defines for tensors and ndd.Batch lacks
_BATCH_ABSENT = tuple(name for name in ("__array__", "__dlpack__", "__dlpack_device__",
                                       "__cuda_array_interface__", "item", "tolist")
                     if not hasattr(_dali.Batch, name))


class TracedBatch(_TracedMixin, _dali.Batch):
    """A symbolic ndd.Batch recorded by the tracer."""

    locals().update({name: _absent(name) for name in _BATCH_ABSENT})

    def __init__(self, tracer: Any, ref: Ref, meta: TensorMeta):
        self._init_traced(tracer, ref, meta)

    @property
    def batch_size(self) -> int:
        size = SymbolicBatchSize(self._tracer.batch_size, self._tracer)
        reason = self._tracer.batch_size_as_int
        return size if reason is None else size.specialized(reason)

    def select(self, sample_range: Any):
        raise graph_break("selects samples with `.select()` (the batch size varies between calls)")

    @property
    def tensors(self):
        raise graph_break("accesses `.tensors` of a traced batch")


class TracedTensor(_TracedMixin, _dali.Tensor):
    """A symbolic ndd.Tensor (one sample) recorded by the tracer."""

    def __init__(self, tracer: Any, ref: Ref, meta: TensorMeta):
        self._init_traced(tracer, ref, meta)

    def __getitem__(self, ranges: Any):
        if not isinstance(ranges, tuple):
            ranges = (ranges,)
        args: dict[str, Any] = {}
        dim = 0
        for i, item in enumerate(ranges):
            if item is Ellipsis:
                dim = self.ndim - len(ranges) + i + 1
            elif isinstance(item, slice):
                for key, value in (("lo", item.start), ("hi", item.stop), ("step", item.step)):
                    if value is not None:
                        args[f"{key}_{dim}"] = value
                dim += 1
            else:
                args[f"at_{dim}"] = item
                dim += 1
        if not args:
            return self
        return _dali.tensor_subscript(self, **args)

    @property
    def size(self):
        raise graph_break("reads `.size` of a traced tensor")


def is_traced(value: Any) -> bool:
    return isinstance(value, _TracedMixin)


def is_concrete_data(value: Any) -> bool:
    return isinstance(value, (_dali.Batch, _dali.Tensor)) and not is_traced(value)



def tracer_of(value: Any) -> Any:
    """The tracer that recorded a traced value."""
    return value._tracer


def traced_ref(value: Any) -> Ref:
    """A traced value's edge in its tracer's graph."""
    return value._ref


def traced_meta(value: Any) -> TensorMeta:
    """A traced value's metadata, as recorded."""
    return value._meta
