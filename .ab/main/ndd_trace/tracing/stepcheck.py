"""Static check of a compiled generator's Python: may its loop body be traced once?

    finding = check_generator(train_batches)   # None: every step does what the traced one did
    if finding is not None:
        print(finding)                          # "train.py:14: `if i % 2 == 0` branches on ..."

A compiled generator is traced for one reader step, and its pipeline then runs every step. That
is exact only if the loop body's Python does the same thing at every step: no branch, `break`,
`raise` or `return` on a value that changes per step, no Python state carried from step to step
(an `enumerate` counter, `step += 1`), no side effect (appending to a list, printing, writing an
attribute), no call whose Python might do any of these, and no code before or after the loop that
eager ndd would run once per epoch but a compiled loop runs once, at the trace. This module
proves that from the source, conservatively: whatever it cannot prove is a finding, and the
caller (api.py) runs such a generator in checked mode instead (each step's Python runs, its ndd
calls run ahead and are used only when they match), which is exact by construction.

Values a body reads from parameters and globals are guarded once per epoch (guards.py); they
are taken as unchanged within an epoch (documented in docs/loops.md). The other check of a
compiled function's Python, `find_effect`, is in effects.py.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import types
from typing import Any

from ..core.source import SourceLoc
from .effects import (IMPURE_MODULES, MAX_DEPTH, PURE_MODULES, Finding, Resolver, Unprovable,
                      snippet, source_loc, source_tree)

# builtins that compute a value from their arguments and touch nothing else
_PURE_BUILTINS = frozenset({
    "abs", "all", "any", "bool", "dict", "divmod", "enumerate", "float", "frozenset", "int",
    "isinstance", "issubclass", "len", "list", "max", "min", "pow", "range", "reversed",
    "round", "set", "slice", "sorted", "str", "sum", "tuple", "type", "zip", "getattr",
    "hasattr", "callable", "repr", "hash", "id",
})
_STEP_SOURCES = ("next_epoch", "captured")
# methods of ndd Batch/Tensor values that return new values and change nothing
_DATA_METHODS = frozenset({"gpu", "cpu", "select", "evaluate", "torch", "tolist", "item",
                           "to_device"})


def _names_read(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _names_bound(target: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(target) if isinstance(n, ast.Name)
            and isinstance(n.ctx, ast.Store)}


def _is_step_source(node: ast.AST) -> bool:
    """`reader.next_epoch(...)`, `source.captured(...)`, or enumerate/zip over them."""
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
               and n.func.attr in _STEP_SOURCES for n in ast.walk(node))


class _Checker(Resolver):
    """Proves one function's Python free of per-step state and side effects."""

    def __init__(self, function: Any, depth: int = 0):
        super().__init__(function, depth)
        code = function.__code__
        self.params = set(code.co_varnames[:code.co_argcount + code.co_kwonlyargcount
                                           + bool(code.co_flags & inspect.CO_VARARGS)
                                           + bool(code.co_flags & inspect.CO_VARKEYWORDS)])
        self.locals: set[str] = set()

    # -- names and calls -----------------------------------------------------------------------

    def check_call(self, call: ast.Call) -> None:
        chain = self._chain(call.func)
        what = snippet(call.func)
        if chain is None:
            raise Unprovable(f"calls `{what}`, whose Python ndd_trace cannot see", call)
        root, attrs = chain
        if root in self.locals:
            if len(attrs) == 1 and attrs[0] in _DATA_METHODS:
                return  # a method of an ndd Batch/Tensor made in the body
            raise Unprovable(f"calls `{what}` on a Python value of its own (it may keep "
                             "state from step to step)", call)
        if root in self.params:
            raise Unprovable(f"calls `{what}` on an argument: ndd_trace cannot tell whether "
                             "its Python keeps state from step to step", call)
        known, value = self._callee(root, attrs)
        if not known:
            raise Unprovable(f"calls `{what}`, which ndd_trace cannot resolve", call)
        self.check_callee(value, what, call)

    def check_callee(self, value: Any, what: str, node: ast.AST) -> None:
        inlined = getattr(value, "_ndd_trace_inlined", None)
        if inlined is not None:  # a compiled function: inlined into the loop body's trace
            value = inlined
        module = getattr(value, "__module__", None) or ""
        if isinstance(value, types.BuiltinFunctionType) and module == "builtins":
            if value.__name__ in _PURE_BUILTINS:
                return
            raise Unprovable(f"calls `{what}` (a side effect, or a value that can change "
                             "from step to step)", node)
        if value in (dict, list, tuple, set, frozenset, int, float, bool, str, range,
                     enumerate, zip, slice, reversed, type):
            return
        if module.startswith(IMPURE_MODULES):
            raise Unprovable(f"calls `{what}`, which gives other values or effects at each "
                             "step", node)
        if isinstance(value, types.FunctionType) and not module.startswith(PURE_MODULES):
            if self.depth >= MAX_DEPTH:
                raise Unprovable(f"calls `{what}`, nested too deeply to check", node)
            finding = _check_helper(value, self.depth + 1)
            if finding is not None:
                raise Unprovable(f"calls `{what}`, which {finding.reason} "
                                 f"(at {finding.loc})", node)
            return
        if module.startswith(PURE_MODULES):
            return
        raise Unprovable(f"calls `{what}`, whose Python ndd_trace cannot check", node)

    # -- statements ----------------------------------------------------------------------------

    def expressions(self, node: ast.AST, varying: set[str]) -> None:
        """Check every call in an expression, and that no per-step name is read."""
        for sub in ast.walk(node):
            if isinstance(sub, (ast.Yield, ast.YieldFrom, ast.Await)) and sub is not node:
                raise Unprovable("uses the value of a `yield` expression", sub)
            if isinstance(sub, ast.Call):
                self.check_call(sub)
            if isinstance(sub, ast.NamedExpr):
                raise Unprovable("assigns with `:=` inside an expression", sub)
            if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Load) and \
                    sub.id in varying:
                raise Unprovable(f"reads `{sub.id}`, which changes from step to step", sub)

    def statement(self, node: ast.stmt, varying: set[str], data: set[str], in_loop: bool
                  ) -> None:
        where = "in its loop body" if in_loop else "in its body"
        if isinstance(node, (ast.Global, ast.Nonlocal)):
            raise Unprovable(f"declares `{', '.join(node.names)}` "
                             f"{type(node).__name__.lower()} (state that outlives a step)", node)
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for sub in ast.walk(target):
                    if isinstance(sub, (ast.Attribute, ast.Subscript)) and \
                            isinstance(sub.ctx, ast.Store):
                        raise Unprovable(f"writes to `{snippet(sub)}` (a side effect)", node)
            if isinstance(node, ast.AugAssign):
                name = node.target.id if isinstance(node.target, ast.Name) else "?"
                varying.add(name)
                if in_loop:
                    raise Unprovable(f"updates `{snippet(node)}` at every step (Python state "
                                     "carried from step to step)", node)
            if node.value is not None:
                self.expressions(node.value, varying)
            for target in targets:
                self.locals |= _names_bound(target)
            return
        if isinstance(node, ast.Expr):
            value = node.value
            if isinstance(value, ast.Constant):
                return  # a docstring
            if isinstance(value, ast.Yield):
                if not in_loop:
                    raise Unprovable("yields outside its reader loop", node)
                if value.value is not None:
                    self.expressions(value.value, varying)
                return
            if isinstance(value, ast.Call):
                self.expressions(value, varying)
                return
            raise Unprovable(f"evaluates `{snippet(node)}` for its effect", node)
        if isinstance(node, ast.If):
            names = _names_read(node.test)
            if names & data:
                raise Unprovable(f"`if {snippet(node.test)}` branches on data {where}", node)
            self.expressions(node.test, varying)
            for child in (*node.body, *node.orelse):
                self.statement(child, varying, data, in_loop)
            return
        if isinstance(node, ast.For):
            if node.orelse:
                raise Unprovable("has a `for ... else`", node)
            self.expressions(node.iter, varying)
            if _names_read(node.iter) & data:
                raise Unprovable(f"loops over data ({snippet(node.iter)}) {where}", node)
            self.locals |= _names_bound(node.target)
            for child in node.body:
                self.statement(child, varying, data, in_loop)
            return
        if isinstance(node, ast.Pass):
            return
        if isinstance(node, ast.Return) and not in_loop and self.depth > 0:
            if node.value is not None:
                self.expressions(node.value, varying)
            return
        kind = {ast.Break: "`break`", ast.Continue: "`continue`", ast.Return: "`return`",
                ast.Raise: "`raise`", ast.Try: "`try`", ast.While: "`while`",
                ast.With: "`with`", ast.Assert: "`assert`", ast.Delete: "`del`"}.get(
                    type(node), f"`{type(node).__name__}`")
        raise Unprovable(f"has {kind} {where} (control flow or effects that may differ from "
                         "step to step)", node)



