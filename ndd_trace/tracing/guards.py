"""Guards: the frozen cache key of a call, and an explanation of what changed on a miss.

    key = build_key(args, kwargs, plan)        # a tuple of (label, frozen value) pairs
    keys.explain_miss(new_key, old_key)        # "size: 224 -> 256", "CFG.size: 48 -> 64"
    fast = FastGuard.of(args, plan, entry)     # the last call's key, checked without building
    fast.matches(args)                         # it: identities and data descriptions

Batches and tensors contribute their kind, device, dtype, ndim and layout (not their data or batch
size); other arguments, module globals and closure values the function reads contribute their
value, frozen recursively (objects by their attributes; an object or class read only as
`CFG.size` by those attributes), so a change re-traces. Labels spell what the user wrote:
`size`, `args[0]`, `kwargs['k']`, `CFG.size`. A per-sample function's keys (`baked=True`) differ
in one point: only its Batches are fed, so every other argument, a Tensor included, contributes
its value.
"""

from __future__ import annotations

import builtins
import collections
import enum
import functools
import inspect
import sys
import types
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import _dali
from ..core.keys import Identity, KeyPolicy, Shown, class_key, freeze
from ..core.objects import attribute_held, is_code, is_user_class
from . import reads
from .aliasing import data_aliasing, rng_aliasing
from .plans import GuardPlan, may_reach_code

_MAX_DEPTH = 4  # (levels of objects below a value read: a list an object holds is none)


class GuardPolicy(KeyPolicy):
    """Guards' rule for what an object is: its attributes (to a depth), its classes' plain data;
    code, DALI's stateful objects and generators by identity; data by its description."""

    by_attributes = True
    unhashable_by_identity = True
    max_depth = _MAX_DEPTH

    def special(self, value: Any, depth: int) -> Any:
        if isinstance(value, (_dali.Batch, _dali.Tensor)):
            return ("data", id(value), describe_data(value))
        if isinstance(value, (_dali.RNG, _dali.Reader, _dali.ExternalSource)):
            return self.by_identity(value)  # stateful: its identity is what matters
        if isinstance(value, type) and is_user_class(value) and depth < _MAX_DEPTH:
            return class_key(value, self, depth)
        if depth < _MAX_DEPTH and reads.is_torch_module(type(value)):
            return _module_key(value, self, depth)
        if isinstance(value, functools.partial):  # what it calls with is part of what it is
            return ("partial", freeze(value.func, self, depth + 1),
                    freeze(value.args, self, depth + 1),
                    freeze(value.keywords, self, depth + 1))
        if isinstance(value, types.MethodType):  # a bound method reads its object's state
            return ("method", freeze(value.__func__, self, depth + 1),
                    freeze(value.__self__, self, depth + 1))
        if isinstance(value, types.FunctionType):
            # by identity and its code (which a reload, IPython's autoreload, replaces in place)
            function = Identity(value, self.named(value), id(value.__code__))
            if value.__defaults__ or value.__kwdefaults__:
                return ("function", function, freeze(value.__defaults__, self, depth + 1),
                        freeze(value.__kwdefaults__, self, depth + 1))
            return function
        if reads.is_lru_cache(value):  # what it answers from: cache_clear() empties it
            clears = reads.lru_clears(value)  # (what it holds counts where they cannot be counted)
            return ("lru_cache", self.by_identity(value), clears,
                    value.cache_info().currsize if clears < 0 else None)
        if is_code(value) or attribute_held(value, "cache_info") is not None:
            # code is guarded by identity (a compiled function by its own cache, not its state)
            return self.by_identity(value)
        if isinstance(value, _dali.DType):
            return Shown(("enum", "DType", str(value)), _dali.dtype_public_name(value))
        if isinstance(value, enum.Enum) or isinstance(value, _dali.Device):
            return Shown(("enum", type(value).__name__, str(value)), str(value))
        if isinstance(value, np.ndarray):
            return ("ndarray", value.dtype.str, value.shape, hash(value.tobytes()))
        if type(value).__module__.startswith("torch") and hasattr(value, "numpy"):
            try:  # (apart from a numpy array of the same data: eager's results are torch's)
                return ("torch", type(value).__name__, str(value.dtype), tuple(value.shape),
                        freeze(_torch_bytes(value), self, depth + 1))
            except Exception:
                return self.by_identity(value)
        return None

    def named(self, value: Any) -> str:
        if isinstance(value, types.ModuleType):
            return f"module {value.__name__}"
        if isinstance(value, types.BuiltinFunctionType) and \
                getattr(value, "__module__", None) == "builtins":
            return f"builtin {value.__name__}"
        if attribute_held(value, "_ndd_trace_inlined") is not None:
            return f"compiled function {attribute_held(value, '__qualname__', '?')}"
        if isinstance(value, type):
            return f"class {value.__module__}.{value.__qualname__}"
        if isinstance(value, (types.FunctionType, types.MethodType, types.BuiltinFunctionType)) \
                or attribute_held(value, "cache_info") is not None:
            name = attribute_held(value, "__qualname__") or attribute_held(value, "__name__", "?")
            return f"function {attribute_held(value, '__module__', '?')}.{name}"
        if isinstance(value, _dali.RNG):
            return f"RNG at {id(value):#x}"
        if isinstance(value, _dali.Reader):
            return f"reader {type(value).__name__} at {id(value):#x}"
        return super().named(value)


