"""What a compiled function's Python does at each call: `find_effect` finds a call known to have
an effect or to give another value at each call, and the loop check (stepcheck.py) builds on
its reading of a function's source (`source_tree`, `Resolver`, `Finding`).

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
import collections.abc
import dataclasses
import dis
import inspect
import sys
import textwrap
import types
from typing import Any

from ..core.source import SourceLoc
from .code_writes import bytecode_write, class_read_line, free_name_chains
from .imports import imported_names
from .writes import DUNDER_MUTATORS, SHALLOW, UNKNOWN, Origin, WriteFinder

# modules whose functions are pure computations (their random/time submodules are not)
PURE_MODULES = ("nvidia.dali", "numpy", "math", "operator", "functools", "itertools", "copy")
IMPURE_MODULES = ("numpy.random", "random", "time", "os", "sys", "logging", "torch.random",
                  "torch.distributions")
# torch's draws are C functions of `torch` (and tensors' methods, of `torch._C`), beside its
# pure computations
_TORCH_DRAWS = frozenset({"rand", "rand_like", "randint", "randint_like", "randn", "randn_like",
                          "randperm", "normal", "bernoulli", "multinomial", "poisson", "seed",
                          "manual_seed", "uniform_", "normal_", "random_", "bernoulli_",
                          "exponential_", "geometric_", "cauchy_", "log_normal_"})
# builtins whose call is an effect, or gives another value at each call
_EFFECT_BUILTINS = frozenset({"print", "next", "input", "open", "exec", "eval", "setattr",
                              "delattr", "breakpoint"})
_EFFECT_MODULES = (*IMPURE_MODULES, "queue", "threading", "warnings", "_warnings")
# builtins that read a value's class or attributes: a traced proxy's are not eager's
_CLASS_READERS = (type, vars, dir)
# methods that change the Python object they are called on, for Python's own containers and
# streams (a deque or a stream is guarded by its identity only: its change would go unseen)
_CONTAINER_MODULES = ("builtins", "collections", "_collections", "io", "_io", "array")
_MUTATORS = frozenset({"append", "appendleft", "extend", "extendleft", "insert", "pop",
                       "popleft", "popitem", "remove", "discard", "add", "update", "clear",
                       "setdefault", "sort", "reverse", "rotate", "write", "writelines",
                       "flush"})
MAX_DEPTH = 3
AT_TRACE_ONLY = "a compiled function's Python runs at its trace only"
# why `type(x)` keeps a function from being compiled whole (isinstance is the proxies' own)
PROXY_CLASS = ("a trace's Batch or Tensor is a proxy of a class of its own (`isinstance(x, "
               "ndd.Batch)` stays compiled)")


@dataclasses.dataclass(frozen=True)
class Finding:
    """Why a loop body cannot be traced once: the construct, and where it is. `captures`: the
    loop iterates `source.captured(...)`, which DALI's capture mode drives (as eagerly)."""

    reason: str
    loc: SourceLoc
    captures: bool = False
    why: str = AT_TRACE_ONLY  # why the construct keeps it from being compiled whole

    def __str__(self) -> str:
        return f"{self.loc}: {self.reason}"


class Unprovable(Exception):
    """What a check could not prove (the reason), at an AST node; `why` it matters."""

    def __init__(self, reason: str, node: ast.AST | None, why: str = ""):
        super().__init__(reason)
        self.reason = reason
        self.node = node
        self.why = why or AT_TRACE_ONLY


def source_tree(function: Any) -> tuple[ast.FunctionDef, str, int] | None:
    """The function's AST, file and first line; None where the source is not available. Its
    own: not what `__wrapped__` names (a `functools.wraps` wrapper's code is what runs)."""
    own = getattr(function, "__code__", function)
    try:
        lines, first = inspect.getsourcelines(own)
        filename = inspect.getsourcefile(own) or function.__code__.co_filename
    except (OSError, TypeError):
        return None
    tree = ast.parse(textwrap.dedent("".join(lines)))
    node = tree.body[0] if tree.body else None
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    return node, filename, first


def snippet(node: ast.AST) -> str:
    """The node as source, its first line, cut to 60 characters."""
    text = ast.unparse(node).strip().splitlines()[0]
    return text if len(text) <= 60 else text[:57] + "..."


def source_loc(filename: str, first: int, node: ast.AST | None, function: Any) -> SourceLoc:
    line = first + (getattr(node, "lineno", 1) - 1)
    return SourceLoc(filename, line, function.__name__)


def _cell_filled(cell: Any) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


