"""What a function's bytecode reads: the globals, closure variables and parameters it loads,
each read bare or only through attribute chains (`CFG.size`), and which code and modules are the
user's. The guard plan (plans.plan_for) is made from it.

    found = global_reads(function.__code__)  # of `return ndd.resize(x, size=CFG.size)`:
    found.loaded                             # {"ndd", "CFG"}
    found.chains                             # {"ndd": {("resize",)}, "CFG": {("size",)}}
    found.bare                               # set(): neither is passed on, stored or read whole
    parameters(function.__code__)            # (("x",), (), None, None): *args, **kwargs: None

Reading bytecode sees what the code does, not what it could do: a name given to a call, stored,
captured by inner code or loaded without an attribute after it is read bare (its whole value
counts), and a function that calls `globals()`, `locals()`, `vars()`, `eval` or `exec`
(`ANY_NAME`) may read any name by its text.
"""

from __future__ import annotations

import dis
import functools
import inspect
import itertools
import sys
import types
from collections.abc import Callable
from typing import Any, NamedTuple

from ..core import process_state
from ..core.objects import attribute_held, is_user_class
from ..core.source import is_internal_file

ANY_NAME = frozenset({"globals", "locals", "vars", "eval", "exec"})  # read names by their text
# what reads a global by its text (`globals()["G"]`, `getattr(sys.modules[__name__], "G")`):
# a code loading one of these reads each global its string constants name
BY_TEXT = ANY_NAME | {"getattr", "sys"}
_ATTRIBUTE_LOADS = frozenset({"LOAD_ATTR", "LOAD_METHOD"})
_GLOBAL_LOADS = frozenset({"LOAD_GLOBAL", "LOAD_NAME"})
_GLOBAL_USES = frozenset({"STORE_GLOBAL", "DELETE_GLOBAL", "STORE_NAME", "DELETE_NAME"})
_CELL_LOADS = frozenset({"LOAD_DEREF"})
_CELL_USES = frozenset({"LOAD_CLOSURE", "STORE_DEREF", "DELETE_DEREF", "MAKE_CELL",
                        "LOAD_FROM_DICT_OR_DEREF", "LOAD_CLASSDEREF"})
_FAST_LOADS = frozenset({"LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_BORROW"})


class Reads(NamedTuple):
    """The names a code object loads; per name loaded with attribute loads after it, their
    chains (`CFG.size.x`: ("size", "x")); the names used otherwise too (bare)."""

    loaded: set[str]
    chains: dict[str, set[tuple[str, ...]]]
    bare: set[str]


def _reads(code: types.CodeType, loads: frozenset[str], uses: Callable[[str], bool],
           nested: bool, found: Reads | None = None) -> Reads:
    """How `code` (and, `nested`, the code nested in it) reads the names `loads` loads; an
    opname `uses` takes uses its names otherwise (stores, captures)."""
    found = found or Reads(set(), {}, set())
    instructions = list(dis.get_instructions(code))
    for index, ins in enumerate(instructions):
        if ins.opname in loads:
            found.loaded.add(ins.argval)
            chain = tuple(following.argval for following in itertools.takewhile(
                lambda i: i.opname in _ATTRIBUTE_LOADS, instructions[index + 1:]))
            if chain:
                found.chains.setdefault(ins.argval, set()).add(chain)
            else:
                found.bare.add(ins.argval)
        elif uses(ins.opname):  # (3.13's LOAD_FAST_LOAD_FAST: two names)
            names = ins.argval if isinstance(ins.argval, tuple) else (ins.argval,)
            found.bare.update(name for name in names if isinstance(name, str))
    for const in code.co_consts if nested else ():
        if isinstance(const, types.CodeType):
            _reads(const, loads, uses, True, found)
    return found


def string_constants(code: types.CodeType) -> set[str]:
    """The string constants of `code` and of the code nested in it."""
    found = {const for const in code.co_consts if isinstance(const, str)}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            found |= string_constants(const)
    return found