def _check_helper(function: Any, depth: int) -> Finding | None:
    """A helper called from a loop body: free of side effects and of hidden state."""
    tree = source_tree(function)
    if tree is None:
        return Finding("has no source to check", SourceLoc(function.__code__.co_filename,
                                                           function.__code__.co_firstlineno,
                                                           function.__name__))
    node, filename, first = tree
    checker = _Checker(function, depth)
    checker.locals |= checker.params
    try:
        for statement in node.body:
            checker.statement(statement, set(), set(), in_loop=False)
    except Unprovable as problem:
        return Finding(problem.reason, source_loc(filename, first, problem.node, function))
    return None


@dataclasses.dataclass
class LoopSite:
    """A generator's reader loop whose body was proved step-invariant: the generator's AST
    (line numbers as in its file), the loop statement, and its body's one `yield`."""

    tree: ast.FunctionDef
    filename: str
    loop: ast.For
    yielded: ast.Expr  # the body's `yield ...` statement


def _reader_loops(body: list[ast.stmt]) -> list[tuple[ast.For, list[ast.stmt]]]:
    """The `for` statements over a reader epoch (or source.captured) in these statements, in
    blocks the generator's own frame runs (try, with, if, loops; not nested functions)."""
    found = []
    for statement in body:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef,
                                  ast.Lambda)):
            continue
        if isinstance(statement, ast.For) and _is_step_source(statement.iter):
            found.append((statement, body))
            continue
        for field in ("body", "orelse", "finalbody"):
            found += _reader_loops(getattr(statement, field, None) or [])
        for handler in getattr(statement, "handlers", None) or []:
            found += _reader_loops(handler.body)
    return found