class Resolver:
    """Reads the free names of one function's Python, without running any of it."""

    def __init__(self, function: Any, depth: int = 0):
        self.function = function
        self.depth = depth
        code = function.__code__
        self.globals = function.__globals__
        self.closure = dict(zip(code.co_freevars,
                                (c.cell_contents for c in function.__closure__ or ()
                                 if _cell_filled(c))))
        # names the body binds by importing (`import torch` in it): read through sys.modules
        self.imported = imported_names(code, self.globals.get("__package__"))

    def _resolve(self, name: str) -> tuple[bool, Any]:
        """(known, value) of a free name: a closure cell, a global or a builtin, or a name the
        body imports (a module imported already)."""
        if name in self.imported:
            module, chain = self.imported[name]
            value = sys.modules.get(module)
            for attr in chain if value is not None else ():
                try:
                    value = inspect.getattr_static(value, attr)
                except AttributeError:
                    return False, None
            return value is not None, value
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

    def _callee(self, root: str, attrs: list[str]) -> tuple[bool, Any]:
        """(known, value) of a free name's attribute chain (`log.info`), read without running
        any code (methods unwrapped to their functions)."""
        known, value = self._resolve(root)
        return _attribute_chain(value, attrs) if known else (False, None)


def _attribute_chain(value: Any, attrs: list[str]) -> tuple[bool, Any]:
    """(known, value) of `value.a.b`, read without running any code (methods unwrapped to
    their functions)."""
    for attr in attrs:
        try:
            value = inspect.getattr_static(value, attr)
        except AttributeError:
            return False, None
        value = getattr(value, "__func__", value)
    return True, value


def _function_called(value: Any) -> Any:
    """The Python function a call of `value` runs: a bound method's function, a callable
    object's `__call__` (a RandAugment object whose `__call__` draws from `random`), of a class
    outside the libraries whose calls are known; else `value` itself."""
    if isinstance(value, types.MethodType):
        return value.__func__
    if isinstance(value, (types.FunctionType, types.BuiltinFunctionType, type)):
        return value
    call = getattr(type(value), "__call__", None)
    if isinstance(call, types.FunctionType) and \
            not _module_of(call).startswith((*PURE_MODULES, "torch")):
        return call
    return value


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


def _parameters(code: types.CodeType) -> tuple[str, ...]:
    """The function's parameters (*args and **kwargs included)."""
    count = code.co_argcount + code.co_kwonlyargcount + \
        bool(code.co_flags & inspect.CO_VARARGS) + bool(code.co_flags & inspect.CO_VARKEYWORDS)
    return code.co_varnames[:count]


def _stored_free_name(code: types.CodeType) -> str | None:
    """The first global or nonlocal name the code assigns or deletes (`global STEP; STEP += 1`),
    or None."""
    for instruction in dis.get_instructions(code):
        if instruction.opname in ("STORE_GLOBAL", "DELETE_GLOBAL") or (
                instruction.opname in ("STORE_DEREF", "DELETE_DEREF")
                and instruction.argval in code.co_freevars):
            return instruction.argval
    return None


