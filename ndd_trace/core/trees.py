"""Structures of values: what a function returns, with its leaves taken out and put back.

    def leaf(value):                          # a leaf's node, or None for anything else
        if is_data(value):
            found.append(value)
            return ("out", len(found) - 1)
        return None

    tree = flatten(result, leaf)              # ("tuple", [("out", 0), ("static", 3)])
    value = unflatten(tree, lambda node: outputs[node[1]])

A tree is made of `("tuple" | "list", [items])`, `("namedtuple", type, [items])`,
`("dict", [(key, item)])`, `("static", value)` (anything else, returned as it is) and leaves,
whose form the caller chooses (`leaf(value)` returns it, or None for a value that is no leaf).
Compiled functions, compiled loop bodies and per-sample functions keep their outputs so.
Imports nothing from DALI.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator
from contextlib import AbstractContextManager, nullcontext
from typing import Any

_CONTAINERS = frozenset(("tuple", "list", "namedtuple", "dict", "static"))


def flatten(value: Any, leaf: Callable[[Any], tuple | None]) -> tuple:
    """The tree of `value`: `leaf(v)` gives the node of a leaf (None: not a leaf)."""
    node = leaf(value)
    if node is not None:
        return node
    if isinstance(value, tuple) and type(value) is not tuple and hasattr(value, "_fields"):
        return ("namedtuple", type(value), [flatten(v, leaf) for v in value])
    if isinstance(value, (tuple, list)):
        return ("tuple" if isinstance(value, tuple) else "list",
                [flatten(v, leaf) for v in value])
    if isinstance(value, dict):
        return ("dict", [(k, flatten(v, leaf)) for k, v in value.items()])
    return ("static", value)


def unflatten(tree: tuple, leaf: Callable[[tuple], Any]) -> Any:
    """The value of `tree`, each leaf node given by `leaf(node)`."""
    tag = tree[0]
    if tag not in _CONTAINERS:
        return leaf(tree)
    if tag == "static":
        return tree[1]
    if tag == "dict":
        return {k: unflatten(v, leaf) for k, v in tree[1]}
    if tag == "namedtuple":
        return tree[1](*(unflatten(v, leaf) for v in tree[2]))
    items = [unflatten(v, leaf) for v in tree[1]]
    return tuple(items) if tag == "tuple" else items


def map_leaves(value: Any, is_leaf: Callable[[Any], bool], visit: Callable[[tuple, Any], Any],
               path: tuple = ()) -> Any:
    """`value` rebuilt with each leaf replaced by `visit(path, leaf)`, through lists, tuples
    (not namedtuples: they are leaves' containers a caller passes as they are) and dicts."""
    if is_leaf(value):
        return visit(path, value)
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(map_leaves(v, is_leaf, visit, path + (i,))
                           for i, v in enumerate(value))
    if isinstance(value, dict):
        return {k: map_leaves(v, is_leaf, visit, path + (k,)) for k, v in value.items()}
    return value


def relay(iterator: Iterator[Any], around: Callable[[], AbstractContextManager] | None = None,
          after: Callable[[Any], None] | None = None) -> Generator[Any, Any, Any]:
    """`yield from iterator`, with each resumption of it made inside `around()` and each item it
    gives passed to `after(item)` first: what the consumer sends in and throws in reaches the
    iterator's own `yield` (as `yield from` passes them), its return value comes out."""
    send = getattr(iterator, "send", None)
    throw = getattr(iterator, "throw", None)
    sent: Any = None
    thrown: BaseException | None = None
    while True:
        with around() if around is not None else nullcontext():
            try:
                if thrown is not None:
                    if throw is None:
                        raise thrown
                    item = throw(thrown)
                else:
                    item = send(sent) if send is not None else next(iterator)
            except StopIteration as stop:
                return stop.value
        if after is not None:
            after(item)
        thrown = None
        try:
            sent = yield item
        except GeneratorExit:
            raise
        except BaseException as error:  # noqa: BLE001 (thrown in by the consumer: passed on)
            thrown, sent = error, None
