"""Writes a function's Python makes into objects it did not make (effects.py's `find_effect`).

    finder = WriteFinder(node, parameters, resolve)
    finder.write_reason(ast_node)        # None, or why the node writes into another's object

Eager writes an argument's, a global's or a closure variable's item or attribute at every call
(`state["n"] += 1`, `cfg.on = not cfg.on`, `del d[k]`, `hist += [1]` on a list, `t.add_(1)`,
`heapq.heappush(h, v)`); a compiled function's Python runs at its trace only. A name's object
is its own where every binding of the name makes a new object (`d = {}`, `out = []`,
`np.zeros(3)`, an ndd op's result); anything else is taken to be another's, which errs toward
transparent mode. A bare `name += v` rebinds a Batch, a Tensor or a number but changes a list,
a numpy array or a torch tensor in place: where the name's value is known (an argument at the
trace, a global), its type decides; where it is not, it counts as a write.
"""

from __future__ import annotations

import ast
import dataclasses
import types
from collections.abc import Callable
from typing import Any

# how much of an object a binding made: the object itself ("shallow": `dict(cfg)`), or it and
# every object in it ("deep": `{}`, `[0] * 3`, `np.zeros(3)`, an ndd op's result)
SHALLOW, DEEP = 1, 2
UNKNOWN = object()  # a name's value where it is not known

# module functions that change their first argument in place
_HEAPQ = frozenset({"heappush", "heappop", "heapify", "heapreplace", "heappushpop"})
_BISECT = frozenset({"insort", "insort_left", "insort_right"})
_OPERATOR = frozenset({"setitem", "delitem", "iadd", "isub", "imul", "imatmul", "itruediv",
                       "ifloordiv", "imod", "ipow", "ilshift", "irshift", "iand", "ixor", "ior",
                       "iconcat"})
MODULE_MUTATORS = types.MappingProxyType({
    "heapq": _HEAPQ, "_heapq": _HEAPQ, "bisect": _BISECT, "_bisect": _BISECT,
    "operator": _OPERATOR, "_operator": _OPERATOR,
    "numpy": frozenset({"copyto", "put", "place", "putmask", "fill_diagonal", "put_along_axis"}),
})
# the special methods behind item and attribute writes and in-place operators, called by name
DUNDER_MUTATORS = frozenset({"__setitem__", "__delitem__", "__setattr__", "__delattr__",
                             "__iadd__", "__isub__", "__imul__", "__imatmul__", "__itruediv__",
                             "__ifloordiv__", "__imod__", "__ipow__", "__ilshift__",
                             "__irshift__", "__iand__", "__ixor__", "__ior__"})
# methods that change the object they are called on (with effects.py's container mutators):
# numpy's in place methods; torch's are every name ending in one `_` (`add_`, `copy_`)
METHOD_MUTATORS = frozenset({"fill", "put", "itemset", "resize", "setfield", "partition",
                             "setflags", *DUNDER_MUTATORS})
_INPLACE = types.MappingProxyType({ast.Add: "__iadd__", ast.Sub: "__isub__", ast.Mult: "__imul__",
            ast.MatMult: "__imatmul__", ast.Div: "__itruediv__", ast.FloorDiv: "__ifloordiv__",
            ast.Mod: "__imod__", ast.Pow: "__ipow__", ast.LShift: "__ilshift__",
            ast.RShift: "__irshift__", ast.BitAnd: "__iand__", ast.BitXor: "__ixor__",
            ast.BitOr: "__ior__"})
_OPERATOR_INPLACE = types.MappingProxyType({f"i{name}": dunder for name, dunder in (
    ("add", "__iadd__"), ("sub", "__isub__"), ("mul", "__imul__"), ("matmul", "__imatmul__"),
    ("truediv", "__itruediv__"), ("floordiv", "__ifloordiv__"), ("mod", "__imod__"),
    ("pow", "__ipow__"), ("lshift", "__ilshift__"), ("rshift", "__irshift__"),
    ("and", "__iand__"), ("xor", "__ixor__"), ("or", "__ior__"), ("concat", "__iadd__"))})
# builtin and collections types: a call makes a new object (its items: the arguments')
_CONSTRUCTOR_MODULES = ("builtins", "collections", "_collections", "copy", "array")
# numpy and torch functions that give a view of (or the very) argument: a write changes it
_VIEWS = frozenset({"asarray", "asanyarray", "ascontiguousarray", "asfortranarray", "reshape",
                    "ravel", "squeeze", "transpose", "swapaxes", "moveaxis", "rollaxis",
                    "expand_dims", "broadcast_to", "broadcast_arrays", "atleast_1d",
                    "atleast_2d", "atleast_3d", "diagonal", "real", "imag", "split",
                    "array_split", "hsplit", "vsplit", "dsplit", "as_tensor", "from_numpy",
                    "frombuffer", "view_as_real", "view_as_complex", "narrow", "select",
                    "unbind", "chunk", "tensor_split", "permute", "unsqueeze", "flatten",
                    "movedim", "as_strided", "unflatten", "detach", "t", "T", "flip"})
