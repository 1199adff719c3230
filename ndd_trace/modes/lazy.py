"""Transparent mode: unmodified ndd code is recorded lazily and runs as cached pipelines.

    with ndd_trace.enabled():              # or ndd_trace.enable() / python -m ndd_trace script.py
        images = ndd.decoders.image(jpegs)             # recorded, nothing runs
        images = ndd.resize(images, size=[64, 64]) * 2
        tensor = images.torch()                        # the pending region runs as one pipeline
    print(ndd_trace.report())

Each ndd call returns a lazy ndd.Batch/Tensor. Consuming one (`.torch()`, `np.asarray`,
`.shape`, iteration, printing) runs the pending calls it depends on as one DALI pipeline, looked
up by the region's structure (same ops, same static arguments, same input kinds), so a loop body
builds its pipeline once and reuses it every iteration. Random ops draw their state when they are
called, exactly as eagerly, so values and generator state match a plain run. A call that cannot
be recorded (a synchronous EvalMode, an argument DALI rejects, a stateful operator) runs eagerly
on the spot and is counted with its reason and `file:line`.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
import time
import weakref
from collections import Counter, OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .. import _dali
from ..ahead.readahead import (RUN_AHEAD, Speculator, can_stream, epoch_of, has_epoch_wrapper,
                               reader_epoch, stream_of)
from ..codegen.lower import lower
from ..codegen.optimize import optimize as optimize_graph
from ..codegen.optimize import requested as optimize_requested
from ..core import logs
from ..core.errors import PipelineError, _GraphBreak
from ..core.ir import Graph, Node, NodeKind, Ref, TensorMeta, op_key
from ..core.source import SourceLoc, user_frame, user_location
from ..execution import waits
from ..execution.interpret import interpret
from ..execution.runtime import Executable, LazyResult, Options
from ..tracing.trace import (BATCH_ABSENT, TracedBatch, TracedTensor, Tracer, _is_concrete_data,
                             inference_metas)

# Region pipelines held at once (each has a few OS threads): past it, the least recently run
# one's pipeline is freed (built again if it runs again).
MAX_LIVE_REGIONS = 64
# Regions made at one line before new ones there run eagerly: a value that changes every call
# (a float argument) would otherwise build a pipeline per value.
MAX_SITE_REGIONS = 32
_SITE_FULL = (f"a new region each time at this line (its arguments keep changing): past "
              f"{MAX_SITE_REGIONS} regions there, new ones run eagerly")


@dataclasses.dataclass
class Region:
    """One cached pipeline of transparent mode, and what it did."""

    key: tuple
    loc: SourceLoc | None
    num_ops: int
    executable: Executable | None
    code: str
    runs: int = 0
    hits: int = 0
    build_s: float = 0.0
    record_s: float = 0.0
    eager_reason: str | None = None
    ahead: int = 0  # runs served by a run launched ahead on batches read ahead
    releases: int = 0  # times its pipeline was freed as the least recently run (rebuilt on use)
    # the region's identity for the speculator's tables (hashing `key` again costs more)
    token: object = dataclasses.field(default_factory=object, compare=False, repr=False)
    optimizations: list = dataclasses.field(default_factory=list)  # optimize.Applied, in order

    @property
    def parts(self) -> list[str]:
        """The region's structure key, one readable line per fed input and op call."""
        return _describe_key(self.key)

    @property
    def op_chain(self) -> str:
        """The op calls of the region, in call order (`decoders.image[cpu] -> resize[cpu]`)."""
        return " -> ".join(part.split("(")[0][3:] for part in self.parts
                           if part.startswith("op "))

    @property
    def input_kinds(self) -> list[str]:
        """What the region is fed: data (device, dtype, ndim, layout) and random states."""
        return [part[6:] for part in self.parts if part.startswith("input ")]


@dataclasses.dataclass
class Report:
    """What transparent mode compiled and what it ran eagerly, with reasons and locations; the
    reader loops' waits for data and the loader verdict."""

    regions: list[Region]
    eager_ops: Counter  # (op name, reason, file:line) -> count
    ops_recorded: int
    readers: Counter  # (reader, file:line) -> epochs read through a reader pipeline
    ops_replayed: int = 0  # of ops_recorded: made from their call site's last call
    releases: int = 0  # region pipelines freed as the least recently run (MAX_LIVE_REGIONS)
    # reader loops timed from their consumer's side: its wait for data vs its own step
    loops: list[waits.LoopTimes] = dataclasses.field(default_factory=list)

    def as_dict(self) -> dict:
        splits = _splits(self.regions)
        return {
            "ops_recorded": self.ops_recorded,
            "ops_replayed": self.ops_replayed,
            "ops_eager": sum(self.eager_ops.values()),
            "pipelines_released": self.releases,
            "regions": [
                {"location": str(r.loc) if r.loc else None, "ops": r.num_ops, "runs": r.runs,
                 "cache_hits": r.hits, "run_ahead": r.ahead,
                 "builds": 1 if r.executable is not None else 0,
                 "build_s": round(r.build_s, 4), "record_s": round(r.record_s, 4),
                 "eager_reason": r.eager_reason, "releases": r.releases, "op_chain": r.op_chain,
                 "inputs": r.input_kinds, "split_by": splits.get(id(r)),
                 "optimizations": [str(applied) for applied in r.optimizations]}
                for r in self.regions
            ],
            "eager_ops": [
                {"op": op, "reason": reason, "location": where, "count": count}
                for (op, reason, where), count in sorted(self.eager_ops.items())
            ],
            "readers": [
                {"reader": reader, "location": where, "epochs": epochs}
                for (reader, where), epochs in sorted(self.readers.items())
            ],
            "loops": [times.as_dict() for times in self.loops],
        }

    def chart(self, path: str) -> str:
        """A chart of each reader loop's per-step wait for data, written to `path` (needs
        matplotlib: ImportError, saying so, without it)."""
        return waits.chart(path, self.loops)

    def __str__(self) -> str:
        lines = ["ndd_trace report (transparent mode)",
                 f"  ndd calls recorded: {self.ops_recorded} "
                 f"({self.ops_replayed} from their call site's last call), "
                 f"run eagerly: {sum(self.eager_ops.values())}",
                 f"  compiled regions: {len(self.regions)}"
                 + (f" (pipelines freed as the least recently run: {self.releases}; at most "
                    f"{MAX_LIVE_REGIONS} held, rebuilt when run again)" if self.releases else "")]
        splits = _splits(self.regions)
        for r in sorted(self.regions, key=lambda r: -r.runs):
            where = r.loc.short if r.loc else "?"
            status = f"eager ({r.eager_reason})" if r.eager_reason else "pipeline"
            if r.releases:
                status += f" (freed {r.releases}x as the least recently run)"
            lines.append(f"    {where:<28} {r.num_ops:3d} ops  runs {r.runs:6d}  "
                         f"cache hits {r.hits:6d}  run ahead {r.ahead:6d}  "
                         f"build {r.build_s * 1000:7.1f} ms  record {r.record_s * 1000:7.1f} ms  "
                         f"{status}")
            if id(r) in splits:  # several regions start at this line: say what tells them apart
                lines.append(f"      ops: {r.op_chain}")
                lines.append(f"      inputs: {', '.join(r.input_kinds) or '-'}")
                lines.append(f"      split by: {splits[id(r)]}")
            lines += [f"      optimization applied: {applied}" for applied in r.optimizations]
        if self.readers:
            lines.append("  readers in a read-ahead pipeline:")
            for (reader, where), epochs in sorted(self.readers.items()):
                lines.append(f"    {where}: {reader}, {epochs} epoch(s)")
        if self.eager_ops:
            lines.append("  calls run eagerly:")
            for (op, reason, where), count in sorted(self.eager_ops.items()):
                lines.append(f"    {where}: ndd.{op} x{count}: {reason}")
        if self.loops:
            lines.append("  reader loops (the consumer's wait for data vs its own step):")
            for times in self.loops:
                lines.extend(times.lines())
        return "\n".join(lines)


