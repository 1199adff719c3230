"""Per-sample values while a per-sample function's pipeline is defined, and the helpers its
rewritten code calls (`_ndd_condition`, `_ndd_attribute`, ...): a per-sample number (`Item`)
becomes a DALI predicate, and where it can, carries a Python guess of its value (`Sample`).

    predicate = _ndd_condition(Item(node, lineno), lineno)   # a DataNode DALI branches on
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from types import MappingProxyType
from typing import Any

from ... import _dali
from ...core import process_state
from ...core.errors import PerSampleError
from ...core.source import SourceLoc


def noted_error(message: str, loc: SourceLoc | None = None) -> PerSampleError:
    """The PerSampleError to raise, noted in this thread's scope: DALI's AutoGraph re-raises it
    wrapped, and it is unwrapped where caught."""
    error = PerSampleError(message, loc)
    process_state.per_sample_scope.raised = error
    return error


def _loc(lineno: int) -> SourceLoc | None:
    definition = process_state.per_sample_scope.definition
    if definition is None:
        return None
    return SourceLoc(definition.filename, lineno, definition.name)


class Item:
    """A per-sample Python number (`x.item()`, `x.shape[i]`): comparisons and truth tests are
    computed as Python computes them (in float64), and the value can be passed to an op.
    `python`, where known, computes the number in Python from one sample's random values and
    input shapes: a guess of the sample's path, checked by the run (see `RandomStream`)."""

    __slots__ = ("lineno", "node", "python")

    def __init__(self, node: Any, lineno: int, python: Callable[[Sample], Any] | None = None):
        self.node = node
        self.lineno = lineno
        self.python = python

    def _wide(self) -> Any:
        return _dali.cast_node(self.node, "FLOAT64")

    def _compare(self, other: Any, name: str) -> Item:
        if isinstance(other, Item):
            right = other._wide()
        elif isinstance(other, (bool, int, float)) and not isinstance(other, Item):
            right = _dali.float64_constant(other)
        else:
            raise noted_error(f"compares a per-sample number with {type(other).__name__}",
                              _loc(self.lineno))
        left = self._wide()
        result = {"eq": lambda: left == right, "ne": lambda: left != right,
                  "lt": lambda: left < right, "le": lambda: left <= right,
                  "gt": lambda: left > right, "ge": lambda: left >= right}[name]()
        compare = getattr(operator, name)
        python = None
        if self.python is not None and isinstance(other, Item) and other.python is not None:
            mine, theirs = self.python, other.python
            python = lambda sample: compare(mine(sample), theirs(sample))  # noqa: E731
        elif self.python is not None and not isinstance(other, Item):
            mine = self.python
            python = lambda sample: compare(mine(sample), other)  # noqa: E731
        return Item(result, self.lineno, python)

    def __eq__(self, other: object) -> Item:  # type: ignore[override]
        return self._compare(other, "eq")

    def __ne__(self, other: object) -> Item:  # type: ignore[override]
        return self._compare(other, "ne")

    def __lt__(self, other: Any) -> Item:
        return self._compare(other, "lt")

    def __le__(self, other: Any) -> Item:
        return self._compare(other, "le")

    def __gt__(self, other: Any) -> Item:
        return self._compare(other, "gt")

    def __ge__(self, other: Any) -> Item:
        return self._compare(other, "ge")

    __hash__ = None  # type: ignore[assignment]

    def _no_python(self, *args: Any) -> Any:
        raise noted_error(
            "uses a per-sample number (`.item()`, `.shape[i]`) as a Python value (arithmetic, "
            "int(), range(), formatting): it differs between the samples of one pipeline run. "
            "Compare it, branch on it, or pass it to an ndd op; compute with ndd ops on the "
            "tensor instead", _loc(self.lineno))

    def __bool__(self) -> bool:
        raise noted_error(
            "uses a per-sample comparison as a Python bool outside an `if`/`and`/`or` (a "
            "chained comparison such as `0 < x.item() < 1`, `bool()`): it differs between the "
            "samples of one pipeline run. Write `0 < x.item() and x.item() < 1`",
            _loc(self.lineno))

    for _name in ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__",
                  "__truediv__", "__rtruediv__", "__floordiv__", "__rfloordiv__", "__mod__",
                  "__rmod__", "__pow__", "__rpow__", "__neg__", "__abs__", "__int__",
                  "__float__", "__index__", "__str__", "__format__", "__len__", "__iter__"):
        locals()[_name] = _no_python
    del _name

    def __repr__(self) -> str:
        return "<per-sample number>"


