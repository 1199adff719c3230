"""Pipelines: options, feeding, scheduling and outputs; DALI's errors read as eager raises them."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import re
import sys
import tempfile
import threading
import weakref
from collections.abc import Iterator
from typing import Any, NamedTuple

import nvidia.dali.backend as backend
import nvidia.dali.experimental.dynamic as ndd
import nvidia.dali.types as types
from nvidia.dali.experimental.dynamic import _exceptions
from nvidia.dali.pipeline import Pipeline

from .base import Batch, EvalMode, Tensor


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
_SEPARABLE_CONVOLUTIONS = frozenset(("GaussianBlur", "Laplacian"))


def crashes_on_empty_samples(schema: str | None) -> bool:
    """Whether a pipeline running this operator crashes on a sample with no elements."""
    return schema in _SEPARABLE_CONVOLUTIONS


def eager_rejects_output_layout(schema: str | None, input_metas: list) -> bool:
    """Whether eager ndd may reject this call's output when it runs it: DALI 2.4's separable
    convolutions given 1-D samples without a layout raise ValueError ("Unexpected layout of
    output 0") at the result's use, a check of eager's run that a pipeline does not make
    (samples whose ndim the trace does not know may be 1-D)."""
    if schema not in _SEPARABLE_CONVOLUTIONS or not input_metas:
        return False
    meta = input_metas[0]
    return meta.ndim in (1, None) and not meta.layout


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
        # (its traceback dropped: DALI's raising frame holds the error, a cycle through which
        # the frames below, and the error they surface, would live until a garbage collection)
        return str(error.with_traceback(None))
    return "An error happened during asynchronous execution"


def deferred_error_text(deferred: bool) -> str:
    """What eager ndd's error says when an operator's run-time error surfaces at the first use of
    its result (`rethrow_exception`'s text for the EvalMode of the call: `deferred` or eager),
    the operator's own error being its cause."""
    return _deferred_error_text(EvalMode.deferred if deferred else EvalMode.eager)


def eval_mode_is_deferred() -> bool:
    """Whether this thread's ndd calls are in EvalMode.deferred (~0.1 us)."""
    return EvalMode.current() is EvalMode.deferred


# a line of the log that DALI's native libraries print on stderr (nvImageCodec:
# "\x1b[0;31m[ERROR] \x1b[0m[libjpeg_turbo_decoder] Could not decode ...")
_NATIVE_LOG_LINE = re.compile(
    rb"^(?:\x1b\[[0-9;]*m)?\[(?:FATAL|ERROR|WARNING|WARN|INFO|DEBUG|TRACE)\] ")
_STDERR_TAKEN = threading.RLock()  # fd 2 is the process's: one thread redirects it at a time


@contextlib.contextmanager
def native_logs_dropped() -> Iterator[None]:
    """While a failed run's ops run again (the eager replay that learns eager's error), drop
    the log lines DALI's native libraries print on stderr: the failed run printed them already,
    as eager's one run does. Anything else written to stderr meanwhile (another thread's) is
    written on once the replay is done."""
    if not _STDERR_TAKEN.acquire(blocking=True, timeout=5):
        yield
        return
    try:
        for stream in (sys.stderr, sys.__stderr__):
            with contextlib.suppress(Exception):
                stream.flush()
        try:
            saved = os.dup(2)
        except OSError:  # no stderr to keep clean
            yield
            return
        with tempfile.TemporaryFile() as captured:
            os.dup2(captured.fileno(), 2)
            try:
                yield
            finally:
                with contextlib.suppress(Exception):
                    sys.stderr.flush()
                os.dup2(saved, 2)
                os.close(saved)
                captured.seek(0)
                kept = b"".join(line for line in captured.read().splitlines(keepends=True)
                                if not _NATIVE_LOG_LINE.match(line))
                if kept:
                    os.write(2, kept)
    finally:
        _STDERR_TAKEN.release()