def read_by_text(code: types.CodeType, loaded: set[str], namespace: dict) -> set[str]:
    """The globals of `namespace` that `code` (which loads `loaded`) may read by their text:
    those its string constants name (`globals()["G"]`, `getattr(module, "G")`), and with `sys`
    its attribute names too (`sys.modules[__name__].G`); none without a BY_TEXT name."""
    if not loaded & BY_TEXT:
        return set()
    texts = string_constants(code) | (set(code.co_names) if "sys" in loaded else set())
    return {text for text in texts if text in namespace}


def global_reads(code: types.CodeType) -> Reads:
    """The globals `code` and the code nested in it read (LOAD_GLOBAL: not attribute names, so
    `ndd.flip` is no read of a global `flip`)."""
    return _reads(code, _GLOBAL_LOADS, _GLOBAL_USES.__contains__, True)


def cell_reads(code: types.CodeType) -> Reads:
    """The closure variables `code` and the code nested in it read."""
    return _reads(code, _CELL_LOADS, _CELL_USES.__contains__, True)


def parameter_reads(code: types.CodeType) -> Reads:
    """The local names (parameters among them) `code` reads: a parameter inner code captures
    is a cell (`code.co_cellvars`), read as such."""
    return _reads(code, _FAST_LOADS, lambda op: "_FAST" in op and op not in _FAST_LOADS, False)


def parameters(code: types.CodeType) -> tuple:
    """A function's positional and keyword-only parameters, its `*args` and `**kwargs`."""
    names, count = code.co_varnames, code.co_argcount + code.co_kwonlyargcount
    varargs = names[count] if code.co_flags & inspect.CO_VARARGS else None
    varkw = names[count + bool(varargs)] if code.co_flags & inspect.CO_VARKEYWORDS else None
    return names[:code.co_argcount], names[code.co_argcount:count], varargs, varkw


def is_user_function(value: Any) -> bool:
    """A Python function of the user's files (not a library's, nor generated code)."""
    if not isinstance(value, types.FunctionType):
        return False
    filename = value.__code__.co_filename
    return not filename.startswith("<") and "site-packages" not in filename and \
        not is_internal_file(filename)


def is_user_module(value: Any) -> bool:
    """A module of the user's (a file of theirs, or one made at run time, `types.ModuleType`),
    not a library's, the standard library's or a builtin one."""
    if not isinstance(value, types.ModuleType):
        return False
    filename = getattr(value, "__file__", None) or ""
    if not filename:
        return value.__name__ not in sys.builtin_module_names
    return "site-packages" not in filename and not filename.startswith(sys.prefix) and \
        not filename.startswith(sys.base_prefix) and not is_internal_file(filename)


MISSING = object()  # (a value not held: no attribute, no table entry)


def chain_value(value: Any, chain: tuple[str, ...]) -> Any:
    for attribute in chain:
        value = getattr(value, attribute, MISSING)
        if value is MISSING:
            break
    return value


def is_lru_cache(value: Any) -> bool:
    """A `functools.lru_cache` (or `functools.cache`) helper: its results are kept state."""
    return attribute_held(value, "cache_clear") is not None and \
        attribute_held(value, "cache_info") is not None and \
        isinstance(attribute_held(value, "__wrapped__"), types.FunctionType) and \
        attribute_held(value, "_ndd_trace_inlined") is None


def lru_clears(helper: Any) -> int:
    """How many times an lru_cache helper was cleared since first keyed: its `cache_clear` is
    counted from then on (an answer computed after a clear may differ from one cached before,
    with as many held)."""
    clears = process_state.lru_clears
    if helper not in clears:
        clears[helper] = 0
        clear = helper.cache_clear

        @functools.wraps(clear)
        def counted_clear() -> None:
            clears[helper] = clears.get(helper, 0) + 1
            clear()

        try:
            helper.cache_clear = counted_clear
        except AttributeError:
            return -1  # (its clears cannot be counted: keyed by what it holds alone)
    return clears[helper]


def _function_behind(held: Any) -> Any:
    """What a class holds as the function it runs: a property's getter, a static or class
    method's function; anything else as it is."""
    if isinstance(held, property):
        return held.fget
    return held.__func__ if isinstance(held, (staticmethod, classmethod)) else held


