"""The guard plan: what a function reads besides its arguments (globals, closure cells, the
user's modules' attributes), its own and that of the user helper functions it calls, found by
reading their bytecode (reads.py). Guard keys (guards.build_key) read the values it names.

    plan = plan_for(preprocess)   # preprocess reads CFG.size and calls augment(), which reads FLIP
    plan.globals_read     # (("", "CFG", globals), ("augment() reads ", "FLIP", globals), ...)
"""

from __future__ import annotations

import dataclasses
import sys
import types
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import _dali
from ..core.objects import attribute_held
from . import reads
from .imports import imported_reads

@dataclasses.dataclass
class GuardPlan:
    """What a function reads besides its arguments: globals and closure cells, its own and
    those of the user helper functions it calls (found by following global functions)."""

    globals_read: tuple[tuple[str, str, dict], ...]  # (label prefix, name, globals dict)
    closure: tuple[tuple[str, Any], ...]  # (label, cell)
    # attributes read of the user's own modules (`config.SIZE`, a module global reads by
    # identity): (label prefix, module global's name, globals dict, attribute chain)
    module_attributes: tuple[tuple[str, str, dict, tuple[str, ...]], ...] = ()
    # names read only as `name.a.b` (never passed, stored or read bare): the chains read, by
    # ("global", id(globals dict), name), ("cell", id(cell)) or ("argument", parameter)
    chains: dict[tuple, tuple[tuple[str, ...], ...]] = dataclasses.field(default_factory=dict)
    # its parameters, as labels spell arguments: (positional, keyword-only, *args, **kwargs)
    parameters: tuple = ((), (), None, None)
    # the plans of the functions reached through arguments, made at their first call:
    # function -> (its code then, its plan), and (label, the argument's key items) -> what
    # argument_plans answered; a new plan (replan) starts without them
    helper_plans: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)

    def reads_builtin(self, name: str) -> bool:
        """Whether the function or a helper it reaches by name loads builtin `name`."""
        return any(read == name and name not in namespace
                   for _, read, namespace in self.globals_read)

    def argument_plans(self, label: str, value: Any,
                       memo: Any = None) -> list[tuple[str, GuardPlan]]:
        """The plans of the user functions a call reaches through one argument (`label`, as
        keys spell it), each with its label prefix (`aug.augment() reads `): a function or
        bound method given, a table of them, the methods of an object or class given
        (`self.augment(x)`, and what those reach through `self`). Their globals are guarded as
        the function's own are. `memo`: the argument's own key items, which fix what it
        reaches (its classes, the functions it holds), so the answer is kept by them."""
        if not may_reach_code(value):
            return []
        known = self.helper_plans.get((label, memo)) if memo is not None else None
        if known is not None:
            return known
        found = []
        for path, function in argument_helpers(value, self.chains.get(("argument", label))):
            made = self.helper_plans.get(function)
            if made is None or made[0] is not function.__code__:
                made = self.helper_plans[function] = (function.__code__, plan_for(function))
            found.append((f"{label}{path}() reads ", made[1]))
        if memo is not None:
            if len(self.helper_plans) > MEMO_LIMIT:
                self.helper_plans.clear()
            self.helper_plans[(label, memo)] = found
        return found

    def reads_as(self, other: GuardPlan | None) -> bool:
        """Whether `other` reads the same globals, cells and module attributes (its keys are
        then built alike: a key made with one holds for the other)."""
        def reads(plan: GuardPlan) -> tuple:
            return (tuple((prefix, name, id(namespace)) for prefix, name, namespace
                          in plan.globals_read),
                    tuple((label, id(cell)) for label, cell in plan.closure),
                    tuple((prefix, name, id(namespace), chain) for prefix, name, namespace, chain
                          in plan.module_attributes))

        return other is not None and reads(self) == reads(other)


_MISSING = object()
MEMO_LIMIT = 512  # the most answers a plan keeps (past it they are made again)
_DATA = (int, float, str, bytes, bool, complex, type(None))


def may_reach_code(value: Any) -> bool:
    """Whether user code may be reached through this argument (not through a number, a
    string, a Batch or an array: the fast way out)."""
    return not isinstance(value, (*_DATA, _dali.Batch, _dali.Tensor, np.ndarray, np.generic)) and (
        hasattr(value, "__dict__") or isinstance(value, (dict, list, tuple, types.MethodType)))


def argument_helpers(value: Any, chains: Any) -> list[tuple[str, types.FunctionType]]:
    """The user functions reached through an argument the function reads as `value.<chain>`
    for each of `chains` (None: read whole), each with the path that reaches it (`.augment`,
    `[0]`, `` for the argument itself): `reads.methods_reached`."""
    if not may_reach_code(value):
        return []
    value = attribute_held(value, "_ndd_trace_inlined") or value  # a compiled helper: inlined
    return reads.methods_reached(value, chains)



