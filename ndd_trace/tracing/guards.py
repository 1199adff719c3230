"""Guards: the frozen cache key of a call, and an explanation of what changed on a miss.

    key = build_key(args, kwargs, plan)        # a tuple of (label, frozen value) pairs
    explain_miss(new_key, old_key)             # "argument `size`: 224 -> 256"
    fast = FastGuard.of(args, plan, entry)     # the last call's key, checked without building
    fast.matches(args)                         # it: identities and data descriptions

Batches and tensors contribute their kind, device, dtype, ndim and layout (not their data or batch
size); other arguments, module globals and closure values the function reads contribute their
value, frozen recursively (objects by their attributes), so a change re-traces. A per-sample
function's keys (`baked=True`) differ in one point: only its Batches are fed, so every other
argument, a Tensor included, contributes its value.
"""

from __future__ import annotations

import builtins
import dataclasses
import dis
import sys
import enum
import types
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import _dali
from ..core.ir import freeze as ir_freeze
from ..core.source import is_internal_file

_MAX_DEPTH = 4


class Shown:
    """A frozen value that is compared by `key` and printed as a user reads it: an object
    guarded by identity as `module numpy`, not as an id; a dtype as `ndd.float32`."""

    __slots__ = ("key", "text")

    def __init__(self, key: tuple, text: str):
        self.key = key
        self.text = text

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Shown) and other.key == self.key

    def __hash__(self) -> int:
        return hash(self.key)

    def __repr__(self) -> str:
        return self.text


def _by_identity(value: Any) -> Shown:
    return Shown(("id", id(value)), _named(value))


def _named(value: Any) -> str:
    if isinstance(value, types.ModuleType):
        return f"module {value.__name__}"
    if isinstance(value, types.BuiltinFunctionType) and \
            getattr(value, "__module__", None) == "builtins":
        return f"builtin {value.__name__}"
    if hasattr(value, "_ndd_trace_inlined"):
        return f"compiled function {value.__qualname__}"
    if isinstance(value, type):
        return f"class {value.__module__}.{value.__qualname__}"
    if isinstance(value, (types.FunctionType, types.MethodType, types.BuiltinFunctionType)) or \
            hasattr(value, "cache_info"):
        name = getattr(value, "__qualname__", None) or getattr(value, "__name__", "?")
        return f"function {getattr(value, '__module__', '?')}.{name}"
    if isinstance(value, _dali.RNG):
        return f"RNG at {id(value):#x}"
    if isinstance(value, _dali.Reader):
        return f"reader {type(value).__name__} at {id(value):#x}"
    return f"{type(value).__name__} object at {id(value):#x}"


def freeze(value: Any, depth: int = 0) -> Any:
    """A hashable summary of `value` that changes whenever the value does."""
    if isinstance(value, float):  # ir's one float rule (-0.0 is not 0.0; NaNs by their bits)
        value = float(value)
        return Shown(ir_freeze(value), repr(value))
    if value is None or isinstance(value, (bool, int, str, bytes, complex)):
        return (type(value).__name__, value)
    if isinstance(value, (_dali.Batch, _dali.Tensor)):
        return ("data", id(value), describe_data(value))
    if isinstance(value, (_dali.RNG, _dali.Reader, _dali.ExternalSource)):
        return _by_identity(value)  # stateful: its identity is what matters
    if isinstance(value, type) and _is_user_class(value) and depth < _MAX_DEPTH:
        # a class read for its attributes (`Config.scale`): its plain data, and its identity
        return ("class", id(value), tuple(
            (k, freeze(v, depth + 1)) for k, v in vars(value).items()
            if not k.startswith("__") and isinstance(v, (bool, int, float, str, list, tuple,
                                                         dict, type(None)))))
    if isinstance(value, (types.ModuleType, types.FunctionType, types.BuiltinFunctionType,
                          type, types.MethodType)) or hasattr(value, "cache_info"):
        # code is guarded by identity (a compiled function by its own cache, not its state)
        return _by_identity(value)
    if isinstance(value, _dali.DType):
        return Shown(("enum", "DType", str(value)), _dali.dtype_public_name(value))
    if isinstance(value, enum.Enum) or isinstance(value, _dali.Device):
        return Shown(("enum", type(value).__name__, str(value)), str(value))
    if isinstance(value, np.ndarray):
        return ("ndarray", value.dtype.str, value.shape, hash(value.tobytes()))
    if isinstance(value, np.generic):
        return ("npscalar", value.dtype.str, freeze(value.item(), depth))  # -0.0 is not 0.0
    if depth >= _MAX_DEPTH:
        return _by_identity(value)
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(freeze(v, depth + 1) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple((freeze(k, depth + 1), freeze(v, depth + 1))
                              for k, v in value.items()))
    if isinstance(value, (set, frozenset)):
        return ("set", frozenset(freeze(v, depth + 1) for v in value))
    if type(value).__module__.startswith("torch") and hasattr(value, "numpy"):
        try:
            return freeze(value.detach().cpu().numpy(), depth + 1)
        except Exception:
            return _by_identity(value)
    if dataclasses.is_dataclass(value) or hasattr(value, "__dict__"):
        try:
            attributes = vars(value)
        except TypeError:
            return _by_identity(value)
        # what `value.x` may read: its own attributes, and its classes' plain data (the same
        # rule as for a class read as a global), base classes included
        return ("object", id(type(value)),
                tuple((k, freeze(v, depth + 1)) for k, v in attributes.items()),
                tuple(freeze(cls, depth + 1) for cls in type(value).__mro__
                      if _is_user_class(cls)))
    try:
        hash(value)
        return ("hashable", type(value).__name__, value)
    except TypeError:
        return _by_identity(value)