def class_attribute(value: Any, name: str) -> types.FunctionType | None:
    """The function behind attribute `name` of a user object or class: a method, a static or
    class method, a property's getter, a user descriptor's `__get__`; where the class holds
    no `name`, its `__getattr__` (None where it is no such thing)."""
    kind = value if isinstance(value, type) else type(value)
    if not is_user_class(kind):
        return None
    own = getattr(value, "__dict__", None) if not isinstance(value, type) else None
    for cls in kind.__mro__:
        if name in vars(cls):
            found = vars(cls)[name]
            if isinstance(own, dict) and name in own and not hasattr(type(found), "__set__"):
                return None  # the object's own attribute hides its class's (`a.op = ...`)
            held = attribute_held(found, "_ndd_trace_inlined") or found  # (compiled: its
            found = _function_behind(held)  # function, whose ops join the caller's)
            if found is held and not isinstance(found, types.FunctionType) and \
                    is_user_class(type(found)):
                found = inspect.getattr_static(type(found), "__get__", None)  # a descriptor
            return found if isinstance(found, types.FunctionType) else None
    if name.startswith("__") or (isinstance(own, dict) and name in own) or \
            torch_table_item(value, name) is not MISSING:
        return None
    found = inspect.getattr_static(kind, "__getattr__", None)  # (what answers a missing name)
    return found if isinstance(found, types.FunctionType) else None


MAX_METHODS = 64  # the most functions followed through one object (and the objects it holds)
_TABLE_ITEMS = 64  # the most items of a list, tuple or dict followed (helpers it dispatches to)
_TORCH_TABLES = ("_parameters", "_buffers", "_modules")


_TORCH_MODULE = "torch.nn.modules.module"


def _derives_from(kind: type, module: str, name: str) -> bool:
    """Whether one of `kind`'s classes is `module.name` (found by name: torch is not imported
    for it)."""
    return any(cls.__name__ == name and cls.__module__ == module for cls in kind.__mro__)


@functools.lru_cache(maxsize=None)
def is_torch_module(kind: type) -> bool:
    """Whether `kind` is a `torch.nn.Module`."""
    return _derives_from(kind, _TORCH_MODULE, "Module")


@functools.lru_cache(maxsize=None)
def torch_getattr(kind: type) -> bool:
    """Whether `module.name` of an nn.Module class reads torch's tables of submodules,
    parameters and buffers (torch's own `__getattr__`, not one of the user's)."""
    getter = getattr(kind, "__getattr__", None)
    return is_torch_module(kind) and getattr(getter, "__module__", "") == _TORCH_MODULE and \
        getattr(getter, "__qualname__", "") == "Module.__getattr__"


@functools.lru_cache(maxsize=None)
def is_torch_tensor(kind: type) -> bool:
    """Whether `kind` is a torch tensor's class (a Parameter's too)."""
    return _derives_from(kind, "torch", "Tensor")


def torch_table_item(value: Any, name: str) -> Any:
    """`value.name` where `value` is an nn.Module holding `name` in torch's tables of
    submodules, parameters and buffers (where torch's `__getattr__` finds it), else MISSING."""
    if not is_torch_module(type(value)):
        return MISSING
    state = getattr(value, "__dict__", None) or {}
    for table in _TORCH_TABLES:
        held = state.get(table)
        if held and name in held:
            return held[name]
    return MISSING


def _held_names(value: Any) -> list[str]:
    """Every attribute name a whole object (or class) read may reach code through: its user
    classes' functions and properties, its own attributes (an nn.Module's submodules too)."""
    kind = value if isinstance(value, type) else type(value)
    names = [name for cls in kind.__mro__ if is_user_class(cls) for name in vars(cls)
             if not (name.startswith("__") and name not in ("__call__", "__init__"))]
    if isinstance(value, type):
        return names
    state = getattr(value, "__dict__", None) or {}
    return names + list(state) + (list(state.get("_modules") or {})
                                  if is_torch_module(kind) else [])


def _walked(value: Any) -> bool:
    """An object whose attributes are followed: the user's, or an nn.Module (torch's own
    containers, ModuleList and Sequential, hold the user's modules)."""
    if isinstance(value, type):
        return is_user_class(value)
    if isinstance(value, (types.FunctionType, types.MethodType, types.ModuleType,
                          functools.partial)):
        return False
    return hasattr(value, "__dict__") and (is_user_class(type(value)) or
                                           is_torch_module(type(value)))


