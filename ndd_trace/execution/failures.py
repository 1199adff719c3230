"""DALI's errors, mapped in one place: a pipeline's failure (building, feeding or running)
becomes the error eager ndd raises for the same call (its type and text, from an eager re-run
of the graph on the same data), with its traceback at the user's line that made the failing op;
and the errors eager raises at the call itself, not at the first use of a result.

    failures = Failures(graph, lowered, feed)
    error = failures.pipeline_error(dali_error, "running", eager=failures.eager_error_of(...))
    raise interpreted_error(graph, leaves, error)   # an interpreted run's failure, the same way
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from .. import _dali
from ..codegen.lower import Lowered
from ..core.errors import PipelineError, pipeline_error_type
from ..core.ir import Graph, Node, NodeKind
from ..core.source import (SourceLoc, hide_own_frames, may_be_caught, raise_at,
                           under_call_stack, without_call_stack)
from .feed import Feed
from .interpret import interpret

_REJECTED = "_ndd_trace_rejected_call"  # set on an eager re-run's error: DALI rejected the call
# an eager re-run's failed calls, held by the error raised for it: their operator instances stay
# out of eager's cache while the user keeps the error, as an eager call's kept error keeps its own
_HELD = "_ndd_trace_held_calls"

_GENERATED_LINE = re.compile(r'File "(<ndd_trace:[^>]*>)", line (\d+)')


def surfacing(error: BaseException, deferred: bool = False, index: int | None = None
              ) -> BaseException:
    """The exception a run's error is raised as at the first use of a result (output `index`
    of its run; None: the first that reads the failing op), as eager ndd's: a new "An error
    happened during asynchronous execution" (`deferred`: "... deferred evaluation", as for a
    call in EvalMode.deferred) of the operator error's type, caused by one such error per op
    between the failing op and that output's (each at its own line: eager re-raises the error
    in each invocation that evaluates a failed input), then by the op's own error (its
    traceback at the user's line), with its notes; other errors are raised as they are."""
    if not isinstance(error, PipelineError):
        return error
    if error.call_stack:  # (once: the frames its call was made from, outside the op's line)
        under_call_stack(error, error.call_stack)
        error.call_stack = ()
    links = error.consumers.get(index) if index is not None else None
    if links is None:
        links = next(iter(error.consumers.values()), ())
    cause: BaseException = error
    for loc, name, stack, own_mode in links:  # (the mode the function set for that call, if)
        link = type(error)(_dali.deferred_error_text(deferred if own_mode is None else own_mode),
                           loc, name)
        try:
            raise_at(link, loc)
        except PipelineError as raised:  # (it is `link`, with its traceback at `loc`)
            link = raised
        under_call_stack(link, stack)
        link.__cause__ = cause
        hide_own_frames(link)
        cause = link
    last_mode = links[-1][3] if links else error.own_mode
    wrapper = type(error)(_dali.deferred_error_text(deferred if last_mode is None else last_mode),
                          error.loc, error.op_name)
    wrapper.__cause__ = cause
    for note in getattr(error, "__notes__", ()):
        wrapper.add_note(note)
    return wrapper


class RunEagerly(Exception):
    """A call that runs eagerly instead (the generators as they were before it): its failure
    eager raises inside the function, under the user's `try`/`with`, so that code handles it;
    or an argument whose own run failed, which eager fails only the results that read."""


def _guarding_line(node: Node) -> str | None:
    """`file:line` of the op call `node`, or of a frame between the traced function and it,
    that is inside a `try` or `with` body (None: none is)."""
    lines = [(code.co_filename, line) for code, line in node.frames]
    if node.loc is not None:
        lines.insert(0, (node.loc.filename, node.loc.lineno))
    return next((f"{filename}:{line}" for filename, line in lines
                 if may_be_caught(filename, line)), None)


def stack_of(call: Node | None, outside: tuple) -> tuple:
    """The user's frames a call was made from: a recorded call's own (transparent mode), else
    those between a traced function and the call, then `outside` (the compiled call's)."""
    if call is None:
        return outside
    return getattr(call.state, "stack", ()) or call.frames + outside


