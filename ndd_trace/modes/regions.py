"""Transparent mode's region runner: when a lazy value is read, the pending calls it depends
on (its region) run as one DALI pipeline, looked up by the region's structure, or are taken
from a run the speculator launched ahead, or are interpreted where no pipeline can run them.

    runner = RegionRunner(options, speculator)
    data = runner.materialize(ref)        # the TensorList of that output, its region run
"""

from __future__ import annotations

import dataclasses
import types
import time
from typing import Any

from .. import _dali
from ..ahead.runahead import runs_ahead
from ..ahead.speculator import Speculator
from ..core import logs
from ..core.ledger import Verdict
from ..core.ir import Graph, Node, NodeKind, Ref, op_key
from ..core.source import site_of
from ..core.keys import FedPart, RegionOutputs
from ..execution.failures import interpret_at_once, interpreted_error
from ..execution.interpret import interpret
from ..execution.results import PendingRun
from ..units.build import compile_graph
from ..execution.runtime import Options
from ..units.cache import LIVE_PIPELINES, REGIONS, Found
from .report import Region, bookkeeping, site_full


class RegionRunner:
    """Runs the regions of one tracer's recorded calls (regions are shared by all threads, in
    units/cache.py's REGIONS)."""

    def __init__(self, options: Options, speculator: Speculator):
        self.options = options
        self.speculator = speculator
        self.optimize = False  # regions get optimize.py's rewrites (enable(optimize=True))
        self.calls_deferred = False  # a call was recorded in EvalMode.deferred (_made_deferred)
        # a region run at a call (lazy's _run_at_call: its failure raises at the call, as an
        # eager call given user data raises); else at a use, as a deferred failure (interpreted)
        self.at_call = False

    def materialize(self, ref: Ref) -> Any:
        """Run the pending region `ref` depends on; return that output's TensorList."""
        node = ref.node
        if node.state.results is None:
            self.run(node, ref.index)
        return node.state.results[ref.index]

    def run(self, target: Node, read: int = 0) -> None:
        """Run the pending ops `target` depends on as a region; `read`: the output of `target`
        asked for (a failure surfaces as eager's evaluation of that output raises it)."""
        started = time.perf_counter()
        region_ops = self.pending_cone(target)
        view = region_view(region_ops, target, clone=False)
        position = view.outputs.index((target, read))  # (the region's output asked for)
        key = view.key
        batch_sizes = set()
        one_value_random = False
        for n in region_ops:
            if n.is_batch:
                batch_sizes.add(int(n.batch_size))
            elif "_random_state" in n.arg_inputs:
                one_value_random = True
        batch_size = max(batch_sizes) if batch_sizes else 1
        # a random op in sample mode draws one value; in a batch pipeline, one per sample: with
        # batches of more than one sample, the region is one of its own (run eagerly)
        own_region = one_value_random and batch_size > 1
        lookup = (key, "batches") if own_region else key
        if self.optimize:  # (regions are shared by threads, which may differ in this)
            lookup = (lookup, "optimize")
        record_s = time.perf_counter() - started
        mixed = len(batch_sizes) > 1 or own_region
        with REGIONS.lock:
            region, found = REGIONS.lookup(
                lookup, lambda: self._new_region(
                    key, region_ops, target, mixed,
                    None if mixed else self._eager_at_site(region_ops, lookup)),
                keep=lambda made: made.eager_reason is None or mixed, explain=False)
            REGIONS.sightings.called(region.site)
            if found is Found.HIT:
                region.hits += 1
            elif found is Found.NEW:
                logs.transparent.info("new region at %s: %s (%s)", region.loc or "?",
                                      region.op_chain, region.eager_reason or "pipeline")
            region.run_count += 1
            region.record_s += record_s
            if region.executable is not None:
                LIVE_PIPELINES.note_run(region)
        times = bookkeeping.times
        checked = time.perf_counter()
        times["key"] += checked - started
        observation = (self.speculator.observe(view.leaves, view.computed)
                       if region.executable is not None else None)
        ahead = (self.speculator.take(region.token, observation) if observation is not None
                 else None)
        fed = time.perf_counter()
        times["check"] += fed - checked
        failed_ahead = ahead if isinstance(ahead, PendingRun) and \
            ahead.executable is region.executable else None
        if ahead is not None and not isinstance(ahead, PendingRun):
            outputs = list(ahead)
            with bookkeeping.lock:
                region.ahead += 1
        elif region.executable is None or (region.executable.feed.empty_sample_unsafe and
                                           self._empty_sample_call(region, view.leaves)):
            outputs = self._interpreted(region_view(region_ops, target, clone=True),
                                        deferred=self._made_deferred(region_ops),
                                        read=position, at_call=self.at_call)
        elif failed_ahead is None and self._eager_after_failure(region):
            outputs = self._interpreted(region_view(region_ops, target, clone=True), True,
                                        self._made_deferred(region_ops), position)
        else:
            try:
                builds = region.executable.builds
                run_s = region.executable.run_s
                started = time.perf_counter()
                run = (region.executable.failed_again(failed_ahead, view.leaves, batch_size,
                                                      region_ops) if failed_ahead is not None
                       else region.executable.run_leaves(view.leaves, batch_size, region_ops))
                run.deferred = self._made_deferred(region_ops)
                if region.executable.builds != builds:
                    region.build_s += time.perf_counter() - started
                waited = time.perf_counter()
                scheduled = region.executable.run_s - run_s
                times["feed"] += waited - fed - scheduled
                times["run"] += scheduled
                outputs = list(run.result(position))
                times["fetch"] += time.perf_counter() - waited
            except Exception:
                retired = region.executable.retired  # (its failed pipelines cannot be freed)
                if region.executable.builds and retired is None:
                    raise
                region.executable = None  # the pipeline cannot be built: interpret from now on
                region.verdict = Verdict.eager_variant(retired or "pipeline build failed",
                                                       region.loc)
                logs.fallbacks.info("region at %s: %s, interpreted eagerly", region.loc or "?",
                                    region.eager_reason)
                outputs = None
            if outputs is None:  # (outside the handler: the failed run is no context)
                return self.run(target, read)
        logs.transparent.debug("region at %s ran (%s)", region.loc or "?",
                               "run ahead" if ahead is not None else f"run {region.run_count}")
        if observation is not None and region.executable is not None:
            learned = time.perf_counter()
            self.speculator.learn(region.token, region.executable, observation, batch_size)
            times["check"] += time.perf_counter() - learned
        for (original, index), output in zip(view.outputs, outputs):
            if original.state.results is None:
                original.state.results = [None] * original.num_outputs
            original.state.results[index] = output
            if all(r is not None for r in original.state.results):
                _settle_proxies(original)

    def _made_deferred(self, region_ops: list[Node]) -> bool:
        """Whether the region's calls were made in EvalMode.deferred: the mode eager's error
        text names, not the one the region runs in (DALI reads a sample in EvalMode.deferred)."""
        return self.calls_deferred and any(op.state.deferred for op in region_ops)

    @staticmethod
    def _interpreted(view: _RegionView, at_once: bool = False, deferred: bool = False,
                     read: int | None = None, at_call: bool = True) -> list:
        """The region's outputs, its calls run eagerly (`at_once`: synchronously, failures
        expected); a failure raised as a pipeline run's (`interpreted_error`: the failed op's
        own error at its line, as a result's first use reads it: of output `read`; `at_call`:
        raised at the call, else at a use, as a deferred failure)."""
        leaves = {id(leaf): _leaf_value(leaf) for leaf in view.leaves}
        if at_once:
            values = interpret_at_once(view.graph, leaves, deferred, read)
            return [_dali.storage_of(values[ref]) for ref in view.graph.outputs]
        try:
            values = interpret(view.graph, leaves)
            return [_dali.storage_of(values[ref]) for ref in view.graph.outputs]
        except Exception as error:  # noqa: BLE001 (raised below, outside the handler)
            failure = error
        raised = interpreted_error(view.graph, leaves, failure, deferred, read,
                                   deferred_failure=not at_call)
        try:  # (no local left referring to it: failures.py, raising without a cycle)
            raise raised
        finally:
            del raised, failure

    @staticmethod
    def _empty_sample_call(region: Region, leaves: list[Node]) -> bool:
        """Whether this run feeds a sample with no elements to an op that crashes a pipeline on
        one: it runs eagerly (interpreted), counted with the reason."""
        executable = region.executable
        if not executable.feed.feeds_empty_sample(leaves=leaves):
            return False
        REGIONS.ledger.tally(region.op_chain, Verdict.eager_call(
            executable.feed.empty_sample_reason, region.loc))
        logs.fallbacks.debug("region at %s runs eagerly: %s", region.loc or "?",
                             executable.feed.empty_sample_reason)
        return True

    @staticmethod
    def _eager_after_failure(region: Region) -> bool:
        """Whether this run is interpreted eagerly, the region's pipeline dropped by a failed
        run lately (runtime.RebuildBackoff), counted with the reason."""
        reason = region.executable.eager_after_failure()
        if reason is None:
            return False
        REGIONS.ledger.tally(region.op_chain, Verdict.eager_call(reason, region.loc))
        logs.fallbacks.debug("region at %s runs eagerly: %s", region.loc or "?", reason)
        return True

    @staticmethod
    def _eager_at_site(region_ops: list[Node], lookup: tuple) -> str | None:
        """Why a new region is not made with a pipeline at its line, counted with the reason
        (this call runs eagerly), or None (counted at its line): past REGIONS.free_units made
        there, one is made once worth it (units/cache.Sightings); past REGIONS.site_limit, none."""
        loc = region_ops[0].loc
        site = site_of(loc)
        verdict = REGIONS.site_verdict(site, lookup)
        if verdict is None:
            return None
        reason = site_full() if verdict is Found.PAST_LIMIT else (
            f"a new region at a line that made {REGIONS.free_units} or more: it is made once "
            "calls of its ops and arguments have taken as long as making it")
        chain = " -> ".join(f"{node.name}[{node.backend}]" for node in region_ops)
        REGIONS.ledger.tally(chain, Verdict.eager_call(reason, loc))
        logs.fallbacks.debug("region at %s: %s", site, reason)
        return reason

    def _new_region(self, key: tuple, region_ops: list[Node], target: Node,
                    mixed_batch_sizes: bool, eager_reason: str | None = None) -> Region:
        loc = region_ops[0].loc if region_ops else None
        started = time.perf_counter()
        if mixed_batch_sizes:
            return Region(key=key, loc=loc, num_ops=len(region_ops),
                          verdict=Verdict.eager_variant("batches of different sizes, or a "
                                                        "one-value random op among batches, in "
                                                        "one region", loc))
        if eager_reason is not None:
            return Region(key=key, loc=loc, num_ops=len(region_ops),
                          verdict=Verdict.eager_variant(eager_reason, loc))
        graph = region_view(region_ops, target, clone=True).graph
        program = compile_graph(graph, self.options, optimize=self.optimize,
                                cache_constants=False, runs_ahead=runs_ahead)
        region = Region(key=key, loc=loc, num_ops=len(region_ops), executable=program.executable,
                        code=program.lowered.source, optimizations=program.optimizations)
        region.build_s = time.perf_counter() - started  # lowering; the build is added on run
        return region

    @staticmethod
    def pending_cone(target: Node) -> list[Node]:
        """The unmaterialized op calls `target` depends on, in call order."""
        seen: dict[int, Node] = {}
        stack = [target]
        while stack:
            node = stack.pop()
            if id(node) in seen or node.kind is not NodeKind.OP or node.state.results is not None:
                continue
            seen[id(node)] = node
            stack.extend(ref.node for ref in node.inputs)
            stack.extend(ref.node for ref in node.arg_inputs.values())
        return sorted(seen.values(), key=lambda n: n.index)