def _yields(nodes: list[ast.stmt]) -> list[ast.AST]:
    return [node for statement in nodes for node in ast.walk(statement)
            if isinstance(node, (ast.Yield, ast.YieldFrom))]


def _loads_outside(node: ast.AST, skipped: list[ast.stmt]) -> set[str]:
    """Names loaded anywhere in `node` but in the statements `skipped`."""
    names: set[str] = set()
    stack = [node]
    while stack:
        current = stack.pop()
        if any(current is statement for statement in skipped):
            continue
        if isinstance(current, ast.Name) and isinstance(current.ctx, ast.Load):
            names.add(current.id)
        stack.extend(ast.iter_child_nodes(current))
    return names


def find_loop(function: Any) -> LoopSite | Finding:
    """The generator's reader loop, if each of its steps runs the Python the traced step ran;
    otherwise the first construct that may not (with its file:line). The Python around the
    loop (before, after, try/finally, with) is not checked: a compiled loop runs it as written."""
    tree = source_tree(function)
    code = function.__code__
    if tree is None:
        return Finding("its source is not available, so its loop body cannot be checked",
                       SourceLoc(code.co_filename, code.co_firstlineno, function.__name__))
    node, filename, first = tree
    loops = _reader_loops(node.body)
    if len(loops) != 1:
        what = ("has no loop over reader.next_epoch(batch_size=...) or source.captured(...)"
                if not loops else "has several loops over readers or sources")
        return Finding(f"{what}; only the body of one such loop can be compiled",
                       source_loc(filename, first, loops[1][0] if loops else node, function))
    loop = loops[0][0]
    if any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
           and n.func.attr == "captured" for n in ast.walk(loop.iter)):
        return Finding("iterates an ndd.ExternalSource with source.captured(...), whose loop "
                       "DALI's capture mode drives (eagerly too): it runs as written",
                       source_loc(filename, first, loop, function), captures=True)
    checker = _Checker(function)
    varying: set[str] = set()
    try:
        if loop.orelse:
            raise Unprovable("has a `for ... else` on its reader loop", loop)
        if any(isinstance(sub, ast.NamedExpr) for sub in ast.walk(loop.iter)):
            raise Unprovable("assigns with `:=` in its reader loop's iterable", loop)
        yields = _yields(loop.body)
        if len(yields) != 1 or not (isinstance(loop.body[-1], ast.Expr)
                                    and loop.body[-1].value is yields[0]
                                    and isinstance(yields[0], ast.Yield)):
            raise Unprovable("does not end its loop body with its one `yield`", loop)
        data = _names_bound(loop.target)
        varying |= _enumerate_counters(loop)
        checker.locals |= data
        varying |= _carried_names(loop.body, data)
        for statement in loop.body:
            checker.statement(statement, varying, data - varying, in_loop=True)
        inside = set()
        for statement in loop.body:
            inside |= _names_bound(statement)
        leaked = sorted(inside & _loads_outside(node, loop.body))
        if leaked:
            raise Unprovable(f"reads `{leaked[0]}`, set in its loop body, outside that body",
                             loop)
    except Unprovable as problem:
        return Finding(problem.reason, source_loc(filename, first, problem.node, function))
    ast.increment_lineno(node, first - 1)
    return LoopSite(node, filename, loop, loop.body[-1])