def _splits(regions: list[Region]) -> dict[int, str]:
    """For regions sharing a `file:line`: id(region) -> the key part where it differs from the
    first of them (the most run), as "op resize[cpu](in0, size=[16, 16])  ->  op resize[cpu](in0,
    size=[8, 8])" or "input in0: batch<cpu, UINT8, ...>  ->  input in0: batch<cpu, FLOAT, ...>"."""
    groups: dict[str, list[Region]] = {}
    for region in sorted(regions, key=lambda r: -r.runs):
        groups.setdefault(str(region.loc) if region.loc else "?", []).append(region)
    splits: dict[int, str] = {}
    for group in groups.values():
        if len(group) < 2:
            continue
        first = group[0].parts
        splits[id(group[0])] = "(the first region there)"
        for region in group[1:]:
            parts = region.parts
            at = next((i for i, (a, b) in enumerate(zip(first, parts)) if a != b),
                      min(len(first), len(parts)))
            if region.key == group[0].key:
                splits[id(region)] = ("the batch size (a random op without batch_size draws one "
                                      "value: a pipeline of batches of more than one sample would "
                                      "draw one per sample)")
            elif len(first) == len(parts) == at:
                splits[id(region)] = (
                    "the values still held when it ran (its outputs)"
                    if region.key[-1] != group[0].key[-1] else "implicit copies or casts")
            elif at >= len(first) or at >= len(parts):
                longer = parts if len(parts) > len(first) else first
                word = "more" if len(parts) > len(first) else "fewer"
                splits[id(region)] = f"{word} steps, from: {longer[at]}"
            else:
                splits[id(region)] = f"{first[at]}  ->  {parts[at]}"
    return splits


class _Shown(str):
    """Text that prints as itself (no quotes) in a region's description."""

    __slots__ = ()

    def __repr__(self) -> str:
        return str.__str__(self)


def _thaw(frozen: Any) -> Any:
    """Back from ir.freeze to a value that prints as the user wrote it."""
    if isinstance(frozen, tuple) and len(frozen) == 2 and isinstance(frozen[0], str):
        kind, value = frozen
        if kind == "float":  # (a NaN's key is its bytes: ir.float_key)
            if isinstance(value, str):
                return float.fromhex(value)
            return _Shown("-nan" if value[-1] & 0x80 else "nan")  # the sign bit, little-endian
        if kind in ("list", "tuple") and isinstance(value, tuple):
            items = [_thaw(v) for v in value]
            return items if kind == "list" else tuple(items)
        if kind == "id":
            return f"<object {value:#x}>"
        return value
    return frozen


def _describe_key(key: tuple) -> list[str]:
    """Readable lines for a region key (built by _region_view: fed leaves and op calls in
    order, then the outputs)."""
    lines: list[str] = []
    names: list[str] = []  # what each key position is called in later lines
    ops = inputs = 0
    for item in key[:-1]:
        if len(item) == 4:  # a fed leaf: (kind, meta, is_batch, no_copy)
            kind, meta, is_batch, _ = item
            if kind == NodeKind.RANDOM_STATE.value:
                text = "random state"
            else:
                text = (f"{'batch' if is_batch else 'tensor'}<{meta.device}, {meta.dtype}, "
                        f"ndim={meta.ndim}" + (f", {meta.layout}" if meta.layout else "") + ">")
            names.append(f"in{inputs}")
            lines.append(f"input in{inputs}: {text}")
            inputs += 1
            continue
        name, backend, _, static, positional, _, arg_inputs, _ = item
        arguments = [names[at] + (f"[{index}]" if index else "") for at, index in positional]
        arguments += [f"{arg}={names[at]}" for arg, at, _ in arg_inputs]
        if isinstance(static, tuple):
            arguments += [f"{arg}={_thaw(value)!r}" for arg, value in static
                          if isinstance(arg, str) and not arg.startswith("_")]
        names.append(f"op{ops}")
        lines.append(f"op {name}[{backend}]({', '.join(arguments)})")
        ops += 1
    return lines


