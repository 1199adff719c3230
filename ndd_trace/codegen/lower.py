"""Lowering: a Graph becomes the readable source of a DALI `@pipeline_def` function.

    lowered = lower(graph, inline_constants=True)
    print(lowered.source)
    # import nvidia.dali as dali
    # from nvidia.dali import fn, pipeline_def, types
    #
    # @pipeline_def
    # def preprocess_pipeline():
    #     jpegs = fn.external_source(name='jpegs', device='cpu', dtype=types.UINT8, ndim=1)
    #     images = fn.decoders.image(jpegs, output_type=types.RGB)  # a.py:7
    #     scaled = images * 0.5  # a.py:8
    #     return (scaled,)
    pipe = lowered.function(batch_size=64, num_threads=4, device_id=None)   # a DALI Pipeline

The code reads as a DALI user would write it: operators for arithmetic and comparisons,
`dali.math` functions, small constants written inline (`fn.constant`), variables named after
the user's own variables where a line assigns one op's result to a name, after the op otherwise,
and each op's `file:line` as a comment. The runtime builds exactly this code. Every statement is
built as an `ast` node and printed with astunparse; `line_map` maps generated lines back to
graph nodes so that pipeline errors can be reported at the user's line. The code is compiled
under a unique file name registered in linecache, so tracebacks through it show real source.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import linecache
import math
import re
from collections.abc import Callable
from types import MappingProxyType
from typing import Any

import numpy as np

from .. import _dali
from ..core import process_state
from ..core.errors import ExportError
from ..core.ir import Graph, Node, NodeKind, Ref
from ..core.keys import float_key
from ..core.source import NameTable, one_line, register_source, unparse

# DataNode operators and the expression names they give DALI's arithmetic operator
# (nvidia/dali/data_node.py): writing the operator reproduces the same expression descriptor.
_BINARY = MappingProxyType({
    "add": ast.Add, "sub": ast.Sub, "mul": ast.Mult, "fdiv": ast.Div, "div": ast.FloorDiv,
    "mod": ast.Mod, "pow": ast.Pow, "bitand": ast.BitAnd, "bitor": ast.BitOr,
    "bitxor": ast.BitXor, "lshift": ast.LShift, "rshift": ast.RShift})
_COMPARE = MappingProxyType({"eq": ast.Eq, "neq": ast.NotEq, "lt": ast.Lt, "leq": ast.LtE,
                             "gt": ast.Gt, "geq": ast.GtE})
_UNARY = MappingProxyType({"minus": ast.USub, "bitnot": ast.Invert})
# `nvidia.dali.math` functions: each passes its arguments, in order, to an expression of its name
_MATH = frozenset({
    "sqrt", "rsqrt", "cbrt", "exp", "log", "log2", "log10", "abs", "fabs", "floor", "ceil", "sin",
    "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "min",
    "max", "pow", "fpow", "atan2", "clamp"})
_ARITHMETIC_STATIC = frozenset({"expression_desc", "integer_constants", "real_constants"})
_DESC = re.compile(r"^(\w+)\((.*)\)$")
# names the generated module defines or reads besides the variables (`float` spells a NaN)
_RESERVED = frozenset({"fn", "types", "dali", "pipeline_def", "consts", "float"})
INLINE_LIMIT = 16  # elements of a constant written into the code (larger ones are fed)


@dataclasses.dataclass
class Lowered:
    """The generated pipeline definition of one graph."""

    source: str
    filename: str
    function: Callable  # the @pipeline_def function: function(batch_size=..., ...) -> Pipeline
    function_name: str
    consts: list[Any]  # static values Python cannot spell, referenced as consts[i]
    line_map: dict[int, Node]  # generated line -> node
    external_sources: list[Node]  # nodes fed per call, in order
    feed_names: list[str]  # the external-source name of each fed node, in the same order
    names: dict[int, str]  # id(node) -> its variable in the code


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


def _dtype(name: str) -> ast.expr:
    return _attribute_chain("types", name)  # types.FLOAT is types.DALIDataType.FLOAT


def _keywords(keywords: dict[str, ast.expr]) -> list[ast.keyword]:
    return [ast.keyword(arg=k, value=v) for k, v in keywords.items()]


def _call(path: str, args: list[ast.expr], keywords: dict[str, ast.expr]) -> ast.Call:
    return ast.Call(func=_attribute_chain("fn", path), args=args, keywords=_keywords(keywords))


@functools.lru_cache(maxsize=1024)
def _assigned_name(filename: str, lineno: int) -> str | None:
    """The variable a source line assigns (`images = ...`, `x += ...`), if it is one name."""
    text = linecache.getline(filename, lineno).strip()
    try:
        statement = ast.parse(text).body[0]
    except (SyntaxError, IndexError):
        return None
    if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
        target = statement.targets[0]
    elif isinstance(statement, (ast.AugAssign, ast.AnnAssign)):
        target = statement.target
    else:
        return None
    return target.id if isinstance(target, ast.Name) else None


def _op_label(node: Node) -> str:
    if node.schema == "_ArithmeticGenericOp":
        match = _DESC.match(str(node.static.get("expression_desc", "")))
        if match:
            return match.group(1)
    return node.name.split(".")[-1]


def _readable_names(graph: Graph) -> dict[int, str]:
    """A unique, readable variable per node: the user's name for the value a line assigns (its
    last op), the parameter name for inputs, the op's name otherwise."""
    table = NameTable(_RESERVED)
    claim = table.claim
    names: dict[int, str] = {}

    ops = [node for node in graph.nodes if node.kind is NodeKind.OP]
    last_on_line = set()
    for node, following in zip(ops, [*ops[1:], None]):
        if node.loc is not None and (following is None or following.loc != node.loc):
            last_on_line.add(id(node))
    for node in graph.nodes:  # inputs first, so parameters keep their own names
        if node.kind is NodeKind.INPUT:
            names[id(node)] = claim(node.name)
    state_users = {id(ref.node): node for node in ops
                   for key, ref in node.arg_inputs.items() if key == "_random_state"}
    for node in graph.nodes:
        if node.kind in (NodeKind.INPUT, NodeKind.RANDOM_STATE):
            continue
        user = None
        if node.kind is NodeKind.OP and id(node) in last_on_line and node.num_outputs == 1:
            user = _assigned_name(node.loc.filename, node.loc.lineno)
        if user is not None:
            names[id(node)] = claim(user)
        elif node.kind is NodeKind.OP:
            names[id(node)] = claim(_op_label(node))
        elif node.kind is NodeKind.CONSTANT:
            names[id(node)] = claim("const")
        elif node.kind is NodeKind.READER:
            names[id(node)] = claim(node.name.split(".")[-1] + "_reader")
        else:
            names[id(node)] = claim("source")
    for node in graph.nodes:  # a random state is named after the op that uses it
        if node.kind is NodeKind.RANDOM_STATE:
            user = state_users.get(id(node))
            names[id(node)] = claim(f"{names[id(user)]}_state" if user else "rng_state")
    return {id(node): names[id(node)] for node in graph.nodes}


