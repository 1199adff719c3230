"""What a function's bytecode binds by importing in its own body, and what it reads through
those names (the guards read such values through `sys.modules` at every call: plans.py; the
effect check resolves calls through them: effects.py).

    imported_names(code, package)   # {"np": ("numpy", ()), "SIZE": ("config", ("SIZE",))}
    imported_reads(code, package)   # {("config", ("SIZE",))}
"""

from __future__ import annotations

import dis
import importlib.util
import types
from typing import Any

from .code_writes import ATTRIBUTE_LOADS

_STORES = frozenset({"STORE_FAST", "STORE_DEREF", "STORE_NAME", "STORE_GLOBAL"})
_LOADS = frozenset({"LOAD_FAST", "LOAD_DEREF", "LOAD_NAME", "LOAD_CLASSDEREF"})
_STACK = frozenset({"SWAP", "POP_TOP", "COPY"})


def imported_names(code: types.CodeType, package: str | None) -> dict[str, tuple]:
    """The local names the code binds by importing (`import m`, `import m.n as k`, `from m
    import a`): name -> (module name, attribute chain from that module)."""
    bound: dict[str, tuple] = {}
    instructions = list(dis.get_instructions(code))
    for index, ins in enumerate(instructions):
        if ins.opname != "IMPORT_NAME" or index < 2:
            continue
        level, fromlist = instructions[index - 2].argval, instructions[index - 1].argval
        try:
            module = importlib.util.resolve_name("." * (level or 0) + ins.argval, package) \
                if level else ins.argval
        except (ImportError, ValueError):
            continue
        if not fromlist:
            module = module.split(".")[0]  # `import a.b` binds `a`, `import a.b as c` a.b
        chain: tuple = ()
        for following in instructions[index + 1:]:
            if following.opname == "IMPORT_FROM":
                chain = (following.argval,) if fromlist else (*chain, following.argval)
            elif following.opname in _STORES:
                bound[following.argval] = (module, chain)
                if not fromlist:
                    break
            elif following.opname not in _STACK:
                break
    return bound


def attribute_reads(code: types.CodeType, names: Any) -> set[tuple[str, tuple]]:
    """(name, attribute chain) of each `name.a.b` the code (nested code included) reads of one
    of `names`, a local or closure variable; `(name, ())` where it reads the name alone."""
    found: set[tuple[str, tuple]] = set()
    instructions = list(dis.get_instructions(code))
    for index, ins in enumerate(instructions):
        if ins.opname not in _LOADS or ins.argval not in names:
            continue
        chain: tuple = ()
        for following in instructions[index + 1:]:
            if following.opname not in ATTRIBUTE_LOADS:
                break
            chain = (*chain, following.argval)
        found.add((ins.argval, chain))
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            found |= attribute_reads(const, names)
    return found


def imported_reads(code: types.CodeType, package: str | None) -> set[tuple[str, tuple]]:
    """(module name, attribute chain) of each value the code reads from a module it imports in
    its own body (`from config import SIZE` then `SIZE`, `import config` then `config.SIZE`),
    nested code included: what a guard reads through `sys.modules` at every call."""
    bound = imported_names(code, package)
    found: set[tuple[str, tuple]] = set()
    for name, chain in attribute_reads(code, bound) if bound else ():
        module, start = bound[name]
        if start or chain:
            found.add((module, (*start, *chain)))
    return found