def _own_functions(value: Any) -> list[tuple[str, types.FunctionType]]:
    """Every function the user classes of an object read whole define (a method an override
    hides included: `super()` reaches it), by `Class.name`."""
    kind = value if isinstance(value, type) else type(value)
    found = []
    for cls in kind.__mro__:
        if not is_user_class(cls):
            continue
        for name, held in vars(cls).items():
            held = _function_behind(held)
            if isinstance(held, types.FunctionType):
                found.append((f"{cls.__name__}.{name}", held))
    return found


class Super(NamedTuple):
    """A chain's step `super().name` in a method of `owner` (its class's `__class__`): what it
    reaches is looked up past `owner` in the object's classes."""

    name: str
    owner: type

    def __str__(self) -> str:
        return f"super({self.owner.__name__}).{self.name}"


def first_parameter_chains(function: types.FunctionType) -> Any:
    """The attribute chains a function reads of its first parameter (`self.augment`:
    ("augment",); `super().op(x)`: (Super("op", its class),)); None where it reads it whole
    (passes it on, stores it, captures it, calls `super()` otherwise)."""
    chains = _first_parameter_chains(function.__code__)
    if not chains or not any(chain[0] == _SUPER for chain in chains):
        return chains
    owner = super_owner(function)
    if owner is None:
        return None
    return tuple((Super(chain[1], owner),) if chain[0] == _SUPER else chain for chain in chains)


_SUPER = "<super>"  # (a chain `(_SUPER, name)` of `super().name`, before its class is known)


@functools.lru_cache(maxsize=1024)  # (read at every call of a function given an object)
def _first_parameter_chains(code: types.CodeType) -> Any:
    if not code.co_argcount:  # (a wrapper's `*args` holds its object: read whole)
        return None if code.co_flags & inspect.CO_VARARGS else ()
    supers: tuple = ()
    if "super" in global_reads(code).loaded:
        supers = super_attributes(code)
        if supers is None:  # (`super(...)` spelled otherwise: reads it whole, unnamed)
            return None
    _, read, bare = parameter_reads(code)
    first = code.co_varnames[0]
    if first in bare or first in code.co_cellvars:
        return None
    return tuple(read.get(first, ())) + tuple((_SUPER, name) for name in supers)


def super_attributes(code: types.CodeType) -> tuple[str, ...] | None:
    """The names `code` reads as `super().name` (zero-argument `super()`, each followed by an
    attribute); None where it uses `super` otherwise, or in code nested in it."""
    if any(isinstance(const, types.CodeType) and "super" in global_reads(const).loaded
           for const in code.co_consts):
        return None
    instructions = [ins for ins in dis.get_instructions(code) if ins.opname not in
                    ("PRECALL", "CACHE", "EXTENDED_ARG")]
    names = []
    for index, ins in enumerate(instructions):
        if ins.opname not in _GLOBAL_LOADS or ins.argval != "super":
            continue
        after = instructions[index + 1:index + 3]
        if len(after) < 2 or after[0].opname != "CALL" or after[0].arg != 0 or \
                after[1].opname not in _ATTRIBUTE_LOADS:
            return None
        names.append(after[1].argval)
    return tuple(dict.fromkeys(names))


def super_owner(function: types.FunctionType) -> type | None:
    """The class whose method `function` is (its `__class__` cell, which `super()` reads)."""
    if "__class__" not in function.__code__.co_freevars or function.__closure__ is None:
        return None
    cell = function.__closure__[function.__code__.co_freevars.index("__class__")]
    try:
        owner = cell.cell_contents
    except ValueError:
        return None
    return owner if isinstance(owner, type) else None


def super_attribute(value: Any, step: Super) -> tuple[Any, Any]:
    """What `super().name` finds in a method of `step.owner` called on `value`: the function
    behind it (a method, a property's getter, a static or class method's function) or the
    value a class past the owner holds (MISSING where none holds it), and what that function's
    first parameter is: `value`, its class (a class method), None (a static method, a value)."""
    kind = value if isinstance(value, type) else type(value)
    mro = kind.__mro__
    if step.owner not in mro:
        return MISSING, None
    for cls in mro[mro.index(step.owner) + 1:]:
        if step.name in vars(cls):
            held = vars(cls)[step.name]
            found = _function_behind(held)
            if isinstance(held, (staticmethod, classmethod)):
                return found, kind if isinstance(held, classmethod) else None
            return found, value if isinstance(found, types.FunctionType) else None
    return MISSING, None


