"""Differential fuzzing of what changes between calls: a function reads something outside its
arguments, the caller changes that thing between calls the ways Python allows, and every call's
result must match eager's bit for bit.

    case = Case.draw(data)                # inside a hypothesis test using st.data()
    check_case(case, batch)               # AssertionError on the first difference

The things read (the families the guard holes of issue 35 came from): a global number, a global
numpy scalar, a global list, a global `functools.partial`, a global bound method of an object,
a helper's default argument, the compiled function's own defaults and keyword defaults, an
object's attribute, a class attribute; and those a new-user probe found stale: a `__slots__`
object's attribute, a class's numpy attribute, a method replaced on its class, a helper's code
reloaded in place, a global read by the user's own `functools.wraps` wrapper, by a helper of the
user's module (`tools.scale(x)`), by a property, and a module imported in the function's body;
and this session's probe's: an lru_cache helper (cleared or not), a file it reads. (State the
function changes itself, a global step counter or a default appended to, cannot be run eagerly
and compiled side by side on one state: test_effects runs those as scenarios.)
The changes: rebind, change in place, swap a Python number for a numpy scalar of the same value,
or nothing. The code is written to a file, as a user's is (helpers of `<string>` code are not
the user's). Used by tests/test_fuzz.py.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
import tempfile
import types
from collections.abc import Callable
from typing import Any

import numpy as np
from harness import Step, assert_each_matches_eager, assert_matches_eager
from hypothesis import strategies as st

import nvidia.dali.experimental.dynamic as ndd


def _scale(x, k):
    return x * k


class _Holder:
    factor = 2.0

    def __init__(self) -> None:
        self.k = 2.0

    def run(self, x):
        return x * self.k


@dataclasses.dataclass
class Case:
    """One family and the values its thing takes from call to call."""

    family: str
    values: list  # what the thing read is made to give before each call
    in_place: list[bool]  # per call: change it in place (where the family can) or rebind it

    @staticmethod
    def draw(data: Any) -> Case:
        family = data.draw(st.sampled_from(FAMILIES))
        calls = data.draw(st.integers(2, 5))
        numbers = st.sampled_from([2.0, 3.0, 0.5, -0.0, 0.0, 2, 3])
        values = []
        for _ in range(calls):
            value = data.draw(numbers)
            if data.draw(st.booleans()):  # the same value as a numpy scalar
                value = data.draw(st.sampled_from([np.float64, np.float32, np.int64]))(value)
            values.append(value)
        return Case(family, values, [data.draw(st.booleans()) for _ in range(calls)])


def _made(case: Case) -> tuple[Callable, Callable[[Any, bool], None]]:
    """The user's function for `case`, and `set(value, in_place)`, which changes what it reads
    as user code would."""
    space: dict[str, Any] = {"ndd": ndd, "np": np, "__name__": "mutationfuzz_user"}
    holder = _Holder()
    family = case.family
    if family == "global number":
        code = "def f(x):\n    return x * K\n"

        def change(value, in_place):
            space["K"] = value
    elif family == "global list":
        code = "def f(x):\n    return x * K[0]\n"
        space["K"] = [1.0]

        def change(value, in_place):
            if in_place:
                space["K"][0] = value
            else:
                space["K"] = [value]
    elif family == "global partial":
        code = "def f(x):\n    return H(x)\n"

        def change(value, in_place):
            space["H"] = functools.partial(_scale, k=value)
    elif family == "global bound method":
        code = "def f(x):\n    return M(x)\n"
        space["M"] = holder.run

        def change(value, in_place):
            if in_place:
                holder.k = value
            else:
                fresh = _Holder()
                fresh.k = value
                space["M"] = fresh.run
    elif family == "class attribute":
        code = "def f(x):\n    return x * C.factor\n"
        space["C"] = _Holder

        def change(value, in_place):
            _Holder.factor = value
    elif family == "helper default":
        code = "def helper(x, k=1.0):\n    return x * k\n\ndef f(x):\n    return helper(x)\n"

        def change(value, in_place):
            space["helper"].__defaults__ = (value,)
    elif family == "own default":
        code = "def f(x, k=1.0):\n    return x * k\n"

        def change(value, in_place):
            space["f"].__defaults__ = (value,)
    elif family == "own keyword default":
        code = "def f(x, *, k=1.0):\n    return x * k\n"

        def change(value, in_place):
            if in_place:
                space["f"].__kwdefaults__["k"] = value
            else:
                space["f"].__kwdefaults__ = {"k": value}
    else:
        code, change = _probed(family, space)
    path = os.path.join(tempfile.gettempdir(), f"mutationfuzz_{family.replace(' ', '_')}.py")
    with open(path, "w") as file:  # a file of the user's (its source and helpers are theirs)
        file.write(code)
    exec(compile(code, path, "exec"), space)
    return space["f"], change


_SETTINGS = "mutationfuzz_settings"  # a module of the user's, made at run time


def _settings_module() -> types.ModuleType:
    module = sys.modules.get(_SETTINGS) or types.ModuleType(_SETTINGS)
    module.K = 1.0
    exec(compile("def scale(x):\n    return x * K\n", f"{_SETTINGS}.py", "exec"), vars(module))
    sys.modules[_SETTINGS] = module
    return module


def _probed(family: str, space: dict) -> tuple[str, Callable[[Any, bool], None]]:
    """The families a new-user probe found stale: the user's code, and its `change`."""
    def set_k(value, in_place):
        space["K"] = value
    if family == "slots attribute":
        code = ("class S:\n    __slots__ = ('k',)\n\n    def run(self, x):\n"
                "        return x * self.k\n\nOBJ = S()\nOBJ.k = 1.0\nM = OBJ.run\n\n"
                "def f(x):\n    return M(x)\n")

        def change(value, in_place):
            if in_place:
                space["OBJ"].k = value
            else:
                space["OBJ"] = space["S"]()
                space["OBJ"].k = value
                space["M"] = space["OBJ"].run
    elif family == "class numpy attribute":
        code = ("class C:\n    arr = np.array([1.0], np.float32)\n\n"
                "def f(x):\n    return x * C.arr[0]\n")

        def change(value, in_place):
            if in_place:
                space["C"].arr[0] = value
            else:
                space["C"].arr = np.array([value])
    elif family == "method replaced":
        code = ("class C:\n    def run(self, x):\n        return x * 1.0\n\nOBJ = C()\n\n"
                "def f(x):\n    return OBJ.run(x)\n")

        def change(value, in_place):
            space["C"].run = lambda self, x: x * value
    elif family == "helper code reloaded":
        code = "def helper(x):\n    return x * 1.0\n\ndef f(x):\n    return helper(x)\n"

        def change(value, in_place):
            made: dict = {"np": np}
            exec(f"def helper(x):\n    return x * {value!r}\n", made)
            space["helper"].__code__ = made["helper"].__code__
    elif family == "wrapper global":
        code = ("import functools\nK = 1.0\n\ndef scaled(function):\n"
                "    @functools.wraps(function)\n    def wrapper(x):\n"
                "        return function(x) * K\n    return wrapper\n\n"
                "@scaled\ndef helper(x):\n    return ndd.flip(x, horizontal=1)\n\n"
                "def f(x):\n    return helper(x)\n")
        change = set_k
    elif family == "module helper":
        space["tools"] = _settings_module()
        code = "def f(x):\n    return tools.scale(x)\n"

        def change(value, in_place):
            space["tools"].K = value
    elif family == "imported in body":
        _settings_module()
        code = f"def f(x):\n    from {_SETTINGS} import K\n    return x * K\n"

        def change(value, in_place):
            sys.modules[_SETTINGS].K = value
    elif family == "lru_cache helper":
        code = ("import functools\nK = 1.0\n\n@functools.lru_cache(maxsize=None)\n"
                "def factor(n):\n    return K * n\n\ndef f(x):\n    return x * factor(1)\n")

        def change(value, in_place):
            space["K"] = value
            if in_place:  # the user clears the helper's cache (else eager keeps its answer)
                space["factor"].cache_clear()
    elif family == "file read":
        path = os.path.join(tempfile.gettempdir(), f"mutationfuzz_k_{os.getpid()}.txt")
        space["PATH"] = path
        code = "def f(x):\n    with open(PATH) as file:\n        return x * float(file.read())\n"

        def change(value, in_place):
            with open(path, "w") as file:
                file.write(repr(float(value)))
    else:  # "property"
        code = ("K = 1.0\n\nclass C:\n    @property\n    def k(self):\n        return K\n\n"
                "OBJ = C()\n\ndef f(x):\n    return x * OBJ.k\n")
        change = set_k
    return code, change


