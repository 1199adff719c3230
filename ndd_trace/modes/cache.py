"""A compiled function's cache: its entries by guard key (keyed through tracing/guards.py), the
counters, the last call's fast guard, the cache limit and why the last miss missed.

    cache = EntryCache(function, "preprocess", limit=8, positional_names=("jpegs", "size"))
    entry = cache.fast_hit(args) or ...            # the last call's entry, without a key
    entry, found = cache.lookup(cache.key(args, kwargs), trace)   # Found.HIT, Found.NEW, ...

It owns no tracing and runs nothing: a miss calls the `trace` it is given (stage.py's).
"""

from __future__ import annotations

import dataclasses
import enum
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, NamedTuple

from .. import _dali
from ..codegen.lower import Lowered
from ..core import keys, logs, trees
from ..core.ledger import Ledger, Runs, Verdict
from ..core.ir import Graph, NodeKind, Ref
from ..execution.results import LazyOutput
from ..execution.runtime import Executable
from ..tracing import guards
from ..tracing.trace import GraphBreakRecord


class Found(enum.Enum):
    """How a lookup found its key's entry."""

    HIT = "hit"
    NEW = "new"  # traced now
    PAST_LIMIT = "past cache_limit"  # not traced: cache_limit entries are held
    TRACE_FAILED = "trace failed"  # tracing raised (the eager call raises the same way, or not)


class CacheInfo(NamedTuple):
    """Counters of a compiled function's cache (`fn.cache_info()`): hits, misses, traces,
    fallbacks (calls not compiled whole) and the entries held."""

    hits: int
    misses: int
    traces: int
    fallbacks: int
    entries: int


@dataclasses.dataclass
class Entry:
    """One cache entry: a compiled graph, or the decision to run eagerly (with the reason)."""

    key: tuple
    graph: Graph | None = None
    graph_text: str = ""
    lowered: Lowered | None = None
    executable: Executable | None = None
    output_tree: Any = None
    static_batch_size: int | None = None
    breaks: list[GraphBreakRecord] = dataclasses.field(default_factory=list)
    verdict: Verdict | None = None  # why its calls do not run as compiled (None: they do)
    num_ops: int = 0
    runs: Runs = Runs.ONE_PIPELINE  # how its calls run
    optimizations: list = dataclasses.field(default_factory=list)  # optimize.Applied (optimize)

    @property
    def eager(self) -> bool:
        return self.verdict is not None

    @property
    def eager_reason(self) -> str | None:
        return self.verdict.reason if self.verdict is not None else None

    def results(self, run: Any, bound: dict, batch_size: int) -> Any:
        """What the call returns, as the function returned it: its outputs fetched from `run`
        when first used, its arguments returned as they are, the batch size as this call's."""
        def leaf(node: tuple) -> Any:
            if node[0] == "batch_size":
                return batch_size
            index, is_batch = node[1], node[2]
            ref: Ref = self.graph.outputs[index]
            if ref.node.kind is NodeKind.INPUT:
                return bound[ref.node.payload]
            lazy = LazyOutput(run, index, is_batch, self.executable.output_device(index))
            if is_batch:
                return _dali.lazy_batch(lazy)
            return _dali.Tensor(invocation_result=lazy)

        return trees.unflatten(self.output_tree, leaf)

    @property
    def path(self) -> str:
        """How its calls run, as explain says it ("one pipeline", "transparent mode", ...)."""
        return self.runs.value


def _is_data(value: Any) -> bool:
    return isinstance(value, (_dali.Batch, _dali.Tensor, _dali.RNG))


def walk_data(value: Any, path: tuple, visit: Callable[[tuple, Any], Any]) -> Any:
    """Rebuild `value`, replacing Batches, Tensors and RNGs found in lists/tuples/dicts."""
    return trees.map_leaves(value, _is_data, visit, path)


def bind_data(args: tuple, kwargs: dict) -> tuple[dict[tuple, Any], set[int]]:
    """The data arguments (Batches, Tensors, RNGs) by path and the batch sizes of the Batch
    ones, in one walk (plain positional Batch/Tensor arguments, the common case, inline)."""
    bound: dict[tuple, Any] = {}
    sizes: set[int] = set()
    batch, tensor, rng = _dali.Batch, _dali.Tensor, _dali.RNG
    for index, value in enumerate(args):
        kind = type(value)
        if kind is batch:
            bound[("args", index)] = value
            sizes.add(value.batch_size)
        elif kind is tensor or kind is rng:
            bound[("args", index)] = value
        elif isinstance(value, (list, tuple, dict, batch, tensor, rng)):
            break
    else:
        if not kwargs:
            return bound, sizes
    bound.clear()
    sizes.clear()

    def visit(path: tuple, value: Any) -> Any:
        bound[path] = value
        if isinstance(value, _dali.Batch):
            sizes.add(value.batch_size)
        return value

    walk_data(args, ("args",), visit)
    walk_data(kwargs, ("kwargs",), visit)
    return bound, sizes


