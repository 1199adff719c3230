"""Coalescing: K consecutive calls of one graph, each of batch N, as one graph of batch K x N
whose outputs hold, bit for bit, what the K calls give, in order (issue 34).

    coalesced = coalesce(graph, k=4, n=8)       # or CannotCoalesce(reason)
    coalesced.graph                              # batch 32; call s's outputs: samples 8s .. 8s + 7
    coalesced.index_input, coalesced.state_inputs

Ops whose every sample's result depends on that sample alone run once over all K x N samples.
A random op cannot: it reads only its batch's first `_random_state` and derives sample i's
values from it and i (DALI's rng_base.h), so over K x N samples it would not give K calls'
values. Each random op runs once per call instead, on that call's slice of its inputs and of
its state: DALI's conditional split by each sample's index in the run, in a balanced tree
(`index < mid * N` halves calls lo .. hi - 1: each sample passes log2(K) splits and merges),
then merged back in order. An inputless random op takes its slice's batch size from its split
state. The outputs are not split: a call's outputs are views of its N samples of the whole
(`_dali.sample_range`), dense where the whole is, so no copy is made to hand them out. `benchmarks/probe_coalesce.py` checks the same construction against eager ndd.

A graph with an op not known to be per-sample (one that reads the whole batch: batch
statistics, padding to the batch's largest sample, permutations) is not coalesced, and the
reason names the op and the user's line. The graph's random states become inputs: the caller
feeds each one K x N copies, call s's state on samples s x N to (s + 1) x N - 1.
"""

from __future__ import annotations

import dataclasses
from types import MappingProxyType

import numpy as np

from .. import _dali
from ..core.ir import Graph, Node, NodeKind, Ref, TensorMeta

__all__ = ["CannotCoalesce", "Coalesced", "coalesce", "INDEX_PATH", "runs_per_call",
           "state_path"]

# ops whose each output sample depends on the same sample of their inputs alone (fn paths);
# where an argument can make one read the whole batch, BATCH_ARGUMENTS says which
PER_SAMPLE = frozenset({
    "_arithmetic_generic_op", "brightness", "brightness_contrast", "cast", "cast_like",
    "color_space_conversion", "color_twist", "contrast", "copy", "crop", "crop_mirror_normalize",
    "decoders.image", "decoders.image_crop", "decoders.image_random_crop",
    "decoders.image_slice", "expand_dims", "flip", "gaussian_blur", "hsv", "hue",
    "jpeg_compression_distortion", "normalize", "pad", "random.coin_flip", "random.normal",
    "random.uniform", "random_resized_crop", "reshape", "resize", "rotate", "saturation",
    "slice", "sphere", "squeeze", "transpose", "warp_affine", "water",
})
BATCH_ARGUMENTS = MappingProxyType({
    "normalize": lambda static: static.get("batch", False),  # batch-wide mean and stddev
    # `shape` entries of 0 or less (or none) pad to the batch's largest extent
    "pad": lambda static: not static.get("shape") or
    any(int(extent) <= 0 for extent in np.atleast_1d(static["shape"])),
})
INDEX_PATH = ("__coalesce", "index")  # the fed input giving each sample its index in the run


def state_path(number: int) -> tuple:
    """The fed input that replaces the graph's `number`-th random state."""
    return ("__coalesce", "state", number)


class CannotCoalesce(Exception):
    """Why a graph's calls cannot be run as one (the op, its line and the reason)."""


@dataclasses.dataclass
class Coalesced:
    graph: Graph
    k: int
    n: int
    state_inputs: list[Node]  # fed K x N copies of each call's state (see module docstring)
    index_input: Node | None  # fed 0 .. K x N - 1 (None: no random op, nothing sliced)
    sliced_ops: int  # random ops run once per call
    origin: dict[int, Node]  # id(a fed leaf of `graph`) -> the source graph's leaf it stands for


def runs_per_call(node: Node) -> bool:
    """Whether a coalesced graph runs `node` once per call, on its slice: a random op."""
    return node.kind is NodeKind.OP and "_random_state" in node.arg_inputs


def why_not(graph: Graph) -> str | None:
    """None where `graph`'s calls can be coalesced, else why not (the op and its line)."""
    for node in graph.nodes:
        where = f" (called at {node.loc})" if node.loc is not None else ""
        if node.kind in (NodeKind.READER, NodeKind.EXTERNAL):
            return f"ndd.{node.name}{where} reads its own data inside the graph"
        if not node.is_batch and node.kind in (NodeKind.INPUT, NodeKind.OP):
            return f"{node.name}{where} is a single sample, not a batch"
        if node.kind is not NodeKind.OP:
            continue
        if node.name not in PER_SAMPLE:
            return f"ndd.{node.name}{where} is not known to compute each sample on its own"
        batchwide = BATCH_ARGUMENTS.get(node.name)
        if batchwide is not None and batchwide(node.static):
            return f"ndd.{node.name}{where} reads the whole batch with these arguments"
    return None


def coalesce(graph: Graph, k: int, n: int) -> Coalesced:
    """`graph` (calls of batch `n`) as one graph running `k` calls; CannotCoalesce if not."""
    reason = why_not(graph)
    if reason is not None:
        raise CannotCoalesce(reason)
    return _Builder(graph, k, n).build()