def plan_for(function: Callable, max_depth: int = 6) -> GuardPlan:
    """Globals and closure cells `function` reads, following user helpers `max_depth` deep."""
    globals_read: dict[tuple[int, str], tuple[str, str, dict]] = {}
    closure: list[tuple[str, Any]] = []
    attributes: dict[tuple, tuple[str, str, dict, tuple[str, ...]]] = {}
    chains: dict[tuple, set[tuple[str, ...]]] = {}
    bare: set[tuple] = set()  # (what `chains` is keyed by) read otherwise too
    seen: set[int] = set()

    def helper(value: Any, depth: int) -> None:
        value = attribute_held(value, "_ndd_trace_inlined") or value  # a compiled helper: inlined
        if reads.is_lru_cache(value):  # what it wraps (its globals: read at each new argument)
            value = value.__wrapped__
        if not isinstance(value, types.FunctionType):  # what it leads to: a bound method's
            for _, item in reads.methods_reached(value, None):  # function, a table's, an
                helper(item, depth)  # object's methods (read whole), a partial's function
            return
        if depth < max_depth and reads.is_user_function(value):
            visit(value, f"{value.__name__}() reads ", depth + 1)

    def visit(fn: Any, prefix: str, depth: int, parameters: bool = True) -> None:
        if id(fn) in seen:
            return
        seen.add(id(fn))
        wrapped = attribute_held(fn, "__wrapped__")
        if wrapped is not None:  # functools.wraps, a compiled helper: what it wraps, and
            own = reads.is_user_function(fn)  # a user's wrapper itself (its parameters)
            visit(wrapped, prefix, depth, parameters=not own)
            if not own:
                return
        if not isinstance(fn, types.FunctionType):
            return
        code = fn.__code__
        namespace = fn.__globals__
        loaded, read, bare_names = reads.global_reads(code)
        any_name = bool(loaded & reads.ANY_NAME)
        loaded = loaded | reads.read_by_text(code, loaded, namespace)
        for name in sorted(loaded):
            globals_read.setdefault((id(namespace), name), (prefix, name, namespace))
            if name in bare_names or any_name or name not in read:  # (else: by its chains)
                helper(namespace.get(name, _MISSING), depth)
        for name, found in read.items():
            chains.setdefault(("global", id(namespace), name), set()).update(found)
            value = namespace.get(name)
            for chain in sorted(found):
                if reads.is_user_module(value):
                    attributes.setdefault((id(namespace), name, chain),
                                          (prefix, name, namespace, chain))
                    helper(reads.chain_value(value, chain), depth)  # `utils.augment(x)`
                else:  # a method or property of a user object or class (`aug.run(x)`)
                    for _, item in reads.methods_reached(value, [chain]):
                        helper(item, depth)
        bare.update(("global", id(namespace), name)
                    for name in (loaded if any_name else bare_names))
        # modules the code imports itself (`from config import SIZE` in its body): read through
        # sys.modules at every call (a module not imported yet reads as missing until it is)
        for name, chain in sorted(imported_reads(code, namespace.get("__package__"))):
            module = sys.modules.get(name)
            if module is None or reads.is_user_module(module):
                attributes.setdefault((id(sys.modules), name, chain),
                                      (prefix, name, sys.modules, chain))
                helper(reads.chain_value(module, chain), depth)
        _, cell_chains, cell_bare = reads.cell_reads(code)
        for name, cell in zip(code.co_freevars, fn.__closure__ or ()):
            closure.append((f"{prefix}{name}", cell))
            chains.setdefault(("cell", id(cell)), set()).update(cell_chains.get(name, ()))
            if name in cell_bare or any_name:
                bare.add(("cell", id(cell)))
            try:
                value = cell.cell_contents
            except ValueError:
                continue
            helper(value, depth)
            for chain in sorted(cell_chains.get(name, ())):  # as for a global
                if reads.is_user_module(value):
                    attributes.setdefault((id(cell), name, chain),
                                          (prefix, name, {name: value}, chain))
                    helper(reads.chain_value(value, chain), depth)
                else:
                    for _, item in reads.methods_reached(value, [chain]):
                        helper(item, depth)
        if depth == 0 and parameters:  # the function's own parameters (not a cell's)
            _, read, bare_names = reads.parameter_reads(code)
            first = reads.first_parameter_chains(fn) if "super" in loaded else None
            whole = code.co_varnames[:1] if "super" in loaded and first is None else ()
            for name in code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]:
                if name in code.co_cellvars or name in bare_names or any_name or name in whole:
                    bare.add(("argument", name))
                chains[("argument", name)] = set(read.get(name, ()))
            if first is not None:  # (`super().name`: a chain of the first parameter's)
                chains[("argument", code.co_varnames[0])] = set(first)

    visit(function, "", 0)
    called = function if reads.is_user_function(function) else \
        getattr(function, "__wrapped__", function)  # (a user's wrapper: its own parameters)
    code = getattr(called, "__code__", None)
    return GuardPlan(tuple(globals_read.values()), tuple(closure), tuple(attributes.values()),
                     {where: tuple(sorted(found, key=str)) for where, found in chains.items()
                      if found and where not in bare},
                     reads.parameters(code) if code is not None else ((), (), None, None))
