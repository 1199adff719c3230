"""Opt-in rewrites a DALI expert makes by hand: `@ndd.compile(optimize=True)`,
`ndd_trace.enable(optimize=True)` or `NDD_TRACE_OPTIMIZE=1`.

    applied = optimize(graph)          # rewrites the graph in place, after CSE and dead code
    for rewrite in applied:            # what `explain` lists under "optimizations applied:"
        print(rewrite)                 # a.py:11: roi decoding: decoders.image (a.py:10) + ...

Each rewrite is recorded with the user's line and what it changes in values. What no rewrite
touches stays exactly what eager ndd computes: random states are never added or dropped (a
fused random crop decodes with the very state drawn for the `random_resized_crop` it replaces),
so every generator advances as it does eagerly and every other random op gets eager's draw.

- roi decoding: `decoders.image` whose only use is a `random_resized_crop`, `crop`, `slice` or a
  `crop_mirror_normalize` with a crop becomes `decoders.image_random_crop` + `resize`,
  `decoders.image_crop`, `decoders.image_slice`, or `decoders.image_crop` +
  `crop_mirror_normalize` without its crop (CPU and GPU): only the window is decoded.
- placement: a CPU op that only rearranges values (flip, transpose, reshape, expand_dims,
  squeeze, an exact widening cast) and whose every consumer reads it on the GPU runs on the GPU,
  the data moving there before it (a widening cast moves the narrow data); values are the same.
- redundant casts: a cast to the dtype its input already has is dropped (exact).
- hw_decoder_load: mixed (GPU) image decoders the user gave no `hw_decoder_load` get
  HW_DECODER_LOAD, the start of execution/tuning.py's per-machine search (`set_hw_decoder_load`).

Every DALI fact (schemas, argument names, backends) comes through `_dali`.
"""

from __future__ import annotations

import dataclasses
import os
from types import MappingProxyType
from typing import Any

from .. import _dali
from ..core import checks, passes
from ..core.ir import Graph, Node, NodeKind, Ref
from ..core.keys import freeze_arguments
from ..core.source import SourceLoc

ENV_VAR = "NDD_TRACE_OPTIMIZE"
HW_DECODER_LOAD_ENV_VAR = "NDD_TRACE_HW_DECODER_LOAD"
# The start of execution/tuning.py's per-machine search. DALI's default, 0.65, is also what
# measured fastest on the H200 for the train workload (RESULTS.md, ninth session: 0.9 ran at
# 0.80-0.92x it, 1.0 at 0.73x); written out, so that `explain` shows what the decoder runs with
HW_DECODER_LOAD = 0.65

_DECODER = "decoders__Image"
_DECODERS = frozenset(("decoders__Image", "decoders__ImageCrop", "decoders__ImageRandomCrop",
                       "decoders__ImageSlice"))
# where the window is, in crop's, crop_mirror_normalize's and the fused decoders' terms
_CROP_WINDOW = frozenset(("crop", "crop_h", "crop_w", "crop_pos_x", "crop_pos_y", "rounding"))
_SLICE_WINDOW = frozenset(("axes", "axis_names", "normalized_anchor", "normalized_shape",
                           "start", "end", "rel_start", "rel_end", "shape", "rel_shape"))
_RANDOM_WINDOW = frozenset(("random_area", "random_aspect_ratio", "num_attempts"))
# random_resized_crop's resampling, which `resize` takes as it is
_RESAMPLING = frozenset(("size", "interp_type", "mag_filter", "min_filter", "antialias",
                         "dtype", "minibatch_size", "temp_buffer_hint", "bytes_per_sample_hint",
                         "preserve"))
_HINTS = frozenset(("bytes_per_sample_hint", "preserve"))  # of an op absorbed by the decoder

# ops whose output is their input's values rearranged: the same on either device, by definition
_REARRANGING = frozenset(("Flip", "Transpose", "Reshape", "ExpandDims", "Squeeze"))
# casts that hold every input value exactly (no rounding, no saturation), on either device
_NARROW = frozenset(("BOOL", "UINT8", "INT8", "UINT16", "INT16"))
_WIDE = frozenset(("INT32", "INT64", "FLOAT", "FLOAT64"))

