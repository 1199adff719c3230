"""Graph-to-graph rewrites run before lowering: common subexpressions, then dead code.

    graph = eliminate_common_subexpressions(graph)
    graph = eliminate_dead_code(graph)

Unused calls are pruned, as in ndd's deferred mode ("operations with unused results may be
skipped"): eager ndd never runs a call on another call's result that nothing uses. A call on
user data it runs at once, and raises its errors there: an unused one of those keeps a function
from being compiled whole (modes/stage.py), so that what is pruned is never run eagerly either.
Random-state nodes are never merged, and their draws are kept even when the op's result is
unused: an eager call draws from the generator either way, so the RNG must advance the same.
"""

from __future__ import annotations

from typing import Any

from .ir import Graph, Node, NodeKind, Ref, op_key


def _replace_refs(graph: Graph, replacement: dict[int, Node]) -> None:
    def fix(ref: Ref) -> Ref:
        target = replacement.get(id(ref.node))
        return Ref(target, ref.index) if target is not None else ref

    for node in graph.nodes:
        node.inputs = [fix(ref) for ref in node.inputs]
        node.arg_inputs = {key: fix(ref) for key, ref in node.arg_inputs.items()}
    graph.outputs = [fix(ref) for ref in graph.outputs]


def call_key(node: Node) -> Any:
    """What makes two operator calls one: the op, its arguments and what it reads."""
    return op_key(node, tuple((id(r.node), r.index) for r in node.inputs),
                  tuple(sorted((k, id(r.node), r.index) for k, r in node.arg_inputs.items())))


def eliminate_common_subexpressions(graph: Graph) -> Graph:
    """Merge operator calls with the same inputs and arguments (tinygrad-style structural key)."""
    seen: dict[Any, Node] = {}
    replacement: dict[int, Node] = {}
    kept: list[Node] = []
    for node in graph.nodes:
        if node.kind is NodeKind.OP and "_random_state" not in node.arg_inputs:
            node.inputs = [Ref(replacement.get(id(r.node), r.node), r.index) for r in node.inputs]
            node.arg_inputs = {
                k: Ref(replacement.get(id(r.node), r.node), r.index)
                for k, r in node.arg_inputs.items()
            }
            key = call_key(node)
            existing = seen.get(key)
            if existing is not None:
                replacement[id(node)] = existing
                continue
            seen[key] = node
        kept.append(node)
    graph.nodes = kept
    _replace_refs(graph, replacement)
    return graph


def live_nodes(graph: Graph) -> set[int]:
    """The ids of the nodes some output of `graph` depends on."""
    live: set[int] = set()
    stack = [ref.node for ref in graph.outputs]
    while stack:
        node = stack.pop()
        if id(node) in live:
            continue
        live.add(id(node))
        stack.extend(ref.node for ref in node.inputs)
        stack.extend(ref.node for ref in node.arg_inputs.values())
    return live


def eliminate_dead_code(graph: Graph) -> Graph:
    """Drop nodes that no output depends on."""
    live = live_nodes(graph)
    graph.nodes = [node for node in graph.nodes if id(node) in live]
    return graph