class _EffectFinder(Resolver):
    """Finds a call known to be impure, or a write into an object the function did not make,
    in a compiled function's Python (find_effect). `origins`: its parameters' (None: not
    known)."""

    def __init__(self, function: Any, depth: int = 0, origins: dict | None = None):
        super().__init__(function, depth)
        self.origins = _all_origins(function.__code__, origins)
        self.caught: frozenset = frozenset()  # names `except ... as` binds (`find` fills it)

    def find(self, body: list[ast.stmt]) -> None:
        code = self.function.__code__
        self.caught = frozenset(node.name for statement in body for node in ast.walk(statement)
                                if isinstance(node, ast.ExceptHandler) and node.name)
        local = {*code.co_varnames, *code.co_cellvars}
        self.writes = WriteFinder(body, self.origins, local, self.callee_of, _MUTATORS)
        for statement in body:
            for node in ast.walk(statement):
                if isinstance(node, (ast.Global, ast.Nonlocal)):
                    self.check_stores(node)
                if isinstance(node, ast.Call):
                    self.check_effect(node, local)
                if isinstance(node, ast.Attribute) and node.attr == "__class__":
                    raise Unprovable(f"reads `{snippet(node)}`", node, PROXY_CLASS)
                write = self.writes.write_reason(node)
                if write is not None:
                    raise Unprovable(*write)

    def callee_of(self, node: ast.expr) -> tuple[bool, Any, str]:
        """(known, value, module) of a free name's attribute chain (WriteFinder's `callee`)."""
        chain = self._chain(node)
        if chain is None or (chain[0] in self.writes.local and chain[0] not in self.imported) \
                or chain[0] in self.origins:
            return False, None, ""
        known, value = self._callee(*chain)
        return known, value, _module_of(value) if known else ""

    def call_origins(self, call: ast.Call, function: Any) -> dict | None:
        """The origins of a helper's parameters at this call (None: not known, as for a
        method's call or a call with `*args`)."""
        chain = self._chain(call.func)
        if chain is None or (chain[1] and not isinstance(
                self._callee(chain[0], chain[1][:-1])[1], types.ModuleType)):
            return None
        code = function.__code__
        positional = code.co_varnames[:code.co_argcount]
        defaults = function.__defaults__ or ()
        given = {**dict(zip(positional[len(positional) - len(defaults):], defaults)),
                 **(function.__kwdefaults__ or {})}
        spread = [a for a in call.args if isinstance(a, ast.Starred)] or \
            [k for k in call.keywords if k.arg is None]
        # (a `*args` or `**kwargs` at the call: what it gives is not known, defaults neither)
        origins = {name: Origin(value=value) for name, value in given.items() if not spread}
        leading = call.args[:call.args.index(spread[0])] if spread and \
            isinstance(spread[0], ast.Starred) else call.args
        for name, argument in [*zip(positional, leading),
                               *((k.arg, k.value) for k in call.keywords if k.arg)]:
            made = self.writes.made(argument)
            values = self.writes.known_values(argument) if not made else None
            if isinstance(argument, ast.Attribute) and argument.attr == "batch_size":
                values = [0]  # (an int, whatever its value: `type(n)` of it is eager's)
            origins[name] = Origin(made) if made else \
                Origin(value=values[0] if values and len(values) == 1 else UNKNOWN)
        return origins

    def check_stores(self, node: ast.AST | None) -> None:
        """A global or nonlocal name the function assigns: eager assigns it at every call."""
        name = _stored_free_name(self.function.__code__)
        if name is not None:
            raise Unprovable(f"assigns `{name}` (global or nonlocal), as eager does at every "
                             "call", node)

    def check_effect(self, call: ast.Call, local: set[str]) -> None:
        if isinstance(call.func, ast.Subscript):
            return self.check_held_helpers(call, local)
        chain = self._chain(call.func)
        if chain is not None and chain[1] and chain[0] in self.origins:
            self.check_held_draw(call, *chain)
        if chain is None or (chain[0] in local and chain[0] not in self.imported):
            return  # a value of its own, or an argument's: its writes are WriteFinder's
        known, value = self._callee(*chain)
        if known:
            inlined = getattr(value, "_ndd_trace_inlined", None) or value
            origins = self.call_origins(call, inlined) \
                if isinstance(inlined, types.FunctionType) else None
            self.check_callee(value, snippet(call.func), call, origins)

    def check_held_helpers(self, call: ast.Call, local: set[str]) -> None:
        """`AUGS["jitter"]()`: a helper held in a global dict, list or tuple, checked as a
        call by its name is (every one it holds where the index is not a constant)."""
        chain = self._chain(call.func.value)
        if chain is None or chain[0] in local or chain[0] in self.origins:
            return
        known, held = self._callee(*chain)
        if not known or not isinstance(held, (dict, list, tuple)):
            return
        index = call.func.slice
        items = held.values() if isinstance(held, dict) else held
        if isinstance(index, ast.Constant):
            try:
                items = [held[index.value]]
            except (KeyError, IndexError, TypeError):
                return
        for value in list(items):
            if callable(value):
                self.check_callee(value, snippet(call.func), call)

    def check_held_draw(self, call: ast.Call, root: str, attrs: list[str]) -> None:
        """`self.rng.uniform(...)`: a generator an argument holds (numpy's, `random.Random`),
        drawn from: other values at each call."""
        given = self.origins[root].value
        known, value = _attribute_chain(given, attrs) if given is not UNKNOWN else (False, None)
        if known and _module_of(value).startswith(IMPURE_MODULES):
            raise Unprovable(f"calls `{snippet(call.func)}`, which gives other values or "
                             "effects at each call", call)

    def check_callee(self, value: Any, what: str, node: ast.AST,
                     origins: dict | None = None) -> None:
        value = getattr(value, "_ndd_trace_inlined", None) or value  # a compiled helper
        module = _module_of(value)
        name = getattr(value, "__name__", "")
        if (module == "builtins" or value is builtins.open) and name in _EFFECT_BUILTINS:
            raise Unprovable(f"calls `{what}`, whose effect eager has at every call", node)
        if any(value is reader for reader in _CLASS_READERS) and \
                _may_name_a_proxys_class(node, self.origins, self.caught):
            raise Unprovable(f"calls `{snippet(node) if node is not None else what}`", node,
                             PROXY_CLASS)
        if (module in _CONTAINER_MODULES and name in _MUTATORS) or name in DUNDER_MUTATORS:
            raise Unprovable(f"calls `{what}`, which changes a Python object at every call",
                             node)
        if module.startswith(_EFFECT_MODULES) or (
                module in ("torch", "torch._C") and name in _TORCH_DRAWS):
            raise Unprovable(f"calls `{what}`, which gives other values or effects at each "
                             "call", node)
        function = _function_called(value)
        if function is not value:  # (a bound method's or a callable object's: `self` first)
            origins, module = None, _module_of(function)
        if isinstance(function, types.FunctionType) and not module.startswith(PURE_MODULES) \
                and self.depth < MAX_DEPTH:
            finding = _find_effect_in(function, self.depth + 1, origins)
            if finding is not None:
                raise Unprovable(f"calls `{what}`, which {finding.reason} (at {finding.loc})",
                                 node, finding.why)