def _is_user_class(cls: type) -> bool:
    module = getattr(cls, "__module__", "") or ""
    return not module.startswith(("builtins", "nvidia", "numpy", "torch", "ndd_trace",
                                  "typing", "collections", "enum", "abc"))


def describe_data(value: Any) -> tuple:
    """The part of a Batch/Tensor argument that a trace depends on."""
    kind = "Batch" if isinstance(value, _dali.Batch) else "Tensor"
    meta = _dali.meta_of(value)
    return (kind, meta.device, meta.dtype, meta.ndim, meta.layout)


def _argument_key(value: Any) -> Any:
    if isinstance(value, (_dali.Batch, _dali.Tensor)):
        return describe_data(value)
    if isinstance(value, _dali.RNG):
        return ("RNG",)  # which generator does not matter: it is read at every call
    if isinstance(value, (list, tuple)) and any(
            isinstance(v, (_dali.Batch, _dali.Tensor, _dali.RNG, list, tuple, dict))
            for v in value):
        return (type(value).__name__, tuple(_argument_key(v) for v in value))
    if isinstance(value, dict) and any(
            isinstance(v, (_dali.Batch, _dali.Tensor, _dali.RNG, list, tuple, dict))
            for v in value.values()):
        return ("dict", tuple((k, _argument_key(v)) for k, v in value.items()))
    return ("static", freeze(value))


def _baked_argument_key(value: Any) -> Any:
    """The key of an argument of a per-sample function: its Batches are fed to the pipeline
    (their description), every other value is baked into it when it is defined (its value,
    a Tensor's by its data: the pipeline holds that data, not the object)."""
    if isinstance(value, _dali.Batch):
        return describe_data(value)
    if isinstance(value, _dali.Tensor):
        return ("tensor", describe_data(value), freeze(_dali.host_array(value)))
    return ("static", freeze(value))


def _rngs_in(value: Any, found: list) -> None:
    if isinstance(value, _dali.RNG):
        found.append(value)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _rngs_in(v, found)
    elif isinstance(value, dict):
        for v in value.values():
            _rngs_in(v, found)


def rng_aliasing(args: tuple, kwargs: dict, others: list) -> tuple:
    """Which RNG arguments are the same generator (as each other, or as one the function reads
    from a global or closure): a trace records one generator per op, so this is part of the key.
    """
    found: list = []
    _rngs_in(args, found)
    _rngs_in(kwargs, found)
    if not found:
        return ()
    first: dict[int, int] = {}
    pattern = []
    for rng in [*found, *others]:
        pattern.append(first.setdefault(id(rng), len(first)))
    return tuple(pattern)


@dataclasses.dataclass
class GuardPlan:
    """What a function reads besides its arguments: globals and closure cells, its own and
    those of the user helper functions it calls (found by following global functions)."""

    globals_read: tuple[tuple[str, str, dict], ...]  # (label prefix, name, globals dict)
    closure: tuple[tuple[str, Any], ...]  # (label, cell)
    # attributes read of the user's own modules (`config.SIZE`, a module global reads by
    # identity): (label prefix, module global's name, globals dict, attribute chain)
    module_attributes: tuple[tuple[str, str, dict, tuple[str, ...]], ...] = ()

    @property
    def global_names(self) -> tuple[str, ...]:
        return tuple(name for _, name, _ in self.globals_read)


_MISSING = object()
_LOAD_GLOBAL = {"LOAD_GLOBAL", "LOAD_NAME"}