@dataclasses.dataclass
class _RegionView:
    """A pending region as a pipeline sees it: its structure key (op names, static arguments,
    edges, leaf kinds; no data), the values it is fed, and which of them an earlier region
    computed; `graph` is a self-contained copy, made only where one is needed (a new region,
    or one the interpreter runs)."""

    key: tuple
    leaves: list[Node]
    computed: list[bool]
    outputs: list[tuple[Node, int]]  # (recorded node, output index) the region gives back
    graph: Graph | None


def region_view(region_ops: list[Node], target: Node, clone: bool) -> _RegionView:
    """The region of `region_ops` (in call order) giving back `target`'s outputs, and those of
    calls whose values are still held; its key's parts are labelled `in0`, ... (fed values),
    `op0`, ... (op calls, reading others by label) and `outputs` (core/keys.py prints them)."""
    graph = Graph("region")  # the fed leaves, and the copied ops where `clone`
    labels: dict[int, str] = {}  # id(recorded op) -> its label in the key
    copies: dict[int, Node] = {}
    fed: dict[tuple[int, int], tuple[str, Ref]] = {}
    parts: list[tuple[str, Any]] = []
    leaves: list[Node] = []
    computed: list[bool] = []

    def mapped(ref: Ref) -> tuple[str, int, Ref | None]:
        node = ref.node
        if id(node) in labels:
            copy = Ref(copies[id(node)], ref.index) if clone else None
            return labels[id(node)], ref.index, copy
        key = (id(node), ref.index)
        if key not in fed:
            leaf = _make_leaf(graph, node, ref.index)
            label = f"in{len(leaves)}"
            fed[key] = (label, Ref(leaf, 0))
            parts.append((label, FedPart(leaf.kind is NodeKind.RANDOM_STATE, leaf.meta[0],
                                         leaf.is_batch, leaf.feed_in_place)))
            leaves.append(leaf)
            computed.append(node.kind is NodeKind.OP)
        label, leaf_ref = fed[key]
        return label, 0, leaf_ref

    for node in region_ops:
        inputs = [mapped(ref) for ref in node.inputs]
        arg_inputs = [(name, mapped(ref)) for name, ref in node.arg_inputs.items()]
        label = labels[id(node)] = f"op{len(labels)}"
        parts.append((label, op_key(
            node, tuple((read, index) for read, index, _ in inputs),
            tuple(sorted((name, read, index) for name, (read, index, _) in arg_inputs)))))
        if clone:
            fields = {f.name: getattr(node, f.name) for f in dataclasses.fields(Node)
                      if f.name not in ("index", "kind", "name", "schema", "inputs",
                                        "arg_inputs", "state")}
            copies[id(node)] = graph.add_op(
                node.name, node.schema, **fields, inputs=[ref for *_, ref in inputs],
                arg_inputs={name: ref for name, (*_, ref) in arg_inputs},
                # the call's own frames only (not its results): an interpreted run's error is
                # shown under them, as a pipeline run's is (failures.op_error)
                state=types.SimpleNamespace(stack=node.state.stack))
    outputs = [(node, index) for node in region_ops
               if node is target or any(proxy() is not None for proxy in node.state.proxies)
               for index in range(node.num_outputs)]
    parts.append(("outputs", RegionOutputs(tuple((labels[id(node)], index)
                                                 for node, index in outputs))))
    if clone:
        graph.outputs = [Ref(copies[id(node)], index) for node, index in outputs]
    return _RegionView(tuple(parts), leaves, computed, outputs, graph if clone else None)