GUARDS = GuardPolicy()

_MODULE_TABLES = ("_parameters", "_buffers", "_modules")
_EMPTY_TABLES = (dict, collections.OrderedDict, set, list)


def _torch_bytes(tensor: Any) -> np.ndarray:
    """A torch tensor's data as numpy holds it; its bytes where numpy has no such dtype
    (bfloat16)."""
    data = tensor.detach().cpu()
    try:
        return data.numpy()
    except TypeError:
        return data.contiguous().view(sys.modules["torch"].uint8).numpy()


def _module_key(module: Any, policy: GuardPolicy, depth: int) -> tuple:
    """A torch.nn.Module as code reads it: its submodules, parameters and buffers one
    attribute deep each (`self.ts[0].k`), where torch keeps them in tables of its own."""
    state = vars(module)  # (torch's empty hook tables left out: one filled changes the key)
    attributes = [(k, v) for k, v in state.items() if k not in _MODULE_TABLES
                  and not (type(v) in _EMPTY_TABLES and not v)]
    for table in _MODULE_TABLES:
        attributes += [(f"{table}.{k}", v) for k, v in (state.get(table) or {}).items()]
    return ("module", id(type(module)),
            tuple((k, freeze(v, policy, depth + 1)) for k, v in attributes),
            tuple(freeze(cls, policy, depth + 1) for cls in type(module).__mro__
                  if is_user_class(cls)))


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
    return ("static", freeze(value, GUARDS))


def _baked_argument_key(value: Any) -> Any:
    """The key of an argument of a per-sample function: its Batches are fed to the pipeline
    (their description), every other value is baked into it when it is defined (its value,
    a Tensor's by its data: the pipeline holds that data, not the object)."""
    if isinstance(value, _dali.Batch):
        return describe_data(value)
    if isinstance(value, _dali.Tensor):
        return ("tensor", describe_data(value), freeze(_dali.host_array(value), GUARDS))
    return ("static", freeze(value, GUARDS))


_MISSING = reads.MISSING


def _narrowed(value: Any) -> bool:
    """Whether a value read only as `value.a.b` is keyed by those: a user's object or class,
    a torch tensor read for its metadata (`self.net.weight.dtype`: not its data)."""
    if isinstance(value, type):
        return is_user_class(value)
    if reads.is_torch_tensor(type(value)) or reads.is_torch_module(type(value)):
        return True  # (torch's own modules too: `self.net.weight` read through their tables)
    if not (hasattr(value, "__dict__") and is_user_class(type(value))) or is_code(value):
        return False
    return GUARDS.special(value, 0) is None


_CODE_RUNS = object()  # reading the attribute runs code (a property, a method, __getattr__)


_TENSOR_METADATA = frozenset({"dtype", "device", "shape", "ndim", "layout", "is_cuda",
                              "requires_grad"})