def _global_loads(code: types.CodeType) -> set[str]:
    """Names a code object (and the code nested in it) loads as globals: LOAD_GLOBAL only,
    not attribute names, so `ndd.flip` does not guard a global called `flip`."""
    names = {ins.argval for ins in dis.get_instructions(code) if ins.opname in _LOAD_GLOBAL}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_loads(const)
    return names


def _is_user_function(value: Any) -> bool:
    if not isinstance(value, types.FunctionType):
        return False
    filename = value.__code__.co_filename
    return not filename.startswith("<") and "site-packages" not in filename and \
        not is_internal_file(filename)


_ATTRIBUTE_LOADS = {"LOAD_ATTR", "LOAD_METHOD"}


def _module_attribute_loads(code: types.CodeType) -> set[tuple[str, tuple[str, ...]]]:
    """(global name, attribute chain) of each `name.a.b` the code (and the code nested in it)
    reads: a LOAD_GLOBAL followed by attribute loads."""
    found = set()
    instructions = list(dis.get_instructions(code))
    for index, ins in enumerate(instructions):
        if ins.opname not in _LOAD_GLOBAL:
            continue
        chain = []
        for following in instructions[index + 1:]:
            if following.opname not in _ATTRIBUTE_LOADS:
                break
            chain.append(following.argval)
        if chain:
            found.add((ins.argval, tuple(chain)))
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            found |= _module_attribute_loads(const)
    return found


def _is_user_module(value: Any) -> bool:
    """A module of the user's (a file of theirs, or one made at run time, `types.ModuleType`),
    not a library's, the standard library's or a builtin one."""
    if not isinstance(value, types.ModuleType):
        return False
    filename = getattr(value, "__file__", None) or ""
    if not filename:
        return value.__name__ not in sys.builtin_module_names
    return "site-packages" not in filename and not filename.startswith(sys.prefix) and \
        not filename.startswith(sys.base_prefix) and not is_internal_file(filename)


def _chain_value(value: Any, chain: tuple[str, ...]) -> Any:
    for attribute in chain:
        value = getattr(value, attribute, _MISSING)
        if value is _MISSING:
            break
    return value


def plan_for(function: Callable, max_depth: int = 3) -> GuardPlan:
    """Globals and closure cells `function` reads, following user helpers `max_depth` deep."""
    globals_read: dict[tuple[int, str], tuple[str, str, dict]] = {}
    closure: list[tuple[str, Any]] = []
    attributes: dict[tuple, tuple[str, str, dict, tuple[str, ...]]] = {}
    seen: set[int] = set()

    def visit(fn: Any, prefix: str, depth: int) -> None:
        fn = getattr(fn, "__wrapped__", fn)
        if id(fn) in seen or not isinstance(fn, types.FunctionType):
            return
        seen.add(id(fn))
        code = fn.__code__
        namespace = fn.__globals__
        for name in sorted(_global_loads(code)):
            globals_read.setdefault((id(namespace), name), (prefix, name, namespace))
            value = namespace.get(name, _MISSING)
            value = getattr(value, "_ndd_trace_inlined", value)  # a compiled helper: inlined
            if depth < max_depth and _is_user_function(value):
                visit(value, f"{value.__name__}() reads ", depth + 1)
        for name, chain in sorted(_module_attribute_loads(code)):
            if _is_user_module(namespace.get(name)):
                attributes.setdefault((id(namespace), name, chain),
                                      (prefix, name, namespace, chain))
        for name, cell in zip(code.co_freevars, fn.__closure__ or ()):
            closure.append((f"{prefix}closure variable `{name}`", cell))
            try:
                value = cell.cell_contents
            except ValueError:
                continue
            if depth < max_depth and _is_user_function(value):
                visit(value, f"{value.__name__}() reads ", depth + 1)

    visit(function, "", 0)
    return GuardPlan(tuple(globals_read.values()), tuple(closure), tuple(attributes.values()))