def consumer_links(graph: Graph, failed: Node, call_of: Callable[[Node], Any],
                   outside: tuple = ()) -> dict[int, tuple]:
    """Per output of `graph` that reads `failed`: the ops eager's evaluation of it passes on the
    way to `failed` (each evaluates its inputs in order, then its argument inputs), innermost
    first, each as (its call's line, `ndd.<name>`, its call's stack: `stack_of(call_of(op),
    outside)`, the EvalMode the function set for it: `Node.deferred`)."""
    links: dict[int, tuple] = {}
    for index, output in enumerate(graph.outputs):
        path: list[Node] = []
        seen: set[int] = set()

        def reaches(node: Node) -> bool:
            if node is failed:
                return True
            if node.kind is not NodeKind.OP or id(node) in seen:
                return False
            seen.add(id(node))
            if any(reaches(ref.node) for ref in (*node.inputs, *node.arg_inputs.values())):
                path.append(node)  # (innermost first: appended as the search unwinds)
                return True
            return False

        if reaches(output.node):
            calls = [call_of(node) for node in path]
            links[index] = tuple(
                (call.loc, f"ndd.{node.name}", stack_of(call, outside), node.deferred)
                for node, call in zip(path, calls))
    return links


def op_error(eager: BaseException, node: Node | None, name: str | None, note: str,
             stack: tuple = ()) -> PipelineError:
    """`eager` (the error eager ndd raises for the call of `node`, which failed) as the
    PipelineError of its type and text, its traceback at the user's line that made the call;
    `note`: what ndd_trace adds (the op, the line, where it ran). `at_call`: DALI rejects the
    call itself (eager raises it at the call: `rejects_call`)."""
    loc: SourceLoc | None = node.loc if node is not None else None
    wrapped = pipeline_error_type(type(eager))(str(eager), loc, name)
    wrapped.at_call = bool(getattr(eager, _REJECTED, False))
    setattr(wrapped, _HELD, getattr(eager, _HELD, ()))
    what = f"`{name}`" if name else "an operator"
    where = f" (created at {loc})" if loc else ""
    wrapped.add_note(f"ndd_trace: raised by {what}{where} {note}")
    if loc is None:
        return wrapped
    try:
        raise_at(wrapped, loc)
    except PipelineError as raised:  # (it is `wrapped`, with its traceback at `loc`)
        wrapped = raised
    wrapped.call_stack = stack  # (shown where it surfaces later: `surfacing`)
    wrapped.__context__ = None  # the failed run is not a context of eager's error
    hide_own_frames(wrapped)
    return wrapped


def _op_by_op(graph: Graph, leaves: dict, batch_size: int | None = None
              ) -> tuple[dict | None, BaseException | None, Node | None]:
    """`graph` run on `leaves` op by op, each call synchronous: its values, or the error that
    stopped it and the op whose call raised it (an error of a call DALI rejects itself marked
    so: `op_error`'s `at_call`)."""
    failed: list[tuple[Node, bool]] = []
    try:
        with _dali.synchronous():
            values = interpret(graph, leaves, batch_size, failed)
            for value in values.values():
                value.evaluate()
        return values, None, None
    except Exception as error:  # noqa: BLE001 (returned as the run's error)
        if failed and failed[0][1]:
            setattr(error, _REJECTED, True)
        return None, error, (failed[0][0] if failed else None)


def eager_replay(graph: Graph, leaves: dict, batch_size: int | None = None
                 ) -> tuple[BaseException, Node | None] | None:
    """What eager ndd raises for a run of `graph` on `leaves`, and the op whose call raised it:
    the graph run op by op, each call synchronous (a pipeline reports every failure as a
    RuntimeError; eager ndd raises the operator's own type, a ValueError for a layout it
    rejects)."""
    with _dali.native_logs_dropped():  # (the failed run logged what the ops log: not twice)
        _, error, node = _op_by_op(graph, leaves, batch_size)
    if error is None:
        return None
    # its text and type are used, not its traceback, whose frames would hold it (a cycle);
    # its failed calls are held instead, so long as the error raised for it lives
    setattr(error, _HELD, _dali.invocations_held_by(error))
    return error.with_traceback(None), node