class _State:
    """Process-wide bookkeeping of transparent mode (the regions are shared by threads)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.regions: dict[tuple, Region] = {}
        # regions holding a built pipeline (or about to), least recently run first
        self.live: OrderedDict[object, Region] = OrderedDict()
        self.site_regions: Counter = Counter()  # file:line -> regions made there
        self.releases = 0
        self.eager_ops: Counter = Counter()
        self.readers: Counter = Counter()
        self.ops_recorded = 0
        self.ops_replayed = 0
        self.local = threading.local()
        # seconds spent per stage, all threads: record (ndd calls), key (a region's cone and
        # structure), check (run-ahead: observe, use, launch), feed (building, feeding), run
        # (DALI's Run), fetch (waiting for the outputs); see step_breakdown()
        self.times = dict.fromkeys(("record", "key", "check", "feed", "run", "fetch"), 0.0)


_state = _State()


class _UnlistedGraph(Graph):
    """A graph that numbers nodes but keeps no list: lazy nodes live as long as their users."""

    def _add(self, kind: NodeKind, name: str, **fields: Any) -> Node:
        node = Node(index=self._next_index, kind=kind, name=name, **fields)
        self._next_index += 1
        node.results = None
        node.proxies = []
        return node

    _next_index = 0


class _LazyMixin:
    _tracer: LazyTracer
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

    def __init__(self, tracer: LazyTracer, ref: Ref, is_batch: bool, device: Any):
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
        return self._ref.node.results


class LazyBatch(_LazyMixin, TracedBatch):
    """A lazy ndd.Batch of transparent mode; consumed, it runs its pending region."""

    # (over _LazyMixin's, which are the tensors')
    locals().update({name: getattr(TracedBatch, name) for name in BATCH_ABSENT})

    def __init__(self, tracer: LazyTracer, ref: Ref, meta: TensorMeta):
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


class LazyTensor(_LazyMixin, TracedTensor):
    """A lazy ndd.Tensor of transparent mode."""

    def __init__(self, tracer: LazyTracer, ref: Ref, meta: TensorMeta):
        self._init_traced(tracer, ref, meta, _known_dtype(meta),
                          lambda device: _LazyHandle(tracer, ref, False, device))

    def __getitem__(self, ranges: Any) -> Any:
        return TracedTensor.__getitem__(self, ranges)

    @property
    def size(self) -> Any:
        self._materialize()
        return _dali.Tensor.size.fget(self)


_IGNORED_KWARGS = frozenset(("_backend", "_caller_frame"))  # what recording drops too
_DATA, _RNG = object(), object()  # argument tokens: recorded data; a random op's generator
_MAX_SITES = 4096
_SITE_FIELDS = ("name", "schema", "backend", "arg_casts", "static", "frozen_static",
                "num_outputs", "output_names", "is_batch", "loc")


@dataclasses.dataclass(eq=False)
class _Site:
    """A call site's last recorded call: what it was given, and its node (whose derived
    fields, shared and never changed, a replayed call reuses)."""

    arguments: tuple  # (name, token) per keyword argument, in call order
    input_metas: tuple
    arg_metas: dict  # data keyword arguments: name -> metadata
    converted: tuple  # lists eager ndd passes as per-call tensor arguments (data too)
    is_random: bool
    fields: dict  # the recorded node's derived fields (_SITE_FIELDS), passed to add_op
    instance: tuple | None  # eager's operator instance: (key, construction arguments, batch size)


def _first_output(result: Any) -> Any:
    """The first output of a recorded call's result (one value, a tuple or a dict of them)."""
    if isinstance(result, dict):
        return next(iter(result.values()))
    return result[0] if isinstance(result, tuple) else result


def _is_lazy(value: Any) -> bool:
    return isinstance(value, _LazyMixin)


def _runs_at_call(node: Node, inputs: tuple, kwargs: dict) -> bool:
    """Whether eager ndd runs this recorded call at once: an input or tensor argument it reads
    as it is wraps user data (DALI's `has_external_inputs`; under 1 us a call)."""
    devices = node.input_devices
    index = 0
    for value in inputs:
        if value is None:
            continue
        if not isinstance(value, _LazyMixin) and index < len(devices) and \
                _dali.eager_reads_as_is(value, node.is_batch) == devices[index]:
            return True
        index += 1
    for key in node.arg_inputs:
        value = kwargs.get(key)
        if value is not None and not isinstance(value, _LazyMixin) and \
                key not in node.arg_casts and \
                _dali.eager_reads_as_is(value, node.is_batch) == "cpu":
            return True
    return False