# the dtypes a `fn.constant` holds exactly (its fdata or idata)
_FLOATS = ("FLOAT16", "FLOAT", "FLOAT64")
_INTEGERS = ("BOOL", "INT8", "INT16", "INT32", "UINT8", "UINT16", "UINT32", "INT64", "UINT64")


class _Emitter:
    def __init__(self, graph: Graph, names: dict[int, str], random_states: str,
                 inline_limit: int | None, standalone: bool):
        self.consts: list[Any] = []
        self.names = names
        self.random_states = random_states
        self.inline_limit = inline_limit
        self.standalone = standalone

    # -- values --------------------------------------------------------------------------------

    def static(self, value: Any, node: Node) -> ast.expr:
        """A static argument as a literal where Python can spell it, else `consts[i]`."""
        if value is None or isinstance(value, (bool, int, str)):
            return ast.Constant(value=value)
        if isinstance(value, float):
            return _float(value)
        if isinstance(value, (list, tuple)):
            elements = [self.static(v, node) for v in value]
            return ast.List(elts=elements, ctx=ast.Load()) if isinstance(value, list) \
                else ast.Tuple(elts=elements, ctx=ast.Load())
        if _is_dali_enum(value):
            if type(value).__name__ == "DALIDataType":
                return _dtype(value.name)
            return _attribute_chain("types", f"{type(value).__name__}.{value.name}")
        if self.standalone:
            raise ExportError(f"a static argument of type {type(value).__name__} has no Python "
                              "spelling in a standalone pipeline", node=node)
        self.consts.append(value)  # kept as is: the runtime's namespace holds it
        return ast.Subscript(value=_name("consts"), slice=ast.Constant(len(self.consts) - 1),
                             ctx=ast.Load())

    def ref(self, ref: Ref) -> ast.expr:
        node = ref.node
        if node.num_outputs == 1:
            return _name(self.names[id(node)])
        key: Any = node.output_names[ref.index] if node.output_names else ref.index
        return ast.Subscript(value=_name(self.names[id(node)]), slice=ast.Constant(key),
                             ctx=ast.Load())

    # -- statements ----------------------------------------------------------------------------

    def external_source(self, node: Node, feed_name: str) -> ast.Call:
        meta = node.meta[0]
        keywords: dict[str, ast.expr] = {
            "name": ast.Constant(feed_name),
            "device": ast.Constant(meta.device),
        }
        if node.kind is NodeKind.RANDOM_STATE or node.feed_in_place:
            # states (and constants fed in place: pipeline outputs nobody writes to) are used
            # in place, kept alive by the runtime; user data is copied at the call, as eager ndd
            # reads it then (callers reuse buffers)
            keywords["no_copy"] = ast.Constant(True)
        if meta.dtype:
            keywords["dtype"] = _dtype(meta.dtype)
        if meta.ndim is not None:
            keywords["ndim"] = ast.Constant(meta.ndim)
        if meta.layout:
            keywords["layout"] = ast.Constant(meta.layout)
        return _call("external_source", [], keywords)

    def constant(self, node: Node) -> ast.Call | None:
        """`fn.constant(...)` holding exactly the value of a one-tensor constant, or None where
        the value cannot be written exactly (or is larger than the inline limit)."""
        if node.is_batch or node.feed_in_place:
            return None
        meta = node.meta[0]
        if meta.dtype not in _FLOATS + _INTEGERS:  # (an enum's: `interp_type` given an int)
            return None
        values = _dali.host_array(node.payload)
        if values.size == 0 or (self.inline_limit is not None and
                                values.size > self.inline_limit):
            return None
        flat = values.reshape(-1)
        if meta.dtype in _FLOATS:
            if not np.all(np.isfinite(flat)) or \
                    not np.array_equal(flat.astype(np.float32).astype(flat.dtype), flat):
                return None
            data_key, data = "fdata", [float(v) for v in flat.astype(np.float32)]
        else:
            as_int = [int(v) for v in flat]
            if any(v < -2**31 or v >= 2**31 for v in as_int):
                return None
            data_key, data = "idata", as_int
        keywords: dict[str, ast.expr] = {
            data_key: ast.List(elts=[_float(v) if data_key == "fdata" else ast.Constant(v)
                                     for v in data], ctx=ast.Load()),
            "shape": ast.List(elts=[ast.Constant(int(s)) for s in values.shape],
                              ctx=ast.Load()),
            "dtype": _dtype(meta.dtype),
        }
        if meta.layout:
            keywords["layout"] = ast.Constant(meta.layout)
        if meta.device != "cpu":
            keywords["device"] = ast.Constant(meta.device)
        if meta.dtype == "FLOAT64":
            # DALI's Constant holds no doubles: the values (exact in float32, checked above)
            # written as floats and cast, bit for bit the same doubles
            keywords["dtype"] = _dtype("FLOAT")
            return _call("cast", [_call("constant", [], keywords)],
                         {"dtype": _dtype("FLOAT64")})
        return _call("constant", [], keywords)

    def _input(self, ref: Ref, device: str) -> ast.expr:
        expr = self.ref(ref)
        if ref.node.meta[ref.index].device != device:
            expr = _moved(expr, device)
        return expr

    def op(self, node: Node) -> ast.expr:
        if node.schema == "Copy" and len(node.inputs) == 1 and not node.arg_inputs:
            source = node.inputs[0]
            target = "cpu" if node.backend == "cpu" else "gpu"
            if source.node.meta[source.index].device != target:
                # ndd's `.gpu()`/`.cpu()` is a Copy across devices: in a pipeline, a transfer
                return _moved(self.ref(source), target)
        if node.schema == "_ArithmeticGenericOp":
            expression = self.arithmetic(node)
            if expression is not None:
                return expression
        args = [self._input(ref, device) for ref, device in zip(node.inputs, node.input_devices)]
        keywords: dict[str, ast.expr] = {}
        if node.backend != "cpu" or any(d != "cpu" for d in node.input_devices):
            keywords["device"] = ast.Constant(node.backend)
        for key, value in sorted(node.static.items()):
            keywords[key] = self.static(value, node)
        for key, ref in node.arg_inputs.items():
            if key == "_random_state" and self.random_states == "own":
                continue  # a standalone pipeline draws its own random numbers
            expr = self.ref(ref)
            if key in node.arg_casts:
                expr = _call("cast", [expr], {"dtype": _dtype(node.arg_casts[key])})
            if ref.node.meta[ref.index].device != "cpu":
                expr = _moved(expr, "cpu")
            keywords[key] = expr
        return _call(node.name, args, keywords)

    def arithmetic(self, node: Node) -> ast.expr | None:
        """`a * 2.5`, `dali.math.sqrt(a)`: the DataNode spelling whose expression descriptor is
        the recorded one (so the types and values are those of eager ndd), or None."""
        if set(node.static) - _ARITHMETIC_STATIC or node.arg_inputs:
            return None
        match = _DESC.match(str(node.static.get("expression_desc", "")))
        if not match:
            return None
        name, operands = match.group(1), match.group(2).split()
        integers = node.static.get("integer_constants") or []
        reals = node.static.get("real_constants") or []
        args: list[ast.expr] = []
        edges = 0
        for operand in operands:
            if operand.startswith("&"):
                if operand != f"&{edges}" or edges >= len(node.inputs):
                    return None  # DataNode numbers inputs in order of appearance
                args.append(self._input(node.inputs[edges], node.input_devices[edges]))
                edges += 1
                continue
            constant = re.match(r"^\$(\d+):(\w+)$", operand)
            if constant is None:
                return None
            index, kind = int(constant.group(1)), constant.group(2)
            # Python literals are the constants DataNode types as int32, float32 and bool
            if kind == "int32" and index < len(integers) and \
                    type(integers[index]) is int:
                args.append(ast.Constant(integers[index]))
            elif kind == "bool" and index < len(integers) and integers[index] in (0, 1):
                args.append(ast.Constant(bool(integers[index])))
            elif kind == "float32" and index < len(reals) and math.isfinite(reals[index]):
                args.append(_float(float(reals[index])))
            else:
                return None
        if edges != len(node.inputs) or not edges or not args:
            return None
        if any(d != node.backend for d in node.input_devices) and node.backend == "cpu":
            return None
        first_is_edge = operands[0].startswith("&")
        if name in _BINARY and len(args) == 2 and (first_is_edge or operands[1][0] == "&"):
            return ast.BinOp(left=args[0], op=_BINARY[name](), right=args[1])
        if name in _COMPARE and len(args) == 2 and first_is_edge:
            # `2 < x` would call x.__gt__(2): only a node on the left keeps the order
            return ast.Compare(left=args[0], ops=[_COMPARE[name]()], comparators=[args[1]])
        if name in _UNARY and len(args) == 1:
            return ast.UnaryOp(op=_UNARY[name](), operand=args[0])
        if name in _MATH:
            return ast.Call(func=_attribute_chain("dali", f"math.{name}"), args=args,
                            keywords=[])
        return None

    def reader(self, node: Node) -> ast.Call:
        static = dict(node.static)
        if self.standalone:
            # the instance name only matters to the runtime (it moves ndd's reader in by name);
            # `checkpointing` is ndd's own flag, the pipeline's enable_checkpointing in DALI
            static["name"] = self.names[id(node)]
            static.pop("checkpointing", None)
        keywords = {key: self.static(value, node) for key, value in sorted(static.items())}
        return _call(node.name, [], keywords)