_RANDOM_CROP_VALUES = (
    "the window is drawn in the decoder, from the random state drawn for random_resized_crop "
    "(the same draw: every generator advances as eagerly; DALI 2.4 picks the same window from "
    "it); the window is then resized from its own pixels, where random_resized_crop resamples "
    "the whole image, so values differ from eager's (most near the window's edges)")
_WINDOW_VALUES = ("the decoder decodes only the window: the same values on the CPU in our tests "
                  "(libjpeg-turbo); the GPU's ROI decoding may differ at the window's edges")


@dataclasses.dataclass(frozen=True)
class Applied:
    """One rewrite made: its name, the user's line, what it did and what changes in values."""

    rewrite: str
    loc: SourceLoc | None
    detail: str
    values: str
    node: Node | None = dataclasses.field(default=None, compare=False, repr=False)  # made

    def __str__(self) -> str:
        where = self.loc.short if self.loc is not None else "?"
        return f"{where}: {self.rewrite}: {self.detail}; values: {self.values}"


def requested(optimize: bool | None) -> bool:
    """`optimize` as given, or where None, whether NDD_TRACE_OPTIMIZE asks for it."""
    if optimize is not None:
        return bool(optimize)
    return checks.env_switch(ENV_VAR, default=False)


def optimize(graph: Graph) -> list[Applied]:
    """Apply every rewrite to `graph` (in place; containers of nodes are replaced, never
    changed, as transparent mode's recorded nodes share them) and list what was done."""
    applied: list[Applied] = []
    applied += drop_redundant_casts(graph)
    applied += fuse_roi_decoding(graph)
    applied += place_on_gpu(graph)
    applied += tune_hw_decoder_load(graph)
    applied.sort(key=lambda item: (item.loc.filename, item.loc.lineno) if item.loc else ("", 0))
    if applied:
        _drop_unused_ops(graph)
        graph.verify()
    return applied


# ---------------------------------------------------------------------------------------------
# Graph helpers

def _uses(graph: Graph) -> dict[int, list[tuple[Node | None, str, Any]]]:
    """id(node) -> every use of its outputs: (user, "input", index), (user, "arg", name) or
    (None, "output", position)."""
    uses: dict[int, list[tuple[Node | None, str, Any]]] = {}
    for node in graph.nodes:
        for index, ref in enumerate(node.inputs):
            uses.setdefault(id(ref.node), []).append((node, "input", index))
        for name, ref in node.arg_inputs.items():
            uses.setdefault(id(ref.node), []).append((node, "arg", name))
    for position, ref in enumerate(graph.outputs):
        uses.setdefault(id(ref.node), []).append((None, "output", position))
    return uses


def _drop_unused_ops(graph: Graph) -> None:
    """Drop the ops no output depends on any more (a `.gpu()` made redundant). Fed nodes stay:
    a transparent-mode region is fed its leaves in the order its graph holds them."""
    live = passes.live_nodes(graph)
    graph.nodes = [node for node in graph.nodes
                   if node.kind is not NodeKind.OP or id(node) in live]


def _redirect(graph: Graph, old: Node, new: Ref) -> None:
    """Every use of `old` (one output) reads `new` instead."""
    def fix(ref: Ref) -> Ref:
        return new if ref.node is old else ref

    for node in graph.nodes:
        if any(ref.node is old for ref in [*node.inputs, *node.arg_inputs.values()]):
            node.inputs = [fix(ref) for ref in node.inputs]
            node.arg_inputs = {key: fix(ref) for key, ref in node.arg_inputs.items()}
    graph.outputs = [fix(ref) for ref in graph.outputs]


def _become(node: Node, path: str, static: dict[str, Any], arg_inputs: dict[str, Ref]) -> None:
    """Make `node` a call of `fn.<path>` with these arguments (its inputs are the caller's)."""
    op_class = _dali.op_class_at(path)
    node.name = _dali.op_path(op_class)
    node.schema = _dali.schema_name(op_class)
    node.op_class = op_class
    node.static = static
    try:
        node.frozen_static = freeze_arguments(static)
    except TypeError:  # an unhashable value: keys freeze it by identity
        node.frozen_static = None
    node.arg_inputs = arg_inputs
    casts = {}
    for key, ref in arg_inputs.items():
        expected = _dali.argument_dtype(op_class, key)
        if expected is not None and ref.node.meta[ref.index].dtype != expected:
            casts[key] = expected
    node.arg_casts = casts