def build_key(args: tuple, kwargs: dict, plan: GuardPlan,
              batch_sizes: tuple | None = None, names: tuple[str, ...] = (),
              baked: bool = False) -> tuple:
    """The guards of one call. `baked`: only Batch arguments are fed, every other argument is
    part of the pipeline (a per-sample function's), keyed by its value."""
    argument_key = _baked_argument_key if baked else _argument_key
    key: list[tuple[str, Any]] = []
    for index, value in enumerate(args):
        label = f"argument `{names[index]}`" if index < len(names) else f"argument #{index}"
        key.append((label, argument_key(value)))
    for name in sorted(kwargs):
        key.append((f"argument `{name}`", argument_key(kwargs[name])))
    for prefix, name, namespace in plan.globals_read:
        value = namespace.get(name, _MISSING)
        if value is _MISSING:
            value = builtins.__dict__.get(name, _MISSING)
        key.append((f"{prefix}global `{name}`",
                    ("missing",) if value is _MISSING else freeze(value)))
    for prefix, name, namespace, chain in plan.module_attributes:
        value = _chain_value(namespace.get(name), chain)
        key.append((f"{prefix}global `{name}.{'.'.join(chain)}`",
                    ("missing",) if value is _MISSING else freeze(value)))
    for label, cell in plan.closure:
        try:
            value = cell.cell_contents
        except ValueError:
            value = None
        key.append((label, freeze(value)))
    if batch_sizes is not None:
        key.append(("batch size", batch_sizes))
    others = [namespace.get(name) for _, name, namespace in plan.globals_read
              if isinstance(namespace.get(name), _dali.RNG)]
    aliasing = rng_aliasing(args, kwargs, others)
    if aliasing and len(set(aliasing)) < len(aliasing):
        key.append(("RNG arguments that are the same generator", aliasing))
    return tuple(key)


_IMMUTABLE = (float, bool, int, str, bytes, complex, type(None), np.number, np.bool_)
_BY_IDENTITY = (types.ModuleType, types.FunctionType, types.BuiltinFunctionType,
                types.MethodType, enum.Enum)


def _same_object_same_guard(value: Any) -> bool:
    """Whether `freeze(value)` cannot change while `value` stays the same object: immutable
    values, and what `freeze` guards by identity (code, modules, generators, sources)."""
    if isinstance(value, _IMMUTABLE):
        return True
    if type(value) is tuple:
        return all(isinstance(v, _IMMUTABLE) for v in value)
    if isinstance(value, (_dali.Batch, _dali.Tensor, np.ndarray)):
        return False
    if isinstance(value, type):
        return not _is_user_class(value)  # a user class is guarded by its attributes
    if isinstance(value, (_dali.RNG, _dali.Reader, _dali.ExternalSource, _dali.DType,
                          _dali.Device, *_BY_IDENTITY)):
        return True
    return hasattr(value, "cache_info")  # a compiled or lru_cache'd helper: by identity


class FastGuard:
    """The last call's key, checked without building it: the same number of positional
    arguments, Batches/Tensors with the same description, and the very same objects
    everywhere else (arguments, globals, closure cells), each of a kind whose frozen value
    cannot change while it stays the same object. A match means `build_key` would give the
    key this guard was made from; anything else takes the full path."""

    __slots__ = ("plan", "entry", "arity", "arguments", "globals_read", "cells", "attributes")

    def __init__(self, plan: GuardPlan, entry: Any, arity: int, arguments: tuple,
                 globals_read: tuple, cells: tuple, attributes: tuple = ()):
        self.plan = plan
        self.entry = entry
        self.arity = arity
        self.arguments = arguments  # per argument: (Batch/Tensor type, signature) or (None, obj)
        self.globals_read = globals_read  # (namespace, name, value or _MISSING, builtin value)
        self.cells = cells  # (cell, value)
        self.attributes = attributes  # (namespace, name, chain, value): module attributes

    @staticmethod
    def of(args: tuple, plan: GuardPlan, entry: Any, baked: bool = False) -> FastGuard | None:
        """The fast guard of a call with these positional arguments (no keyword arguments),
        or None where one of its guarded values could change in place (`baked`: as in
        `build_key`)."""
        arguments = []
        for value in args:
            kind = type(value)
            if kind is _dali.Batch or (kind is _dali.Tensor and not baked):
                arguments.append((kind, _dali.data_signature(value)))
            elif _same_object_same_guard(value) and (baked or not isinstance(value, _dali.RNG)):
                # (an RNG argument's aliasing is keyed; a baked one's identity is)
                arguments.append((None, value))
            else:
                return None
        globals_read = []
        for _, name, namespace in plan.globals_read:
            value = namespace.get(name, _MISSING)
            builtin = builtins.__dict__.get(name, _MISSING) if value is _MISSING else None
            if not _same_object_same_guard(builtin if value is _MISSING else value) and \
                    (value is not _MISSING or builtin is not _MISSING):
                return None
            globals_read.append((namespace, name, value, builtin))
        cells = []
        for _, cell in plan.closure:
            try:
                value = cell.cell_contents
            except ValueError:
                return None
            if not _same_object_same_guard(value):
                return None
            cells.append((cell, value))
        attributes = []
        for _, name, namespace, chain in plan.module_attributes:
            value = _chain_value(namespace.get(name), chain)
            if not _same_object_same_guard(value):
                return None
            attributes.append((namespace, name, chain, value))
        return FastGuard(plan, entry, len(args), tuple(arguments), tuple(globals_read),
                         tuple(cells), tuple(attributes))

    def matches(self, args: tuple) -> bool:
        if len(args) != self.arity:
            return False
        signature = _dali.data_signature
        for value, (kind, expected) in zip(args, self.arguments):
            if kind is None:
                if value is not expected:
                    return False
            elif type(value) is not kind or signature(value) != expected:
                return False
        for namespace, name, value, builtin in self.globals_read:
            if namespace.get(name, _MISSING) is not value:
                return False
            if value is _MISSING and builtins.__dict__.get(name, _MISSING) is not builtin:
                return False
        for cell, value in self.cells:
            try:
                if cell.cell_contents is not value:
                    return False
            except ValueError:
                return False
        for namespace, name, chain, value in self.attributes:
            if _chain_value(namespace.get(name), chain) is not value:
                return False
        return True