def _float(value: float) -> ast.expr:
    """A float literal; a NaN as `float("nan")`, negated where its sign bit is set (the NaNs
    Python and the FPU make). A NaN with another payload stays `nan`, which no pipeline
    defines: its build fails, and the call runs eagerly, exactly."""
    if math.isnan(value):
        nan = ast.Call(func=_name("float"), args=[ast.Constant(value="nan")], keywords=[])
        if float_key(value) == _NAN:
            return nan
        if float_key(value) == _NEGATIVE_NAN:
            return ast.UnaryOp(op=ast.USub(), operand=nan)
    return ast.Constant(value=value)  # (infinities print as 1e309, which reads back as inf)


_NAN = float_key(float("nan"))
_NEGATIVE_NAN = float_key(-float("nan"))


def _moved(expr: ast.expr, device: str) -> ast.expr:
    method = "gpu" if device == "gpu" else "cpu"
    return ast.Call(func=ast.Attribute(value=expr, attr=method, ctx=ast.Load()), args=[],
                    keywords=[])


def _unparse(statement: ast.stmt) -> str:
    module = ast.Module(body=[statement], type_ignores=[])
    return unparse(ast.fix_missing_locations(module)).strip()


def _expression(value: ast.expr) -> str:
    """The source of an expression, without the parentheses astunparse puts around it all."""
    text = _unparse(ast.Expr(value=value))
    if text.startswith("(") and text.endswith(")"):
        depth = 0
        for position, char in enumerate(text):
            depth += {"(": 1, ")": -1}.get(char, 0)
            if depth == 0 and position < len(text) - 1:
                return text  # the first parenthesis closes early: `(a + b) * c`
        text = text[1:-1]
        if text.startswith(("- ", "~ ")):
            text = text[0] + text[2:]
    return text


