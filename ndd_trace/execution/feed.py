"""What a pipeline is fed: per call, one item per external source in lowering order (a call's
argument, a random state drawn in eager's order, a constant made once), kept alive while DALI
reads it in place.

    feed = Feed(graph, lowered, draws, prefetch_queue_depth, rng_objects)
    states = feed.draw_states(bound)               # from the caller's generators, in call order
    feed.into(pipeline, feed.call_data(bound, states, batch_size))
"""

from __future__ import annotations

import collections
from typing import Any

from .. import _dali
from ..codegen.lower import Lowered
from ..core.ir import Graph, Node, NodeKind

_FROM_ARGUMENT, _DRAWN_PER_CALL, _OTHER = "argument", "drawn per call", "other"


class Feed:
    """The data side of one Executable: its external sources, constants, draws and what DALI
    still reads."""

    def __init__(self, graph: Graph, lowered: Lowered, draws: list, prefetch_queue_depth: int,
                 rng_objects: dict[int, Any]):
        self.graph = graph
        self.draws = draws
        self.rng_objects = rng_objects
        self._constants: dict[tuple, Any] = {}
        self.cache_constants = True  # off where each run brings new constant nodes
        # Fed with no_copy: DALI reads the buffers in place until the iteration's outputs are
        # consumed and `prefetch_queue_depth` more iterations have run; keep them alive so long.
        self._fed: collections.deque = collections.deque(maxlen=2 * prefetch_queue_depth + 2)
        # per call, in lowering order: (external source name, how its data is found)
        self.names = list(lowered.feed_names)
        # per external source, in lowering order: what a call feeds it, found without
        # re-reading the node (an argument's path, a state drawn per call, or anything else)
        self._sources = [self._source_kind(node) for node in lowered.external_sources]
        # an op that crashes the process in a pipeline on a sample with no elements: each
        # call's data is checked for one (feeds_empty_sample), and such calls run eagerly
        self.empty_sample_unsafe = any(
            node.kind is NodeKind.OP and _dali.crashes_on_empty_samples(node.schema)
            for node in graph.nodes)

    def rng_for(self, slot: tuple, bound: dict) -> Any:
        kind = slot[0]
        if kind == "default":
            return _dali.default_rng()
        if kind == "arg":
            return bound[slot[1]]
        return self.rng_objects[slot[1]]

    def _data_for(self, node: Node, bound: dict, states: dict[int, Any], batch_size: int) -> Any:
        if node.kind is NodeKind.RANDOM_STATE:
            if isinstance(node.payload, tuple) and node.payload[0] == "drawn":
                return _dali.broadcast_state(node.payload[1], batch_size)
            return _dali.broadcast_state(states[id(node)], batch_size)
        if node.kind is NodeKind.INPUT:
            value = bound[node.payload]
        else:
            value = node.payload
        if isinstance(value, _dali.Batch):
            if node.kind is NodeKind.INPUT and node.feed_in_place:
                return _dali.owned_storage(value)
            return _dali.storage_of(value)
        key: tuple = (id(node), batch_size)
        cache = self.cache_constants and node.kind is NodeKind.CONSTANT
        if not cache and type(value) in (int, float, bool):
            # a Python scalar (a fresh constant node per run in transparent mode): the same
            # value gives the same data; repr tells -0.0 from 0.0 and keeps nan equal to nan
            key, cache = (type(value), repr(value), batch_size), True
        cached = self._constants.get(key) if cache else None
        if cached is not None:
            return cached
        data = _dali.storage_of(_dali.to_batch(value, batch_size))
        if cache:
            if len(self._constants) >= 256:  # scalars that change every run: keep it bounded
                self._constants.clear()
            self._constants[key] = data
        return data

    @staticmethod
    def _source_kind(node: Node) -> tuple:
        if node.kind is NodeKind.INPUT:
            return _FROM_ARGUMENT, node.payload, node
        if node.kind is NodeKind.RANDOM_STATE and not (
                isinstance(node.payload, tuple) and node.payload[0] == "drawn"):
            return _DRAWN_PER_CALL, id(node), node
        return _OTHER, None, node

    def draw_states(self, bound: dict) -> dict[int, Any]:
        """Draw every random op's state, in eager call order, from the caller's generators."""
        states: dict[int, Any] = {}
        for slot, node in self.draws:
            states[id(node)] = _dali.draw_state(self.rng_for(slot, bound))
        return states

    def call_data(self, bound: dict, states: dict[int, Any], batch_size: int) -> list:
        """What one call feeds, one item per external source in lowering order."""
        data = []
        batch_type = _dali.Batch
        for kind, where, node in self._sources:
            if kind is _FROM_ARGUMENT:
                value = bound[where]
                if type(value) is batch_type:
                    data.append(_dali.owned_storage(value) if node.feed_in_place
                                else _dali.storage_of(value))
                    continue
            elif kind is _DRAWN_PER_CALL:
                data.append(_dali.broadcast_state(states[where], batch_size))
                continue
            data.append(self._data_for(node, bound, states, batch_size))
        return data

    def feeds_empty_sample(self, bound: dict | None = None, leaves: list | None = None) -> bool:
        """Whether a call with these arguments (or a region with these fed leaves) would feed
        a sample with no elements to a pipeline that crashes on one (empty_sample_unsafe)."""
        if not self.empty_sample_unsafe:
            return False
        if leaves is not None:
            return any(leaf.kind is NodeKind.CONSTANT and _dali.has_empty_sample(leaf.payload)
                       for leaf in leaves)
        return any(kind is _FROM_ARGUMENT and _dali.has_empty_sample(bound[where])
                   for kind, where, _ in self._sources)

    @property
    def empty_sample_reason(self) -> str:
        """Why a call that feeds a sample with no elements runs eagerly, naming the op."""
        node = next(node for node in self.graph.nodes if node.kind is NodeKind.OP
                    and _dali.crashes_on_empty_samples(node.schema))
        return (f"a sample with no elements (a zero-size dimension) is fed to ndd.{node.name} "
                f"(called at {node.loc or '?'}), which crashes a DALI pipeline on one; eager ndd "
                "runs it")

    def leaf_data(self, leaf: Node, batch_size: int) -> Any:
        """What a fed leaf (constant or drawn random state) gives the pipeline."""
        return self._data_for(leaf, {}, {}, batch_size)

    def into(self, pipeline: Any, data: list) -> None:
        """Feed one iteration's external sources (in lowering order), keeping the data alive."""
        for name, item in zip(self.names, data):
            _dali.feed(pipeline, name, item)
        self._fed.append(data)

    def keep_fed(self, prefetch_queue_depth: int) -> None:
        """Keep what is fed as long as a pipeline of this depth may read it."""
        self._fed = collections.deque(self._fed, maxlen=2 * prefetch_queue_depth + 2)

    def forget_fed(self) -> None:
        """Nothing reads what was fed any more (the pipeline is gone)."""
        self._fed.clear()