_IMMUTABLE = (type(None), bool, int, float, complex, str, bytes, range)
_FRESH_MODULES = ("numpy", "torch", "nvidia.dali")
_FRESH_METHODS = types.MappingProxyType({"copy": SHALLOW, "clone": DEEP, "astype": DEEP,
                                         "tolist": DEEP})


@dataclasses.dataclass(frozen=True)
class Origin:
    """What a parameter holds when the function starts: the caller's own object (`made`, how
    much of it), or another's, its value where known."""

    made: int = 0
    value: Any = UNKNOWN

    def __post_init__(self) -> None:
        if type(self.value) in _IMMUTABLE:  # nothing to write into (until rebound)
            object.__setattr__(self, "made", DEEP)


def _targets(node: ast.AST) -> list[ast.expr]:
    """The targets a statement assigns or deletes, tuples unpacked."""
    if isinstance(node, ast.Assign):
        found = list(node.targets)
    elif isinstance(node, (ast.AugAssign, ast.For, ast.AsyncFor, ast.comprehension)):
        found = [node.target]
    elif isinstance(node, ast.AnnAssign):
        found = [node.target] if node.value is not None else []
    elif isinstance(node, ast.Delete):
        found = list(node.targets)
    elif isinstance(node, ast.withitem):
        found = [node.optional_vars] if node.optional_vars is not None else []
    else:
        return []
    flat: list[ast.expr] = []
    while found:
        target = found.pop()
        if isinstance(target, (ast.Tuple, ast.List)):
            found.extend(target.elts)
        elif isinstance(target, ast.Starred):
            found.append(target.value)
        else:
            flat.append(target)
    return flat


def _root(node: ast.expr) -> ast.expr:
    """The name (or expression) an item or attribute chain starts from: `state` of
    `state["a"].b`, of `state.get("a")["b"]` too."""
    while True:
        if isinstance(node, (ast.Attribute, ast.Subscript)):
            node = node.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            node = node.func.value
        else:
            return node


def _snippet(node: ast.AST) -> str:
    text = ast.unparse(node).strip().splitlines()[0]
    return text if len(text) <= 60 else text[:57] + "..."


def is_mutator_method(name: str, mutators: frozenset) -> bool:
    """A method name known to change the object it is called on (`append`, `fill`, `add_`)."""
    return name in mutators or name in METHOD_MUTATORS or (
        name.endswith("_") and not name.startswith("_"))