def _plain_attribute(value: Any, name: str) -> Any:
    """`value.name` where reading it runs none of the user's code (an attribute of the object's
    own, a class's plain data; a torch tensor's metadata): the value, _MISSING, or _CODE_RUNS."""
    if reads.is_torch_tensor(type(value)):
        return getattr(value, name) if name in _TENSOR_METADATA else _CODE_RUNS
    found = inspect.getattr_static(value, name, _MISSING)
    if found is _MISSING and reads.torch_getattr(type(value)):
        found = reads.torch_table_item(value, name)
    if found is _MISSING:
        return _CODE_RUNS if hasattr(type(value), "__getattr__") else _MISSING
    return _CODE_RUNS if hasattr(type(found), "__get__") else found


def _read(label: str, value: Any, chains: tuple | None, whole: Callable[[Any], Any]) -> list:
    """The key items of a value the function reads: where it reads it only as `CFG.size` and
    it is `_narrowed`, the attributes it reads (down to a value of another kind, or where one
    runs code: a property, a method, followed through what it reads of its own `self`); else
    the value itself (`whole` makes its key)."""
    if not (chains and _narrowed(value)):
        return [(label, whole(value))]
    items: dict[str, Any] = {}
    todo = [(label, value, chain) for chain in reversed(chains)]
    followed: set[tuple[int, int]] = set()
    while todo:
        at, current, chain = todo.pop()
        for attribute in chain:
            if isinstance(attribute, reads.Super):  # `super().name` of a method followed
                method = _super_read(current, attribute)
            else:
                found = _plain_attribute(current, attribute) if _narrowed(current) \
                    else _CODE_RUNS
                if found is not _CODE_RUNS:
                    at, current = f"{at}.{attribute}", found
                    if found is _MISSING:
                        break
                    continue
                method = _method_read(current, attribute)
            if method is None or len(followed) >= reads.MAX_METHODS:
                break  # (code it cannot follow, or reading its `self` whole: keyed whole)
            function, own_chains, owner = method  # (its code, and what it reads of `self`)
            items[f"{at}.{attribute}"] = ("missing",) if function is _MISSING else \
                freeze(function, GUARDS)
            if owner is not current and owner is not None and own_chains:  # (a class method:
                items[f"{at}.{attribute}()"] = freeze(owner, GUARDS)  # what it reads, its class's)
            elif owner is current and (id(current), id(function)) not in followed:
                followed.add((id(current), id(function)))
                todo += [(at, current, own) for own in reversed(own_chains)]
            at = None
            break
        if at is None:
            continue
        if at == label:  # (read whole: what it reads through attributes is in it)
            return [(label, whole(value))]
        # (from depth 0: a chain the code spells out is no nesting to bound)
        items[at] = ("missing",) if current is _MISSING else freeze(current, GUARDS)
    return list(items.items())


def _method_read(value: Any, name: str) -> tuple[types.FunctionType, tuple, Any] | None:
    """`value.name` where it is a method or property of the user's class whose code reads its
    `self` only through attribute chains: the function, those chains, and `value`."""
    if isinstance(value, type) or not _narrowed(value) or name in vars(value):
        return None
    found = inspect.getattr_static(value, name, None)
    found = found.fget if isinstance(found, property) else found
    if not (isinstance(found, types.FunctionType) and reads.is_user_function(found)):
        return None
    chains = reads.first_parameter_chains(found)
    return None if chains is None else (found, chains, value)


def _super_read(value: Any, step: reads.Super) -> tuple[Any, tuple, Any] | None:
    """`super().name` in a method called on `value`, as `_method_read` answers: what it finds
    (a function, a value, MISSING), the chains that function reads of its first parameter
    (none for a value or a static method), and that parameter (`value`, or its class for a
    class method, None); None where it reads that parameter whole."""
    found, owner = reads.super_attribute(value, step)
    chains = reads.first_parameter_chains(found) if owner is not None else ()
    return None if chains is None else (found, chains, owner)


