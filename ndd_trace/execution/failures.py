"""DALI's errors, mapped in one place: a pipeline's failure (building, feeding or running)
becomes the error eager ndd raises for the same call (its type and text, from an eager re-run
of the graph on the same data), with its traceback at the user's line that made the failing op;
and the errors eager raises at the call itself, not at the first use of a result.

    failures = Failures(graph, lowered, feed)
    error = failures.pipeline_error(dali_error, "running", eager=failures.eager_error_of(...))
"""

from __future__ import annotations

import re
from typing import Any

from .. import _dali
from ..codegen.lower import Lowered
from ..core.errors import PipelineError, pipeline_error_type
from ..core.ir import Graph, Node, NodeKind
from ..core.source import SourceLoc, hide_own_frames, raise_at
from .feed import Feed
from .interpret import interpret

_GENERATED_LINE = re.compile(r'File "(<ndd_trace:[^>]*>)", line (\d+)')


def surfacing(error: BaseException, deferred: bool = False) -> BaseException:
    """The exception a run's error is raised as at the first use of a result, as eager ndd's: a
    new "An error happened during asynchronous execution" (`deferred`: "... deferred
    evaluation", as for a call in EvalMode.deferred) of the operator error's type, caused by it
    (its traceback at the user's line), with its notes; other errors are raised as they are."""
    if not isinstance(error, PipelineError):
        return error
    wrapper = type(error)(_dali.deferred_error_text(deferred), error.loc, error.op_name)
    wrapper.__cause__ = error
    for note in getattr(error, "__notes__", ()):
        wrapper.add_note(note)
    return wrapper


def _cone(node: Node) -> set[Node]:
    """The ops `node` reads, directly or not."""
    seen: dict[int, Node] = {}
    stack = [ref.node for ref in (*node.inputs, *node.arg_inputs.values())]
    while stack:
        other = stack.pop()
        if other.kind is NodeKind.OP and id(other) not in seen:
            seen[id(other)] = other
            stack.extend(ref.node for ref in (*other.inputs, *other.arg_inputs.values()))
    return set(seen.values())