class LazyTracer(Tracer):
    """Records ndd calls of one thread for transparent mode; runs regions when consumed."""

    def __init__(self, device_id: int | None, num_threads: int):
        super().__init__("transparent", device_id)
        self.graph = _UnlistedGraph("transparent")
        self.options = Options(num_threads, device_id, RUN_AHEAD)
        self.optimize = False  # regions get optimize.py's rewrites (enable(optimize=True))
        self.speculator = Speculator()
        self._sites: dict[tuple, _Site] = {}  # (op, code, instruction) -> its last call
        self._converted: dict[tuple, Any] = {}  # lists converted to tensor arguments, kept
        self._owned: set[int] = set()  # ids of the values in _converted

    # -- recording -----------------------------------------------------------------------------

    def _proxy(self, ref: Ref, meta: TensorMeta, is_batch: bool) -> Any:
        proxy = (LazyBatch if is_batch else LazyTensor)(self, ref, meta)
        ref.node.proxies.append(weakref.ref(proxy))
        return proxy

    def _ref_of(self, value: Any, is_batch: bool, loc: SourceLoc | None) -> Ref:
        if _is_lazy(value):
            if _dali.proxy_storage(value) is None and value._tracer is self:
                return value._ref
            value._materialize()
            storage = _dali.proxy_storage(value)
            concrete = (_dali.wrap_batch(storage) if isinstance(value, _dali.Batch)
                        else _dali.Tensor(storage))
            return super()._constant_ref(concrete, is_batch, loc)
        return super()._ref_of(value, is_batch, loc)

    def _tensor_argument(self, op_class: type, key: str, value: Any, batch_size: Any) -> Any:
        """A list eager ndd passes as a per-call tensor argument, converted as ndd converts it
        (for a batch, the Batch ndd broadcasts it to). Kept per value and batch size: a loop
        passes the same list every step (`mean=MEAN`), and the conversion, the copy recording
        makes of user data and a broadcast at every run cost ~0.2 ms a call; these are
        ndd_trace's own, never written to, and fed in place."""
        token = _dali.argument_token(value)
        cache_key = (op_class, key, token, batch_size) if token is not None else None
        converted = self._converted.get(cache_key) if cache_key is not None else None
        if converted is None:
            with _dali.eager_inside_trace():
                converted = _dali.tensor_argument(op_class, key, value, batch_size)
            if cache_key is not None:
                if len(self._converted) >= _MAX_SITES:
                    self._converted.clear()
                    self._owned.clear()
                self._converted[cache_key] = converted
                self._owned.add(id(converted))  # (alive while in _converted)
        return converted

    def _constant_ref(self, value: Any, is_batch: bool, loc: SourceLoc | None) -> Ref:
        """User data is copied when the call is recorded, as eager ndd reads it then (a loop
        that refills one numpy buffer must not change pending results); batches handed out
        by a read-ahead reader are the pipeline's own and used as they are, and so are the
        tensor arguments converted here (`_tensor_argument`)."""
        ref = super()._constant_ref(value, is_batch, loc)
        if id(value) in self._owned:
            if ref.node.meta[0].device == "cpu":
                ref.node.static["no_copy"] = True
            return ref
        if not self.speculator.is_reader_batch(ref.node.payload):
            with _dali.eager_inside_trace():
                ref.node.payload = _dali.snapshot(ref.node.payload)
        elif ref.node.meta[0].device == "cpu":
            ref.node.static["no_copy"] = True  # fed in place: nobody writes to it
        return ref

    def reader_used(self, obj: Any, *args: Any, **kwargs: Any) -> Any:
        """`reader.next_epoch(batch_size=...)` reads through a read-ahead pipeline (readahead.py).
        Sample epochs, operator objects and ExternalSource pulls run eagerly (their lazy inputs
        are materialized by ndd itself when it evaluates them)."""
        kind = kwargs.get("_ndd_trace_kind")
        reason = None
        if kind is None:
            stream = stream_of(obj)
            reason = can_stream(obj)
            if reason is None:
                batch_size = (stream.request(args, kwargs) if stream is not None
                              else _dali.reader_epoch_request(obj, args, kwargs))
                if batch_size is not None:
                    loc = user_location()
                    with _state.lock:
                        _state.readers[(type(obj).__name__, str(loc) if loc else "?")] += 1
                    logs.transparent.debug("%s.next_epoch(batch_size=%s) at %s: read ahead",
                                           type(obj).__name__, batch_size, loc or "?")
                    epoch = waits.timed(
                        reader_epoch(obj, batch_size, self.options, self.speculator.note_batch),
                        f"{type(obj).__name__}.next_epoch", str(loc) if loc else "?")
                    return epoch_of(obj, epoch, args, kwargs)
                reason = ("DALI's capture mode runs this loop (capture=True)"
                          if _dali.reader_epoch_captures(args, kwargs) else
                          "reader epochs of single samples (or an explicit ctx) run eagerly")
        elif kind == "operator" and not isinstance(obj, _dali.Reader):
            reason = "operator object called directly"
        if reason is not None:
            loc = user_location()
            name = f"{type(obj).__name__}.next_epoch" if kind is None else type(obj).__name__
            with _state.lock:
                _state.eager_ops[(name, reason, str(loc) if loc else "?")] += 1
        if kind is None and has_epoch_wrapper(obj):  # an eager epoch, through its wrapper
            epoch = _dali.unwatched(_dali.Reader, "next_epoch")(obj, *args, **kwargs)
            return epoch_of(obj, epoch, args, kwargs)
        return None

    def _rng_slot(self, rng: Any, loc: SourceLoc | None) -> tuple:
        return ("pending", _dali.resolve_rng(rng))

    @_dali.plumbing
    def handle(self, op_class: type, original: Any, inputs: tuple, kwargs: dict) -> Any:
        started = time.perf_counter()
        try:
            return self._handle(op_class, original, inputs, kwargs)
        finally:
            _state.times["record"] += time.perf_counter() - started

    @_dali.plumbing  # it calls ndd's own op when the call runs eagerly: DALI looks past it
    def _handle(self, op_class: type, original: Any, inputs: tuple, kwargs: dict) -> Any:
        name = _dali.op_path(op_class)
        if _dali.eval_mode_is_sync():
            return self._eager(original, inputs, kwargs, name, "a synchronous EvalMode is active")
        if _dali.process_params_replaced():
            return self._eager(original, inputs, kwargs, name,
                               "DALI's Operator._process_params is replaced")
        frame = user_frame(sys._getframe(1))
        site_key = (op_class, frame.f_code, frame.f_lasti) if frame is not None else None
        site = self._sites.get(site_key) if site_key is not None else None
        reason = None
        try:
            result = self._replay(site, op_class, inputs, kwargs) if site is not None else None
            replayed = result is not None
            if result is None:
                result = super().handle(op_class, original, inputs, dict(kwargs))
                instance = self._keep_eager_instance(
                    op_class, _first_output(result)._ref.node, kwargs,
                    _dali.call_site_frame(sys._getframe(1), kwargs))
                if site_key is not None:
                    self._remember_site(site_key, result, inputs, kwargs, instance)
        except _GraphBreak as graph_break:
            reason = graph_break.reason
        except Exception as error:  # DALI rejects the call: eager raises its own error
            reason = f"could not be recorded ({type(error).__name__})"
        if reason is not None:  # run outside the handler: eager's error has no internal context
            return self._eager(original, inputs, kwargs, name, reason)
        state = _first_output(result)._ref.node.arg_inputs.get("_random_state")
        if state is not None:  # draw now, in call order, exactly as the eager call would
            _, rng = state.node.payload
            position = _dali.rng_position(rng)
            words = _dali.draw_state(rng)
            state.node.payload = ("drawn", words)
            self.speculator.note_draw(words, rng, position)
        with _state.lock:
            _state.ops_recorded += 1
            _state.ops_replayed += replayed
        node = _first_output(result)._ref.node
        if _runs_at_call(node, inputs, kwargs):
            self._run_at_call(node)
        return result

    def _run_at_call(self, node: Node) -> None:
        """Run `node`'s region now, as eager ndd runs a call given user data as it is, so that
        its run-time error raises at this call (the calls after it never happen, nor draw):
        the op's own error, or eager's error for a result used if an op it reads failed."""
        try:
            self.materialize(Ref(node, 0))
            return
        except PipelineError as error:  # raised as at a result's first use
            own = error.__cause__
            at_call = own if isinstance(own, PipelineError) and own.loc == node.loc and \
                own.op_name == f"ndd.{node.name}" else error
        raise at_call  # (outside the handler: no internal context)

    # -- replaying a call site ------------------------------------------------------------------
    #
    # A loop records the same calls every step. Where a call site's call is given what its
    # last recorded call was given (the same static arguments, token for token, and data with
    # the same metadata), recording it again would derive the same backend, static arguments
    # and output metadata: the node is made from the site's last call instead (no argument
    # normalization, freezing or inference). Anything else is recorded as usual.

    def _keep_eager_instance(self, op_class: type, node: Node, kwargs: dict,
                             call_frame: Any) -> tuple | None:
        """Leave an operator instance in the EvalContext's cache where the eager call would
        (code that inspects `EvalContext._instance_cache` finds eager's entries); its key and
        construction arguments, for the call site's replays. None where eager's view of the
        call site is not known (code ndd_trace generated)."""
        if call_frame is None:
            return None
        split = _dali.eager_split(op_class, call_frame, kwargs)
        arg_metas = {}
        for name in split.call_args:
            ref = node.arg_inputs.get(name)
            if ref is not None:
                arg_metas[name] = ref.node.meta[ref.index]
            elif name != "_random_state":  # a Python number recording keeps static
                with _dali.eager_inside_trace():
                    arg_metas[name] = _dali.tensor_argument_meta(op_class, name, kwargs[name])
        key = _dali.eager_instance_key(
            op_class, node.backend, _dali.current_device_id(),
            node.batch_size if node.is_batch else None, split,
            [ref.node.meta[ref.index] for ref in node.inputs], arg_metas)
        _dali.keep_eager_instance(op_class, key, split.init_args)
        return key, split.init_args, node.batch_size if node.is_batch else None

    def _remember_site(self, site_key: tuple, result: Any, inputs: tuple, kwargs: dict,
                       instance: tuple | None) -> None:
        node = _first_output(result)._ref.node
        arguments = self._describe_arguments(node.op_class, kwargs)
        if arguments is None or not all(self._replayable_input(value) for value in inputs
                                        if value is not None):
            self._sites.pop(site_key, None)
            return
        if len(self._sites) >= _MAX_SITES:
            self._sites.clear()
        converted = tuple(key for key in node.arg_inputs if type(kwargs.get(key)) in (list, tuple))
        self._sites[site_key] = _Site(
            arguments=arguments,
            input_metas=tuple(ref.node.meta[ref.index] for ref in node.inputs),
            arg_metas={key: ref.node.meta[ref.index] for key, ref in node.arg_inputs.items()
                       if key != "_random_state"},
            converted=converted,
            instance=instance,
            is_random="_random_state" in node.arg_inputs,
            # the node's derived fields as recorded (its metadata may be refined later, from
            # that call's data), not the node: it would keep its results alive
            fields={name: getattr(node, name) for name in _SITE_FIELDS} | {
                "meta": list(node.meta), "input_devices": list(node.input_devices)})

    def _describe_arguments(self, op_class: type, kwargs: dict) -> tuple | None:
        """(name, token) per keyword argument: a static value's token, or "data" for a value
        recorded by this tracer (compared by its metadata); None if one has neither."""
        described = []
        for key, value in kwargs.items():
            if value is None or key in _IGNORED_KWARGS:  # (recording drops them too)
                continue
            if key == "rng" and _dali.is_random(op_class):
                described.append((key, _RNG))
                continue
            if _is_lazy(value) and _dali.proxy_storage(value) is None and \
                    value._tracer is self:
                described.append((key, _DATA))
                continue
            token = _dali.argument_token(value)
            if token is None:
                return None
            described.append((key, token))
        return tuple(described)

    def _replayable_input(self, value: Any) -> bool:
        """A value this tracer recorded, or concrete ndd data (fed as a constant), a lazy value
        that ran included (an op given user data runs at its call)."""
        if _is_lazy(value):
            return _dali.proxy_storage(value) is not None or value._tracer is self
        return _is_concrete_data(value)

    def _replay(self, site: _Site, op_class: type, inputs: tuple, kwargs: dict) -> Any:
        """This call recorded from its site's last call, if it was given the same (else None)."""
        if self._describe_arguments(op_class, kwargs) != site.arguments:
            return None
        data = [kwargs[key] for key in site.arg_metas  # the data arguments, in call order
                if key not in site.converted]
        if any(value._meta != meta for value, meta in zip(data, site.arg_metas.values())):
            return None
        inputs = tuple(value for value in inputs if value is not None)
        if len(inputs) != len(site.input_metas) or not all(
                self._replayable_input(value) for value in inputs):
            return None
        fields = site.fields
        is_batch, loc = fields["is_batch"], fields["loc"]
        # batch or sample mode, as recording decides it: the batch_size argument, else the
        # first Batch among the inputs, then the data arguments (all of one size: recording
        # leaves batches of different sizes to ndd, which rejects them)
        batch_size = kwargs.get("batch_size")
        if batch_size is None:
            sizes = [value.batch_size for value in (*inputs, *data)
                     if isinstance(value, _dali.Batch)]
            if sizes:
                batch_size = sizes[0]
                if any(size != batch_size for size in sizes):
                    return None
        if (batch_size is not None) != is_batch:
            return None
        refs = [self._ref_of(value, is_batch, loc) for value in inputs]
        if any(ref.node.meta[ref.index] != meta for ref, meta in zip(refs, site.input_metas)):
            return None  # (constants made for the inputs are left unused)
        if batch_size is not None:
            self._note_static_batch_size(int(batch_size), loc)
        arg_inputs = {}
        for key in site.arg_metas:
            if key in site.converted:  # the same list (its token): converted as recorded
                value = self._tensor_argument(op_class, key, kwargs[key], batch_size)
                arg_inputs[key] = self._ref_of(value, is_batch, loc)
            else:
                arg_inputs[key] = kwargs[key]._ref
        if site.instance is not None:
            key, init_args, recorded_batch_size = site.instance
            if batch_size != recorded_batch_size:
                key = _dali.eager_instance_key_for_batch(key, int(batch_size or 1))
            _dali.keep_eager_instance(op_class, key, init_args)
        if site.is_random:
            if not is_batch:
                self.sample_random_ops.append(loc)
            state = self.graph.add_random_state(self._rng_slot(kwargs.get("rng"), loc), loc)
            arg_inputs["_random_state"] = Ref(state, 0)
        new = self.graph.add_op(**fields, op_class=op_class, batch_size=batch_size, inputs=refs,
                                arg_inputs=arg_inputs)
        self.num_ops += 1
        results = [self._proxy(Ref(new, i), new.meta[i], new.is_batch)
                   for i in range(new.num_outputs)]
        if new.num_outputs == 1:
            return results[0]
        if new.output_names is None:
            return tuple(results)
        return dict(zip(new.output_names, results))

    @_dali.plumbing
    def _eager(self, original: Any, inputs: tuple, kwargs: dict, name: str, reason: str) -> Any:
        loc = user_location()
        with _state.lock:
            _state.eager_ops[(name, reason, str(loc) if loc else "?")] += 1
        logs.transparent.debug("ndd.%s at %s runs eagerly: %s", name, loc or "?", reason)
        for value in (*inputs, *kwargs.values()):
            if _is_lazy(value):
                value._materialize()
        with _dali.eager_inside_trace():
            return original(*inputs, **kwargs)

    # -- running -------------------------------------------------------------------------------

    def refine_meta(self, ref: Ref) -> bool:
        """Infer a pending op's output metadata again from its inputs' real metadata, as eager
        ndd does to answer `.dtype`, `.ndim` or `.layout` before it runs an op (its inputs have
        run by then: ndd runs an op fed by user data at the call). The inputs' regions run, the
        op itself does not: its own run-time error still comes at first use, as eagerly. True
        if the node's metadata changed (its proxies then answer from it)."""
        node = ref.node
        if node.kind is not NodeKind.OP or node.results is not None or node.op_class is None:
            return False

        def real(value: Ref) -> TensorMeta:
            if value.node.kind is not NodeKind.OP:
                return value.node.meta[value.index]
            return _dali.meta_of(_dali.wrap_batch(self.materialize(value)))

        input_metas, arg_metas = inference_metas(
            [real(value) for value in node.inputs], node.input_devices,
            {key: real(value) for key, value in node.arg_inputs.items()}, node.arg_casts)
        # with its inputs' metadata complete, DALI's verdict on the call is eager's: a call it
        # rejects raises here, as ndd's inference does when asked for the metadata
        _, _, metas = _dali.infer_metadata(node.op_class, node.backend, node.static,
                                           input_metas, arg_metas)
        if len(metas) != node.num_outputs or metas == node.meta:
            return False
        node.meta = list(metas)
        for proxy_ref in node.proxies:
            proxy = proxy_ref()
            if proxy is not None:
                proxy._meta = node.meta[proxy._ref.index]
        return True

    def materialize(self, ref: Ref) -> Any:
        """Run the pending region `ref` depends on; return that output's TensorList."""
        node = ref.node
        if node.results is None:
            self._run_region(node)
        return node.results[ref.index]

    def _run_region(self, target: Node) -> None:
        started = time.perf_counter()
        region_ops = self._pending_cone(target)
        view = _region_view(region_ops, target, clone=False)
        key = view.key
        batch_sizes = set()
        one_value_random = False
        for n in region_ops:
            if n.is_batch:
                batch_sizes.add(int(n.batch_size))
            elif "_random_state" in n.arg_inputs:
                one_value_random = True
        batch_size = max(batch_sizes) if batch_sizes else 1
        # a random op in sample mode draws one value; in a batch pipeline, one per sample: with
        # batches of more than one sample, the region is one of its own (run eagerly)
        own_region = one_value_random and batch_size > 1
        lookup = (key, "batches") if own_region else key
        if self.optimize:  # (regions are shared by threads, which may differ in this)
            lookup = (lookup, "optimize")
        record_s = time.perf_counter() - started
        with _state.lock:
            region = _state.regions.get(lookup)
            if region is None:
                mixed = len(batch_sizes) > 1 or own_region
                region = self._new_region(key, region_ops, target, mixed,
                                          mixed or self._site_has_room(region_ops))
                if region.eager_reason is None or mixed:
                    _state.regions[lookup] = region
                    logs.transparent.info("new region at %s: %s (%s)", region.loc or "?",
                                          region.op_chain, region.eager_reason or "pipeline")
            else:
                region.hits += 1
            region.runs += 1
            region.record_s += record_s
            if region.executable is not None:
                self._note_live(region)
        times = _state.times
        checked = time.perf_counter()
        times["key"] += checked - started
        observation = (self.speculator.observe(view.leaves, view.computed)
                       if region.executable is not None else None)
        ahead = (self.speculator.take(region.token, observation) if observation is not None
                 else None)
        fed = time.perf_counter()
        times["check"] += fed - checked
        if ahead is not None:
            outputs = list(ahead)
            with _state.lock:
                region.ahead += 1
        elif region.executable is None or (region.executable.feed.empty_sample_unsafe and
                                           self._empty_sample_call(region, view.leaves)):
            view = _region_view(region_ops, target, clone=True)
            values = interpret(view.graph, {id(leaf): _leaf_value(leaf) for leaf in view.leaves})
            outputs = [_dali.storage_of(values[ref]) for ref in view.graph.outputs]
        else:
            try:
                builds = region.executable.builds
                run_s = region.executable.run_s
                started = time.perf_counter()
                run = region.executable.run_leaves(view.leaves, batch_size, region_ops)
                if region.executable.builds != builds:
                    region.build_s += time.perf_counter() - started
                waited = time.perf_counter()
                scheduled = region.executable.run_s - run_s
                times["feed"] += waited - fed - scheduled
                times["run"] += scheduled
                outputs = list(run.result())
                times["fetch"] += time.perf_counter() - waited
            except Exception:
                retired = region.executable.retired  # (its failed pipelines cannot be freed)
                if region.executable.builds and retired is None:
                    raise
                region.executable = None  # the pipeline cannot be built: interpret from now on
                region.eager_reason = retired or "pipeline build failed"
                logs.fallbacks.info("region at %s: %s, interpreted eagerly", region.loc or "?",
                                    region.eager_reason)
                return self._run_region(target)
        logs.transparent.debug("region at %s ran (%s)", region.loc or "?",
                               "run ahead" if ahead is not None else f"run {region.runs}")
        if observation is not None and region.executable is not None:
            learned = time.perf_counter()
            self.speculator.learn(region.token, region.executable, observation, batch_size)
            times["check"] += time.perf_counter() - learned
        for (original, index), output in zip(view.outputs, outputs):
            if original.results is None:
                original.results = [None] * original.num_outputs
            original.results[index] = output
            if all(r is not None for r in original.results):
                _settle_proxies(original)

    @staticmethod
    def _empty_sample_call(region: Region, leaves: list[Node]) -> bool:
        """Whether this run feeds a sample with no elements to an op that crashes a pipeline on
        one: it runs eagerly (interpreted), counted with the reason."""
        executable = region.executable
        if not executable.feed.feeds_empty_sample(leaves=leaves):
            return False
        site = str(region.loc) if region.loc else "?"
        with _state.lock:
            _state.eager_ops[(region.op_chain, executable.feed.empty_sample_reason, site)] += 1
        logs.fallbacks.debug("region at %s runs eagerly: %s", site,
                             executable.feed.empty_sample_reason)
        return True

    @staticmethod
    def _site_has_room(region_ops: list[Node]) -> bool:
        """Whether a new pipelined region may be made at its line (MAX_SITE_REGIONS); if not,
        this call runs eagerly (interpreted), counted with the reason."""
        loc = region_ops[0].loc
        site = str(loc) if loc else "?"
        if _state.site_regions[site] < MAX_SITE_REGIONS:
            _state.site_regions[site] += 1
            return True
        chain = " -> ".join(f"{node.name}[{node.backend}]" for node in region_ops)
        _state.eager_ops[(chain, _SITE_FULL, site)] += 1
        logs.fallbacks.debug("region at %s: %s", site, _SITE_FULL)
        return False

    @staticmethod
    def _note_live(region: Region) -> None:
        """`region` runs now: the most recently run; past MAX_LIVE_REGIONS pipelines, the least
        recently run one's is freed (its threads go; it is built again if it runs again)."""
        live = _state.live
        live[region.token] = region
        live.move_to_end(region.token)
        if len(live) > MAX_LIVE_REGIONS:
            _, oldest = live.popitem(last=False)
            if oldest.executable is not None and oldest.executable.release():
                oldest.releases += 1
                _state.releases += 1
                logs.transparent.info("region at %s: pipeline freed (the least recently run of "
                                      "%d)", oldest.loc or "?", MAX_LIVE_REGIONS)

    def _new_region(self, key: tuple, region_ops: list[Node], target: Node,
                    mixed_batch_sizes: bool, site_has_room: bool = True) -> Region:
        loc = region_ops[0].loc if region_ops else None
        started = time.perf_counter()
        if mixed_batch_sizes:
            return Region(key, loc, len(region_ops), None, "",
                          eager_reason="batches of different sizes, or a one-value random op "
                                       "among batches, in one region")
        if not site_has_room:
            return Region(key, loc, len(region_ops), None, "", eager_reason=_SITE_FULL)
        graph = _region_view(region_ops, target, clone=True).graph
        applied = optimize_graph(graph) if self.optimize else []
        lowered = lower(graph)
        executable = Executable(graph, lowered, [], self.options, {})
        executable.feed.cache_constants = False
        region = Region(key, loc, len(region_ops), executable, lowered.source,
                        optimizations=applied)
        region.build_s = time.perf_counter() - started  # lowering; the build is added on run
        return region

    @staticmethod
    def _pending_cone(target: Node) -> list[Node]:
        """The unmaterialized op calls `target` depends on, in call order."""
        seen: dict[int, Node] = {}
        stack = [target]
        while stack:
            node = stack.pop()
            if id(node) in seen or node.kind is not NodeKind.OP or node.results is not None:
                continue
            seen[id(node)] = node
            stack.extend(ref.node for ref in node.inputs)
            stack.extend(ref.node for ref in node.arg_inputs.values())
        return sorted(seen.values(), key=lambda n: n.index)


