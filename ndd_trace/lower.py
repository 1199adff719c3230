"""Lowering: a Graph becomes the readable Python source of a DALI pipeline definition.

    lowered = lower(graph)
    print(lowered.source)
    # def preprocess_pipeline(fn, types, consts):
    #     in0 = fn.external_source(name='in0', device='cpu', dtype=types.DALIDataType.UINT8, ...)
    #     v1 = fn.decoders.image(in0, device='cpu', output_type=types.DALIImageType.RGB)  # a.py:7
    #     return (v1,)
    outputs = lowered.function(fn, types, consts)   # inside `with pipe:`

Every statement is built as an `ast` node and printed with astunparse; each op line carries the
user's `file:line` as a comment, and `line_map` maps generated lines back to graph nodes so that
pipeline errors can be reported at the user's line. The code is compiled under a unique file name
registered in linecache, so tracebacks through it show real source.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import itertools
from collections.abc import Callable
from typing import Any

import astunparse

from .ir import Graph, Node, NodeKind, Ref
from .source import register_source

_counter = itertools.count()


@dataclasses.dataclass
class Lowered:
    """The generated pipeline definition of one graph."""

    source: str
    filename: str
    function: Callable
    consts: list[Any]
    line_map: dict[int, Node]  # generated line -> node
    external_sources: list[Node]  # nodes fed per call, in order


def _name(identifier: str) -> ast.Name:
    return ast.Name(id=identifier, ctx=ast.Load())


def _attribute_chain(root: str, path: str) -> ast.expr:
    expr: ast.expr = _name(root)
    for part in path.split("."):
        expr = ast.Attribute(value=expr, attr=part, ctx=ast.Load())
    return expr


def _is_dali_enum(value: Any) -> bool:
    module = type(value).__module__ or ""
    return module.startswith("nvidia.dali") and hasattr(value, "name") and \
        hasattr(type(value), "__members__")


class _Emitter:
    def __init__(self) -> None:
        self.consts: list[Any] = []

    def static(self, value: Any) -> ast.expr:
        """A static argument as a literal where Python can spell it, else `consts[i]`."""
        if value is None or isinstance(value, (bool, int, float, str)):
            return ast.Constant(value=value)
        if isinstance(value, (list, tuple)):
            elements = [self.static(v) for v in value]
            return ast.List(elts=elements, ctx=ast.Load()) if isinstance(value, list) \
                else ast.Tuple(elts=elements, ctx=ast.Load())
        if _is_dali_enum(value):
            return _attribute_chain("types", f"{type(value).__name__}.{value.name}")
        if isinstance(value, enum.Enum):
            self.consts.append(value)
        else:
            self.consts.append(value)
        return ast.Subscript(value=_name("consts"), slice=ast.Constant(len(self.consts) - 1),
                             ctx=ast.Load())


def _ref_expr(ref: Ref) -> ast.expr:
    node = ref.node
    if node.num_outputs == 1:
        return _name(node.var)
    key: Any = node.output_names[ref.index] if node.output_names else ref.index
    return ast.Subscript(value=_name(node.var), slice=ast.Constant(key), ctx=ast.Load())


def _moved(expr: ast.expr, device: str) -> ast.expr:
    method = "gpu" if device == "gpu" else "cpu"
    return ast.Call(func=ast.Attribute(value=expr, attr=method, ctx=ast.Load()), args=[],
                    keywords=[])


def _call(path: str, args: list[ast.expr], keywords: dict[str, ast.expr]) -> ast.Call:
    return ast.Call(func=_attribute_chain("fn", path), args=args,
                    keywords=[ast.keyword(arg=k, value=v) for k, v in keywords.items()])


def _external_source(node: Node, emitter: _Emitter) -> ast.Call:
    meta = node.meta[0]
    keywords: dict[str, ast.expr] = {
        "name": ast.Constant(node.var),
        "device": ast.Constant(meta.device),
    }
    if node.kind is NodeKind.RANDOM_STATE or node.static.get("no_copy"):
        # states (and constants marked no_copy: pipeline outputs nobody writes to) are used in
        # place, kept alive by the runtime; user data is copied at the call, as eager ndd reads
        # it then (callers reuse buffers)
        keywords["no_copy"] = ast.Constant(True)
    if meta.dtype:
        keywords["dtype"] = _attribute_chain("types", f"DALIDataType.{meta.dtype}")
    if meta.ndim is not None:
        keywords["ndim"] = ast.Constant(meta.ndim)
    if meta.layout:
        keywords["layout"] = ast.Constant(meta.layout)
    return _call("external_source", [], keywords)


def _op_call(node: Node, emitter: _Emitter) -> ast.expr:
    if node.schema == "Copy" and len(node.inputs) == 1 and not node.arg_inputs:
        source = node.inputs[0]
        target = "cpu" if node.backend == "cpu" else "gpu"
        if source.node.meta[source.index].device != target:
            # ndd's `.gpu()`/`.cpu()` is a Copy across devices: in a pipeline, a transfer
            return _moved(_ref_expr(source), target)
    args = []
    for ref, device in zip(node.inputs, node.input_devices):
        expr = _ref_expr(ref)
        if ref.node.meta[ref.index].device != device:
            expr = _moved(expr, device)
        args.append(expr)
    keywords: dict[str, ast.expr] = {"device": ast.Constant(node.backend)}
    for key, value in sorted(node.static.items()):
        keywords[key] = emitter.static(value)
    for key, ref in node.arg_inputs.items():
        expr = _ref_expr(ref)
        if key in node.arg_casts:
            expr = _call("cast", [expr], {
                "dtype": _attribute_chain("types", f"DALIDataType.{node.arg_casts[key]}")})
        if ref.node.meta[ref.index].device != "cpu":
            expr = _moved(expr, "cpu")
        keywords[key] = expr
    return _call(node.name, args, keywords)


def _reader_call(node: Node, emitter: _Emitter) -> ast.Call:
    keywords: dict[str, ast.expr] = {"device": ast.Constant("cpu")}
    for key, value in sorted(node.static.items()):
        keywords[key] = emitter.static(value)
    return _call(node.name, [], keywords)


def _unparse(statement: ast.stmt) -> str:
    module = ast.Module(body=[statement], type_ignores=[])
    return astunparse.unparse(ast.fix_missing_locations(module)).strip()


def lower(graph: Graph) -> Lowered:
    """Generate, register and compile the pipeline definition of `graph`."""
    graph.verify()
    emitter = _Emitter()
    safe_name = "".join(c if c.isalnum() or c == "_" else "_" for c in graph.name)
    function_name = f"{safe_name}_pipeline"
    header = f"def {function_name}(fn, types, consts):"
    lines = [header]
    line_map: dict[int, Node] = {}
    external: list[Node] = []
    for node in graph.nodes:
        if node.kind is NodeKind.OP:
            value = _op_call(node, emitter)
        elif node.kind is NodeKind.READER:
            value = _reader_call(node, emitter)
        else:
            value = _external_source(node, emitter)
            external.append(node)
        statement = ast.Assign(targets=[ast.Name(id=node.var, ctx=ast.Store())], value=value)
        text = "    " + _unparse(statement)
        if node.loc is not None:
            text += f"  # {node.loc}"
        lines.append(text)
        line_map[len(lines)] = node
    outputs = ast.Tuple(elts=[_ref_expr(ref) for ref in graph.outputs], ctx=ast.Load())
    lines.append("    " + _unparse(ast.Return(value=outputs)))
    source = "\n".join(lines) + "\n"

    filename = f"<ndd_trace:{safe_name}#{next(_counter)}>"
    register_source(filename, source)
    namespace: dict[str, Any] = {}
    exec(compile(source, filename, "exec"), namespace)
    return Lowered(source=source, filename=filename, function=namespace[function_name],
                   consts=emitter.consts, line_map=line_map, external_sources=external)