def _may_name_a_proxys_class(node: ast.AST | None, origins: dict,
                             caught: frozenset = frozenset()) -> bool:
    """Whether a `type(...)` (`vars`, `dir`) call may be given a traced Batch or Tensor: one
    argument, not a constant, a `.batch_size` (an int, as eagerly), an exception caught by
    name (`caught`) or a parameter known to hold a number; a reference without source may."""
    if not isinstance(node, ast.Call):
        return node is None
    if len(node.args) != 1 or node.keywords:
        return False
    given = node.args[0]
    if isinstance(given, ast.Name) and given.id in caught:
        return False
    if isinstance(given, ast.Name) and given.id in origins:
        return not isinstance(origins[given.id].value, (int, float))
    return not isinstance(given, ast.Constant) and not (
        isinstance(given, ast.Attribute) and given.attr == "batch_size")


def find_effect(function: Any, arguments: dict | None = None) -> Finding | None:
    """The first call in `function` (or a helper it calls, 3 deep) known to have an effect or
    to give another value at each call, or write into an object the function did not make;
    None where there is none. `arguments`: the call's, by parameter name (a bare `x += 1`
    changes a list in place, and rebinds a Batch or a number)."""
    if not isinstance(function, types.FunctionType):
        return None
    for name, value in (arguments or {}).items():  # (a generator, `iter(...)`, a file)
        if isinstance(value, collections.abc.Iterator):
            code = function.__code__
            return Finding(f"is given an iterator as `{name}`, which eager's Python advances "
                           "at every call", SourceLoc(code.co_filename, code.co_firstlineno,
                                                      function.__name__))
    origins = {name: Origin(value=value) for name, value in (arguments or {}).items()}
    return _find_effect_in(function, 0, origins)


def _all_origins(code: types.CodeType, origins: dict | None) -> dict[str, Origin]:
    """Every parameter's origin: as given, another's object of an unknown value where not
    given; `*args` and `**kwargs` are made by the call (their items are not)."""
    found = {name: (origins or {}).get(name, Origin()) for name in _parameters(code)}
    for flag, index in ((inspect.CO_VARARGS, code.co_argcount + code.co_kwonlyargcount),
                        (inspect.CO_VARKEYWORDS, len(found) - 1)):
        if code.co_flags & flag:
            found[_parameters(code)[index]] = Origin(SHALLOW)
    return found


def _find_effect_in(function: Any, depth: int, origins: dict | None = None) -> Finding | None:
    if not isinstance(function, types.FunctionType):
        return None
    try:
        tree = source_tree(function)
    except SyntaxError:
        tree = None
    if tree is None:  # `python -c`, exec'd strings: read the bytecode instead
        return _find_effect_in_code(function, depth, origins)
    node, filename, first = tree
    try:
        _EffectFinder(function, depth, origins).find(node.body)
    except Unprovable as problem:
        return Finding(problem.reason, source_loc(filename, first, problem.node, function),
                       why=problem.why)
    return None


def _find_effect_in_code(function: Any, depth: int, origins: dict | None = None
                         ) -> Finding | None:
    """find_effect without the source: every free name's attribute chain the bytecode reads
    (called or not: a reference counts, which errs toward transparent mode) is checked as a
    callee would be."""
    finder = _EffectFinder(function, depth)
    code = function.__code__
    stored = _stored_free_name(code)
    if stored is not None:
        return Finding(f"assigns `{stored}` (global or nonlocal), as eager does at every call",
                       SourceLoc(code.co_filename, code.co_firstlineno, function.__name__))
    written = bytecode_write(code, _parameters(code), {
        name: origin.value for name, origin in (origins or {}).items()})
    if written is not None:
        return Finding(written[0], SourceLoc(code.co_filename, written[1], function.__name__))
    line = class_read_line(code)
    if line is not None:
        return Finding("reads `.__class__`", SourceLoc(code.co_filename, line,
                                                        function.__name__), why=PROXY_CLASS)
    for root, attrs, line in free_name_chains(code, finder.imported):
        known, value = finder._callee(root, attrs)
        if not known or not callable(value):
            continue
        try:
            finder.check_callee(value, ".".join([root, *attrs]), None)
        except Unprovable as problem:
            loc = SourceLoc(code.co_filename, line or code.co_firstlineno, function.__name__)
            return Finding(problem.reason, loc, why=problem.why)
    return None


# -- what code reads of the modules it imports ---------------------------------------------------