def checked_call_key(node: Node) -> tuple | None:
    """What eager ndd's check of `node`'s call (lazy's `_accepts`) depends on: the structure
    and the fed data's metadata of the pending calls it reads, itself included; None where an
    op it reads takes a tensor argument, whose values may decide what that op gives."""
    ops = RegionRunner.pending_cone(node)
    if any(key != "_random_state" for op in ops if op is not node for key in op.arg_inputs):
        return None
    return region_view(ops, node, clone=False).key


def _make_leaf(graph: Graph, node: Node, index: int) -> Node:
    """The fed leaf standing for output `index` of `node`, outside the region."""
    if node.kind is NodeKind.OP:  # materialized earlier: its data is fed
        data = node.state.results[index]
        value = _dali.wrap_batch(data) if node.is_batch else _dali.wrap_tensor(data)
        # the data's own metadata (inference may not know the layout), so that regions fed
        # differently laid-out data get different pipelines
        leaf = graph.add_constant(value, _dali.meta_of(value), node.is_batch, None)
        if leaf.meta[0].device == "cpu":
            leaf.feed_in_place = True  # a pipeline's output: nobody writes to it
        return leaf
    if node.kind is NodeKind.RANDOM_STATE:
        return graph.add_random_state(node.payload, node.loc)
    leaf = graph.add_constant(node.payload, node.meta[0], node.is_batch, None)
    leaf.static = dict(node.static)
    leaf.feed_in_place = node.feed_in_place
    return leaf


def _leaf_value(leaf: Node) -> Any:
    if leaf.kind is NodeKind.RANDOM_STATE:
        return leaf.payload[1]
    return leaf.payload


def _settle_proxies(node: Node) -> None:
    node.state.proxies = []  # (its values read its results from now on)
