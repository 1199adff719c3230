"""The lazy values transparent mode hands out: real ndd.Batch and ndd.Tensor objects, as eager
ndd's own results are, whose data is a recorded call's output (`LazyValue`, ndd's
invocation-result protocol), run when something reads it (`.torch()`, `np.asarray`, `.shape`).
Metadata the recording knows (dtype, layout, ndim) answers without running anything.

    value = lazy_value(tracer, Ref(node, 0), is_batch=True)   # an ndd.Batch, nothing run
    handle = lazy_handle(value)       # its LazyValue (None for any other value): the recorder
    handle.ref, handle.pending        # reads which recorded output it is, and whether it ran

The recorder tells its pending values by the handle they hold (ndd's `_invocation_result`
field, read through the adapter), not by their type: `type(x) is ndd.Batch`, `repr(x)` and
the messages naming the type are eager's.
"""

from __future__ import annotations

import pickle
from typing import Any

from .. import _dali
from ..core.ir import Node, Ref, TensorMeta
from ..execution.results import LazyResult


class LazyValue(LazyResult):
    """One output of a call transparent mode recorded, as ndd's InvocationResult: the
    ndd.Batch/Tensor built on it (and any copy ndd code makes of its fields, `ndd.as_tensor(x)`,
    `ndd.batch([...])`) asks it for metadata and, when read, for the data, which runs the
    pending region the output belongs to."""

    def __init__(self, tracer: Any, ref: Ref, is_batch: bool):  # a lazy.LazyTracer
        meta = ref.node.meta[ref.index]
        device = _dali.device(meta.device, tracer.device_id if meta.device == "gpu" else None)
        super().__init__(is_batch, device)
        self.tracer, self.ref = tracer, ref

    @property
    def meta(self) -> TensorMeta:
        """The output's metadata as recorded (refined from its inputs' data, see `refine_meta`)."""
        return self.ref.node.meta[self.ref.index]

    @property
    def pending(self) -> bool:
        """Whether its call has not run yet."""
        results = self.ref.node.state.results
        return results is None or results[self.ref.index] is None

    def _data(self) -> Any:
        return self.tracer.materialize(self.ref)

    def _batch_size(self) -> int:
        return int(self.ref.node.batch_size)

    def _known(self, name: str) -> Any:
        """`name` of the metadata as recorded, refined from the inputs' data where it is not
        known (as eager ndd infers it before it runs an op); None once the call ran, or where
        only running tells it."""
        if not self.pending:
            return None
        value = getattr(self.meta, name)
        if value is None and self.tracer.refine_meta(self.ref):
            value = getattr(self.meta, name)
        return value if self.pending else None

    @property
    def dtype(self) -> Any:
        name = self._known("dtype")
        return _dali.dtype_of(name) if name is not None else super().dtype

    @property
    def ndim(self) -> int:
        ndim = self._known("ndim")
        return ndim if ndim is not None else super().ndim

    @property
    def layout(self) -> str | None:
        if self.pending and (self.meta.ndim is None or not self.meta.layout_known):
            self.tracer.refine_meta(self.ref)
        meta = self.meta
        if self.pending and meta.layout_known and (meta.ndim is not None or
                                                   meta.layout is not None):
            return meta.layout or None  # ("" where DALI knows the ndim-less output has none)
        return super().layout

    @property
    def invocation(self) -> LazyValue:
        return self

    @property
    def index(self) -> int:
        return self.ref.index

    @property
    def _invocation(self) -> LazyValue:
        """ndd's `InvocationResult._invocation`: the call record, here the handle itself."""
        return self

    @property
    def _results(self) -> list | None:
        """ndd's `Invocation._results`: None until the call has run, then its outputs."""
        return self.ref.node.state.results

    def __reduce_ex__(self, protocol: int) -> Any:
        """Pickling fails as on eager's result not read yet, whether or not this one's region
        ran (ahead, or for another value): it meets DALI's operator class first (which may not
        pickle: eager's PicklingError), then the invocation's lock (as `__deepcopy__` does).
        (A value read is a Batch holding its TensorList, which fails first, as eagerly.)"""
        pickle.dumps(self.ref.node.op_class, protocol)
        return self.__deepcopy__({})


def lazy_value(tracer: Any, ref: Ref, is_batch: bool) -> Any:
    """The ndd.Batch (or ndd.Tensor) standing for recorded output `ref`, and its handle."""
    handle = LazyValue(tracer, ref, is_batch)
    value = _dali.lazy_batch(handle) if is_batch else _dali.Tensor(invocation_result=handle)
    return value, handle


def lazy_handle(value: Any) -> LazyValue | None:
    """The LazyValue a Batch or Tensor of transparent mode is built on, else None."""
    handle = _dali.invocation_result_of(value)
    return handle if type(handle) is LazyValue else None


def is_lazy(value: Any) -> bool:
    return type(_dali.invocation_result_of(value)) is LazyValue


def node_of(result: Any) -> Node:
    """The recorded node of a call's result (one value, a tuple or a dict of them)."""
    if isinstance(result, dict):
        result = next(iter(result.values()))
    elif isinstance(result, tuple):
        result = result[0]
    return lazy_handle(result).ref.node