@dataclasses.dataclass
class _RegionView:
    """A pending region as a pipeline sees it: its structure key (op names, static arguments,
    edges, leaf kinds; no data), the values it is fed, and which of them an earlier region
    computed; `graph` is a self-contained copy, made only where one is needed (a new region,
    or one the interpreter runs)."""

    key: tuple
    leaves: list[Node]
    computed: list[bool]
    outputs: list[tuple[Node, int]]  # (recorded node, output index) the region gives back
    graph: Graph | None


def _region_view(region_ops: list[Node], target: Node, clone: bool) -> _RegionView:
    graph = Graph("region")  # the fed leaves, and the copied ops where `clone`
    position: dict[int, int] = {}  # id(recorded op) -> its position in the key
    copies: dict[int, Node] = {}
    fed: dict[tuple[int, int], tuple[int, Ref]] = {}
    items: list[Any] = []
    leaves: list[Node] = []
    computed: list[bool] = []

    def mapped(ref: Ref) -> tuple[int, int, Ref | None]:
        node = ref.node
        if id(node) in position:
            copy = Ref(copies[id(node)], ref.index) if clone else None
            return position[id(node)], ref.index, copy
        key = (id(node), ref.index)
        if key not in fed:
            leaf = _make_leaf(graph, node, ref.index)
            fed[key] = (len(items), Ref(leaf, 0))
            items.append((leaf.kind.value, leaf.meta[0], leaf.is_batch,
                          bool(leaf.static.get("no_copy"))))
            leaves.append(leaf)
            computed.append(node.kind is NodeKind.OP)
        at, leaf_ref = fed[key]
        return at, 0, leaf_ref

    for node in region_ops:
        inputs = [mapped(ref) for ref in node.inputs]
        arg_inputs = [(name, mapped(ref)) for name, ref in node.arg_inputs.items()]
        position[id(node)] = len(items)
        items.append(op_key(
            node, tuple((at, index) for at, index, _ in inputs),
            tuple(sorted((name, at, index) for name, (at, index, _) in arg_inputs))))
        if clone:
            fields = {f.name: getattr(node, f.name) for f in dataclasses.fields(Node)
                      if f.name not in ("index", "kind", "name", "schema", "inputs",
                                        "arg_inputs")}
            copies[id(node)] = graph.add_op(
                node.name, node.schema, **fields, inputs=[ref for *_, ref in inputs],
                arg_inputs={name: ref for name, (*_, ref) in arg_inputs})
    outputs = [(node, index) for node in region_ops
               if node is target or any(proxy() is not None for proxy in node.proxies)
               for index in range(node.num_outputs)]
    items.append(tuple((position[id(node)], index) for node, index in outputs))
    if clone:
        graph.outputs = [Ref(copies[id(node)], index) for node, index in outputs]
    return _RegionView(tuple(items), leaves, computed, outputs, graph if clone else None)