FAMILIES = ["global number", "global list", "global partial", "global bound method",
            "class attribute", "helper default", "own default", "own keyword default",
            "slots attribute", "class numpy attribute", "method replaced", "helper code reloaded",
            "wrapper global", "module helper", "imported in body", "property",
            "lru_cache helper", "file read"]


def check_case(case: Case, batch: Any) -> None:
    """Each call, after its change, eagerly and compiled: the same result (values, dtype)."""
    saved = _Holder.factor
    function, change = _made(case)
    try:
        assert_each_matches_eager(function, batch, warn="quiet", changes=[
            functools.partial(change, value, in_place)
            for value, in_place in zip(case.values, case.in_place)])
    finally:
        _Holder.factor = saved


# -- how values are consumed --------------------------------------------------------------------

def _observe(value: Any, way: str) -> Any:
    """What user code sees when it consumes `value` one `way` (an exception: its type and text)."""
    try:
        if way == "len":
            return len(value)
        if way == "list":
            return [np.asarray(t).tolist() for t in list(value)]
        if way == "iter":
            return [np.asarray(t).tolist() for t in value]
        if way == "star":
            return [np.asarray(t).tolist() for t in [*value]]
        if way == "bool":
            return bool(value)
        if way == "numpy":
            return [np.asarray(value.select(i)).tolist() for i in range(value.batch_size)]
        if way == "shape":
            return value.shape
        if way == "dtype":
            return str(value.dtype)
        if way == "torch":
            return value.torch(pad=True).tolist()
        if way == "in dict":
            return sorted({"k": value}.keys())
        if way == "repr":
            return repr(value).split("(")[0]
        return type(value).__name__  # "type"
    except Exception as error:  # noqa: BLE001 (what a user's `except` sees)
        return (type(error).__name__, str(error))


WAYS = ["len", "list", "iter", "star", "bool", "numpy", "shape", "dtype", "torch", "in dict",
        "repr", "type"]
# transparent mode's values are ndd.Batch subclasses (a known difference, docs/limitations.md)
TRANSPARENT_WAYS = [way for way in WAYS if way not in ("repr", "type")]


def check_consumption(ways: list[str], batch: Any) -> None:
    """A result consumed in `ways`, in order: the same observations eagerly, from a compiled
    function and in transparent mode."""
    def step(x):
        return ndd.flip(x, horizontal=1) * 2

    def consumed(step, ways):
        return [_observe(step(batch), way) for way in ways]

    kept = [way for way in ways if way in TRANSPARENT_WAYS]
    assert_matches_eager(consumed, Step(step), ways, modes=("step",), warn=None, context=ways)
    assert_matches_eager(consumed, step, kept, modes=("transparent",), warn=None, context=kept)
