"""What a scheduled pipeline run hands back: the run (`PendingRun`), fetched at the first use of
its outputs, and each output as ndd's lazy-result protocol (`LazyOutput`), so that an ndd.Batch
or ndd.Tensor built on it evaluates it only when read.

    run = executable.run(bound_values, batch_size=64)         # a PendingRun (runtime.py)
    batch = _dali.lazy_batch(LazyOutput(run, 0, True, device))  # fetched when first read
"""

from __future__ import annotations

import time
from typing import Any

from .. import _dali
from ..core.ir import Node, TensorMeta
from . import waits
from .failures import interpreted_op_error, surfacing
from .interpret import interpret_unaffected


class PendingRun:
    """One scheduled pipeline iteration whose outputs are fetched on first use."""

    def __init__(self, executable: Any, batch_size: int):  # a runtime.Executable
        self._executable = executable
        self.batch_size = batch_size
        self.outputs: tuple | None = None
        self.error: BaseException | None = None
        self.replay: Any = None  # () -> the exception eager ndd raises on this run's data
        self.leaves: Any = None  # () -> this run's data as `interpret` takes it
        # a failed run's outputs that do not read the failing op, as eager gives them (None
        # for those that do); () where there are none, or they cannot be told apart
        self.readable: list | tuple | None = None
        self.data: list | None = None  # what it was fed (to run it again, see `lost`)
        # an earlier run of the same pipeline failed while this one was scheduled: the pipeline
        # is gone, and this run is run again from its data when its outputs are asked for (an
        # eager call fails alone; the next ones give their own results)
        self.lost = False
        self.failed: Node | None = None  # the op whose failure `error` is, where DALI names it
        self.dali_error: BaseException | None = None  # DALI's report of its own failure
        self.deferred = _dali.eval_mode_is_deferred()  # the EvalMode eager's error text names
        self.as_is = False  # `error` raised as it is (a reader's: eager raises it at once)
        # the recorded op calls the run stands for, in the graph's op order (a transparent-mode
        # region's calls this time): its errors name their lines; None: the graph's own
        self.calls: list[Node] | None = None
        self.fetched: tuple | None = None  # (seconds waited, when, thread) once fetched
        # the user's frames of the call it stands for (source.call_stack): a deferred error's
        # traceback shows them, as eager's shows the op call's stack
        self.call_stack: tuple = ()
        self.used = False  # its outputs were asked for (the tuner counts consumer steps)

    @property
    def executable(self) -> Any:  # a runtime.Executable
        """The executable this run was launched on."""
        return self._executable

    def result(self, index: int | None = None) -> tuple:
        """The run's outputs; its error (the operator's own, as eager raises it at the call)
        raised as eager raises it at the first use of a result (output `index`; None: any)."""
        if self.outputs is None and self.error is None:
            started = time.perf_counter()
            self._executable.fetch(self)
            waits.note_fetched(self, started)  # the consumer's wait, for the loader verdict
        if not self.used:
            self.used = True
            tuner = self._executable.tuner
            if tuner is not None:
                tuner.consumed()
        if self.error is not None:
            raise self.error if self.as_is else surfacing(self.error, self.deferred, index)
        return self.outputs  # type: ignore[return-value]

    def output(self, index: int) -> Any:
        """Output `index` (`result()[index]`); of a failed run, an output that does not read
        the failing op is eager's value: eager fails only the results that use a failing call
        (at their first use), and computes the others."""
        try:
            return self.result(index)[index]
        except Exception:
            readable = self._readable()
            if not readable or readable[index] is None:
                raise
        if type(readable[index]) is tuple:  # another op of the run failed on its own: its error
            eager, node = readable[index]
            raise interpreted_op_error(eager, node, self.deferred,
                                       self._executable.failures.graph, index)
        return readable[index]

    def _readable(self) -> list | tuple:
        if self.readable is None:
            self.readable = ()
            if self.failed is not None and self.leaves is not None and not self.as_is:
                self.readable = interpret_unaffected(
                    self._executable.failures.graph, self.failed, self.leaves(),
                    self.batch_size) or ()
        return self.readable


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

    def __deepcopy__(self, memo: dict) -> Any:
        # eager's pending result holds its invocation's lock, which copy.deepcopy cannot copy
        # (this one holds a run or a recorded call, a pipeline and their threads: the same
        # TypeError, not a walk through them that ends in a RecursionError)
        raise TypeError("cannot pickle '_thread.lock' object")

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


_UNKNOWN = object()  # what the trace does not know of a failed run's output either


class LazyOutput(LazyResult):
    """One output of a scheduled pipeline run."""

    def __init__(self, run: PendingRun, index: int, is_batch: bool, device: Any):
        self.is_batch = is_batch  # (LazyResult's fields, set here: one per call's output)
        self.device = device
        self._run = run
        self._index = index

    def _data(self) -> Any:
        return self._run.output(self._index)

    def _batch_size(self) -> int:
        return self._run.batch_size

    # A failed run's output tells its dtype, ndim and layout as eager ndd's result of the failing
    # call does: from the op's schema, without running it (DALI's output inference, which the
    # trace recorded); where that leaves one unknown, eager runs the op and raises, as here.

    def _traced_meta_of_failed_run(self) -> TensorMeta | None:
        """The output's metadata as the trace inferred it, where its run failed; else None."""
        if self._run.error is None:
            return None
        ref = self._run.executable.graph.outputs[self._index]
        return ref.node.meta[ref.index]

    def _read_or_traced(self, name: str, traced: Any) -> Any:
        """`name` read from the run; where the run failed, `traced(meta)` of the output's
        traced metadata, unless that is _UNKNOWN too (the run's error raised, as eagerly)."""
        try:
            return getattr(super(), name)
        except Exception:
            meta = self._traced_meta_of_failed_run()
            answer = _UNKNOWN if meta is None else traced(meta)
            if answer is _UNKNOWN:
                raise
        return answer

    @property
    def dtype(self) -> Any:
        return self._read_or_traced("dtype", lambda meta: _UNKNOWN if meta.dtype is None
                                    else _dali.dtype_of(meta.dtype))

    @property
    def ndim(self) -> int:
        return self._read_or_traced("ndim", lambda meta: _UNKNOWN if meta.ndim is None
                                    else meta.ndim)

    @property
    def layout(self) -> str | None:
        # ("" where DALI knows the ndim-less output has none)
        return self._read_or_traced("layout", lambda meta: _UNKNOWN if not meta.layout_known or
                                    meta.ndim is None and meta.layout is None
                                    else meta.layout or None)

    @property
    def invocation(self) -> Any:
        return self._run

    @property
    def index(self) -> int:
        return self._index

