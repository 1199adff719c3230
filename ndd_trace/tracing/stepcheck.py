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
are taken as unchanged within an epoch (documented in docs/loops.md).

    finding = find_effect(step)                 # None: no call known to be impure

A compiled function's Python runs at its trace only. `find_effect` looks in it (and the helpers
it calls) for a call known to have an effect or to give another value at each call (`print`,
`next`, `random`, `time`, `logging`, a global deque's `append`, ...), which eager runs at every
call: the caller (stage.py) then runs the function in transparent mode, its Python at every
call. Unlike the loop check it is not conservative: what it does not know to be impure is left
to the guards (docs/limitations.md).
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import inspect
import textwrap
import types
from typing import Any

from ..core.source import SourceLoc

# builtins that compute a value from their arguments and touch nothing else
_PURE_BUILTINS = frozenset({
    "abs", "all", "any", "bool", "dict", "divmod", "enumerate", "float", "frozenset", "int",
    "isinstance", "issubclass", "len", "list", "max", "min", "pow", "range", "reversed",
    "round", "set", "slice", "sorted", "str", "sum", "tuple", "type", "zip", "getattr",
    "hasattr", "callable", "repr", "hash", "id",
})
# modules whose functions are pure computations (their random/time submodules are not)
_PURE_MODULES = ("nvidia.dali", "numpy", "math", "operator", "functools", "itertools")
_IMPURE_MODULES = ("numpy.random", "random", "time", "os", "sys", "logging")
# builtins whose call is an effect, or gives another value at each call
_EFFECT_BUILTINS = frozenset({"print", "next", "input", "open", "exec", "eval", "setattr",
                              "delattr", "breakpoint"})
_EFFECT_MODULES = (*_IMPURE_MODULES, "queue", "threading")
# methods that change the Python object they are called on, for Python's own containers and
# streams (a deque or a stream is guarded by its identity only: its change would go unseen)
_CONTAINER_MODULES = ("builtins", "collections", "_collections", "io", "_io", "array")
_MUTATORS = frozenset({"append", "appendleft", "extend", "extendleft", "insert", "pop",
                       "popleft", "popitem", "remove", "discard", "add", "update", "clear",
                       "setdefault", "sort", "reverse", "rotate", "write", "writelines",
                       "flush"})
_STEP_SOURCES = ("next_epoch", "captured")
# methods of ndd Batch/Tensor values that return new values and change nothing
_DATA_METHODS = frozenset({"gpu", "cpu", "select", "evaluate", "torch", "tolist", "item",
                           "to_device"})
_MAX_DEPTH = 3


@dataclasses.dataclass(frozen=True)
class Finding:
    """Why a loop body cannot be traced once: the construct, and where it is. `captures`: the
    loop iterates `source.captured(...)`, which DALI's capture mode drives (as eagerly)."""

    reason: str
    loc: SourceLoc
    captures: bool = False

    def __str__(self) -> str:
        return f"{self.loc}: {self.reason}"


class _Unprovable(Exception):
    def __init__(self, reason: str, node: ast.AST | None):
        super().__init__(reason)
        self.reason = reason
        self.node = node


def _source_tree(function: Any) -> tuple[ast.FunctionDef, str, int] | None:
    """The function's AST, file and first line; None where the source is not available."""
    try:
        lines, first = inspect.getsourcelines(function)
        filename = inspect.getsourcefile(function) or function.__code__.co_filename
    except (OSError, TypeError):
        return None
    tree = ast.parse(textwrap.dedent("".join(lines)))
    node = tree.body[0] if tree.body else None
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    return node, filename, first


def _text(node: ast.AST) -> str:
    text = ast.unparse(node).strip().splitlines()[0]
    return text if len(text) <= 60 else text[:57] + "..."


def _names_read(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _names_bound(target: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(target) if isinstance(n, ast.Name)
            and isinstance(n.ctx, ast.Store)}


def _is_step_source(node: ast.AST) -> bool:
    """`reader.next_epoch(...)`, `source.captured(...)`, or enumerate/zip over them."""
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
               and n.func.attr in _STEP_SOURCES for n in ast.walk(node))


class _Checker:
    """Proves one function's Python free of per-step state and side effects."""

    def __init__(self, function: Any, depth: int = 0):
        self.function = function
        self.depth = depth
        code = function.__code__
        self.globals = function.__globals__
        self.closure = dict(zip(code.co_freevars,
                                (c.cell_contents for c in function.__closure__ or ()
                                 if _cell_filled(c))))
        self.params = set(code.co_varnames[:code.co_argcount + code.co_kwonlyargcount
                                           + bool(code.co_flags & inspect.CO_VARARGS)
                                           + bool(code.co_flags & inspect.CO_VARKEYWORDS)])
        self.locals: set[str] = set()

    # -- names and calls -----------------------------------------------------------------------

    def _resolve(self, name: str) -> tuple[bool, Any]:
        """(known, value) of a free name: a closure cell, a global or a builtin."""
        if name in self.closure:
            return True, self.closure[name]
        if name in self.globals:
            return True, self.globals[name]
        if hasattr(builtins, name):
            return True, getattr(builtins, name)
        return False, None

    def _chain(self, node: ast.AST) -> tuple[str, list[str]] | None:
        attrs = []
        while isinstance(node, ast.Attribute):
            attrs.append(node.attr)
            node = node.value
        if isinstance(node, ast.Name):
            return node.id, attrs[::-1]
        return None

    def check_call(self, call: ast.Call) -> None:
        chain = self._chain(call.func)
        what = _text(call.func)
        if chain is None:
            raise _Unprovable(f"calls `{what}`, whose Python ndd_trace cannot see", call)
        root, attrs = chain
        if root in self.locals:
            if len(attrs) == 1 and attrs[0] in _DATA_METHODS:
                return  # a method of an ndd Batch/Tensor made in the body
            raise _Unprovable(f"calls `{what}` on a Python value of its own (it may keep "
                              "state from step to step)", call)
        if root in self.params:
            raise _Unprovable(f"calls `{what}` on an argument: ndd_trace cannot tell whether "
                              "its Python keeps state from step to step", call)
        known, value = self._callee(root, attrs)
        if not known:
            raise _Unprovable(f"calls `{what}`, which ndd_trace cannot resolve", call)
        self.check_callee(value, what, call)

    def _callee(self, root: str, attrs: list[str]) -> tuple[bool, Any]:
        """(known, value) of a free name's attribute chain (`log.info`), read without running
        any code (methods unwrapped to their functions)."""
        known, value = self._resolve(root)
        if not known:
            return False, None
        for attr in attrs:
            try:
                value = inspect.getattr_static(value, attr)
            except AttributeError:
                return False, None
            value = getattr(value, "__func__", value)
        return True, value

    def check_callee(self, value: Any, what: str, node: ast.AST) -> None:
        inlined = getattr(value, "_ndd_trace_inlined", None)
        if inlined is not None:  # a compiled function: inlined into the loop body's trace
            value = inlined
        module = getattr(value, "__module__", None) or ""
        if isinstance(value, types.BuiltinFunctionType) and module == "builtins":
            if value.__name__ in _PURE_BUILTINS:
                return
            raise _Unprovable(f"calls `{what}` (a side effect, or a value that can change "
                              "from step to step)", node)
        if value in (dict, list, tuple, set, frozenset, int, float, bool, str, range,
                     enumerate, zip, slice, reversed, type):
            return
        if module.startswith(_IMPURE_MODULES):
            raise _Unprovable(f"calls `{what}`, which gives other values or effects at each "
                              "step", node)
        if isinstance(value, types.FunctionType) and not module.startswith(_PURE_MODULES):
            if self.depth >= _MAX_DEPTH:
                raise _Unprovable(f"calls `{what}`, nested too deeply to check", node)
            finding = _check_helper(value, self.depth + 1)
            if finding is not None:
                raise _Unprovable(f"calls `{what}`, which {finding.reason} "
                                  f"(at {finding.loc})", node)
            return
        if module.startswith(_PURE_MODULES):
            return
        raise _Unprovable(f"calls `{what}`, whose Python ndd_trace cannot check", node)

    # -- statements ----------------------------------------------------------------------------

    def expressions(self, node: ast.AST, varying: set[str]) -> None:
        """Check every call in an expression, and that no per-step name is read."""
        for sub in ast.walk(node):
            if isinstance(sub, (ast.Yield, ast.YieldFrom, ast.Await)) and sub is not node:
                raise _Unprovable("uses the value of a `yield` expression", sub)
            if isinstance(sub, ast.Call):
                self.check_call(sub)
            if isinstance(sub, ast.NamedExpr):
                raise _Unprovable("assigns with `:=` inside an expression", sub)
            if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Load) and \
                    sub.id in varying:
                raise _Unprovable(f"reads `{sub.id}`, which changes from step to step", sub)

    def statement(self, node: ast.stmt, varying: set[str], data: set[str], in_loop: bool
                  ) -> None:
        where = "in its loop body" if in_loop else "in its body"
        if isinstance(node, (ast.Global, ast.Nonlocal)):
            raise _Unprovable(f"declares `{', '.join(node.names)}` "
                              f"{type(node).__name__.lower()} (state that outlives a step)", node)
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for sub in ast.walk(target):
                    if isinstance(sub, (ast.Attribute, ast.Subscript)) and \
                            isinstance(sub.ctx, ast.Store):
                        raise _Unprovable(f"writes to `{_text(sub)}` (a side effect)", node)
            if isinstance(node, ast.AugAssign):
                name = node.target.id if isinstance(node.target, ast.Name) else "?"
                varying.add(name)
                if in_loop:
                    raise _Unprovable(f"updates `{_text(node)}` at every step (Python state "
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
                    raise _Unprovable("yields outside its reader loop", node)
                if value.value is not None:
                    self.expressions(value.value, varying)
                return
            if isinstance(value, ast.Call):
                self.expressions(value, varying)
                return
            raise _Unprovable(f"evaluates `{_text(node)}` for its effect", node)
        if isinstance(node, ast.If):
            names = _names_read(node.test)
            if names & data:
                raise _Unprovable(f"`if {_text(node.test)}` branches on data {where}", node)
            self.expressions(node.test, varying)
            for child in (*node.body, *node.orelse):
                self.statement(child, varying, data, in_loop)
            return
        if isinstance(node, ast.For):
            if node.orelse:
                raise _Unprovable("has a `for ... else`", node)
            self.expressions(node.iter, varying)
            if _names_read(node.iter) & data:
                raise _Unprovable(f"loops over data ({_text(node.iter)}) {where}", node)
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
        raise _Unprovable(f"has {kind} {where} (control flow or effects that may differ from "
                          "step to step)", node)


def _cell_filled(cell: Any) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


def _loc(filename: str, first: int, node: ast.AST | None, function: Any) -> SourceLoc:
    line = first + (getattr(node, "lineno", 1) - 1)
    return SourceLoc(filename, line, function.__name__)


def _check_helper(function: Any, depth: int) -> Finding | None:
    """A helper called from a loop body: free of side effects and of hidden state."""
    tree = _source_tree(function)
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
    except _Unprovable as problem:
        return Finding(problem.reason, _loc(filename, first, problem.node, function))
    return None


def _module_of(value: Any) -> str:
    """The module a callee comes from, bound builtins (`random.random`: a method of a hidden
    Random) and C methods (numpy's `Generator.random`) included."""
    module = getattr(value, "__module__", None)
    if module:
        return module
    owner = getattr(value, "__objclass__", None) or getattr(value, "__self__", None)
    if owner is None or inspect.ismodule(owner):
        return getattr(owner, "__name__", "") or ""
    return getattr(owner if isinstance(owner, type) else type(owner), "__module__", "") or ""


class _EffectFinder(_Checker):
    """Finds a call known to be impure in a compiled function's Python (find_effect)."""

    def find(self, body: list[ast.stmt]) -> None:
        code = self.function.__code__
        local = {*code.co_varnames, *code.co_cellvars}
        for statement in body:
            for node in ast.walk(statement):
                if isinstance(node, ast.Call):
                    self.check_effect(node, local)

    def check_effect(self, call: ast.Call, local: set[str]) -> None:
        chain = self._chain(call.func)
        if chain is None or chain[0] in local:
            return  # a value of its own, or an argument's: left to the guards
        known, value = self._callee(*chain)
        if known:
            self.check_callee(value, _text(call.func), call)

    def check_callee(self, value: Any, what: str, node: ast.AST) -> None:
        value = getattr(value, "_ndd_trace_inlined", None) or value  # a compiled helper
        module = _module_of(value)
        name = getattr(value, "__name__", "")
        if module == "builtins" and name in _EFFECT_BUILTINS:
            raise _Unprovable(f"calls `{what}`, whose effect eager has at every call", node)
        if module in _CONTAINER_MODULES and name in _MUTATORS:
            raise _Unprovable(f"calls `{what}`, which changes a Python object at every call",
                              node)
        if module.startswith(_EFFECT_MODULES):
            raise _Unprovable(f"calls `{what}`, which gives other values or effects at each "
                              "call", node)
        if isinstance(value, types.FunctionType) and not module.startswith(_PURE_MODULES) \
                and self.depth < _MAX_DEPTH:
            finding = _find_effect_in(value, self.depth + 1)
            if finding is not None:
                raise _Unprovable(f"calls `{what}`, which {finding.reason} (at {finding.loc})",
                                  node)


def find_effect(function: Any) -> Finding | None:
    """The first call in `function` (or a helper it calls, 3 deep) known to have an effect or
    to give another value at each call; None where there is none, or no source to read."""
    return _find_effect_in(function, 0)


def _find_effect_in(function: Any, depth: int) -> Finding | None:
    if not isinstance(function, types.FunctionType):
        return None
    try:
        tree = _source_tree(function)
    except SyntaxError:
        return None
    if tree is None:
        return None
    node, filename, first = tree
    try:
        _EffectFinder(function, depth).find(node.body)
    except _Unprovable as problem:
        return Finding(problem.reason, _loc(filename, first, problem.node, function))
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
    tree = _source_tree(function)
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
                       _loc(filename, first, loops[1][0] if loops else node, function))
    loop = loops[0][0]
    if any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
           and n.func.attr == "captured" for n in ast.walk(loop.iter)):
        return Finding("iterates an ndd.ExternalSource with source.captured(...), whose loop "
                       "DALI's capture mode drives (eagerly too): it runs as written",
                       _loc(filename, first, loop, function), captures=True)
    checker = _Checker(function)
    varying: set[str] = set()
    try:
        if loop.orelse:
            raise _Unprovable("has a `for ... else` on its reader loop", loop)
        if any(isinstance(sub, ast.NamedExpr) for sub in ast.walk(loop.iter)):
            raise _Unprovable("assigns with `:=` in its reader loop's iterable", loop)
        yields = _yields(loop.body)
        if len(yields) != 1 or not (isinstance(loop.body[-1], ast.Expr)
                                    and loop.body[-1].value is yields[0]
                                    and isinstance(yields[0], ast.Yield)):
            raise _Unprovable("does not end its loop body with its one `yield`", loop)
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
            raise _Unprovable(f"reads `{leaked[0]}`, set in its loop body, outside that body",
                              loop)
    except _Unprovable as problem:
        return Finding(problem.reason, _loc(filename, first, problem.node, function))
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
