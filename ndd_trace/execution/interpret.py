"""Run a graph with eager ndd: the reference semantics, and the fallback when a pipeline fails.

    values = interpret(graph, leaves)      # leaves: node -> concrete Batch/Tensor or words
    values[Ref(node, 0)]                   # an ndd.Batch

Random ops get back the exact state recorded for them (through a generator that replays the
drawn words), so an interpreted graph gives the values the pipeline would, and draws nothing new.
"""

from __future__ import annotations

from typing import Any

from .. import _dali
from ..core.ir import Graph, NodeKind, Ref


def interpret(graph: Graph, leaves: dict[Any, Any],
              batch_size: int | None = None) -> dict[Ref, Any]:
    """Evaluate every op node of `graph` eagerly; `leaves` maps id(node) (or (id(node), output
    index)) -> value for the other nodes (inputs, constants, random-state words, readers).
    `batch_size`: the batch size of the run being replayed (a pipeline runs every batch op at
    it; the graph holds the batch size it was recorded or traced with)."""
    values: dict[Ref, Any] = {}

    def value_of(ref: Ref) -> Any:
        if ref.node.kind is NodeKind.OP:
            return values[ref]
        if (id(ref.node), ref.index) in leaves:  # one entry per output of multi-output leaves
            return leaves[(id(ref.node), ref.index)]
        return leaves[id(ref.node)]

    with _dali.eager_inside_trace():
        for node in graph.nodes:
            if node.kind is not NodeKind.OP:
                continue
            function = _dali.op_function_of(node.op_class)
            kwargs: dict[str, Any] = dict(node.static)
            for key, ref in node.arg_inputs.items():
                if key == "_random_state":
                    kwargs["rng"] = _dali.ReplayRNG(value_of(ref))
                else:
                    kwargs[key] = value_of(ref)
            inputs = [value_of(ref) for ref in node.inputs]
            device = "gpu" if node.backend in ("gpu", "mixed") else "cpu"
            if node.is_batch and not inputs:
                kwargs["batch_size"] = int(node.batch_size if batch_size is None else batch_size)
            result = function(*inputs, device=device, **kwargs)
            if node.num_outputs == 1:
                values[Ref(node, 0)] = result
            else:
                items = list(result.values()) if isinstance(result, dict) else list(result)
                for index, item in enumerate(items):
                    values[Ref(node, index)] = item
    return values