def _make_leaf(graph: Graph, node: Node, index: int) -> Node:
    """The fed leaf standing for output `index` of `node`, outside the region."""
    if node.kind is NodeKind.OP:  # materialized earlier: its data is fed
        data = node.results[index]
        value = _dali.wrap_batch(data) if node.is_batch else _dali.wrap_tensor(data)
        # the data's own metadata (inference may not know the layout), so that regions fed
        # differently laid-out data get different pipelines
        leaf = graph.add_constant(value, _dali.meta_of(value), node.is_batch, None)
        if leaf.meta[0].device == "cpu":
            leaf.static["no_copy"] = True  # a pipeline's output: fed in place
        return leaf
    if node.kind is NodeKind.RANDOM_STATE:
        return graph.add_random_state(node.payload, node.loc)
    leaf = graph.add_constant(node.payload, node.meta[0], node.is_batch, None)
    leaf.static = dict(node.static)
    return leaf


def _leaf_value(leaf: Node) -> Any:
    if leaf.kind is NodeKind.RANDOM_STATE:
        return leaf.payload[1]
    return leaf.payload


def _settle_proxies(node: Node) -> None:
    for proxy_ref in node.proxies:
        proxy = proxy_ref()
        if proxy is not None and _dali.proxy_storage(proxy) is None:
            _dali.set_proxy_storage(proxy, node.results[proxy._ref.index])
    node.proxies = []