def interpreted_op_error(eager: BaseException, node: Node, deferred: bool | None = None,
                         graph: Graph | None = None, read: int | None = None,
                         held: tuple | None = None) -> BaseException:
    """The failure of `node`'s call in an interpreted run (`eager`: eager's error for it) as a
    pipeline run's: the op's own error at the user's line, as a result's first use raises it
    (`deferred`: whether the call was made in EvalMode.deferred; None: the mode now); `held`:
    the calls it holds, where not `eager`'s (`_HELD`)."""
    own = op_error(eager, node, f"ndd.{node.name}", "while running it eagerly (interpreted)",
                   stack_of(node, ()))  # (a recorded call's own, as a run's)
    if held is not None:
        setattr(own, _HELD, held)
    own.own_mode = node.deferred
    if graph is not None:
        own.consumers = consumer_links(graph, node, lambda op: op)
    return surfacing(own, _dali.eval_mode_is_deferred() if deferred is None else deferred, read)


# Raising without a cycle: an error raised from a local variable is held by its own
# traceback's frame, a cycle that only a garbage collection frees; with it live the DALI
# operator instances of the failed calls, which eager ndd reuses once their invocation is
# freed (a GPU decoder made anew for the next call cost ~270 ms on an H100). Such frames
# delete the local as they raise.


def interpret_at_once(graph: Graph, leaves: dict, deferred: bool | None = None,
                      read: int | None = None) -> dict:
    """`interpret(graph, leaves)`, each call run at once (synchronous): a failure raises as
    `interpreted_error` raises it, without running the graph again to find the op (a region
    that runs eagerly after failed runs, where failures are expected)."""
    values, failure, node = _op_by_op(graph, leaves)
    if failure is None:
        return values
    raised = failure if node is None else interpreted_op_error(failure, node, deferred, graph,
                                                               read)
    try:  # (no local left referring to it: raising without a cycle)
        raise raised
    finally:
        del raised, failure


def interpreted_error(graph: Graph, leaves: dict, error: BaseException,
                      deferred: bool | None = None, read: int | None = None,
                      deferred_failure: bool = False) -> BaseException:
    """The error an interpreted run of `graph` (`interpret(graph, leaves)`, which raised `error`)
    is raised as: as a pipeline run's (`surfacing` of the failed op's own error, at the user's
    line of its call), so that the call that runs it at once raises the op's own error as
    eagerly (see lazy's `_run_at_call`); `error` itself where a synchronous replay names no
    op. `deferred_failure`: raised at a result's use, not at the call."""
    replayed = eager_replay(graph, leaves)
    if replayed is None or replayed[1] is None:
        return error
    eager, node = replayed
    first = _first_runs_own_error(error)
    if first is not None and type(first) is type(eager):
        # the first run's own error: its calls met eager's operator cache as eager would (the
        # replay's find their instances taken, and build them anew)
        setattr(first, _REJECTED, getattr(eager, _REJECTED, False))
        # the replay's calls held by the error raised, and by `first` (in DALI's cycle until a
        # collection) where the failure is deferred, as eager's failed run holds its call
        held, eager = getattr(eager, _HELD, ()), first.with_traceback(None)
        if deferred_failure:
            setattr(first, _HELD, held)
        return interpreted_op_error(eager, node, deferred, graph, read, held)
    return interpreted_op_error(eager, node, deferred, graph, read)


def _first_runs_own_error(error: BaseException) -> BaseException | None:
    """The operator's own error under DALI's "An error happened during asynchronous execution"
    (or "... deferred evaluation"), which raises it as its cause; None for any other error."""
    cause = error.__cause__
    if cause is None or str(error) not in (_dali.deferred_error_text(True),
                                           _dali.deferred_error_text(False)):
        return None
    return cause


def validated_at_call(node: Node) -> bool:
    """Whether eager ndd checks `node`'s call against the real metadata of what it reads, at
    the call (its operator's `_init_spec`, in every EvalMode): where the traced metadata of an
    input (or tensor argument) lacks its ndim or type, eager runs that input at the call to
    learn it, and a call DALI rejects (a layout for the input's ndim) raises there."""
    return bool(unknown_inputs(node))


