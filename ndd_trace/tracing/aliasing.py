"""Which arguments are the same object: a trace records one proxy per object and one
generator per op, so where two data arguments (or two RNGs) are one, the guard key says
which (guards.build_key; the fast guard holds for distinct ones only).

    data_aliasing([x, (x, y)])        # (0, 0, 1): the first two are one batch
    rng_aliasing(args, kwargs, [])    # likewise for ndd.random.RNG arguments
"""

from __future__ import annotations

from typing import Any

from .. import _dali
from ..core import trees


def _rngs_in(value: Any, found: list) -> None:
    if isinstance(value, _dali.RNG):
        found.append(value)
    elif isinstance(value, (list, tuple, dict)):
        for v in value.values() if isinstance(value, dict) else value:
            _rngs_in(v, found)


def rng_aliasing(args: tuple, kwargs: dict, others: list) -> tuple:
    """Which RNG arguments are the same generator (as each other, or as one the function reads
    from a global or closure): a trace records one generator per op, so this is part of the
    key."""
    found: list = []
    _rngs_in(args, found)
    _rngs_in(kwargs, found)
    return _first_positions([*found, *others]) if found else ()


def data_aliasing(values: list) -> tuple | None:
    """Which of the Batch and Tensor values are the same object (each one's first position
    among them), where two are (`a is b` reads it: a trace gives one object one proxy); else
    None."""
    data: list = []
    trees.map_leaves(values, lambda value: isinstance(value, (_dali.Batch, _dali.Tensor)),
                     lambda _, value: data.append(value))  # (in lists, tuples and dicts too)
    if len(data) < 2:
        return None
    pattern = _first_positions(data)
    return pattern if max(pattern) + 1 < len(data) else None


def _first_positions(values: list) -> tuple[int, ...]:
    """Each value's number among the distinct objects, in order of first appearance."""
    first: dict[int, int] = {}
    return tuple(first.setdefault(id(value), len(first)) for value in values)