# ---------------------------------------------------------------------------------------------
# Public switches

def _local() -> Any:
    return _state.local


def enable(optimize: bool | None = None) -> None:
    """Record ndd calls of this thread lazily and run them as cached pipelines; `optimize`:
    with optimize.py's rewrites (None: as NDD_TRACE_OPTIMIZE says, off by default)."""
    if not is_enabled():
        _switch_on(new_tracer(optimize))
    elif optimize is not None:
        _local().tracer.optimize = bool(optimize)


def _switch_on(tracer: LazyTracer) -> None:
    """This thread's ndd calls go to `tracer` from now on (until `disable()`)."""
    context = _dali.intercept(tracer.handle, tracer.reader_used)
    context.__enter__()
    local = _local()
    local.context, local.tracer = context, tracer


def new_tracer(optimize: bool | None = None) -> LazyTracer:
    """A transparent-mode tracer set up for this thread's device and thread count (and
    `optimize`, as `enable` takes it)."""
    tracer = LazyTracer(_dali.current_device_id(), _dali.current_num_threads())
    tracer.optimize = optimize_requested(optimize)
    return tracer


def disable() -> None:
    """Back to plain eager ndd for this thread (values already recorded stay usable)."""
    local = _local()
    context = getattr(local, "context", None)
    if context is not None:
        local.context = None
        context.__exit__(None, None, None)


