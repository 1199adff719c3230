"""Structures of values: what a function returns, with its leaves taken out and put back.

    def leaf(value):                          # a leaf's node, or None for anything else
        if is_data(value):
            found.append(value)
            return ("out", len(found) - 1)
        return None

    tree = flatten(result, leaf)              # its structure and its leaves' nodes
    value = unflatten(tree, lambda node: outputs[node[1]])

The structure is optree's (the library DALI itself uses for structures): tuples, lists, dicts
(their key order kept), namedtuples, OrderedDicts, defaultdicts, deques, and the types
registered with optree; dataclasses and subclasses of list and dict are registered here, in
ndd_trace's own optree namespace, at their first sight. Any other value is a static leaf,
returned as it is. Compiled functions, compiled loop bodies and per-sample functions keep their
outputs so, and hand back what eager returns: the same types, the same key order. Imports
nothing from DALI.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
from collections.abc import Callable, Generator, Iterator
from contextlib import AbstractContextManager, nullcontext
from typing import Any, NamedTuple

import optree

from . import process_state

NAMESPACE = "ndd_trace"


class Tree(NamedTuple):
    """A flattened structure: optree's spec, and per leaf its node (`("static", value)` for a
    value given back as it is)."""

    spec: Any
    nodes: list


def _fields_of(value: Any) -> tuple[list, Any, tuple]:
    names = tuple(field.name for field in dataclasses.fields(value))
    return [getattr(value, name) for name in names], (value, names), names


def _with_fields(meta: tuple, children: Any) -> Any:
    """A copy of the dataclass instance eager returned, its fields the new values (frozen
    ones too: the object is new)."""
    value, names = meta
    made = copy.copy(value)
    for name, child in zip(names, children):
        object.__setattr__(made, name, child)
    return made


def _items_of(value: Any) -> tuple[list, Any]:
    return list(value), value


def _with_items(value: Any, children: Any) -> Any:
    made = copy.copy(value)
    list.__setitem__(made, slice(None), list(children))  # (list's own: a subclass may override)
    return made


def _with_tuple_items(value: Any, children: Any) -> Any:
    """A tuple subclass's value remade as eager returned it: its items, its attributes (its
    `__new__` may take other arguments: `Sample(image, label)`, so it is not called)."""
    made = tuple.__new__(type(value), children)
    if hasattr(value, "__dict__"):
        made.__dict__.update(value.__dict__)
    for kind in type(value).__mro__:
        for name in getattr(kind, "__slots__", ()):
            if hasattr(value, name) and name not in ("__dict__", "__weakref__"):
                object.__setattr__(made, name, getattr(value, name))
    return made


def _mapping_of(value: Any) -> tuple[list, Any, list]:
    keys = list(value)
    return [value[key] for key in keys], (value, keys), keys


def _with_mapping(meta: tuple, children: Any) -> Any:
    value, keys = meta
    made = copy.copy(value)
    dict.clear(made)  # (dict's own: Counter.update would count the pairs)
    dict.update(made, zip(keys, children))
    return made


def _register(kind: type) -> bool:
    """Register a dataclass, or a subclass of list, tuple or dict, with optree (ndd_trace's own
    namespace): whether `kind` is one."""
    if dataclasses.is_dataclass(kind):
        optree.register_pytree_node(kind, _fields_of, _with_fields, namespace=NAMESPACE)
    elif issubclass(kind, list):
        optree.register_pytree_node(kind, _items_of, _with_items, namespace=NAMESPACE)
    elif issubclass(kind, tuple):
        optree.register_pytree_node(kind, _items_of, _with_tuple_items, namespace=NAMESPACE)
    elif issubclass(kind, dict):
        optree.register_pytree_node(kind, _mapping_of, _with_mapping, namespace=NAMESPACE)
    else:
        return False
    return True


def is_container(kind: type) -> bool:
    """Whether optree takes values of `kind` apart (registering it here where it is a
    dataclass or a container subclass)."""
    if kind in process_state.container_types:
        return True
    if kind in process_state.leaf_types:
        return False
    known = optree.register_pytree_node.get(kind, namespace=NAMESPACE) is not None or \
        optree.is_namedtuple_class(kind) or optree.is_structseq_class(kind)
    if not known:
        try:
            known = _register(kind)
        except ValueError:  # registered meanwhile (another thread)
            known = True
    (process_state.container_types if known else process_state.leaf_types).add(kind)
    return known




def holds_any(value: Any, found: Callable[[Any], bool]) -> bool:
    """Whether a container holds a leaf `found` accepts, at any depth (as flatten takes it
    apart)."""
    if not is_container(type(value)):
        return found(value)
    leaves = optree.tree_leaves(value, is_leaf=lambda item: not is_container(type(item)),
                                none_is_leaf=True, namespace=NAMESPACE)
    return any(found(leaf) for leaf in leaves)


def _in_own_order(mapping: collections.OrderedDict) -> None:
    """Store an OrderedDict's items in its own order: optree reads the order of the dict
    underneath, which `move_to_end` does not change (the items, their order and the object
    stay what the user sees)."""
    if list(mapping) != list(dict.keys(mapping)):
        items = list(mapping.items())
        mapping.clear()
        mapping.update(items)


def flatten(value: Any, leaf: Callable[[Any], tuple | None]) -> Tree:
    """The tree of `value`: `leaf(v)` gives the node of a leaf (None: not a leaf); a leaf met
    again (the same object) gets the node it got first, so that `unflatten` gives back one
    object there too, as eager returns one."""
    nodes: list = []
    raised: list[BaseException] = []
    seen: dict[int, tuple] = {}

    def is_leaf(item: Any) -> bool:
        if raised:
            return True
        node = seen.get(id(item))
        if node is not None:
            nodes.append(node)
            return True
        try:
            node = leaf(item)
        except BaseException as error:  # noqa: BLE001 (raised below, outside optree's frames)
            raised.append(error)
            return True
        if node is None:
            if is_container(type(item)):
                if isinstance(item, collections.OrderedDict):
                    _in_own_order(item)
                return False
            node = ("static", item)
        else:
            seen[id(item)] = node
        nodes.append(node)
        return True

    _, spec = optree.tree_flatten(value, is_leaf=is_leaf, none_is_leaf=True,
                                  namespace=NAMESPACE)
    if raised:  # (a graph break's traceback ends at the user's line, not in optree)
        raise raised[0]
    return Tree(spec, nodes)


def unflatten(tree: Tree, leaf: Callable[[tuple], Any]) -> Any:
    """The value of `tree`, each leaf node given by `leaf(node)` (once per node: a leaf that
    was one object is one object again); a `("copied", value)` node's value copied anew."""
    made: dict[tuple, Any] = {}
    copies: dict[int, Any] = {}
    leaves = []
    for node in tree.nodes:
        if node[0] == "static":
            leaves.append(node[1])
        elif node[0] == "copied":  # a value the function made: a new one at each call
            value = node[1]
            if id(value) not in copies:
                copies[id(value)] = copy.copy(value)
            leaves.append(copies[id(value)])
        elif node in made:
            leaves.append(made[node])
        else:
            leaves.append(leaf(node))
            made[node] = leaves[-1]
    return optree.tree_unflatten(tree.spec, leaves)


def map_leaves(value: Any, is_leaf: Callable[[Any], bool], visit: Callable[[tuple, Any], Any],
               path: tuple = ()) -> Any:
    """`value` rebuilt with each leaf replaced by `visit(path, leaf)`, through lists, tuples
    (not namedtuples: they are leaves' containers a caller passes as they are) and dicts."""
    if is_leaf(value):
        return visit(path, value)
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        items = [map_leaves(v, is_leaf, visit, path + (i,)) for i, v in enumerate(value)]
        if all(new is old for new, old in zip(items, value)):
            return value  # (no leaf in it: the very object, its type kept: an AttrDict's)
        return type(value)(items)
    if isinstance(value, dict):
        mapped = {k: map_leaves(v, is_leaf, visit, path + (k,)) for k, v in value.items()}
        if all(mapped[k] is v for k, v in value.items()):
            return value
        return mapped
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