class Failures:
    """The error side of one Executable (see the module's docstring)."""

    def __init__(self, graph: Graph, lowered: Lowered, feed: Feed):
        self.graph = graph
        self.lowered = lowered
        self._feed = feed
        self._fed_as_they_are: list[tuple[Node, tuple]] | None = None  # see ops_run_at_call
        self._op_positions: dict[int, int] | None = None  # id(op node) -> its position

    def node_for_error(self, error: BaseException) -> Node | None:
        match = None
        for match in _GENERATED_LINE.finditer(str(error)):
            if match.group(1) == self.lowered.filename:
                node = self.lowered.line_map.get(int(match.group(2)))
                if node is not None:
                    return node
        return None

    def eager_error(self, leaves: dict, batch_size: int) -> BaseException | None:
        """What eager ndd raises for a failed run: its graph run op by op on the same data (the
        run's batch size), each call synchronous (a pipeline reports every failure as a
        RuntimeError; eager ndd raises the operator's own type, a ValueError for a layout it
        rejects)."""
        try:
            with _dali.synchronous():
                for value in interpret(self.graph, leaves, batch_size).values():
                    value.evaluate()
        except Exception as error:  # noqa: BLE001 (returned as the run's error)
            return error
        return None

    def leaves_of(self, bound: dict, states: dict) -> dict:
        leaves: dict = {}
        for node in self.graph.nodes:
            if node.kind is NodeKind.RANDOM_STATE:
                drawn = isinstance(node.payload, tuple) and node.payload[0] == "drawn"
                leaves[id(node)] = node.payload[1] if drawn else states.get(id(node))
            elif node.kind is NodeKind.CONSTANT:
                leaves[id(node)] = node.payload
            elif node.kind is NodeKind.INPUT:
                leaves[id(node)] = bound[node.payload]
        return leaves

    def call_of(self, node: Node | None, calls: list[Node] | None) -> Node | None:
        """The recorded call `node` (an op of the graph) stands for in a run of `calls`."""
        if node is None or calls is None:
            return node
        if self._op_positions is None:
            self._op_positions = {id(op): position for position, op in
                                  enumerate(self.graph.nodes_of(NodeKind.OP))}
        position = self._op_positions.get(id(node))
        return calls[position] if position is not None and position < len(calls) else node

    def pipeline_error(self, error: BaseException, stage: str,
                        eager: BaseException | None = None,
                        calls: list[Node] | None = None) -> PipelineError:
        """The operator's error as eager ndd raises it at the call: eager's type and text (from
        the eager re-run `eager`, else the operator's message in DALI's report, a RuntimeError),
        its traceback at the user's line that made the call (of `calls`, where the run stands
        for other calls than the graph's own); what ndd_trace adds (the op, the line, the
        pipeline) is a note. DALI's own report stays on it as `dali_error`."""
        node = self.call_of(self.node_for_error(error), calls)
        loc: SourceLoc | None = node.loc if node is not None else None
        failure = _dali.pipeline_failure(error)
        name = f"ndd.{node.name}" if node is not None else failure.ndd_name
        kind = type(eager) if eager is not None else RuntimeError
        wrapped = pipeline_error_type(kind)(str(eager) if eager is not None else failure.message,
                                            loc, name)
        wrapped.dali_error = error
        what = f"`{name}`" if name else "an operator"
        where = f" (created at {loc})" if loc else ""
        wrapped.add_note(f"ndd_trace: raised by {what}{where} while {stage} pipeline "
                         f"{self.lowered.filename}")
        if loc is None:
            return wrapped
        try:
            raise_at(wrapped, loc)
        except PipelineError as raised:  # (it is `wrapped`, with its traceback at `loc`)
            wrapped = raised
        wrapped.__context__ = None  # the pipeline's report is `dali_error`, not a context
        hide_own_frames(wrapped)
        return wrapped

    def eager_error_of(self, bound: dict, states: dict, batch_size: int) -> BaseException | None:
        """What eager ndd raises for a call with these arguments and random states (a failed
        run's replay)."""
        return self.eager_error(self.leaves_of(bound, states), batch_size)

    # -- errors at the call --------------------------------------------------------------------
    #
    # Eager ndd runs an op call at once where an input or tensor argument wraps user data as it
    # is (`ndd.as_batch(arrays)`, `ndd.as_tensor(torch_tensor)`: DALI's `has_external_inputs`),
    # with the pending calls it reads; their run-time errors raise at that call, and the calls
    # after it never happen (nor draw random states). A compiled call given such data waits for
    # its run, so that such an error raises at the call too, with the generators where eager's
    # stand; any other failure stays for the first use of a result, as eagerly.

    def ops_run_at_call(self, bound: dict) -> list[Node]:
        """The ops eager ndd would run at the call, given these arguments (usually none)."""
        fed = self._fed_as_they_are
        if fed is None:
            fed = self._fed_as_they_are = self._ops_fed_as_they_are()
        if not fed:
            return []
        return [node for node, path in fed if _dali.wraps_user_data(bound.get(path))]

    def _ops_fed_as_they_are(self) -> list[tuple[Node, tuple]]:
        """(op, argument path) where the op reads a call argument without converting it (same
        device, batch or sample as the call, no cast): what eager hands the op as it is."""
        fed = []
        for node in self.graph.nodes_of(NodeKind.OP):
            for index, ref in enumerate(node.inputs):
                leaf = ref.node
                if leaf.kind is NodeKind.INPUT and leaf.is_batch == node.is_batch and \
                        leaf.meta[ref.index].device == node.input_devices[index]:
                    fed.append((node, leaf.payload))
            for key, ref in node.arg_inputs.items():
                leaf = ref.node
                if leaf.kind is NodeKind.INPUT and key not in node.arg_casts and \
                        leaf.is_batch == node.is_batch and leaf.meta[ref.index].device == "cpu":
                    fed.append((node, leaf.payload))
        return fed

    def rng_snapshots(self, bound: dict) -> list[tuple[Any, Any]]:
        """The generators this call draws from, as they are before it draws."""
        seen: dict[int, tuple[Any, Any]] = {}
        for slot, _ in self._feed.draws:
            rng = self._feed.rng_for(slot, bound)
            if id(rng) not in seen:
                seen[id(rng)] = (rng, _dali.rng_snapshot(rng))
        return list(seen.values())

    def raise_at_call(self, run: Any, at_call: list[Node], bound: dict,
                      snapshots: list[tuple[Any, Any]]) -> None:
        """Wait for `run`; if an op of `at_call` failed (or an op it reads), raise as eager
        does at the call: the op's own error (an op it reads: eager's error for a result used),
        after putting back the draws of the random ops called after it."""
        try:
            run.result()
            return
        except Exception:  # noqa: BLE001 (kept in the run, for the first use of a result)
            pass
        failed = run.failed
        if failed is None or run.error is None:
            return
        first = next((node for node in sorted(at_call, key=lambda n: n.index)
                      if node is failed or failed in _cone(node)), None)
        if first is None:
            return
        for rng, snapshot in snapshots:
            _dali.rng_restore(rng, snapshot)
        for slot, state in self._feed.draws:  # eager called the ops before `first`, and drew
            if state.index < first.index:
                _dali.draw_state(self._feed.rng_for(slot, bound))
        raise run.error if failed is first else surfacing(run.error, run.deferred)
