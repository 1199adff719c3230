"""Writes a function without source makes (`python -c`, exec'd text, a lambda), read in its
bytecode: writes.py's rules where only the bytecode is there (effects._find_effect_in_code),
and the other bytecode readers it uses.

    bytecode_write(function.__code__, parameters, values)   # None, or (why, line)
    free_name_chains(code, imported)    # [("random", ["choice"], line), ...]
    class_read_line(code)               # the line of a `.__class__` read, or None
    names_read(code)                    # {"ndd", "random", "RNG", ...}: globals and attributes

An item or attribute written (`STATS["n"] += 1`, `obj.x = v`, `del log[:]`) into an object the
code did not make, found by following the written object back on the stack to where it was
loaded: a global or closure variable, an argument, a local bound only to literals (its own),
or a place it cannot follow (which errs toward transparent mode); and an in-place operator on
an argument whose value changes in place (`hist += [1]` on a list).
"""

from __future__ import annotations

import dis
import sys
import types
from typing import Any

from .writes import UNKNOWN

# where the written object is on the stack (0: on top) before each writing instruction
_ITEM_WRITES = types.MappingProxyType({"STORE_SUBSCR": 1, "DELETE_SUBSCR": 1, "STORE_ATTR": 0,
                                       "DELETE_ATTR": 0})
# loads of a global or closure variable (effects.py reads free names with them too)
FREE_LOADS = frozenset({"LOAD_GLOBAL", "LOAD_DEREF", "LOAD_NAME", "LOAD_CLASSDEREF"})
_LOCAL_LOADS = frozenset({"LOAD_FAST", "LOAD_FAST_CHECK"})
_MADE = ("BUILD_MAP", "BUILD_LIST", "BUILD_SET", "BUILD_CONST_KEY_MAP", "LOAD_CONST")
_NO_PUSH = ("STORE_", "DELETE_", "POP_", "RETURN_", "JUMP", "NOP", "RESUME", "PRECALL",
            "KW_NAMES", "EXTENDED_ARG", "CACHE", "PRINT_EXPR")


def _pushes(ins: Any) -> int | None:
    """How many values `ins` pushes (None: not known here)."""
    name, arg = ins.opname, ins.arg or 0
    if name.startswith(_NO_PUSH):
        return 0
    if name == "LOAD_GLOBAL" or (name == "LOAD_ATTR" and sys.version_info >= (3, 12)):
        return 1 + (arg & 1)  # (a NULL or self below the value for a call)
    if name == "LOAD_METHOD":
        return 2
    if name.startswith(("UNPACK_", "FOR_ITER", "BEFORE_", "SETUP_", "PUSH_EXC", "LOAD_FAST_LOAD")):
        return None
    return 1


def _stack_origin(instructions: list, index: int, depth: int) -> tuple[str, Any]:
    """Where the value `depth` deep on the stack before instruction `index` came from:
    ("free", name), ("local", name), ("made", None) or ("unknown", None)."""
    for j in range(index - 1, -1, -1):
        if instructions[j + 1].is_jump_target:
            return "unknown", None  # (another path may have put it there)
        ins = instructions[j]
        name = ins.opname
        if name == "SWAP":
            depth = {0: ins.arg - 1, ins.arg - 1: 0}.get(depth, depth)
            continue
        if name == "COPY":
            if depth == 0:
                return _stack_origin(instructions, j, ins.arg - 1)
            depth -= 1
            continue
        pushes = _pushes(ins)
        if pushes is None:
            return "unknown", None
        try:
            net = dis.stack_effect(ins.opcode, ins.arg, jump=False) if ins.opcode >= \
                dis.HAVE_ARGUMENT else dis.stack_effect(ins.opcode, jump=False)
        except ValueError:
            return "unknown", None
        if depth >= pushes:
            depth -= net
            continue
        if name in FREE_LOADS:
            return "free", ins.argval
        if name in _LOCAL_LOADS:
            return "local", ins.argval
        if name.startswith(_MADE):
            return "made", None
        if name in ("LIST_EXTEND", "SET_UPDATE", "DICT_UPDATE", "DICT_MERGE") and depth == 0:
            return _stack_origin(instructions, j, ins.arg)  # (the literal it fills)
        if name in ("LOAD_ATTR", "BINARY_SUBSCR", "BINARY_SLICE") and depth == 0:
            return _stack_origin(instructions, j, {"LOAD_ATTR": 0, "BINARY_SUBSCR": 1}.get(name, 2))
        return "unknown", None
    return "unknown", None


# in-place operators as `dis` spells them (BINARY_OP's argrepr; Python 3.10's opnames)
_INPLACE_OPS = types.MappingProxyType({
    "+=": "__iadd__", "-=": "__isub__", "*=": "__imul__", "@=": "__imatmul__",
    "/=": "__itruediv__", "//=": "__ifloordiv__", "%=": "__imod__", "**=": "__ipow__",
    "<<=": "__ilshift__", ">>=": "__irshift__", "&=": "__iand__", "^=": "__ixor__",
    "|=": "__ior__", "INPLACE_ADD": "__iadd__", "INPLACE_SUBTRACT": "__isub__",
    "INPLACE_MULTIPLY": "__imul__", "INPLACE_OR": "__ior__", "INPLACE_AND": "__iand__"})