def _move_before(graph: Graph, node: Node, anchor: Node) -> None:
    graph.nodes.remove(node)
    graph.nodes.insert(graph.nodes.index(anchor), node)


def _arguments(node: Node) -> set[str]:
    return {*node.static, *(key for key in node.arg_inputs if key != "_random_state")}


def _split(node: Node, names: frozenset[str]) -> tuple[dict[str, Any], dict[str, Ref]]:
    """The static and tensor arguments of `node` among `names`."""
    return ({key: value for key, value in node.static.items() if key in names},
            {key: ref for key, ref in node.arg_inputs.items() if key in names})


def _short(loc: SourceLoc | None) -> str:
    return loc.short if loc is not None else "?"


# ---------------------------------------------------------------------------------------------
# ROI decoding

def _fusable_pair(graph: Graph, decoder: Node, uses: dict) -> Node | None:
    """The consumer of `decoder` a fused decoder can replace, or None: a plain image decoder
    whose one output is used exactly once, as the first input of an op on the device where the
    decoder leaves it."""
    if decoder.kind is not NodeKind.OP or decoder.schema != _DECODER or \
            decoder.num_outputs != 1 or len(decoder.inputs) != 1 or decoder.arg_inputs:
        return None
    found = uses.get(id(decoder), [])
    if len(found) != 1:
        return None
    consumer, kind, where = found[0]
    if consumer is None or kind != "input" or where != 0 or consumer.kind is not NodeKind.OP:
        return None
    device = decoder.meta[0].device
    if consumer.input_devices[0] != device or consumer.is_batch != decoder.is_batch or \
            consumer.backend != ("gpu" if decoder.backend == "mixed" else "cpu"):
        return None
    return consumer


def _accepts(path: str, names: set[str]) -> bool:
    return names <= _dali.argument_names(_dali.op_class_at(path))


def _in_bounds_only(node: Node) -> bool:
    """No padding asked for: the window lies inside the image (else the op fails, as the fused
    decoder does)."""
    return node.static.get("out_of_bounds_policy", "error") == "error" and \
        "out_of_bounds_policy" not in node.arg_inputs


def fuse_roi_decoding(graph: Graph) -> list[Applied]:
    """decode + random_resized_crop / crop / slice / crop_mirror_normalize(crop=...) -> a
    decoder that decodes only the window (see the module's docstring)."""
    applied = []
    for decoder in list(graph.nodes):
        if decoder not in graph.nodes:
            continue
        consumer = _fusable_pair(graph, decoder, _uses(graph))
        if consumer is None:
            continue
        rewrite = _FUSIONS.get(consumer.schema)
        done = rewrite(graph, decoder, consumer) if rewrite is not None else None
        if done is not None:
            applied.append(done)
    return applied


def _fuse_random_resized_crop(graph: Graph, decoder: Node, consumer: Node) -> Applied | None:
    arguments = _arguments(consumer)
    state = consumer.arg_inputs.get("_random_state")
    if state is None or not arguments <= _RANDOM_WINDOW | _RESAMPLING:
        return None
    window_static, window_args = _split(consumer, _RANDOM_WINDOW)
    if window_args or not _accepts("decoders.image_random_crop",
                                   {*decoder.static, *window_static}):
        return None
    resample_static, resample_args = _split(consumer, _RESAMPLING)
    if not _accepts("resize", {*resample_static, *resample_args}):
        return None
    decoder_loc = decoder.loc
    _become(decoder, "decoders.image_random_crop", {**decoder.static, **window_static},
            {"_random_state": state})
    _move_before(graph, decoder, consumer)  # after the state, which may come after it
    _become(consumer, "resize", resample_static, resample_args)
    return Applied("roi decoding", consumer.loc,
                   f"decoders.image ({_short(decoder_loc)}) + random_resized_crop -> "
                   "decoders.image_random_crop + resize", _RANDOM_CROP_VALUES)