def unknown_inputs(node: Node) -> list[Node]:
    """The ops `node` reads whose traced metadata lacks an ndim or a type (see
    `validated_at_call`)."""
    unknown = []
    for key, ref in (*enumerate(node.inputs), *node.arg_inputs.items()):
        meta = ref.node.meta[ref.index]
        if ref.node.kind is NodeKind.OP and (meta.ndim is None or (
                meta.dtype is None and key not in node.arg_casts)):
            unknown.append(ref.node)
    return unknown


USER_DATA = ("a constant that wraps user data",)  # (an argument path: a tuple)


def _given_user_data(path: Any, bound: dict) -> bool:
    """Whether what an op reads as it is at `path` (an argument's, or `USER_DATA`) wraps user
    data in this call (eager then runs the op at the call)."""
    return path is USER_DATA or _dali.wraps_user_data(bound.get(path))


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
        self._validated: list[Node] = []  # the ops `validated_at_call`, with it
        self._data_dependent: list[Node] = []  # those of them checked at every call
        self._accepted = False  # a run waited for at the call went through
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
        run's batch size), each call synchronous (`eager_replay`)."""
        replayed = eager_replay(self.graph, leaves, batch_size)
        return replayed[0] if replayed is not None else None

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
                        calls: list[Node] | None = None, stack: tuple = ()) -> PipelineError:
        """The operator's error as eager ndd raises it at the call: eager's type and text (from
        the eager re-run `eager`, else the operator's message in DALI's report, a RuntimeError),
        its traceback at the user's line that made the call (of `calls`, where the run stands
        for other calls than the graph's own); what ndd_trace adds (the op, the line, the
        pipeline) is a note. DALI's own report stays on it as `dali_error`. `stack`: the user's
        frames of the call the run stands for, outside the op's line (a recorded call's own,
        in transparent mode)."""
        failed = self.node_for_error(error)
        node = self.call_of(failed, calls)
        failure = _dali.pipeline_failure(error)
        name = f"ndd.{node.name}" if node is not None else failure.ndd_name
        wrapped = op_error(eager if eager is not None else RuntimeError(failure.message), node,
                           name, f"while {stage} pipeline {self.lowered.filename}",
                           stack_of(node, stack))
        wrapped.own_mode = failed.deferred if failed is not None else None
        if failed is not None and stage == "running":
            wrapped.consumers = consumer_links(self.graph, failed,
                                               lambda op: self.call_of(op, calls), stack)
        # the pipeline's report, not a context; its traceback (DALI's fetch, this package's
        # callers) dropped: their frames would hold it, a cycle (see interpret_at_once's note)
        wrapped.dali_error = error.with_traceback(None)
        return wrapped

    def run_error(self, error: BaseException, eager: BaseException | None,
                  run: Any) -> PipelineError:
        """pipeline_error of a failed run (a results.PendingRun): its calls' and its stack's."""
        return self.pipeline_error(error, "running", eager, run.calls, run.call_stack)

    def eager_error_of(self, bound: dict, states: dict, batch_size: int) -> BaseException | None:
        """What eager ndd raises for a call with these arguments and random states (a failed
        run's replay)."""
        return self.eager_error(self.leaves_of(bound, states), batch_size)

    # -- errors at the call --------------------------------------------------------------------
    #
    # Eager ndd runs an op call at once where an input or tensor argument wraps user data as it
    # is (`ndd.as_batch(arrays)`, `ndd.as_tensor(torch_tensor)`: DALI's `has_external_inputs`),
    # with the pending calls it reads; their run-time errors raise at that call, and the calls
    # after it never happen (nor draw random states). It also checks every call against the
    # real metadata of its inputs, running those whose metadata it cannot infer
    # (`validated_at_call`): a call DALI rejects then raises at the call. A compiled call given
    # such data, or making such a call, waits for its run, so that such an error raises at the
    # call too, with the generators where eager's stand; any other failure stays for the first
    # use of a result, as eagerly.

    def ops_run_at_call(self, bound: dict) -> list[Node]:
        """The ops eager ndd would run (or check with what they read run) at the call, given
        these arguments (usually none)."""
        fed = self._fed_as_they_are
        if fed is None:
            fed = self._fed_as_they_are = self._ops_fed_as_they_are()
            self._validated = [node for node in self.graph.nodes_of(NodeKind.OP)
                               if validated_at_call(node)]
            self._data_dependent = [node for node in self._validated if any(
                key != "_random_state" for read in unknown_inputs(node)
                for op in (read, *_cone(read)) for key in op.arg_inputs)]
        # once a run went through, they accepted what they read, as they do again: the same
        # graph, fed data of the same metadata (the guard key), unless a tensor argument's
        # values decide what an op they read gives
        validated = self._data_dependent if self._accepted else self._validated
        if not fed:
            return list(validated)
        run = {id(node): node for node, path in fed if _given_user_data(path, bound)}
        run.update((id(node), node) for node in validated)
        return list(run.values())

    def _raises_at(self, node: Node, failed: Node, error: BaseException, bound: dict) -> bool:
        """Whether eager raises the failure of op `failed` at the call of `node`."""
        if any(op is node and _given_user_data(path, bound)
               for op, path in self._fed_as_they_are or ()):
            return node is failed or failed in _cone(node)  # run at once, with what it reads
        if node is failed:  # checked at once: raises there if DALI rejects the call itself
            return bool(getattr(error, "at_call", False))
        return any(failed is read or failed in _cone(read) for read in unknown_inputs(node))

    def _ops_fed_as_they_are(self) -> list[tuple[Node, Any]]:
        """(op, argument path) where the op reads a call argument without converting it (same
        device, batch or sample as the call, no cast): what eager hands the op as it is; (op,
        `USER_DATA`) where it so reads a constant that wraps user data (an `ndd.as_batch(arrays)`
        made in the function or held in a global), which eager runs at every call."""
        fed: list[tuple[Node, Any]] = []
        for node in self.graph.nodes_of(NodeKind.OP):
            for index, ref in enumerate(node.inputs):
                leaf = ref.node
                if leaf.kind is NodeKind.INPUT and leaf.is_batch == node.is_batch and \
                        leaf.meta[ref.index].device == node.input_devices[index]:
                    fed.append((node, leaf.payload))
                elif leaf.kind is NodeKind.CONSTANT and _dali.eager_reads_as_is(
                        leaf.payload, node.is_batch) == node.input_devices[index]:
                    fed.append((node, USER_DATA))
            for key, ref in node.arg_inputs.items():
                leaf = ref.node
                if key in node.arg_casts:
                    continue
                if leaf.kind is NodeKind.INPUT and leaf.is_batch == node.is_batch and \
                        leaf.meta[ref.index].device == "cpu":
                    fed.append((node, leaf.payload))
                elif leaf.kind is NodeKind.CONSTANT and \
                        _dali.eager_reads_as_is(leaf.payload, node.is_batch) == "cpu":
                    fed.append((node, USER_DATA))
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
        """Wait for `run`; if an op of `at_call` failed (or an op it reads) as eager would see
        at the call (`_raises_at`), raise as eager does there: the op's own error (an op it
        reads: eager's error for a result used), after putting back the draws of the random
        ops called after it."""
        try:
            run.result()
            self._accepted = True
            return
        except Exception:  # noqa: BLE001 (kept in the run, for the first use of a result)
            pass
        failed = run.failed
        if failed is None or run.error is None:
            return
        first = next((node for node in sorted(at_call, key=lambda n: n.index)
                      if self._raises_at(node, failed, run.error, bound)), None)
        if first is None:
            return
        for rng, snapshot in snapshots:
            _dali.rng_restore(rng, snapshot)
        guard = _guarding_line(first)
        if guard is not None:  # eager raises it inside the function, whose code may handle it
            raise RunEagerly(f"`ndd.{first.name}` (called at {first.loc}) failed at the call, "
                             f"inside a `try` or `with` at {guard}, which may handle its error")
        for slot, state in self._feed.draws:  # eager called the ops before `first`, and drew
            if state.index < first.index:
                _dali.draw_state(self._feed.rng_for(slot, bound))
        if failed is not first:
            raise surfacing(run.error, run.deferred)
        own = without_call_stack(run.error)  # (raised from the call's own frames, as eager's)
        if first.frames:  # a helper between the function and the op: eager's traceback has it
            under_call_stack(own, first.frames)
        raise own