def _inplace_on_argument(instructions: list, index: int, parameters: tuple[str, ...],
                         values: dict) -> str | None:
    """Why instruction `index`, an in-place operator on an argument (`hist += [1]`), changes
    the caller's object: its value at the trace has the operator's in-place method, or its
    value is not known; None otherwise (a Batch, a Tensor or a number is rebound)."""
    ins = instructions[index]
    dunder = _INPLACE_OPS.get(ins.argrepr if ins.opname == "BINARY_OP" else ins.opname)
    if dunder is None:
        return None
    kind, name = _stack_origin(instructions, index, 1)
    if kind == "local" and name not in parameters:  # a local bound to an argument (`h = hist`)
        name = next((found[1] for found in _bindings(instructions, name)
                     if found[0] == "local" and found[1] in parameters), name)
    if kind != "local" or name not in parameters:
        return None
    value = values.get(name, UNKNOWN)
    if value is UNKNOWN:
        return f"may change `{name}`, an argument, in place (its type not known here)"
    if hasattr(type(value), dunder):
        return f"changes `{name}`, an argument, in place (`{ins.argrepr or ins.opname}` on a " \
               f"{type(value).__name__})"
    return None


def _bindings(instructions: list, name: str) -> list[tuple[str, Any]]:
    """Where each value the code binds to the local `name` came from (`_stack_origin`)."""
    return [_stack_origin(instructions, at, 0) for at, ins in enumerate(instructions)
            if ins.opname == "STORE_FAST" and ins.argval == name]


def _line_of(ins: Any, code: types.CodeType) -> int:
    return ins.positions.lineno if ins.positions and ins.positions.lineno else \
        code.co_firstlineno


def bytecode_write(code: types.CodeType, parameters: tuple[str, ...],
                   values: dict | None = None) -> tuple[str, int] | None:
    """The first write of an item or attribute into an object the code did not make (a
    global's, a closure variable's, an argument's, or one it cannot follow: which errs toward
    transparent mode), or an in-place operator on an argument whose value (`values`, by
    parameter name, at the trace) changes in place, as (why, line); None where there is none.
    A local's object is its own where every binding of it is a literal (`d = {}`)."""
    instructions = list(dis.get_instructions(code))
    for index, ins in enumerate(instructions):
        inplace = _inplace_on_argument(instructions, index, parameters, values or {})
        if inplace is not None:
            return f"{inplace}, which eager does at every call", _line_of(ins, code)
        depth = _ITEM_WRITES.get(ins.opname)
        if depth is None:
            continue
        kind, name = _stack_origin(instructions, index, depth)
        if kind == "local" and name not in parameters:
            bindings = _bindings(instructions, name)
            if bindings and all(found[0] == "made" for found in bindings):
                continue
        what = {"free": f"`{name}`, a global or closure variable",
                "local": f"`{name}`" + (", an argument" if name in parameters else ""),
                }.get(kind, "an object it did not make")
        verb = "deletes" if ins.opname.startswith("DELETE") else "writes"
        return (f"{verb} an item or attribute of {what}, which eager does at every call",
                _line_of(ins, code))
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            found = bytecode_write(constant, ())
            if found is not None:
                return found
    return None


# attributes read (`x.attr`, `x.method(...)`)
ATTRIBUTE_LOADS = frozenset({"LOAD_ATTR", "LOAD_METHOD"})


def free_name_chains(code: types.CodeType, imported: dict) -> list[tuple[str, list[str],
                                                                         int | None]]:
    """Each free name (or name the body imports) and the attributes read off it
    (`random.choice`), with its line, in the code and the code nested in it (lambdas,
    comprehensions)."""
    local = {*code.co_varnames, *code.co_cellvars} - set(imported)
    chains: list[tuple[str, list[str], int | None]] = []
    current: tuple[str, list[str], int | None] | None = None
    for instruction in dis.get_instructions(code):
        if instruction.opname in ATTRIBUTE_LOADS and current is not None:
            current[1].append(instruction.argval)
            continue
        if current is not None:
            chains.append(current)
            current = None
        if (instruction.opname in FREE_LOADS or instruction.opname == "LOAD_FAST") \
                and instruction.argval not in local:
            line = instruction.positions.lineno if instruction.positions else None
            current = (instruction.argval, [], line)
    if current is not None:
        chains.append(current)
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            chains.extend(free_name_chains(constant, imported))
    return chains


def class_read_line(code: types.CodeType) -> int | None:
    """The line of the first `.__class__` the code (or code nested in it) reads; None: none."""
    for instruction in dis.get_instructions(code):
        if instruction.opname in ATTRIBUTE_LOADS and instruction.argval == "__class__":
            return (instruction.positions.lineno if instruction.positions else None) or \
                code.co_firstlineno
    nested = (class_read_line(c) for c in code.co_consts if isinstance(c, types.CodeType))
    return next((line for line in nested if line is not None), None)


_NAMES_READ = ATTRIBUTE_LOADS | {"LOAD_GLOBAL", "LOAD_NAME"}


def names_read(code: types.CodeType) -> set[str]:
    """The global names and attribute names the code (or code nested in it) reads."""
    names = {instruction.argval for instruction in dis.get_instructions(code)
             if instruction.opname in _NAMES_READ and isinstance(instruction.argval, str)}
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            names |= names_read(constant)
    return names
