"""The AST rewrite of a per-sample function: truth tests and tensor attributes go through the
runtime helpers (conditions.py), and the result is compiled as a function of its own.

    converted = convert(augment)   # .function: the rewritten function; .source: its text
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
import types
from collections.abc import Callable
from typing import Any

from ...core import process_state
from ...core.source import SourceLoc, register_source, unparse
from .conditions import RUNTIME_HELPERS, noted_error

_ATTRIBUTES = frozenset({"shape", "item", "dtype", "ndim", "layout", "tolist", "torch", "evaluate",
                         "cpu", "gpu", "select", "batch_size", "size"})


class _Rewriter(ast.NodeTransformer):
    """Routes truth tests and tensor attributes of one function through the runtime helpers."""

    def __init__(self, filename: str):
        self.filename = filename

    def _wrap(self, test: ast.expr, helper: str = "_ndd_condition") -> ast.expr:
        if helper == "_ndd_condition" and (isinstance(test, ast.BoolOp) or (
                isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not))):
            return test  # its operands are tested already
        return ast.Call(func=ast.Name(id=helper, ctx=ast.Load()),
                        args=[test, ast.Constant(test.lineno)], keywords=[])

    def visit_If(self, node: ast.If) -> ast.If:
        self.generic_visit(node)
        side_effect = _side_effect_line(node)
        node.test = self._wrap(node.test)
        if side_effect is not None:
            node.test.args.append(ast.Constant(side_effect))
        return node

    def visit_While(self, node: ast.While) -> ast.While:
        self.generic_visit(node)
        node.test = self._wrap(node.test, "_ndd_loop_condition")
        return node

    def visit_BoolOp(self, node: ast.BoolOp) -> ast.BoolOp:
        self.generic_visit(node)
        node.values = [self._wrap(value) for value in node.values]
        return node

    def visit_UnaryOp(self, node: ast.UnaryOp) -> ast.expr:
        self.generic_visit(node)
        if isinstance(node.op, ast.Not):
            node.operand = self._wrap(node.operand)
        return node

    def visit_IfExp(self, node: ast.IfExp) -> ast.expr:
        self.generic_visit(node)

        def thunk(body: ast.expr) -> ast.Lambda:
            return ast.Lambda(args=ast.arguments(posonlyargs=[], args=[], kwonlyargs=[],
                                                 kw_defaults=[], defaults=[]), body=body)

        return ast.copy_location(ast.Call(
            func=ast.Name(id="_ndd_if_exp", ctx=ast.Load()),
            args=[self._wrap(node.test), thunk(node.body), thunk(node.orelse)], keywords=[]),
            node)

    def visit_Attribute(self, node: ast.Attribute) -> ast.expr:
        self.generic_visit(node)
        if node.attr in _ATTRIBUTES and isinstance(node.ctx, ast.Load):
            return ast.copy_location(ast.Call(
                func=ast.Name(id="_ndd_attribute", ctx=ast.Load()),
                args=[node.value, ast.Constant(node.attr), ast.Constant(node.lineno)],
                keywords=[]), node)
        return node

    def visit_Global(self, node: ast.Global) -> Any:
        raise noted_error("`global` is not supported in a per-sample function",
                          SourceLoc(self.filename, node.lineno, ""))

    visit_Nonlocal = visit_Global


def _side_effect_line(node: ast.If) -> int | None:
    """The first statement in a branch that changes a Python object (attribute or item
    assignment, a method call whose result is dropped): both branches of a per-sample `if` run
    while the pipeline is defined, so its effects would happen for every sample."""
    for statement in [*node.body, *node.orelse]:
        for inner in ast.walk(statement):
            if isinstance(inner, (ast.Assign, ast.AugAssign)) and any(
                    isinstance(t, (ast.Attribute, ast.Subscript))
                    for t in getattr(inner, "targets", [getattr(inner, "target", None)])):
                return inner.lineno
            if isinstance(inner, ast.Expr) and isinstance(inner.value, ast.Call) and \
                    isinstance(inner.value.func, ast.Attribute):
                return inner.lineno
    return None


_HELPERS = '''
def _ndd_if_exp(condition, if_true, if_false):
    if condition:
        value = if_true()
    else:
        value = if_false()
    return value
'''


@dataclasses.dataclass
class Converted:
    """A rewritten per-sample function."""

    function: Callable
    source: str  # the rewritten function (and the conditional-expression helper)
    filename: str
    user_lines: dict[int, int] = dataclasses.field(default_factory=dict)  # source -> user line


def convert(function: Callable) -> Converted:
    """Rewrite `function`'s truth tests and tensor attributes (see the module docstring)."""
    code = function.__code__
    try:
        source = textwrap.dedent(inspect.getsource(code))  # (its own, not its __wrapped__)
    except (OSError, TypeError) as error:
        raise noted_error(f"the source of `{function.__qualname__}` is not available "
                          f"({error}); per-sample functions are rewritten from their source",
                          SourceLoc(code.co_filename, code.co_firstlineno, code.co_name))
    tree = ast.parse(source)
    ast.increment_lineno(tree, code.co_firstlineno - 1)
    definition = tree.body[0]
    if not isinstance(definition, ast.FunctionDef):
        raise noted_error("per_sample=True needs a function defined with `def`",
                          SourceLoc(code.co_filename, code.co_firstlineno, code.co_name))
    definition.decorator_list = []
    if any(isinstance(node, (ast.Yield, ast.YieldFrom)) for node in ast.walk(definition)):
        raise noted_error("a per-sample function cannot be a generator",
                          SourceLoc(code.co_filename, definition.lineno, code.co_name))
    uses_if_exp = any(isinstance(node, ast.IfExp) for node in ast.walk(definition))
    definition = _Rewriter(code.co_filename).visit(definition)
    helpers = ast.parse(_HELPERS).body if uses_if_exp else []
    # The rewritten function is made inside a factory whose parameters are the runtime helpers
    # and the function's closure variables: it then reads the helpers from cells of its own,
    # and everything else where the original reads it, live (its globals, its closure cells).
    helper_names = [*RUNTIME_HELPERS, *(["_ndd_if_exp"] if uses_if_exp else [])]
    factory = ast.FunctionDef(
        name="_ndd_factory",
        args=ast.arguments(posonlyargs=[], args=[ast.arg(arg=name) for name in
                                                 [*helper_names, *code.co_freevars]],
                           kwonlyargs=[], kw_defaults=[], defaults=[]),
        body=[definition, ast.Return(value=ast.Name(id=definition.name, ctx=ast.Load()))],
        decorator_list=[], returns=None)
    module = ast.fix_missing_locations(ast.Module(body=[*helpers, factory], type_ignores=[]))
    text = unparse(module).strip() + "\n"
    user_lines: dict[int, int] = {}
    for printed, original in zip(ast.walk(ast.parse(text)), ast.walk(module)):
        if isinstance(printed, ast.stmt) and hasattr(original, "lineno"):
            user_lines.setdefault(printed.lineno, original.lineno)
    filename = f"<ndd_trace per-sample:{code.co_name}#{next(process_state.rewritten_sources)}>"
    register_source(filename, text)
    scratch: dict[str, Any] = {}
    exec(compile(text, filename, "exec"), scratch)  # noqa: S102 (the rewritten function)
    values = {**scratch, **RUNTIME_HELPERS}  # (`_ndd_if_exp` is defined in the text)
    cells = dict(zip(code.co_freevars, function.__closure__ or ()))
    inner = next(const for const in scratch["_ndd_factory"].__code__.co_consts
                 if isinstance(const, types.CodeType) and const.co_name == definition.name)
    # made from its code, not by calling the factory: defaults and annotations are the
    # original's, evaluated once where it was defined, not again here
    converted = types.FunctionType(
        inner, function.__globals__, function.__name__, function.__defaults__,
        tuple(cells[name] if name in cells else types.CellType(values[name])
              for name in inner.co_freevars) or None)
    converted.__kwdefaults__ = function.__kwdefaults__
    return Converted(converted, text, filename, user_lines)