def _header(decorator_options: dict[str, Any] | None) -> list[str]:
    imports = [
        ast.Import(names=[ast.alias(name="nvidia.dali", asname="dali")]),
        ast.ImportFrom(module="nvidia.dali", level=0,
                       names=[ast.alias(name=n) for n in ("fn", "pipeline_def", "types")]),
    ]
    lines = [_unparse(statement) for statement in imports]
    decorator: ast.expr = _name("pipeline_def")
    if decorator_options:
        decorator = ast.Call(func=decorator, args=[], keywords=_keywords(
            {key: ast.Constant(value) for key, value in decorator_options.items()}))
    return [*lines, "", "", "@" + unparse(decorator).strip()]


def lower(graph: Graph, *, inline_constants: bool = False, random_states: str = "fed",
          inline_limit: int | None = INLINE_LIMIT, standalone: bool = False,
          decorator_options: dict[str, Any] | None = None,
          function_name: str | None = None) -> Lowered:
    """Generate, register and compile the `@pipeline_def` of `graph`.

    `inline_constants`: one-tensor constants become `fn.constant(...)` where their value can be
    written exactly (compiled functions; transparent-mode regions feed theirs, as their cache key
    holds no data). `random_states`: "fed" (each random op's state is an input, drawn per call
    as eager draws it) or "own" (the pipeline draws its own, for export). `standalone`: raise
    ExportError for anything the code cannot hold by itself (a fed constant, a Python object).
    """
    graph.verify()
    names = _readable_names(graph)
    emitter = _Emitter(graph, names, random_states, inline_limit, standalone)
    safe_name = NameTable().claim(graph.name)
    function_name = NameTable(_RESERVED).claim(function_name or f"{safe_name}_pipeline")
    lines = _header(decorator_options)
    lines.append(f"def {function_name}():")
    line_map: dict[int, Node] = {}
    external: list[Node] = []
    feed_names: list[str] = []
    for node in graph.nodes:
        if node.kind is NodeKind.OP:
            value = emitter.op(node)
        elif node.kind is NodeKind.READER:
            value = emitter.reader(node)
        elif node.kind is NodeKind.RANDOM_STATE and random_states == "own":
            continue
        else:
            value = emitter.constant(node) if inline_constants and \
                node.kind is NodeKind.CONSTANT else None
            if value is None:
                if standalone and node.kind in (NodeKind.CONSTANT, NodeKind.EXTERNAL):
                    what = ("concrete data that cannot be written exactly into the code (a "
                            "constant batch, or values a DALI constant cannot hold)"
                            if node.kind is NodeKind.CONSTANT else
                            "an ndd.ExternalSource (a Python callback)")
                    raise ExportError(f"the pipeline uses {what}", node=node)
                value = emitter.external_source(node, names[id(node)])
                external.append(node)
                feed_names.append(names[id(node)])
        text = f"    {names[id(node)]} = {_expression(value)}"
        if node.loc is not None:
            # no absolute path in code that may be deployed; a file name may hold a line break
            text += f"  # {one_line(node.loc.portable)}"
        lines.append(text)
        line_map[len(lines)] = node
    outputs = ast.Tuple(elts=[emitter.ref(ref) for ref in graph.outputs], ctx=ast.Load())
    lines.append("    " + _unparse(ast.Return(value=outputs)))
    source = "\n".join(lines) + "\n"

    filename = f"<ndd_trace:{safe_name}#{next(process_state.lowered_sources)}>"
    register_source(filename, source)
    namespace: dict[str, Any] = {"consts": emitter.consts}
    exec(compile(source, filename, "exec"), namespace)  # noqa: S102 (our generated code)
    return Lowered(source=source, filename=filename, function=namespace[function_name],
                   function_name=function_name, consts=emitter.consts, line_map=line_map,
                   external_sources=external, feed_names=feed_names, names=names)