def batch_sizes(args: tuple, kwargs: dict) -> set[int]:
    """The batch sizes of the Batch arguments."""
    return bind_data(args, kwargs)[1]


class EntryCache:
    """The entries of one compiled function, by guard key, and the guard plan that keys them."""

    def __init__(self, function: Callable, name: str, limit: int,
                 positional_names: tuple[str, ...], ledger: Ledger):
        self._function = function
        self._name = name
        self.limit = limit
        self._positional_names = positional_names
        self.plan = guards.plan_for(function)
        self.entries: OrderedDict[tuple, Entry] = OrderedDict()
        self.ledger = ledger  # its counters are the cache's
        self.lock = threading.RLock()
        self.specialized_on_batch_size = False  # keys hold the batch size (a trace read it)
        self.last_key: tuple | None = None
        self.last_miss_reason: str | None = None
        self._fast: guards.FastGuard | None = None  # the last entry's guard, checked first

    # -- keys ----------------------------------------------------------------------------------

    def replan(self) -> None:
        """Plan the guards again: the helpers the function calls may have changed."""
        self.plan = guards.plan_for(self._function)

    def key(self, args: tuple, kwargs: dict) -> tuple:
        sizes = None
        if self.specialized_on_batch_size:
            found = batch_sizes(args, kwargs)
            sizes = max(found) if found else None
        return guards.build_key(args, kwargs, self.plan, (sizes,) if sizes else None,
                                self._positional_names)

    def specialize_on_batch_size(self) -> None:
        """From now on keys hold the batch size (a trace read it as a Python value)."""
        self.specialized_on_batch_size = True
        self._fast = None

    # -- lookups -------------------------------------------------------------------------------

    def fast_hit(self, args: tuple, kwargs: dict) -> Entry | None:
        """The last call's entry where this call matches its fast guard (counted as a hit)."""
        fast = self._fast
        if fast is None or kwargs or fast.plan is not self.plan or not fast.matches(args):
            return None
        entry = fast.entry
        with self.lock:
            self.ledger.counters.hits += 1
            self.last_key = entry.key
        return entry

    def remember_fast(self, args: tuple, kwargs: dict, entry: Entry) -> None:
        """Check this entry first at the next call (calls without keyword arguments)."""
        if not kwargs and not self.specialized_on_batch_size:
            self._fast = guards.FastGuard.of(args, self.plan, entry)

    def lookup(self, key: tuple, trace: Callable[[], Entry | None]
               ) -> tuple[Entry | None, Found]:
        """The entry for this key, made by `trace` on a miss, and how it was found."""
        with self.lock:
            entry = self.entries.get(key)
            if entry is not None:
                self.ledger.counters.hits += 1
                self.last_key = key
                return entry, Found.HIT
            self.ledger.counters.misses += 1
            self.last_miss_reason = keys.explain_miss(key, self.last_key)
            (logs.recompiles if self.entries else logs.trace).info(
                "`%s`: cache miss (%d of cache_limit %d entries held): %s", self._name,
                len(self.entries), self.limit, self.last_miss_reason)
            if len(self.entries) >= self.limit:
                return None, Found.PAST_LIMIT  # (the caller records the verdict)
            self.ledger.counters.traces += 1
            entry = trace()
            if entry is None:
                return None, Found.TRACE_FAILED  # (the caller records the verdict)
            self.entries[entry.key] = entry
            self.last_key = key
            return entry, Found.NEW

    def store(self, key: tuple, entry: Entry) -> None:
        self.entries[key] = entry

    def last_entry(self) -> Entry | None:
        return self.entries.get(self.last_key) if self.last_key is not None else None

    # -- the public face -----------------------------------------------------------------------

    def info(self) -> CacheInfo:
        c = self.ledger.counters
        return CacheInfo(c.hits, c.misses, c.traces, c.fallbacks, len(self.entries))

    def clear(self) -> None:
        with self.lock:
            for entry in self.entries.values():
                if entry.executable is not None:
                    entry.executable.close()
            self.entries.clear()
            self._fast = None
            self.ledger.clear()