def build_key(args: tuple, kwargs: dict, plan: GuardPlan,
              batch_sizes: tuple | None = None, names: tuple[str, ...] = (),
              baked: bool = False) -> tuple:
    """The guards of one call, labelled as the user spells each (`size`, `args[0]`,
    `kwargs['k']`, `CFG`, `CFG.size`). `baked`: only Batch arguments are fed, every other
    argument is part of the pipeline (a per-sample function's), keyed by its value."""
    argument_key = _baked_argument_key if baked else _argument_key
    positional, keyword_only, varargs, varkw = plan.parameters
    names, chains = names or positional, plan.chains
    key: list[tuple[str, Any]] = []
    arguments = []
    for index, value in enumerate(args):
        label = names[index] if index < len(names) else \
            f"{varargs or 'args'}[{index - len(names)}]"
        items = _read(label, value, chains.get(("argument", label)), argument_key)
        key += items
        if may_reach_code(value):
            arguments.append((label, value, tuple(items)))
    for name in sorted(kwargs):
        label = f"{varkw}[{name!r}]" if varkw and name not in keyword_only else name
        items = _read(label, kwargs[name], chains.get(("argument", name)), argument_key)
        key += items
        if may_reach_code(kwargs[name]):
            arguments.append((name, kwargs[name], tuple(items)))
    spread = [name for name in kwargs if varkw and name not in keyword_only]
    if len(spread) > 1:  # (`**kwargs` iterates in the call's order)
        key.append((f"the order of {varkw}", tuple(spread)))
    for label, value, items in arguments:  # what functions reached through them read
        for prefix, helper_plan in plan.argument_plans(label, value, items):
            key += _reads_key(helper_plan, prefix)
    key += _reads_key(plan, "")
    if batch_sizes is not None:
        key.append(("batch size", batch_sizes))
    others = [namespace.get(name) for _, name, namespace in plan.globals_read
              if isinstance(namespace.get(name), _dali.RNG)]
    aliasing = rng_aliasing(args, kwargs, others)
    if aliasing and len(set(aliasing)) < len(aliasing):
        key.append(("RNG arguments that are the same generator", aliasing))
    aliasing = data_aliasing([*args, *(kwargs[name] for name in sorted(kwargs))])
    if aliasing is not None:
        key.append(("Batch or Tensor arguments that are the same object", aliasing))
    return tuple(key)


def _reads_key(plan: GuardPlan, outer: str) -> list:
    """The key items of what a plan reads besides arguments: globals, the user's modules'
    attributes, closure cells (each label after `outer`)."""
    key: list[tuple[str, Any]] = []
    chains = plan.chains
    frozen = functools.partial(freeze, policy=GUARDS)
    for prefix, name, namespace in plan.globals_read:
        value = namespace.get(name, _MISSING)
        if value is _MISSING:
            value = builtins.__dict__.get(name, _MISSING)
        label = f"{outer}{prefix}{name}"
        key += [(label, ("missing",))] if value is _MISSING else \
            _read(label, value, chains.get(("global", id(namespace), name)), frozen)
    for prefix, name, namespace, chain in plan.module_attributes:
        value = reads.chain_value(namespace.get(name), chain)
        key.append((f"{outer}{prefix}{name}.{'.'.join(chain)}",
                    ("missing",) if value is _MISSING else freeze(value, GUARDS)))
    for label, cell in plan.closure:
        try:
            value = cell.cell_contents
        except ValueError:
            value = None
        key += _read(f"{outer}{label}", value, chains.get(("cell", id(cell))), frozen)
    return key


_IMMUTABLE = (float, bool, int, str, bytes, complex, type(None), np.number, np.bool_)
_BY_IDENTITY = (types.ModuleType, types.BuiltinFunctionType, enum.Enum)