_PLAIN_KINDS = frozenset(("bool", "int", "str", "bytes", "complex", "NoneType"))


def show(frozen: Any) -> str:
    """A frozen value (a key's item) as the user would write the value: `8`, `[224, 224]`,
    `Batch(cpu, UINT8, ndim=1)`, `module numpy`, `Config(scale=2)`."""
    if isinstance(frozen, Shown) or not isinstance(frozen, tuple) or not frozen:
        return repr(frozen)
    kind = frozen[0]
    if kind == "static" and len(frozen) == 2:
        return show(frozen[1])
    if kind in _PLAIN_KINDS and len(frozen) == 2:
        return repr(frozen[1])
    if kind == "float":
        return str(frozen[1])
    if kind in ("list", "tuple") and len(frozen) == 2 and isinstance(frozen[1], tuple):
        items = ", ".join(show(item) for item in frozen[1])
        return f"[{items}]" if kind == "list" else f"({items}{',' if len(frozen[1]) == 1 else ''})"
    if kind == "dict" and len(frozen) == 2:
        return "{" + ", ".join(f"{show(k)}: {show(v)}" for k, v in frozen[1]) + "}"
    if kind in ("Batch", "Tensor") and len(frozen) == 5:
        _, device, dtype, ndim, layout = frozen
        return f"{kind}({device}, {dtype}, ndim={ndim}" + (f", {layout!r}" if layout else "") + ")"
    if kind in ("object", "class") and len(frozen) == 3:
        attributes = ", ".join(f"{name}={show(value)}" for name, value in frozen[2])
        return f"{'object' if kind == 'object' else 'class'}({attributes})"
    if kind == "data" and len(frozen) == 3:
        return show(frozen[2])
    if kind == "missing":
        return "(not defined)"
    if kind == "npscalar":
        return f"numpy {frozen[1]} {show(frozen[2])}"
    if kind == "ndarray":
        return f"ndarray({frozen[1]}, shape={frozen[2]})"
    return repr(frozen)


def _short(value: Any) -> str:
    text = show(value)
    return text if len(text) <= 60 else text[:57] + "..."


def describe(key: tuple) -> list[str]:
    """A key's guards, one line each, as explain prints them; builtins the function reads by
    name (`enumerate`) are guarded (a module global of that name would shadow them) but not
    listed."""
    return [f"{label} == {_short(value)}" for label, value in key
            if not (isinstance(value, Shown) and value.text.startswith("builtin "))]


def _difference(old: Any, new: Any) -> str:
    """Old -> new, cut around the first place where the two texts differ."""
    old_text, new_text = show(old), show(new)
    if len(old_text) <= 60 and len(new_text) <= 60:
        return f"{old_text} -> {new_text}"
    start = next((i for i, (a, b) in enumerate(zip(old_text, new_text)) if a != b),
                 min(len(old_text), len(new_text)))
    start = max(0, start - 20)
    return f"...{old_text[start:start + 50]}... -> ...{new_text[start:start + 50]}..."


def explain_miss(new_key: tuple, old_key: tuple | None) -> str:
    """Name the guard fields that differ between two keys."""
    if old_key is None:
        return "first call"
    old = dict(old_key)
    new = dict(new_key)
    changes = []
    for label in new:
        if label not in old:
            changes.append(f"{label} is new")
        elif old[label] != new[label]:
            changes.append(f"{label}: {_difference(old[label], new[label])}")
    for label in old:
        if label not in new:
            changes.append(f"{label} is gone")
    return "; ".join(changes) or "no guard differs"
