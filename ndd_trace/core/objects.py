"""Objects read without running the user's code: which classes are the user's, what an
object holds (`attribute_held`: no `__getattr__`, property or descriptor of theirs runs), its
`__slots__`. Guards and keys read objects only through these.
"""

from __future__ import annotations

import inspect
import types
from typing import Any

UNSET = object()  # a `__slots__` attribute never set


def attribute_held(value: Any, name: str, default: Any = None) -> Any:
    """`getattr(value, name, default)` that runs none of the user's code: of a user class or
    its instance, only what it or its classes hold themselves (no `__getattr__`, property or
    other descriptor of theirs is called: a function, a property is returned as it is held; a
    slot is read); of anything else, getattr's answer, its errors read as absent."""
    kind = value if isinstance(value, type) else type(value)
    if not is_user_class(kind):
        try:
            return getattr(value, name, default)
        except Exception:  # (a library's __getattr__ raising other than AttributeError)
            return default
    found = inspect.getattr_static(value, name, default)
    if isinstance(found, types.MemberDescriptorType) and not isinstance(value, type):
        try:  # a `__slots__` attribute: its value (reading a slot runs no user code)
            return found.__get__(value, kind)
        except AttributeError:
            return default
    return found


def is_user_class(cls: type) -> bool:
    """A class of the user's (whose attributes a function may read as data), not a library's."""
    module = getattr(cls, "__module__", "") or ""
    return not module.startswith(_LIBRARIES)


# modules whose classes are not the user's data: a logger, a lock, a queue is a handle (keyed by
# identity), whose attributes reach the whole process (every logger, every thread)
_LIBRARIES = ("builtins", "nvidia", "numpy", "torch", "ndd_trace", "typing", "collections",
              "enum", "abc", "logging", "threading", "multiprocessing", "concurrent", "asyncio",
              "queue", "socket", "io", "_io", "weakref", "subprocess", "tempfile")


def is_code(value: Any) -> bool:
    """Modules, functions, classes and methods: keyed by identity by every policy that looks
    into objects (their state is code, not data)."""
    return isinstance(value, (types.ModuleType, types.FunctionType, types.BuiltinFunctionType,
                              type, types.MethodType))


def slot_names(kind: type) -> tuple[str, ...]:
    """The `__slots__` attributes (as stored: private ones mangled) of a user class: what its
    objects' state is, whatever its own `__eq__` compares (code may read an attribute its
    `__eq__` leaves out). Empty for a library's class."""
    if not is_user_class(kind):
        return ()
    names: list[str] = []
    for cls in kind.__mro__:
        slots = cls.__dict__.get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name in ("__dict__", "__weakref__"):
                continue
            if name.startswith("__") and not name.endswith("__"):
                name = f"_{cls.__name__.lstrip('_')}{name}"
            names.append(name)
    return tuple(names)