class _Shape:
    """`x.shape` of a per-sample value: its items are per-sample numbers."""

    def __init__(self, node: Any, lineno: int):
        self._node = _dali.shape_node(node)
        self._lineno = lineno
        definition = process_state.per_sample_scope.definition
        self._argument = definition.input_keys.get(_dali.node_key(node)) \
            if definition is not None else None

    def __getitem__(self, index: Any) -> Item:
        if not isinstance(index, int):
            raise noted_error("indexes a per-sample shape with something other than an int",
                              _loc(self._lineno))
        python = None
        if self._argument is not None:  # an input's shape: known before the run
            argument = self._argument
            python = lambda sample: sample.shape(argument)[index]  # noqa: E731
        return Item(self._node[index], self._lineno, python)

    def __len__(self) -> int:
        raise noted_error("takes len() of a per-sample shape (use x.ndim)", _loc(self._lineno))

    def __eq__(self, other: object) -> bool:  # (Python's default, identity, is always False)
        raise noted_error("compares a whole per-sample shape (compare its items: "
                          "`x.shape[0] == 5 and x.shape[1] == 3`)", _loc(self._lineno))

    __ne__ = __eq__
    __hash__ = None  # type: ignore[assignment]


def _ndd_condition(value: Any, lineno: int, side_effect: int | None = None) -> Any:
    """A truth test: Python values pass through; a per-sample number becomes the predicate of
    DALI's conditional execution; a tensor is refused (eager's `if tensor:` is always true)."""
    if isinstance(value, Item):
        if side_effect is not None:
            raise noted_error(
                f"changes a Python object at line {side_effect} inside a per-sample branch: "
                "both branches are run once to build the pipeline, so the change would happen "
                "for every sample; keep per-sample branches to ndd ops on local variables",
                _loc(lineno))
        predicate = _dali.cast_node(value.node, "BOOL")
        definition = process_state.per_sample_scope.definition
        if definition is not None and value.python is not None:
            python = value.python
            definition.predicates[_dali.node_key(predicate)] = \
                lambda sample: bool(python(sample))
        return predicate
    if _dali.is_data_node(value):
        raise noted_error(
            "uses a tensor as a Python bool (`if tensor:`): in eager ndd a Tensor has no "
            "truth value of its own, so such a test is always true. Test its value with "
            "`.item()` (e.g. `if flip.item():`), or a comparison of `.item()`", _loc(lineno))
    return value


def _ndd_loop_condition(value: Any, lineno: int) -> Any:
    if isinstance(value, Item) or _dali.is_data_node(value):
        raise noted_error("a `while` loop on a per-sample value is not supported (a "
                          "pipeline runs the same number of ops for every sample); loop a "
                          "fixed number of times, or branch with `if`", _loc(lineno))
    return value


def _ndd_attribute(value: Any, name: str, lineno: int) -> Any:
    """`x.shape`, `x.item()`, ... of a per-sample value; other objects' attributes as usual."""
    if isinstance(value, Item) and name == "item":
        return lambda: value
    if not _dali.is_data_node(value):
        return getattr(value, name)
    if name == "shape":
        return _Shape(value, lineno)
    if name == "item":
        definition = process_state.per_sample_scope.definition
        site = definition.site_keys.get(_dali.node_key(value)) if definition else None
        python = (lambda sample: sample.item(site)) if site is not None else None
        return lambda: Item(_dali.scalar_node(value), lineno, python)
    if name in ("gpu", "cpu") and hasattr(value, name):
        return getattr(value, name)  # a transfer inside the pipeline
    raise noted_error(f"reads `.{name}` of a per-sample value, which a per-sample pipeline "
                      "does not provide (`.shape` and `.item()` are supported)", _loc(lineno))


RUNTIME_HELPERS = MappingProxyType({  # what the rewritten function calls
    "_ndd_condition": _ndd_condition, "_ndd_loop_condition": _ndd_loop_condition,
    "_ndd_attribute": _ndd_attribute})
for _helper in RUNTIME_HELPERS.values():
    _dali.do_not_convert(_helper)
del _helper


class Unknown(Exception):
    """A Python guess needs a value this sample does not have (a random op it did not reach)."""


class Sample:
    """One sample's random values and input shapes, as the Python guesses of its predicates
    (`Item.python`) read them."""

    def __init__(self, stream: Any, index: int):  # a random_stream.RandomStream
        self._stream = stream
        self.index = index
        self.values: dict[int, Any] = {}  # site -> this sample's value (a Tensor)

    def item(self, site: int) -> Any:
        if site not in self.values:
            raise Unknown(site)
        return _dali.host_array(self.values[site]).item()

    def shape(self, argument: int) -> tuple:
        return self._stream.shapes(argument)[self.index]
