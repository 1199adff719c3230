"""The lazy values transparent mode hands out: an ndd.Batch or ndd.Tensor whose data is a
pending region's output, run when something reads it (`.torch()`, `np.asarray`, `.shape`).
Metadata the recording knows (dtype, layout, ndim) answers without running anything.
"""

from __future__ import annotations

from typing import Any

from .. import _dali
from ..core.ir import Ref, TensorMeta
from ..execution.results import LazyResult
from ..tracing.values import BATCH_ABSENT, TracedBatch, TracedTensor


class LazyMixin:
    _tracer: Any  # lazy.LazyTracer
    _ref: Ref

    def _materialize(self) -> None:
        if _dali.proxy_storage(self) is None:
            _dali.set_proxy_storage(self, self._tracer.materialize(self._ref))

    def _concrete(name: str):  # noqa: N805 (a method factory used in the class bodies)
        def method(self, *args: Any, **kwargs: Any) -> Any:
            self._materialize()
            base = _dali.Batch if isinstance(self, _dali.Batch) else _dali.Tensor
            return getattr(base, name)(self, *args, **kwargs)

        method.__name__ = name
        return method

    def _concrete_property(name: str):  # noqa: N805
        def getter(self: Any) -> Any:
            self._materialize()
            base = _dali.Batch if isinstance(self, _dali.Batch) else _dali.Tensor
            return getattr(base, name).fget(self)

        return property(getter)

    def _known_or_concrete(name: str):  # noqa: N805
        def getter(self: Any) -> Any:
            value = getattr(self._meta, name)
            ran = _dali.proxy_storage(self) is not None
            if value is None and not ran and self._tracer.refine_meta(self._ref):
                value = getattr(self._meta, name)
            if value is not None and not ran:
                return getattr(TracedBatch, name).fget(self)
            self._materialize()
            base = _dali.Batch if isinstance(self, _dali.Batch) else _dali.Tensor
            return getattr(base, name).fget(self)

        return property(getter)

    shape = _concrete_property("shape")
    dtype = _known_or_concrete("dtype")
    ndim = _known_or_concrete("ndim")
    evaluate = _concrete("evaluate")
    torch = _concrete("torch")
    __array__ = _concrete("__array__")
    __repr__ = _concrete("__repr__")
    __iter__ = _concrete("__iter__")
    item = _concrete("item")
    tolist = _concrete("tolist")

    @property
    def layout(self) -> str | None:
        ran = _dali.proxy_storage(self) is not None
        if not ran and self._meta.ndim is None:
            self._tracer.refine_meta(self._ref)
        if not ran and (self._meta.ndim is not None or self._meta.layout is not None):
            return self._meta.layout or None  # ("" where DALI knows the ndim-less output has none)
        self._materialize()
        base = _dali.Batch if isinstance(self, _dali.Batch) else _dali.Tensor
        return base.layout.fget(self)

    def __bool__(self) -> bool:
        self._materialize()
        return True

    def __len__(self) -> int:
        """As eager's: ndd's Batch and Tensor have no len() (list(), tuple() and `[*x]` ask for
        it as a hint, then iterate)."""
        base = _dali.Batch if isinstance(self, _dali.Batch) else _dali.Tensor
        raise TypeError(f"object of type '{base.__name__}' has no len()")

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        self._materialize()
        return _dali.Tensor.__dlpack__(self, *args, **kwargs)

    def __dlpack_device__(self) -> Any:
        self._materialize()
        return _dali.Tensor.__dlpack_device__(self)

    @property
    def __cuda_array_interface__(self) -> Any:
        self._materialize()
        return _dali.Tensor.__cuda_array_interface__.fget(self)


def _known_dtype(meta: TensorMeta) -> Any:
    return _dali.dtype_of(meta.dtype) if meta.dtype is not None else None


class _LazyHandle(LazyResult):
    """A lazy value's result handle: ndd code that copies a Batch/Tensor's fields
    (`ndd.as_tensor(x)`, `ndd.batch([...])`) keeps something that runs the region."""

    def __init__(self, tracer: Any, ref: Ref, is_batch: bool, device: Any):
        super().__init__(is_batch, device)
        self._tracer, self._ref = tracer, ref

    def _data(self) -> Any:
        return self._tracer.materialize(self._ref)

    def _batch_size(self) -> int:
        return int(self._ref.node.batch_size)

    @property
    def _invocation(self) -> _LazyHandle:
        """ndd's `InvocationResult._invocation`: the call record, here the handle itself."""
        return self

    @property
    def _results(self) -> list | None:
        """ndd's `Invocation._results`: None until the call has run, then its outputs."""
        return self._ref.node.state.results


class LazyBatch(LazyMixin, TracedBatch):
    """A lazy ndd.Batch of transparent mode; consumed, it runs its pending region."""

    # (over LazyMixin's, which are the tensors')
    locals().update({name: getattr(TracedBatch, name) for name in BATCH_ABSENT})

    def __init__(self, tracer: Any, ref: Ref, meta: TensorMeta):
        self._init_traced(tracer, ref, meta, _known_dtype(meta),
                          lambda device: _LazyHandle(tracer, ref, True, device))

    @property
    def batch_size(self) -> int:
        return int(self._ref.node.batch_size)

    def select(self, sample_range: Any) -> Any:
        self._materialize()
        return _dali.Batch.select(self, sample_range)

    @property
    def tensors(self) -> Any:
        self._materialize()
        return _dali.Batch.tensors.fget(self)


class LazyTensor(LazyMixin, TracedTensor):
    """A lazy ndd.Tensor of transparent mode."""

    def __init__(self, tracer: Any, ref: Ref, meta: TensorMeta):
        self._init_traced(tracer, ref, meta, _known_dtype(meta),
                          lambda device: _LazyHandle(tracer, ref, False, device))

    def __getitem__(self, ranges: Any) -> Any:
        return TracedTensor.__getitem__(self, ranges)

    @property
    def size(self) -> Any:
        self._materialize()
        return _dali.Tensor.size.fget(self)


def is_lazy(value: Any) -> bool:
    return isinstance(value, LazyMixin)
