"""Readers: ndd readers owned by compiled loops and streams, their epochs, shards and checkpoints;
external sources."""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

import numpy as np

import nvidia.dali.experimental.dynamic as ndd
import nvidia.dali.types as types
from nvidia.dali import fn
from nvidia.dali.experimental.dynamic import _ops
from nvidia.dali.pipeline import Pipeline

from ..core.ir import TensorMeta
from .base import Batch
from .operators import infer_metadata
from .interception import unwatched, watch_method


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


def external_source_pull(source: Any, batch_size: int) -> tuple:
    """One item of an ndd.ExternalSource, converted exactly as `source(batch_size=...)` does
    (raises StopIteration at its end); a tuple of Batches (or Tensors), one per output."""
    data = source._callback()
    return tuple(source._convert_outputs(data, batch_size))


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
