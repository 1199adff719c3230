"""The graph IR: nodes of DALI operator calls, edges as `Ref(node, output_index)`.

    graph = Graph("preprocess")
    jpegs = graph.add_input(InputSpec(path=("args", 0), kind="batch", device="cpu", ...))
    node = graph.add_node("decoders.image", "decoders__Image", backend="cpu",
                          inputs=[Ref(jpegs, 0)], static={"output_type": RGB}, loc=loc)
    graph.set_outputs([Ref(node, 0)])
    print(graph)          # stable text form, used by golden tests and `ndd_trace.explain`
    graph.verify()

Values are kept apart from static parameters (JAX's `bind(*values, **params)`); every node
carries the user's `file:line`. This module imports nothing from DALI.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, NamedTuple

from .errors import GraphError
from .keys import STATIC_BY_IDENTITY, OpPart, freeze_arguments
from .source import SourceLoc

class NodeKind(enum.Enum):
    INPUT = "input"  # a Batch/Tensor argument of the compiled function, fed per call
    CONSTANT = "constant"  # concrete data met while tracing, fed per call from the stored value
    RANDOM_STATE = "random_state"  # the 7-word Philox state drawn per call for one random op
    READER = "reader"  # a reader owned by a compiled loop: one batch per pipeline iteration
    EXTERNAL = "external"  # an ndd.ExternalSource of a compiled loop: pulled ahead, fed per step
    OP = "op"  # a DALI operator call


class TensorMeta(NamedTuple):
    """What is known statically of one value: device, dtype name, ndim, layout (None: unknown).
    A named tuple: transparent mode hashes and compares these for every recorded call."""

    device: str
    dtype: str | None = None
    ndim: int | None = None
    layout: str | None = None
    # False where DALI's inference gives the ndim but leaves the layout open (`ndd.stack`
    # without `axis_name`): eager runs the op to answer `.layout`, so a trace cannot answer it
    layout_known: bool = True


@dataclasses.dataclass(eq=False, slots=True)
class Node:
    """One value-producing step: an input, a constant, a random state or an operator call."""

    index: int
    kind: NodeKind
    name: str  # the fn path for ops ("decoders.image"), the input's name otherwise
    schema: str | None = None  # DALI schema name, for ops
    backend: str = "cpu"
    inputs: list[Ref] = dataclasses.field(default_factory=list)
    input_devices: list[str] = dataclasses.field(default_factory=list)  # where ndd moves inputs
    arg_casts: dict[str, str] = dataclasses.field(default_factory=dict)  # name -> dtype name
    arg_inputs: dict[str, Ref] = dataclasses.field(default_factory=dict)
    static: dict[str, Any] = dataclasses.field(default_factory=dict)
    frozen_static: Any = None  # `static` in hashable form, made once when an op is recorded
    num_outputs: int = 1
    output_names: tuple[str, ...] | None = None
    meta: list[TensorMeta] = dataclasses.field(default_factory=list)
    is_batch: bool = True
    loc: SourceLoc | None = None
    # (code, line) of the user's frames between the traced function's and the op call's line,
    # innermost first (a helper the function called): a deferred failure shows them, as eager
    frames: tuple = ()
    # the EvalMode the traced function itself set for the call (True: deferred, False: not);
    # None: the caller's, at each call (an error's "... during deferred evaluation" follows it)
    deferred: bool | None = None
    payload: Any = None  # INPUT: argument path; CONSTANT: the value; RANDOM_STATE: rng slot
    op_class: Any = None  # the ndd operator class, for ops (lets the interpreter run them)
    batch_size: Any = None  # the batch size the op was called with (None: sample mode)
    # a fed constant nobody writes to (a pipeline's output, ndd_trace's own conversions): DALI
    # reads it in place (external_source's no_copy) instead of a copy made at the call
    feed_in_place: bool = False
    # what a front end keeps on a node beside the IR, as FX's `Node.meta`: transparent mode's
    # results and live values of a recorded call (modes/lazy.py); None elsewhere
    state: Any = None

    @property
    def var(self) -> str:
        prefix = {NodeKind.INPUT: "in", NodeKind.CONSTANT: "const", NodeKind.RANDOM_STATE: "rng",
                  NodeKind.READER: "reader", NodeKind.EXTERNAL: "es"}
        return f"{prefix.get(self.kind, 'v')}{self.index}"

    def __repr__(self) -> str:
        return f"Node({self.var}: {self.name})"


class Ref(NamedTuple):
    """One output of a node."""

    node: Node
    index: int = 0

    def __str__(self) -> str:
        if self.node.num_outputs == 1:
            return self.node.var
        return f"{self.node.var}[{self.index}]"


# OpPart(...) at half its cost (no Python-level __new__): made for every op of every region read
_new_part = tuple.__new__


def op_key(node: Node, inputs: tuple, arg_inputs: tuple) -> OpPart:
    """The structural identity of an op call, given how its inputs are identified (`inputs`:
    one item per input; `arg_inputs`: sorted (name, *item) per tensor argument): two calls with
    equal keys compute the same values from equal inputs (tinygrad's idea). Common
    subexpressions (passes.py) and transparent mode's region keys (regions.py) are made of it."""
    return _new_part(OpPart, (node.name, node.backend, node.is_batch,
                              node.frozen_static if node.frozen_static is not None
                              else freeze_arguments(node.static, STATIC_BY_IDENTITY),
                              inputs, tuple(node.input_devices), arg_inputs,
                              tuple(sorted(node.arg_casts.items()))))


def _format_static(value: Any) -> str:
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"<array {getattr(value, 'dtype', '?')}{list(getattr(value, 'shape', ()))}>"
    return repr(value)


class Graph:
    """An ordered list of nodes (program order = topological order) and the output refs."""

    def __init__(self, name: str):
        self.name = name
        self.nodes: list[Node] = []
        self.outputs: list[Ref] = []

    def _add(self, kind: NodeKind, name: str, **fields: Any) -> Node:
        node = Node(index=len(self.nodes), kind=kind, name=name, **fields)
        self.nodes.append(node)
        return node

    def add_input(self, name: str, path: tuple, meta: TensorMeta, is_batch: bool) -> Node:
        return self._add(NodeKind.INPUT, name, payload=path, meta=[meta], is_batch=is_batch,
                         backend=meta.device)

    def add_constant(self, value: Any, meta: TensorMeta, is_batch: bool,
                     loc: SourceLoc | None) -> Node:
        return self._add(NodeKind.CONSTANT, "constant", payload=value, meta=[meta],
                         is_batch=is_batch, loc=loc, backend=meta.device)

    def add_random_state(self, rng_slot: Any, loc: SourceLoc | None) -> Node:
        meta = TensorMeta("cpu", "UINT32", 1, None)
        return self._add(NodeKind.RANDOM_STATE, "random_state", payload=rng_slot, meta=[meta],
                         loc=loc)

    def add_reader(self, name: str, schema: str, reader: Any, static: dict[str, Any],
                   num_outputs: int, output_names: tuple[str, ...] | None,
                   meta: list[TensorMeta], loc: SourceLoc | None) -> Node:
        return self._add(NodeKind.READER, name, schema=schema, payload=reader, static=static,
                         num_outputs=num_outputs, output_names=output_names, meta=meta, loc=loc)

    def add_op(self, name: str, schema: str, **fields: Any) -> Node:
        return self._add(NodeKind.OP, name, schema=schema, **fields)

    def nodes_of(self, kind: NodeKind) -> list[Node]:
        return [node for node in self.nodes if node.kind is kind]

    def verify(self) -> None:
        """Check that every edge points to an earlier node and an existing output."""
        position = {id(node): i for i, node in enumerate(self.nodes)}
        for i, node in enumerate(self.nodes):
            for ref in [*node.inputs, *node.arg_inputs.values()]:
                j = position.get(id(ref.node))
                if j is None or j >= i:
                    raise GraphError(f"{node!r} uses {ref}, which is not an earlier node")
                if not 0 <= ref.index < ref.node.num_outputs:
                    raise GraphError(f"{node!r} uses output {ref.index} of {ref.node!r}")
        for ref in self.outputs:
            if id(ref.node) not in position:
                raise GraphError(f"graph output {ref} is not in the graph")

    def format(self, with_locations: bool = True) -> str:
        """A stable, readable text form (one line per node)."""
        lines = [f"graph {self.name}:"]
        for node in self.nodes:
            targets = ", ".join(str(Ref(node, i)) for i in range(node.num_outputs))
            if node.num_outputs > 1:
                targets = ", ".join(f"{node.var}[{i}]" for i in range(node.num_outputs))
            if node.kind is NodeKind.OP:
                args = [str(ref) for ref in node.inputs]
                args += [f"{key}={ref}" for key, ref in node.arg_inputs.items()]
                args += [f"{key}={_format_static(v)}" for key, v in sorted(node.static.items())]
                text = f"{targets} = {node.name}[{node.backend}]({', '.join(args)})"
            elif node.kind is NodeKind.INPUT:
                meta = node.meta[0]
                kind = "batch" if node.is_batch else "tensor"
                text = (f"{targets} = input {node.name}: {kind}<{meta.device}, {meta.dtype}, "
                        f"ndim={meta.ndim}, layout={meta.layout!r}>")
            elif node.kind is NodeKind.READER:
                args = [f"{key}={_format_static(v)}" for key, v in sorted(node.static.items())]
                text = f"{targets} = {node.name}[reader]({', '.join(args)})"
            elif node.kind is NodeKind.CONSTANT:
                text = f"{targets} = constant {_format_static(node.payload)}"
            elif node.kind is NodeKind.EXTERNAL:
                text = f"{targets} = external_source {type(node.payload).__name__}"
            else:
                text = f"{targets} = random_state({node.payload})"
            if with_locations and node.loc is not None:
                text = f"{text:<72}  # {node.loc.short}"
            lines.append("  " + text)
        lines.append("  return " + ", ".join(str(ref) for ref in self.outputs))
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format()