def check_generator(function: Any) -> Finding | None:
    """None if each step of the generator's reader loop runs the Python the traced step ran;
    otherwise the first construct that may not (with its file:line)."""
    found = find_loop(function)
    return found if isinstance(found, Finding) else None


def _enumerate_counters(loop: ast.For) -> set[str]:
    """The counter of `for i, x in enumerate(reader.next_epoch(...))`: one value per step."""
    call = loop.iter
    if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and \
            call.func.id == "enumerate" and isinstance(loop.target, ast.Tuple) and \
            loop.target.elts:
        return _names_bound(loop.target.elts[0])
    return set()


def _assigned(body: list[ast.stmt]) -> set[str]:
    names: set[str] = set()
    for statement in body:
        for node in ast.walk(statement):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
    return names


def _carried_names(body: list[ast.stmt], targets: set[str]) -> set[str]:
    """Names a step reads before it assigns them: values carried over from the last step."""
    assigned: set[str] = set(targets)
    carried: set[str] = set()
    for statement in body:
        if isinstance(statement, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            value = statement.value
            if value is not None:
                carried |= _names_read(value) & (_assigned(body) - assigned)
            if isinstance(statement, ast.AugAssign):
                carried |= _names_bound(statement.target)
            targets = statement.targets if isinstance(statement, ast.Assign) \
                else [statement.target]
            for target in targets:
                assigned |= _names_bound(target)
        else:
            carried |= _names_read(statement) & (_assigned(body) - assigned)
            assigned |= _assigned([statement])
    return carried