def methods_reached(value: Any, chains: Any) -> list[tuple[str, types.FunctionType]]:
    """The user functions code reaches through a value it reads as `value.<chain>` for each
    of `chains` (None: it reads it whole, so every attribute counts): a function, a bound
    method (and what it reaches through its object), a `functools.partial` (its function and
    what it is given), the items of a list, tuple or dict; of an object or class, its class's
    methods and properties (`self.augment(x)`, every one of its user classes' where it is read
    whole), the functions and values it holds (`self.fn = helper`, a table of transforms, an
    nn.Module's submodules), and within each method found, what that method reaches through
    its own first parameter (`self._inner(x)`). Each with the path that reaches it
    (`.augment`, `.aug.run`, `.transforms[0].__call__`, `` for the value itself);
    MAX_METHODS at most."""
    found: dict[int, tuple[str, types.FunctionType]] = {}
    read_whole: set[int] = set()
    todo: list[tuple[Any, str, Any]] = [(value, "", chains)]
    while todo and len(found) < MAX_METHODS:
        obj, base, obj_chains = todo.pop()
        if not _walked(obj):
            _reach_held(obj, base, found, todo)
            continue
        whole = obj_chains is None
        if whole:
            if id(obj) in read_whole or len(read_whole) >= MAX_METHODS:
                continue
            read_whole.add(id(obj))
            obj_chains = [(name,) for name in _held_names(obj)]
        for chain in obj_chains:
            current, at = obj, base
            for step, attribute in enumerate(chain):
                path = f"{at}.{attribute}"
                if isinstance(attribute, Super):  # `super().name`: past its method's class
                    held, owner = super_attribute(current, attribute)
                    if isinstance(held, types.FunctionType):
                        _found(found, path, held, todo, owner, at)
                    break
                function = class_attribute(current, attribute)
                if function is not None:  # a method: and what its own `self` reaches
                    _found(found, path, function, todo, current, at)
                    break
                held = MISSING
                if _walked(current):
                    held = torch_table_item(current, attribute)
                    if held is MISSING:
                        held = inspect.getattr_static(current, attribute, None)
                if not _walked(held):
                    _reach_held(held, path, found, todo)
                    break
                current, at = held, path
                if step == len(chain) - 1:  # an object read whole (`self.aug(x)`, passed on)
                    todo.append((held, path, None))
        for name, function in _own_functions(obj) if whole else ():  # (those an override
            _found(found, f"{base}.{name}", function, todo, obj, base)  # hides: `super()`)
    return list(found.values())


def _found(found: dict, path: str, function: types.FunctionType, todo: list,
           owner: Any = None, owner_path: str = "") -> None:
    """A user function reached at `path`, whose first parameter is `owner` (a method's
    object, at `owner_path`; None for a plain function): what it reaches through that, next."""
    if is_user_function(function) and id(function) not in found:
        found[id(function)] = (path, function)
        if owner is not None:
            todo.append((owner, owner_path, first_parameter_chains(function)))


def _reach_held(held: Any, path: str, found: dict, todo: list) -> None:
    """What a value that is no walked object leads to (see methods_reached)."""
    if isinstance(held, functools.partial):
        _reach_held(held.func, path, found, todo)
        for index, item in enumerate((*held.args, *held.keywords.values())):
            todo.append((item, f"{path}.args[{index}]", None))
    elif isinstance(held, types.MethodType):
        owner = held.__self__
        _found(found, path, held.__func__, todo, owner if _walked(owner) else None, path)
    elif isinstance(held, types.FunctionType):
        _found(found, path, held, todo)
    elif isinstance(held, (dict, list, tuple)):
        items = held.items() if isinstance(held, dict) else enumerate(held)
        for key, item in itertools.islice(items, _TABLE_ITEMS):
            if isinstance(item, (types.FunctionType, types.MethodType, functools.partial,
                                 dict, list, tuple)) or _walked(item):
                todo.append((item, f"{path}[{key!r}]", None))