def _fuse_crop(graph: Graph, decoder: Node, consumer: Node) -> Applied | None:
    return _absorb(graph, decoder, consumer, _CROP_WINDOW, "decoders.image_crop", "crop")


def _fuse_slice(graph: Graph, decoder: Node, consumer: Node) -> Applied | None:
    if any(device != "cpu" for device in consumer.input_devices[1:]) or any(
            ref.node.meta[ref.index].device != "cpu" for ref in consumer.inputs[1:]):
        return None  # anchor and shape: the decoders read them on the CPU
    return _absorb(graph, decoder, consumer, _SLICE_WINDOW, "decoders.image_slice", "slice")


def _absorb(graph: Graph, decoder: Node, consumer: Node, window: frozenset[str], path: str,
            what: str) -> Applied | None:
    """`consumer` (a crop or slice of the decoded image) becomes the fused decoder itself."""
    arguments = _arguments(consumer) - {"out_of_bounds_policy"}
    if "_random_state" in consumer.arg_inputs or not _in_bounds_only(consumer) or \
            not arguments <= window | _HINTS:
        return None
    window_static, window_args = _split(consumer, window)
    if not _accepts(path, {*decoder.static, *window_static, *window_args}):
        return None
    _become(consumer, path, {**decoder.static, **window_static}, window_args)
    consumer.backend = decoder.backend
    consumer.inputs = [decoder.inputs[0], *consumer.inputs[1:]]
    consumer.input_devices = [decoder.input_devices[0], *consumer.input_devices[1:]]
    consumer_loc, consumer.loc = consumer.loc, decoder.loc  # decoding is what fails on bad data
    graph.nodes.remove(decoder)
    return Applied("roi decoding", consumer_loc,
                   f"decoders.image ({_short(decoder.loc)}) + {what} -> {consumer.name}",
                   _WINDOW_VALUES)


def _fuse_crop_mirror_normalize(graph: Graph, decoder: Node, consumer: Node
                                ) -> Applied | None:
    arguments = _arguments(consumer)
    if not ({"crop"} & arguments or {"crop_h", "crop_w"} <= arguments) or \
            arguments & {"crop_d", "crop_pos_z", "fill_values"} or \
            not _in_bounds_only(consumer):
        return None
    window_static, window_args = _split(consumer, _CROP_WINDOW)
    if not _accepts("decoders.image_crop", {*decoder.static, *window_static, *window_args}):
        return None
    rest_static = {key: value for key, value in consumer.static.items()
                   if key not in _CROP_WINDOW and key != "out_of_bounds_policy"}
    rest_args = {key: ref for key, ref in consumer.arg_inputs.items() if key not in _CROP_WINDOW}
    decoder_loc = decoder.loc
    _become(decoder, "decoders.image_crop", {**decoder.static, **window_static}, window_args)
    _move_before(graph, decoder, consumer)  # after the window's tensor arguments
    _become(consumer, "crop_mirror_normalize", rest_static, rest_args)
    return Applied("roi decoding", consumer.loc,
                   f"decoders.image ({_short(decoder_loc)}) + crop_mirror_normalize(crop) -> "
                   "decoders.image_crop + crop_mirror_normalize", _WINDOW_VALUES)


_FUSIONS = MappingProxyType({
    "RandomResizedCrop": _fuse_random_resized_crop,
    "Crop": _fuse_crop,
    "Slice": _fuse_slice,
    "CropMirrorNormalize": _fuse_crop_mirror_normalize,
})


# ---------------------------------------------------------------------------------------------
# Placement

def _rearranges_exactly(node: Node) -> bool:
    if node.schema in _REARRANGING:
        return True
    if node.schema != "Cast" or "dtype" not in node.static:
        return False
    source = node.inputs[0]
    return source.node.meta[source.index].dtype in _NARROW and \
        _dali.dtype_name(node.static["dtype"]) in _WIDE


def _read_on_gpu(uses: list[tuple[Node | None, str, Any]]) -> bool:
    """Whether every use reads the value on the GPU: a GPU op's input ndd moves there, or a
    `.gpu()` (a Copy to the GPU)."""
    for user, kind, where in uses:
        if user is None or kind != "input":
            return False
        if user.schema == "Copy" and user.backend == "gpu":
            continue
        if user.backend not in ("gpu", "mixed") or user.input_devices[where] != "gpu":
            return False
    return bool(uses)