def is_enabled() -> bool:
    """Whether this thread's ndd calls are recorded by transparent mode."""
    return getattr(_local(), "context", None) is not None


class Steps:
    """Transparent mode around each step of a generator, and not in between (a compiled
    generator's checked mode): the consumer's code between steps runs as it would without
    ndd_trace.

        steps = Steps(tracer)        # one tracer for every step: the reader batches it saw and
        with steps.step():           # the run-ahead patterns it learned carry from step to step
            item = next(generator)
        steps.close()                # the hooks, kept installed between steps, go

    A fresh tracer per step would forget which batches came from a read-ahead reader (copying
    them) and never see three steps of a pattern (running nothing ahead)."""

    def __init__(self, tracer: LazyTracer):
        self.tracer = tracer
        self._release = _dali.hold_interception()

    @contextmanager
    def step(self) -> Iterator[None]:
        if is_enabled():  # transparent mode already records
            yield
            return
        _switch_on(self.tracer)
        try:
            yield
        finally:
            disable()

    def close(self) -> None:
        self._release()


@contextmanager
def enabled(optimize: bool | None = None) -> Iterator[None]:
    """`with ndd_trace.enabled(): ...` runs the block in transparent mode (`optimize`: as
    `enable` takes it)."""
    was_enabled = is_enabled()
    previous = _local().tracer.optimize if was_enabled else None
    enable(optimize)
    try:
        yield
    finally:
        if not was_enabled:
            disable()
        elif optimize is not None:
            _local().tracer.optimize = previous


def report() -> Report:
    """What transparent mode compiled and ran eagerly so far, and how long the consumer of each
    reader loop waited for its data (the loader verdict; compiled generators too), all threads."""
    with _state.lock:
        return Report(list(_state.regions.values()), Counter(_state.eager_ops),
                      _state.ops_recorded, Counter(_state.readers), _state.ops_replayed,
                      _state.releases, waits.loops())


def step_breakdown() -> dict[str, float]:
    """Seconds transparent mode spent so far (all threads): `record` (recording ndd calls),
    `key` (a region's cone and structure key), `check` (run-ahead: describing the fed leaves,
    using a run launched ahead, which may wait for it, and launching the next), `feed`
    (building, feeding), `run` (DALI's Run of the region's own runs), `fetch` (waiting for
    their outputs)."""
    with _state.lock:
        return dict(_state.times)


def reset_report() -> None:
    """Forget the regions, eager calls, readers and loop times counted so far (all threads)."""
    with _state.lock:
        _state.times = dict.fromkeys(_state.times, 0.0)
        _state.regions.clear()
        _state.live.clear()
        _state.site_regions.clear()
        _state.releases = 0
        _state.eager_ops.clear()
        _state.readers.clear()
        _state.ops_recorded = 0
        _state.ops_replayed = 0
    waits.reset()
