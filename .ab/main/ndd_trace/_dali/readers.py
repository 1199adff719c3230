"""Readers: ndd readers owned by compiled loops and streams, their epochs, shards and checkpoints;
external sources."""

from __future__ import annotations

import base64
import dataclasses
import os
import re
from collections.abc import Callable
from typing import Any

import numpy as np

import nvidia.dali.backend as backend
import nvidia.dali.experimental.dynamic as ndd
import nvidia.dali.types as types
from nvidia.dali import fn
from nvidia.dali.experimental.dynamic import _ops
from nvidia.dali.pipeline import Pipeline

from ..core.ir import TensorMeta
from .base import Batch
from .operators import infer_metadata
from .interception import eager_inside_trace, synchronous, unwatched, watch_method


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


def claim_reader_unmapped(reader: Any, batch_size: int) -> tuple[Any, bool]:
    """`claim_reader`, the operator made with `dont_use_mmap=True` where eager ndd has not made
    it yet, so that it reads files into memory instead of mapping them (the reader's own
    arguments are left as they were). Returns the operator and whether it maps its files (one
    eager ndd made earlier keeps its own setting)."""
    own_args = reader._init_args
    unmapped = reader._op_backend is None or bool(own_args.get("dont_use_mmap"))
    if reader._op_backend is None:
        reader._init_args = {**own_args, "dont_use_mmap": True}
        reader._op_spec = None  # (made again from these arguments by the backend's init)
    try:
        operator = claim_reader(reader, batch_size)
    finally:
        reader._init_args = own_args
    return operator, not unmapped


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


@dataclasses.dataclass(frozen=True)
class ReaderFiles:
    """How a File or Numpy reader's samples come from local files, for reading them again
    (ahead/streams.py): each sample of `content_outputs` is the one file its source info names,
    relative to `root`."""

    root: str | None  # what source infos are relative to (None: paths as they are)
    content_outputs: tuple[int, ...]  # outputs read from the files (not File's labels)
    shuffled: bool  # random_shuffle: DALI's buffer loads files up to initial_fill samples ahead
    prefetch_depth: int  # batches DALI's own prefetch thread loads ahead of the runs
    mapped: bool  # eager ndd maps the files (dont_use_mmap=False), reading them at each run
    whole_files: bool  # a sample is its file's bytes (File), so its size is the file's
    read_args: tuple[tuple[str, Any], ...]  # the arguments that shape a sample from its file


def _file_read_arguments(kind: str) -> tuple[str, ...]:
    """The arguments of a `kind` reader that shape a sample from its file's bytes."""
    if kind == "Numpy":
        return ("dont_use_mmap", "read_ahead", "use_o_direct", "roi_start", "rel_roi_start",
                "roi_end", "rel_roi_end", "roi_shape", "rel_roi_shape", "roi_axes",
                "out_of_bounds_policy", "fill_value")
    return ("dont_use_mmap", "read_ahead")


def reader_files(reader: Any) -> ReaderFiles | None:
    """How `reader`'s samples map to local files, or None where ndd_trace cannot tell (other
    readers, GPU readers, URIs, cached images skipped)."""
    kind = type(reader).__name__
    args = {k: v for k, v in reader._init_args.items() if v is not None}
    if kind not in ("File", "Numpy") or reader._backend != "cpu" or \
            args.get("skip_cached_images") or args.get("cache_header_information"):
        return None
    root = args.get("file_root")
    if root is None and args.get("file_list"):
        root = os.path.dirname(args["file_list"]) or None  # (DALI's default root for a list)
    named = [root or "", args.get("file_list") or "", *(args.get("files") or ())]
    if any("://" in str(name) for name in named):
        return None
    return ReaderFiles(root=root, content_outputs=(0,),
                       shuffled=bool(args.get("random_shuffle")),
                       prefetch_depth=int(args.get("prefetch_queue_depth", 1)),
                       mapped=not args.get("dont_use_mmap"), whole_files=kind == "File",
                       read_args=tuple((name, args[name]) for name in _file_read_arguments(kind)
                                       if name in args))


def sample_sources(batch: Batch) -> list[str]:
    """Each sample's source info (the file a reader read it from, as the reader names it)."""
    storage = batch.evaluate()._storage
    return [storage[index].source_info() for index in range(len(storage))]


def sample_lengths(batch: Batch) -> list[int]:
    """Each sample's length (a File reader's sample: its file's size in bytes)."""
    return [int(shape[0]) if shape else 0 for shape in batch.evaluate()._storage.shape()]


def file_path(files: ReaderFiles, source: str) -> str:
    return os.path.join(files.root, source) if files.root else source


def read_files_again(reader: Any, files: ReaderFiles, sources: list[str]) -> list[tuple]:
    """Read these files as eager ndd's `reader` reads them now (a reader of its kind, over just
    them, in order); per file, its samples of the content outputs. Raises the error eager's
    reader raises for a file it cannot read (its own type and text)."""
    args = dict(files.read_args)
    if files.root is not None:
        args["file_root"] = files.root
    again = type(reader)(files=list(sources), random_shuffle=False, **args)
    with eager_inside_trace(), synchronous():
        outputs = next(_ops.Reader._batches(again, len(sources), None))
        if isinstance(outputs, dict):
            outputs = tuple(outputs.values())
        storages = [outputs[index].evaluate()._storage for index in files.content_outputs]
    return [tuple(storage[position] for storage in storages)
            for position in range(len(sources))]


# where DALI's file readers name the file they failed on (either way of reading it)
_FAILED_FILE = (re.compile(r"Could not open file (.+): [^:]*$", re.M),
                re.compile(r"Failed to read file: (.+?), read: \d+ while it should be \d+", re.M),
                re.compile(r"File mapping failed: (.+)$", re.M),
                re.compile(r"Failed to read file: (.+)$", re.M),
                re.compile(r"\. File: (.+)$", re.M))


def as_eager_read_error(reader: Any, files: ReaderFiles, error: BaseException) -> BaseException:
    """The error eager ndd's `reader` raises for the file `error` (a reader run's, which read
    files another way: into memory, or mapped) failed on: that file read again as eager reads
    it; `error` itself where it names no file, or the file now reads."""
    text = str(error)
    for pattern in _FAILED_FILE:
        match = pattern.search(text)
        if match is None:
            continue
        path = match.group(1)
        root = (files.root or "").rstrip("/")
        source = path[len(root) + 1:] if root and path.startswith(root + "/") else path
        try:
            read_files_again(reader, files, [source])
        except Exception as eager_error:  # noqa: BLE001 (what eager raises for it)
            if os.path.basename(source) in str(eager_error):  # (not a failure of its own)
                return eager_error
        return error
    return error


def with_samples(batches: tuple, files: ReaderFiles, replaced: dict[int, tuple]) -> tuple:
    """The reader outputs `batches` with some samples of their content outputs replaced
    (`replaced`: sample index -> its samples, as `read_files_again` gives them)."""
    result = list(batches)
    for slot, output in enumerate(files.content_outputs):
        storage = batches[output].evaluate()._storage
        samples = [replaced[index][slot] if index in replaced else storage[index]
                   for index in range(len(storage))]
        result[output] = Batch(backend.TensorListCPU(samples, storage.layout() or None))
    return tuple(result)


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