def place_on_gpu(graph: Graph) -> list[Applied]:
    """CPU ops that only rearrange values, read only on the GPU, move to the GPU (the last
    first, so that a chain of them moves together)."""
    applied = []
    moved = True
    while moved:
        moved = False
        uses = _uses(graph)
        for node in reversed(graph.nodes):
            if node.kind is not NodeKind.OP or node.backend != "cpu" or node.num_outputs != 1 \
                    or len(node.inputs) != 1 or node.input_devices != ["cpu"] or \
                    not _rearranges_exactly(node) or not _dali.has_gpu_backend(node.op_class):
                continue
            node_uses = uses.get(id(node), [])
            if not _read_on_gpu(node_uses):
                continue
            node.backend = "gpu"
            node.input_devices = ["gpu"]  # its one input, moved (`.gpu()`) before it
            node.meta = [meta._replace(device="gpu") for meta in node.meta]
            for user, _, _ in node_uses:
                if user.schema == "Copy":  # now a copy from the GPU to the GPU: not needed
                    _redirect(graph, user, Ref(node, 0))
            applied.append(Applied(
                "placement", node.loc, f"{node.name} runs on the GPU (every consumer reads it "
                "there); its input moves to the GPU before it", "exact: the op only rearranges "
                "(or exactly widens) its input's values, alike on both devices"))
            moved = True
            break
    return applied


# ---------------------------------------------------------------------------------------------
# Casts, decoder tuning

def drop_redundant_casts(graph: Graph) -> list[Applied]:
    """A cast to the dtype its input already has (on the input's device) is dropped: its users
    read the input. Not where that would return one value twice, or a function's argument."""
    applied = []
    for node in list(graph.nodes):
        if node.kind is not NodeKind.OP or node.schema != "Cast" or node.arg_inputs or \
                len(node.inputs) != 1:
            continue
        source = node.inputs[0]
        meta = source.node.meta[source.index]
        if meta.dtype is None or _dali.dtype_name(node.static.get("dtype")) != meta.dtype or \
                node.input_devices[0] != meta.device or node.meta[0].device != meta.device:
            continue
        returned = [ref for ref in graph.outputs if ref.node is node]
        if returned and (source.node.kind is not NodeKind.OP or source in graph.outputs or
                         len(returned) > 1):
            continue
        _redirect(graph, node, source)
        graph.nodes.remove(node)
        applied.append(Applied("redundant cast", node.loc,
                               f"cast to {meta.dtype}, which its input already is, dropped",
                               "exact"))
    return applied


def _hw_decoder_load() -> float:
    text = os.environ.get(HW_DECODER_LOAD_ENV_VAR, "").strip()
    if not text:
        return HW_DECODER_LOAD
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{HW_DECODER_LOAD_ENV_VAR} must be a number between 0 and 1, got "
                         f"{text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{HW_DECODER_LOAD_ENV_VAR} must be between 0 and 1, got {value}")
    return value


def tune_hw_decoder_load(graph: Graph) -> list[Applied]:
    """Mixed image decoders the user gave no `hw_decoder_load` get HW_DECODER_LOAD."""
    applied = []
    load = None
    for node in graph.nodes:
        if node.kind is not NodeKind.OP or node.schema not in _DECODERS or \
                node.backend != "mixed" or "hw_decoder_load" in _arguments(node):
            continue
        load = _hw_decoder_load() if load is None else load
        _become(node, _dali.op_path(node.op_class), {**node.static, "hw_decoder_load": load},
                dict(node.arg_inputs))
        applied.append(Applied(
            "hw_decoder_load", node.loc, f"{node.name}: hw_decoder_load={load} (not set by the "
            "call; tuned per machine from there)", "which images the hardware JPEG decoder takes: "
            "its pixels may differ slightly from the CUDA decoder's", node))
    return applied


def set_hw_decoder_load(node: Node, load: float) -> None:
    """A decoder `tune_hw_decoder_load` gave its load gets another (execution/tuning.py)."""
    _become(node, _dali.op_path(node.op_class), {**node.static, "hw_decoder_load": load},
            dict(node.arg_inputs))
