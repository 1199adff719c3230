"""The one key encoding: values frozen into hashable keys, printed back as the user wrote them.

    freeze([224, 224])                        # ('list', (('int', 224), ('int', 224)))
    freeze(-0.0) != freeze(0.0)               # floats by their bits (float_key)
    freeze_arguments({"size": [224, 224]})    # an op's static arguments, in name order
    show(freeze([224, 224]))                  # '[224, 224]'
    explain_miss(new_key, old_key)            # "size: 224 -> 256", "CFG.size: 48 -> 64"

Guard keys (tracing/guards.py), op keys and region keys (ir.op_key) are all made by `freeze`;
they differ only in their `KeyPolicy`: what an object that is not plain data stands for. The
default policy (`STATIC`) is an op's static arguments: a hashable value stands for itself and an
unhashable one raises TypeError. Guards use a policy that looks into objects (their attributes,
to a depth) and knows DALI's kinds. This module imports nothing from DALI.

A guard key and a region key (modes/regions.py) are both tuples of labelled parts, (label,
part), printed by `describe` and told apart by `explain_miss`: a guard's label spells what the
user wrote (`CFG.size`), a region's names a fed value or an op call (`in0`, `op1`), whose parts
are `FedPart`, `OpPart` (an op key) and `RegionOutputs`.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import struct
import types
import weakref
from typing import Any, NamedTuple

import numpy as np

from .objects import UNSET, attribute_held, is_user_class, slot_names

_DOUBLE = struct.Struct("<d")
_HELD_TABLES = (list, tuple, dict)  # an object's transform list: its items one level down


def float_key(value: float) -> Any:
    """A float as a key that tells apart what DALI tells apart: `-0.0` is not `0.0`, and NaNs
    of another sign or payload differ (`float.hex` writes every NaN as "nan"): the hex text,
    or for a NaN its 8 bytes."""
    return _DOUBLE.pack(value) if math.isnan(value) else value.hex()


class Shown:
    """A frozen value compared by `key` and printed as a user reads it: an object keyed by its
    identity as `module numpy` rather than an id; a dtype as `ndd.float32`."""

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


class Identity(Shown):
    """An object keyed by its identity, equal only while it is the very same live object (held
    weakly, or strongly where it cannot be: a list), so an object given a freed one's address
    is another key, not a stale hit."""

    __slots__ = ("held",)

    def __init__(self, value: Any, text: str, *more: Any):
        super().__init__(("id", id(value), *more), text)
        try:
            self.held = weakref.ref(value)
        except TypeError:
            self.held = (lambda held: lambda: held)(value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Identity) and other.key == self.key and \
            self.held() is not None and self.held() is other.held()

    __hash__ = Shown.__hash__


class KeyPolicy:
    """What `freeze` makes of values that are not plain data (numbers, strings, containers).
    The base policy is an op's static arguments'; guards.GuardPolicy extends it."""

    by_attributes = False  # an object stands for its attributes (else for its hash)
    unhashable_by_identity = False  # an unhashable value stands for its object (else TypeError)
    max_depth: int | None = None  # past it, a value stands for its object

    def special(self, value: Any, depth: int) -> Any:
        """The key of a kind this policy knows (None: not one of them)."""
        return None

    def named(self, value: Any) -> str:
        """How an object keyed by its identity is printed."""
        return f"{type(value).__name__} object at {id(value):#x}"

    def by_identity(self, value: Any) -> Shown:
        return Identity(value, self.named(value))


STATIC = KeyPolicy()


class _ByIdentity(KeyPolicy):
    unhashable_by_identity = True


# op keys of calls whose static arguments hold an unhashable value (an array DALI takes as is)
STATIC_BY_IDENTITY = _ByIdentity()

_SCALARS = frozenset((int, bool, str, bytes, complex, type(None)))


def _float(value: float) -> Shown:
    encoded = float_key(value)
    return Shown(("float", encoded), _show_float(encoded))


def freeze(value: Any, policy: KeyPolicy = STATIC, depth: int = 0) -> Any:
    """A hashable key of `value` that changes whenever the value does (what counts as a change
    for objects is the policy's)."""
    kind = type(value)
    if kind in _SCALARS:
        return (kind.__name__, value)
    if kind is float:
        return _float(value)
    if isinstance(value, np.generic):  # before float: np.float64 is a float, with its own dtype
        return ("npscalar", value.dtype.str, freeze(value.item(), policy, depth))
    if isinstance(value, float):  # a float subclass
        return _float(float(value))
    if isinstance(value, (bool, int, str, bytes, complex)):  # subclasses: IntEnum, ...
        return (kind.__name__, value)
    found = policy.special(value, depth)
    if found is not None:
        return found
    if policy.max_depth is not None and depth >= policy.max_depth:
        return policy.by_identity(value)
    if isinstance(value, (list, tuple)):
        return (kind.__name__, tuple(freeze(v, policy, depth + 1) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple((freeze(k, policy, depth + 1), freeze(v, policy, depth + 1))
                              for k, v in value.items()))
    if isinstance(value, (set, frozenset)):  # (in iteration order: a loop over it sees it)
        return ("frozenset" if isinstance(value, frozenset) else "set",
                tuple(freeze(v, policy, depth + 1) for v in value))
    slots = slot_names(kind) if policy.by_attributes else ()
    if policy.by_attributes and (dataclasses.is_dataclass(value) or hasattr(value, "__dict__")
                                 or slots):
        try:
            attributes = [*vars(value).items()] if hasattr(value, "__dict__") else []
        except TypeError:
            return policy.by_identity(value)
        attributes += [(name, attribute_held(value, name, UNSET)) for name in slots]
        # what `value.x` may read: its own attributes (`__slots__` ones too), and its classes'
        # data (the same rule as for a class read as a global), base classes included
        return ("object", id(kind),  # (a list an object holds is no level of its own)
                tuple((k, freeze(v, policy, depth + (type(v) not in _HELD_TABLES)))
                      for k, v in attributes),
                tuple(freeze(cls, policy, depth + 1) for cls in kind.__mro__
                      if is_user_class(cls)))
    try:
        hash(value)
    except TypeError:
        if not policy.unhashable_by_identity:
            raise
        return policy.by_identity(value)
    return ("hashable", kind.__name__, value)


def freeze_arguments(arguments: dict[str, Any], policy: KeyPolicy = STATIC) -> tuple:
    """An op's static arguments (name -> value) as a key: in name order, since eager does not
    care in which order keyword arguments were passed."""
    return ("arguments", tuple(sorted((name, freeze(value, policy))
                                      for name, value in arguments.items())))


class FedPart(NamedTuple):
    """A value a region is fed: a random state, or data of this metadata (a batch or a tensor)."""

    random: bool
    meta: Any  # ir.TensorMeta: device, dtype, ndim, layout
    is_batch: bool
    feed_in_place: bool


class OpPart(NamedTuple):
    """An op call's structural identity (ir.op_key): its op, static arguments and what it reads
    (in a region key, by the reads' labels: `("in0", 0)`)."""

    name: str
    backend: str
    is_batch: bool
    static: Any  # freeze_arguments' key
    inputs: tuple  # (what it reads, output index) per input
    input_devices: tuple
    arg_inputs: tuple  # (argument, what it reads, output index), by argument
    arg_casts: tuple

    @property
    def op(self) -> str:
        """The op and where it runs: `resize[cpu]`."""
        return f"{self.name}[{self.backend}]"


class RegionOutputs(NamedTuple):
    """What a region gives back: (label, output index) per output."""

    outputs: tuple


def parts_of(key: tuple, kind: type) -> list[tuple[str, Any]]:
    """A region key's parts of one kind (FedPart, OpPart), with their labels, in key order."""
    return [(label, part) for label, part in key if type(part) is kind]


# what a class attribute holds that its key keeps by value (besides instances of user classes)
_CLASS_DATA = (bool, int, float, str, bytes, complex, list, tuple, dict, set, frozenset,
               type(None), np.generic, np.ndarray, enum.Enum)
_LIBRARY_DATA = ("torch",)  # modules whose values a class may hold as data (a tensor constant)
# and what it keeps by identity: its methods (a method replaced on the class changes it)
_CLASS_CODE = (types.FunctionType, staticmethod, classmethod, property)


def class_key(cls: type, policy: KeyPolicy, depth: int) -> tuple:
    """A class read for its attributes (`Config.scale`): its data (numbers, containers, numpy
    values, enums, instances and classes of the user's: `CFG.aug.angle`), its methods by
    identity, its identity, and its user base classes the same way."""
    items = []
    for k, v in vars(cls).items():
        if k.startswith("__") and not isinstance(v, _CLASS_CODE):  # (`__call__` replaced: code)
            continue
        if isinstance(v, _CLASS_CODE):
            items.append((k, ("code", id(v))))
        elif isinstance(v, _CLASS_DATA) or (is_user_class(v) if isinstance(v, type) else (
                is_user_class(type(v)) or type(v).__module__.startswith(_LIBRARY_DATA))):
            items.append((k, freeze(v, policy, depth + 1)))
    bases = tuple(freeze(base, policy, depth + 1) for base in cls.__bases__
                  if is_user_class(base))
    return ("class", id(cls), tuple(items), *((bases,) if bases else ()))


# -- printing ----------------------------------------------------------------------------------

_PLAIN_KINDS = frozenset(("bool", "int", "str", "bytes", "complex", "NoneType"))


def _show_float(encoded: Any) -> str:
    if isinstance(encoded, str):
        return repr(float.fromhex(encoded))
    return "-nan" if encoded[-1] & 0x80 else "nan"  # a NaN's bytes: the sign bit, little-endian


def show(frozen: Any) -> str:
    """A frozen value as the user would write the value: `8`, `[224, 224]`, `0.5`,
    `Batch(cpu, UINT8, ndim=1)`, `module numpy`, `object(size=64)`; a region's parts as
    `batch<cpu, UINT8, ndim=3, HWC>` and `resize[cpu](in0, resize_x=8)`."""
    if type(frozen) is FedPart:
        if frozen.random:
            return "random state"
        meta = frozen.meta
        return (f"{'batch' if frozen.is_batch else 'tensor'}<{meta.device}, {meta.dtype}, "
                f"ndim={meta.ndim}" + (f", {meta.layout}" if meta.layout else "") + ">")
    if type(frozen) is OpPart:
        arguments = [read + (f"[{index}]" if index else "") for read, index in frozen.inputs]
        arguments += [f"{argument}={read}" for argument, read, _ in frozen.arg_inputs]
        arguments += show_arguments(frozen.static)
        return f"{frozen.op}({', '.join(arguments)})"
    if isinstance(frozen, Shown) or not isinstance(frozen, tuple) or not frozen:
        return repr(frozen)
    kind = frozen[0]
    if kind == "static" and len(frozen) == 2:
        return show(frozen[1])
    if kind in _PLAIN_KINDS and len(frozen) == 2:
        return repr(frozen[1])
    if kind in ("list", "tuple") and len(frozen) == 2 and isinstance(frozen[1], tuple):
        items = ", ".join(show(item) for item in frozen[1])
        return f"[{items}]" if kind == "list" else f"({items}{',' if len(frozen[1]) == 1 else ''})"
    if kind == "dict" and len(frozen) == 2:
        return "{" + ", ".join(f"{show(k)}: {show(v)}" for k, v in frozen[1]) + "}"
    if kind in ("set", "frozenset") and len(frozen) == 2 and isinstance(frozen[1], tuple):
        items = "{" + ", ".join(show(v) for v in frozen[1]) + "}"
        return items if kind == "set" else f"frozenset({items})"
    if kind in ("Batch", "Tensor") and len(frozen) == 5:
        _, device, dtype, ndim, layout = frozen
        return f"{kind}({device}, {dtype}, ndim={ndim}" + (f", {layout!r}" if layout else "") + ")"
    if kind in ("object", "class") and len(frozen) in (3, 4):
        attributes = ", ".join(f"{name}={show(value)}" for name, value in frozen[2])
        return f"{kind}({attributes})"
    if kind == "data" and len(frozen) == 3:
        return show(frozen[2])
    if kind == "hashable" and len(frozen) == 3:
        return repr(frozen[2])
    if kind == "missing":
        return "(not defined)"
    if kind == "npscalar":
        return f"numpy {frozen[1]} {show(frozen[2])}"
    if kind == "ndarray":
        return f"ndarray({np.dtype(frozen[1]).name}, shape={frozen[2]})"
    if kind == "torch" and len(frozen) == 3:  # (a torch tensor: its data as numpy's)
        return "torch." + show(frozen[2]).replace("ndarray", frozen[1], 1)
    if kind == "module" and len(frozen) == 4:  # (a torch.nn.Module, as an object)
        return show(("object",) + frozen[1:])
    return repr(frozen)


def show_arguments(frozen: Any) -> list[str]:
    """`freeze_arguments`'s key as `name=value` texts (names starting with `_` left out)."""
    if not (isinstance(frozen, tuple) and len(frozen) == 2 and frozen[0] == "arguments"):
        return []
    return [f"{name}={show(value)}" for name, value in frozen[1] if not name.startswith("_")]


def _short(value: Any) -> str:
    text = show(value)
    return text if len(text) <= 60 else text[:57] + "..."


def describe(key: tuple) -> list[str]:
    """A key's labelled parts, one line each, as explain and the report print them: a guard
    key's `size == 8`, a region key's `input in0: batch<cpu, UINT8, ndim=3, HWC>` and
    `op resize[cpu](in0, resize_x=8)`. Left out: what a region gives back, and builtins a
    function reads by name (`enumerate`: guarded, as a module global of that name would shadow
    them)."""
    lines = []
    for label, part in key:
        kind = type(part)
        if kind is FedPart:
            lines.append(f"input {label}: {show(part)}")
        elif kind is OpPart:
            lines.append(f"op {show(part)}")
        elif kind is not RegionOutputs and not (isinstance(part, Shown)
                                                and part.text.startswith("builtin ")):
            lines.append(f"{label} == {_short(part)}")
    return lines


def difference(old: Any, new: Any) -> str:
    """Old -> new, cut around the first place where the two texts differ."""
    old_text, new_text = show(old), show(new)
    if len(old_text) <= 60 and len(new_text) <= 60:
        return f"{old_text} -> {new_text}"
    start = next((i for i, (a, b) in enumerate(zip(old_text, new_text)) if a != b),
                 min(len(old_text), len(new_text)))
    start = max(0, start - 20)
    return f"...{old_text[start:start + 50]}... -> ...{new_text[start:start + 50]}..."


def explain_miss(new_key: tuple, old_key: tuple | None) -> str:
    """Name the guard items that differ between two keys, each as the user spells the part of
    it that changed (`CFG.size: 48 -> 64`, `images.dtype: UINT8 -> FLOAT`); of two region keys,
    the first line where they differ (`_region_difference`). The one printer of a miss
    (`last_miss_reason`, explain, the `recompiles` log, the cache_limit warning, the report's
    `split by`)."""
    if old_key is None:
        return "first call"
    if new_key and type(new_key[-1][1]) is RegionOutputs:
        return _region_difference(new_key, old_key)
    old = dict(old_key)
    new = dict(new_key)
    changes = []
    for label in new:
        if label not in old:
            changes.append(f"{label} is new")
        elif old[label] != new[label]:
            changes.extend(changed(label, old[label], new[label]))
    for label in old:
        if label not in new:
            changes.append(f"{label} is gone")
    if len(changes) > _CHANGES_SHOWN:
        changes[_CHANGES_SHOWN:] = [f"and {len(changes) - _CHANGES_SHOWN} more"]
    return "; ".join(changes) or "no guard differs"


def _region_difference(new_key: tuple, old_key: tuple) -> str:
    """The first of two region keys' lines that differs, old  ->  new (`op resize[cpu](in0,
    resize_x=16)  ->  op resize[cpu](in0, resize_x=8)`), or the steps one has beyond the
    other, or what differs that no line shows."""
    if new_key == old_key:
        return "no part differs"
    old, new = describe(old_key), describe(new_key)
    at = next((i for i, (a, b) in enumerate(zip(old, new)) if a != b), min(len(old), len(new)))
    if len(old) == len(new) == at:
        return ("the values still held when it ran (its outputs)"
                if new_key[-1] != old_key[-1] else "implicit copies or casts")
    if at >= len(old) or at >= len(new):
        word, longer = ("more", new) if len(new) > len(old) else ("fewer", old)
        return f"{word} steps, from: {longer[at]}"
    return f"{old[at]}  ->  {new[at]}"


_CHANGES_SHOWN = 4
_HERE = "\0"  # where the expression goes in a step's template: "\0.size", "\0[0]"
_NOT_SET = Shown(("not set",), "(not set)")


def changed(expression: str, old: Any, new: Any) -> list[str]:
    """Where two frozen values of `expression` differ, as `part: old -> new` texts, the part
    spelled as the user writes it: `CFG.size`, `SIZES[1]`, `OPTIONS['size']`,
    `helper.__defaults__[0]`, `scale.keywords['k']`, `args[0].shape`."""
    if old == new:
        return []
    old_kind, old_parts = _parts(old)
    new_kind, new_parts = _parts(new)
    if old_kind is not None and old_kind == new_kind:
        found = []
        for step in {**old_parts, **new_parts}:
            found.extend(changed(step.replace(_HERE, expression), old_parts.get(step, _NOT_SET),
                                 new_parts.get(step, _NOT_SET)))
        # a list or tuple with several items changed reads best whole: `[14, 14] -> [8, 8]`
        if found and (len(found) == 1 or not isinstance(old_kind, tuple)
                      or old_kind[0] not in ("list", "tuple")):
            return found
    return [f"{expression}: {_leaf_difference(old, new)}"]


def _parts(frozen: Any) -> tuple[Any, dict[str, Any]]:
    """A frozen value's kind (values of one kind pair their parts) and its parts, by the step
    that reaches each (a template: `_HERE` is the value); (None, {}) for a value of no parts."""
    if not isinstance(frozen, tuple) or not frozen or isinstance(frozen, Shown):
        return None, {}
    kind, rest = frozen[0], frozen[1:]
    if kind in ("static", "data") and len(frozen) in (2, 3):
        return kind, {_HERE: frozen[-1]}
    if kind in ("list", "tuple") and len(rest) == 1 and isinstance(rest[0], tuple):
        return (kind, len(rest[0])), {f"{_HERE}[{i}]": v for i, v in enumerate(rest[0])}
    if kind == "dict" and len(rest) == 1:
        return kind, {f"{_HERE}[{show(k)}]": v for k, v in rest[0]}
    if kind in ("object", "class") and len(frozen) in (3, 4):
        parts = {f"{_HERE}.{name}": value for name, value in frozen[2]}
        for cls in frozen[3] if len(frozen) == 4 else ():  # class attributes read through it
            for name, value in _parts(cls)[1].items():
                parts.setdefault(name, value)
        return (kind, frozen[1]), parts
    if kind in ("Batch", "Tensor") and len(frozen) == 5:
        return kind, {f"{_HERE}.{field}": Shown(("field", value), str(value) if field != "layout"
                                                else repr(value))
                      for field, value in zip(("device", "dtype", "ndim", "layout"), rest)}
    if kind == "ndarray" and len(frozen) == 4:
        return kind, {f"{_HERE}.dtype": Shown(("dtype", rest[0]), np.dtype(rest[0]).name),
                      f"{_HERE}.shape": Shown(("shape", rest[1]), repr(rest[1]))}
    if kind == "npscalar" and len(frozen) == 3:
        return (kind, frozen[1]), {_HERE: frozen[2]}
    if kind == "partial" and len(frozen) == 4:
        return kind, dict(zip((f"{_HERE}.func", f"{_HERE}.args", f"{_HERE}.keywords"), rest))
    if kind == "method" and len(frozen) == 3:
        return kind, {f"{_HERE}.__func__": rest[0], f"{_HERE}.__self__": rest[1]}
    if kind == "function" and len(frozen) == 4:
        return (kind, rest[0]), {f"{_HERE}.__defaults__": rest[1],
                                 f"{_HERE}.__kwdefaults__": rest[2]}
    return None, {}


def _leaf_difference(old: Any, new: Any) -> str:
    if show(old) != show(new):
        return difference(old, new)
    if isinstance(old, tuple) and old[:1] == ("ndarray",):
        return f"other values of the same dtype and shape ({_short(new)})"
    return f"another object that reads the same ({_short(new)})"