class WriteFinder:
    """Which objects one function's Python made itself, and the writes it makes into others'.
    `origins`: its parameters'; `local`: the names its code binds; `callee(func)`: (known,
    value, module) of a call's callee, read without running code; `mutators`: the method names
    known to change a container."""

    def __init__(self, body: list[ast.stmt], origins: dict[str, Origin], local: set[str],
                 callee: Callable[[ast.expr], tuple[bool, Any, str]], mutators: frozenset):
        self.origins = origins
        self.callee = callee
        self.mutators = mutators
        self.bindings: dict[str, list[Any]] = {}
        self.declared: set[str] = set()  # global or nonlocal: another's
        for statement in body:
            for node in ast.walk(statement):
                self._bind(node)
        self.local = (local | set(self.bindings)) - self.declared - set(origins)
        self._made: dict[str, int] = {}
        # parameter -> the value a top-level `name = value` rebinds it to before any other use
        # of the name (`h = list(h)`): the caller's object is not reached through it after that
        self.rebound: dict[str, ast.expr] = {}
        used: set[str] = set()
        for statement in body:
            names = {node.id for node in ast.walk(statement) if isinstance(node, ast.Name)}
            for name in (names & set(origins)) - used:
                targets = statement.targets if isinstance(statement, ast.Assign) else []
                if len(targets) == 1 and isinstance(targets[0], ast.Name) and \
                        targets[0].id == name:
                    self.rebound[name] = statement.value
            used |= names

    # -- what each name's bindings made --------------------------------------------------------

    def _bind(self, node: ast.AST) -> None:
        if isinstance(node, (ast.Global, ast.Nonlocal)):
            self.declared.update(node.names)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                self._bind_target(target, node.value)
        elif isinstance(node, (ast.AnnAssign, ast.NamedExpr)) and node.value is not None:
            self._bind_target(node.target, node.value)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            self.bindings.setdefault(node.name, []).append(DEEP)  # a new function or class
        elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension, ast.withitem)):
            for target in _targets(node):
                self._bind_target(target, None)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                self._bind_name(alias.asname or alias.name.split(".")[0], None)
        elif isinstance(node, (ast.arguments)):  # a nested function's or lambda's parameters
            for argument in (*node.posonlyargs, *node.args, *node.kwonlyargs, node.vararg,
                             node.kwarg):
                if argument is not None:
                    self._bind_name(argument.arg, None)
        else:
            name = getattr(node, "name", None) if isinstance(
                node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) else \
                getattr(node, "rest", None) if isinstance(node, ast.MatchMapping) else None
            if name:
                self._bind_name(name, None)

    def _bind_name(self, name: str, value: Any) -> None:
        self.bindings.setdefault(name, []).append(value)

    def _bind_target(self, target: ast.expr, value: ast.expr | None) -> None:
        if isinstance(target, ast.Name):
            self._bind_name(target.id, value)
        elif isinstance(target, (ast.Tuple, ast.List)):
            values: list = [None] * len(target.elts)
            if isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(values) \
                    and not any(isinstance(e, ast.Starred) for e in (*value.elts, *target.elts)):
                values = list(value.elts)
            for element, item in zip(target.elts, values):
                self._bind_target(element, item)
        elif isinstance(target, ast.Starred):
            self._bind_target(target.value, None)

    def name_made(self, name: str) -> int:
        """How much of a name's object the function made (0: none of it, or not known)."""
        if name not in self.local and name not in self.origins:
            return 0  # a global, closure or builtin name: another's
        if name in self._made:
            return self._made[name]
        rebound = self.rebound.get(name)
        if rebound is not None:  # (its first rebinding reads the parameter's object)
            self._made[name] = self.origins[name].made
            made = self.made(rebound)
        else:
            made = self.origins[name].made if name in self.origins else DEEP
        self._made[name] = made if rebound is not None else DEEP  # (`out = out + [y]`)
        for value in self.bindings.get(name, [] if name in self.origins else [None]) \
                if made else ():
            if value is rebound:
                continue
            made = min(made, value if isinstance(value, int) else
                       self.made(value) if value is not None else 0)
            if not made:
                break
        self._made[name] = made
        return made

    def made(self, node: ast.expr) -> int:
        """How much of an expression's value the function made: DEEP, SHALLOW, or 0."""
        if isinstance(node, (ast.Constant, ast.JoinedStr, ast.Compare, ast.Lambda)):
            return DEEP
        if isinstance(node, ast.Name):
            return self.name_made(node.id)
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            return DEEP if all(self.made(e) == DEEP for e in node.elts) else SHALLOW
        if isinstance(node, ast.Dict):
            return DEEP if all(k is not None and self.made(v) == DEEP
                               for k, v in zip(node.keys, node.values)) else SHALLOW
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp)):
            return DEEP if self.made(node.elt) == DEEP else SHALLOW
        if isinstance(node, ast.DictComp):
            return DEEP if self.made(node.value) == DEEP else SHALLOW
        if isinstance(node, ast.BinOp):
            return min(DEEP, self.made(node.left), self.made(node.right)) or SHALLOW
        if isinstance(node, ast.UnaryOp):
            return self.made(node.operand) or SHALLOW
        if isinstance(node, (ast.BoolOp, ast.IfExp)):  # `cfg or {}` is `cfg`
            parts = node.values if isinstance(node, ast.BoolOp) else [node.body, node.orelse]
            return min(self.made(part) for part in parts)
        if isinstance(node, (ast.Attribute, ast.Subscript)):  # an item of a deep-made object
            return DEEP if self.made(node.value) == DEEP else 0
        if isinstance(node, ast.Call):
            return self._call_made(node)
        return 0

    def _call_made(self, call: ast.Call) -> int:
        known, value, module = self.callee(call.func)
        if not known:  # a method of a value: `cfg.copy()`
            method = call.func.attr if isinstance(call.func, ast.Attribute) else None
            return _FRESH_METHODS.get(method, 0) if method else 0
        name = getattr(value, "__name__", "")
        if module.startswith(_FRESH_MODULES):  # (an ndd op's result is always new)
            return 0 if name in _VIEWS and not module.startswith("nvidia.dali") else DEEP
        if module.startswith(_CONSTRUCTOR_MODULES) and (isinstance(value, type) or
                                                       module == "copy"):
            if name == "deepcopy":
                return DEEP
            arguments = [*call.args, *(k.value for k in call.keywords)]
            return DEEP if all(self.made(a) == DEEP or self._is_type(a) for a in arguments) \
                else SHALLOW
        if module == "builtins":
            return 0 if name in ("getattr", "vars", "next", "max", "min", "iter", "globals",
                                 "locals") else \
                SHALLOW if name in ("sorted", "reversed", "zip", "enumerate", "map", "filter") \
                else DEEP
        return 0  # another function's result: it may be an argument, or a global's object

    def _is_type(self, node: ast.expr) -> bool:
        known, value, _ = self.callee(node)
        return known and isinstance(value, type)  # `defaultdict(list)`

    # -- the writes ----------------------------------------------------------------------------

    def known_values(self, node: ast.expr, seen: frozenset = frozenset()) -> list | None:
        """The values another's object behind `node` may be, where each is known: an
        argument's at the trace, a global's; None where one is not known."""
        if isinstance(node, ast.Call) and self.callee(node.func)[0]:
            return self._result_values(node, seen)
        if not isinstance(node, ast.Name) or node.id in seen:
            return None if not isinstance(node, ast.Name) else []
        name = node.id
        if name not in self.local and name not in self.origins:
            known, value, _ = self.callee(node)
            return [value] if known else None
        found = []
        if name in self.origins:
            if self.origins[name].value is UNKNOWN:
                return None
            found.append(self.origins[name].value)
        for value in self.bindings.get(name, [] if name in self.origins else [None]):
            if isinstance(value, int) or (value is not None and self.made(value)):
                continue  # the function's own object
            more = self.known_values(value, seen | {name}) if value is not None else None
            if more is None:
                return None
            found.extend(more)
        return found

    def _result_values(self, call: ast.Call, seen: frozenset) -> list | None:
        """What a function's result may be that the function did not make: one of the
        arguments it was given (`y = normalize(x)`; a global it returns goes unseen)."""
        found: list = []
        for argument in [*call.args, *(k.value for k in call.keywords)]:
            argument = argument.value if isinstance(argument, ast.Starred) else argument
            more = [] if self.made(argument) else self.known_values(argument, seen)
            if more is None:
                return None
            found.extend(more)
        return found

    def whose(self, node: ast.expr) -> str:
        """Whose object `node` is, in words."""
        root = _root(node)
        if not isinstance(root, ast.Name):
            return "an object it did not make"
        if root.id in self.origins:
            return f"its argument `{root.id}`"
        if root.id in self.local:
            return f"`{root.id}` (an object it did not make)"
        return f"the global or closure variable `{root.id}`"

    def write_reason(self, node: ast.AST) -> tuple[str, ast.AST] | None:
        """Why `node` writes into an object the function did not make (and where), or None."""
        if isinstance(node, ast.Call):
            return self._call_reason(node)
        verb = "deletes" if isinstance(node, ast.Delete) else "writes"
        for target in _targets(node):
            if isinstance(target, (ast.Subscript, ast.Attribute)) and not self.made(target.value):
                return (f"{verb} `{_snippet(target)}`, an item or attribute of "
                        f"{self.whose(target.value)}, which eager does at every call", node)
            if isinstance(node, ast.AugAssign):
                reason = self._inplace_reason(target, _INPLACE[type(node.op)], node)
                if reason is not None:
                    return reason
        return None

    def _inplace_reason(self, target: ast.expr, dunder: str, node: ast.AST
                        ) -> tuple[str, ast.AST] | None:
        """`target op= v` (or `operator.iadd(target, v)`): a change in place of another's
        object where its type has `dunder`, or its type is not known."""
        if self.made(target):
            return None
        values = self.known_values(target)
        if values is None:
            return (f"may change {self.whose(target)} in place (`{_snippet(node)}`, its type "
                    "not known here), which eager does at every call", node)
        changed = [v for v in values if hasattr(type(v), dunder)]
        if changed:
            return (f"changes {self.whose(target)} in place (`{_snippet(node)}` on a "
                    f"{type(changed[0]).__name__}), which eager does at every call", node)
        return None

    def _call_reason(self, call: ast.Call) -> tuple[str, ast.AST] | None:
        func = call.func
        known, value, module = self.callee(func)
        name = getattr(value, "__name__", "") if known else ""
        if known and name in MODULE_MUTATORS.get(module, ()) and call.args:
            first = call.args[0]
            if name in _OPERATOR_INPLACE and module in ("operator", "_operator"):
                return self._inplace_reason(first, _OPERATOR_INPLACE[name], call)
            if not self.made(first):
                return (f"calls `{_snippet(func)}`, which changes {self.whose(first)} at every "
                        "call", call)
            return None
        if isinstance(func, ast.Attribute) and is_mutator_method(func.attr, self.mutators) \
                and not self.made(func.value) and not self._is_module(func.value):
            return (f"calls `{_snippet(func)}`, which may change {self.whose(func.value)} at "
                    "every call", call)
        return None

    def _is_module(self, node: ast.expr) -> bool:
        known, value, _ = self.callee(node)
        return known and isinstance(value, types.ModuleType)