class _Builder:
    def __init__(self, graph: Graph, k: int, n: int):
        self.source, self.k, self.n = graph, k, n
        self.graph = Graph(f"{graph.name}_x{k}")
        self.refs: dict[int, list[Ref]] = {}  # id(source node) -> its outputs in the new graph
        self.states: list[Node] = []
        self.index: Node | None = None
        self._predicates: dict[tuple[int, int], Ref] = {}  # (lo, hi) -> its split's predicate
        self._indices: dict[tuple[int, int], Ref] = {}  # (lo, hi) -> those calls' indices
        self.sliced = 0
        self.origin: dict[int, Node] = {}

    def build(self) -> Coalesced:
        for node in self.source.nodes:
            if node.kind is NodeKind.OP:
                self.refs[id(node)] = self._sliced(node) if runs_per_call(node) \
                    else self._copied(node)
            else:
                leaf = self._leaf(node)
                self.origin[id(leaf)] = node
                self.refs[id(node)] = [Ref(leaf, 0)]
        self.graph.outputs = [self._mapped(ref) for ref in self.source.outputs]
        self.graph.verify()
        return Coalesced(self.graph, self.k, self.n, self.states, self.index, self.sliced,
                         self.origin)

    def _mapped(self, ref: Ref) -> Ref:
        return self.refs[id(ref.node)][ref.index]

    def _leaf(self, node: Node) -> Node:
        if node.kind is NodeKind.RANDOM_STATE:
            state = self.graph.add_input(f"__state{len(self.states)}",
                                         state_path(len(self.states)), node.meta[0], True)
            state.loc = node.loc
            self.states.append(state)
            return state
        if node.kind is NodeKind.INPUT:
            return self.graph.add_input(node.name, node.payload, node.meta[0], node.is_batch)
        return self.graph.add_constant(node.payload, node.meta[0], node.is_batch, node.loc)

    def _copied(self, node: Node, inputs: list[Ref] | None = None,
                arg_inputs: dict[str, Ref] | None = None) -> list[Ref]:
        fields = {field.name: getattr(node, field.name) for field in dataclasses.fields(node)
                  if field.name not in ("index", "kind", "name", "schema", "state")}
        fields["inputs"] = inputs if inputs is not None else \
            [self._mapped(ref) for ref in node.inputs]
        fields["arg_inputs"] = arg_inputs if arg_inputs is not None else \
            {key: self._mapped(ref) for key, ref in node.arg_inputs.items()}
        fields["meta"] = list(node.meta)
        new = self.graph.add_op(node.name, node.schema, **fields)
        return [Ref(new, i) for i in range(node.num_outputs)]

    def _sliced(self, node: Node) -> list[Ref]:
        """A random op once per call, on that call's slice; its outputs merged back."""
        self.sliced += 1
        inputs = [self._slices(self._mapped(ref)) for ref in node.inputs]
        arg_inputs = {key: self._slices(self._mapped(ref)) for key, ref in node.arg_inputs.items()}
        calls = [self._copied(node, [parts[call] for parts in inputs],
                              {key: parts[call] for key, parts in arg_inputs.items()})
                 for call in range(self.k)]
        return [self._merged([refs[output] for refs in calls])
                for output in range(node.num_outputs)]

    def _predicate(self, lo: int, hi: int) -> Ref:
        """Over the samples of calls lo .. hi - 1: whether a sample is one of the first half's
        calls (the slices are a balanced tree of splits: each sample passes log2(K) of them)."""
        if not self._predicates:
            meta = TensorMeta("cpu", "INT32", 0, None)
            self.index = self.graph.add_input("__sample_index", INDEX_PATH, meta, True)
            self._indices = {(0, self.k): Ref(self.index, 0)}
        if (lo, hi) not in self._predicates:
            mid = (lo + hi) // 2
            index = self._indices[(lo, hi)]
            predicate = Ref(self.graph.add_op(  # (`index < bound`, the bound a literal)
                "_arithmetic_generic_op", "_ArithmeticGenericOp", inputs=[index],
                input_devices=["cpu"],
                static={"expression_desc": "lt(&0 $0:int32)", "integer_constants": [mid * self.n]},
                meta=[TensorMeta("cpu", "BOOL", 0, None)]), 0)
            self._predicates[(lo, hi)] = predicate
            self._indices[(lo, mid)], self._indices[(mid, hi)] = self._split(index, predicate)
        return self._predicates[(lo, hi)]

    def _split(self, ref: Ref, predicate: Ref) -> tuple[Ref, Ref]:
        meta = ref.node.meta[ref.index]
        split = self.graph.add_op(*_dali.SPLIT_OP, inputs=[ref],
                                  input_devices=[meta.device], arg_inputs={"predicate": predicate},
                                  backend=meta.device, num_outputs=2, meta=[meta, meta])
        return Ref(split, 0), Ref(split, 1)

    def _slices(self, ref: Ref, lo: int = 0, hi: int | None = None) -> list[Ref]:
        """`ref`'s slices of N samples for calls lo .. hi - 1 (all K by default), in order."""
        hi = self.k if hi is None else hi
        if hi - lo == 1:
            return [ref]
        mid = (lo + hi) // 2
        first, second = self._split(ref, self._predicate(lo, hi))
        return self._slices(first, lo, mid) + self._slices(second, mid, hi)

    def _merged(self, parts: list[Ref], lo: int = 0) -> Ref:
        """The slices `parts` (of calls lo, lo + 1, ...) merged back into one batch, in order."""
        if len(parts) == 1:
            return parts[0]
        predicate = self._predicate(lo, lo + len(parts))  # (before its halves': theirs split it)
        half = len(parts) // 2
        first, second = self._merged(parts[:half], lo), self._merged(parts[half:], lo + half)
        meta = first.node.meta[first.index]
        node = self.graph.add_op(*_dali.MERGE_OP, inputs=[first, second],
                                 input_devices=[meta.device] * 2,
                                 arg_inputs={"predicate": predicate}, backend=meta.device,
                                 meta=[meta])
        return Ref(node, 0)