def _same_object_same_guard(value: Any) -> bool:
    """Whether the guard key of `value` cannot change while `value` stays the same object:
    immutable values, and what is guarded by identity (code, modules, generators, sources)."""
    if isinstance(value, _IMMUTABLE):
        return True
    if type(value) is tuple:
        return all(isinstance(v, _IMMUTABLE) for v in value)
    if isinstance(value, (_dali.Batch, _dali.Tensor, np.ndarray)):
        return False
    if isinstance(value, type):
        return not is_user_class(value)  # a user class is guarded by its attributes
    if isinstance(value, types.FunctionType):  # defaults can be set or changed in place
        return value.__defaults__ is None and value.__kwdefaults__ is None
    if isinstance(value, types.MethodType):  # its object's attributes can change
        return _same_object_same_guard(value.__self__)
    if isinstance(value, (_dali.RNG, _dali.Reader, _dali.ExternalSource, _dali.DType,
                          _dali.Device, *_BY_IDENTITY)):
        return True
    # (a compiled helper)
    return attribute_held(value, "cache_info") is not None and not reads.is_lru_cache(value)


class FastGuard:
    """The last call's key, checked without building it: the same number of positional
    arguments, Batches/Tensors with the same description, and the very same objects
    everywhere else (arguments, globals, closure cells), each of a kind whose frozen value
    cannot change while it stays the same object. A match means `build_key` would give the
    key this guard was made from; anything else takes the full path."""

    __slots__ = ("plan", "entry", "arity", "arguments", "globals_read", "cells", "attributes",
                 "functions", "data_positions")

    def __init__(self, plan: GuardPlan, entry: Any, arity: int, arguments: tuple,
                 globals_read: tuple, cells: tuple, attributes: tuple = ()):
        self.plan = plan
        self.entry = entry
        self.arity = arity
        self.arguments = arguments  # per argument: (Batch/Tensor type, signature) or (None, obj)
        self.globals_read = globals_read  # (namespace, name, value or _MISSING, builtin value)
        self.cells = cells  # (cell, value)
        self.attributes = attributes  # (namespace, name, chain, value): module attributes
        # the functions among them, with their code: they have no defaults and keep their
        # code as long as this guard holds
        self.functions = tuple((value, value.__code__) for value in (
            *(value for kind, value in arguments if kind is None),
            *(value for _, _, value, _ in globals_read), *(value for _, value in cells),
            *(value for *_, value in attributes)) if isinstance(value, types.FunctionType))
        # (two Batch/Tensor arguments or more: each call's are distinct objects, as the key's)
        positions = tuple(index for index, (kind, _) in enumerate(arguments) if kind is not None)
        self.data_positions = positions if len(positions) > 1 else ()

    @staticmethod
    def of(args: tuple, plan: GuardPlan, entry: Any, baked: bool = False) -> FastGuard | None:
        """The fast guard of a call with these positional arguments (no keyword arguments),
        or None where one of its guarded values could change in place (`baked`: as in
        `build_key`)."""
        if data_aliasing(list(args)) is not None:
            return None  # (its key has the aliasing; the fast guard's calls have none)
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
        # what the function reads, and what functions given as arguments read
        names = plan.parameters[0]
        reached = [helper for index, (kind, value) in enumerate(arguments) if kind is None
                   for _, helper in plan.argument_plans(
                       names[index] if index < len(names) else f"args[{index}]", value)]
        globals_read, cells, attributes = [], [], []
        for read in (plan, *reached):
            for _, name, namespace in read.globals_read:
                value = namespace.get(name, _MISSING)
                builtin = builtins.__dict__.get(name, _MISSING) if value is _MISSING else None
                if not _same_object_same_guard(builtin if value is _MISSING else value) and \
                        (value is not _MISSING or builtin is not _MISSING):
                    return None
                globals_read.append((namespace, name, value, builtin))
            for _, cell in read.closure:
                try:
                    value = cell.cell_contents
                except ValueError:
                    return None
                if not _same_object_same_guard(value):
                    return None
                cells.append((cell, value))
            for _, name, namespace, chain in read.module_attributes:
                value = reads.chain_value(namespace.get(name), chain)
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
        if self.data_positions and len({id(args[index]) for index in self.data_positions}) \
                < len(self.data_positions):
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
            if reads.chain_value(namespace.get(name), chain) is not value:
                return False
        for function, code in self.functions:  # (defaults given since: the full key has them)
            if function.__defaults__ is not None or function.__kwdefaults__ is not None or \
                    function.__code__ is not code:
                return False
        return True
