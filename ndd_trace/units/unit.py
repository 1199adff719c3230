"""A compiled unit, what every mode caches: its key, its executable (or none) and its verdict
(compiled, or why its calls run otherwise). Entries (a compiled function's), regions
(transparent mode's), variants (a per-sample function's) and reader streams (ahead/streams.py)
are units with their own fields.

    entry = Entry(key=key, graph=graph, executable=program.executable)
    entry.eager                  # whether its calls run otherwise (entry.verdict says why)
    entry.release()              # free its pipeline (built again when it runs again)

Also here: the data arguments of a call (`bind_data`), read by every front end.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar

from .. import _dali
from ..codegen.lower import Lowered
from ..core import trees
from ..core.ir import Graph, NodeKind, Ref
from ..core.ledger import Verdict
from ..execution.results import LazyOutput
from ..execution.runtime import Executable
from ..tracing.trace import GraphBreakRecord


@dataclasses.dataclass(eq=False)
class Unit:
    """What the cache holds: a key, an executable (None: not built, or runs eagerly) and the
    verdict on its calls (compiled until decided otherwise)."""

    key: tuple = ()
    executable: Executable | None = None
    verdict: Verdict = dataclasses.field(default_factory=Verdict.compiled)
    num_ops: int = 0
    optimizations: list = dataclasses.field(default_factory=list)  # optimize.Applied, in order
    releases: int = 0  # times its pipeline was freed as the least recently run (rebuilt on use)
    make_s: float = 0.0  # seconds its making took (a trace, lowering), before its builds
    pinned: ClassVar[bool] = False  # never freed as the least recently run (a reader stream's)

    @property
    def site(self) -> str | None:
        """Where its cache's Sightings count its calls: None (a compiled function's units),
        a file:line (a region's)."""
        return None

    @property
    def eager(self) -> bool:
        return self.verdict.eager

    @property
    def eager_reason(self) -> str | None:
        return self.verdict.reason if self.verdict.eager else None

    def release(self) -> bool:
        """Free its pipeline once its runs in flight are done; whether there was one."""
        if self.executable is not None and self.executable.release():
            self.releases += 1
            return True
        return False

    def close(self) -> None:
        if self.executable is not None:
            self.executable.close()


@dataclasses.dataclass(eq=False)
class Entry(Unit):
    """A compiled function's unit: a traced graph, or the decision to run eagerly (its verdict,
    with the graph breaks that made it)."""

    graph: Graph | None = None
    graph_text: str = ""
    lowered: Lowered | None = None
    output_tree: Any = None
    static_batch_size: int | None = None
    breaks: list[GraphBreakRecord] = dataclasses.field(default_factory=list)

    def call_batch_size(self, bound: dict, sizes: set[int]) -> tuple[int, str | None, str]:
        """This call's batch size, and why its pipeline cannot run it (None: it can), with what
        to add to that: batches of different sizes, an empty batch, or an empty sample fed to
        an op that crashes a pipeline on one; the call then runs eagerly."""
        batch_size = max(sizes) if sizes else None
        consistent = len(sizes) <= 1
        if batch_size is None:
            batch_size = self.static_batch_size or 1
        elif self.static_batch_size is not None and self.static_batch_size != batch_size:
            consistent = False
        if not consistent or batch_size == 0:  # a pipeline cannot run an empty batch
            return batch_size, ("an empty batch" if batch_size == 0 and consistent else
                                f"batches of different sizes ({sorted(sizes)}, traced with "
                                f"{self.static_batch_size})"), \
                " (a pipeline runs one batch size per iteration)"
        feed = self.executable.feed
        if feed.empty_sample_unsafe and feed.feeds_empty_sample(bound):
            return batch_size, feed.empty_sample_reason, ""
        return batch_size, None, ""

    def results(self, run: Any, bound: dict, batch_size: int, args: tuple = (),
                kwargs: dict | None = None) -> Any:
        """What the call returns, as the function returned it: its outputs fetched from `run`
        when first used, its arguments returned as they are (`args`, `kwargs`: the call's), the
        batch size as this call's."""
        def leaf(node: tuple) -> Any:
            if node[0] == "batch_size":
                return batch_size
            if node[0] == "argument":
                where, name = node[1]
                return args[name] if where == "args" else (kwargs or {})[name]
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
        return self.verdict.runs.value


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


