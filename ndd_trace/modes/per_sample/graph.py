"""A per-sample function's pipeline as the shared IR: every operator its definition makes (its
ndd calls, the splits and merges of DALI's conditionals, DataNode arithmetic) becomes a graph
node, its external sources become inputs, and the graph is lowered, built and run as every other
compiled unit's (units/build.py).

    graph, definition = trace(function, converted, parameters, args, options)
    # (inside: a GraphRecorder gets each operator DALI reports, `_dali.defined_ops(recorder.add)`,
    # while DALI's AutoGraph runs the rewritten function; `recorder.finish(outputs)` is the
    # straight-line graph, its branches spelled as splits and merges)
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from ... import _dali
from ...core import process_state, trees
from ...core.ir import Graph, Ref, TensorMeta
from ...core.passes import eliminate_dead_code
from ...core.source import SourceLoc, is_internal_file
from .conditions import Item
from .definition import (SAMPLE_INDEX, Definition, EagerLoop, call_location, handler,
                         logical_guess)
from .gather import is_number


class GraphRecorder:
    """Builds the Graph of one pipeline definition from the operators DALI reports."""

    def __init__(self, name: str, feed_path: Callable[[str], tuple],
                 locate: Callable[[], SourceLoc | None]):
        self.graph = Graph(name)
        self._feed_path = feed_path  # external source name -> the input path it is fed from
        self._locate = locate
        self._refs: dict[int, Ref] = {}  # id(DataNode) -> its graph value
        self._alive: list = []  # the DataNodes seen (their ids stay theirs)

    def add(self, op: Any) -> None:  # a _dali.DefinedOp
        if op.feed_name is not None:
            static = op.static
            meta = TensorMeta(op.backend, _dali.dtype_name(static.get("dtype")),
                              static.get("ndim"), static.get("layout") or None)
            node = self.graph.add_input(op.feed_name, self._feed_path(op.feed_name), meta, True)
        else:
            node = self.graph.add_op(
                op.fn_path, op.schema, backend=op.backend,
                inputs=[self._ref(data) for data in op.inputs],
                input_devices=[data.device for data in op.inputs],
                arg_inputs={name: self._ref(data) for name, data in op.arg_inputs.items()},
                static=dict(op.static), num_outputs=len(op.outputs),
                meta=[TensorMeta("gpu" if out.device == "gpu" else "cpu")
                      for out in op.outputs],
                loc=self._locate())
        for index, output in enumerate(op.outputs):
            self._refs[id(output)] = Ref(node, index)
            self._alive.append(output)

    def _ref(self, data: Any) -> Ref:
        ref = self._refs.get(id(data))
        if ref is None:  # (every DataNode of a definition comes from an operator it made)
            raise RuntimeError(f"ndd_trace: a per-sample pipeline reads {data!r}, which its "
                               "definition did not make")
        return ref

    def finish(self, outputs: tuple) -> Graph:
        """The graph whose outputs are `outputs` (DataNodes), without the ops none reads."""
        self.graph.outputs = [self._ref(data) for data in outputs]
        self._alive.clear()
        eliminate_dead_code(self.graph)
        self.graph.verify()
        return self.graph


def _flatten(value: Any, outputs: list) -> Any:
    """The output tree of a per-sample function's result; its DataNodes go into `outputs`."""
    def leaf(item: Any) -> tuple | None:
        if isinstance(item, Item):  # read back as Python numbers, batched as eager's loop does
            outputs.append(item.node)
            return ("number", len(outputs) - 1)
        if _dali.is_data_node(item):
            outputs.append(item)
            return ("out", len(outputs) - 1)
        if is_number(item):  # the same number for every sample, batched as eager's loop does
            return ("constant", item)
        return None

    return trees.flatten(value, leaf)


def _not_definable(definition: Definition, error: Exception) -> EagerLoop:
    """The eager per-sample loop for a function whose pipeline could not be defined (DALI's
    conditionals run both branches of every per-sample `if` while defining it: a `raise` in a
    branch no sample takes, a variable or `return` set in one branch only, ...): the loop runs
    the function as written, with eager's results or eager's error, at eager's moment."""
    message, frames = _dali.definition_error(error)
    loc = None
    for filename, lineno in frames:  # innermost first: the user's line (a helper's too)
        if definition.is_rewritten(filename):
            loc = SourceLoc(definition.filename, definition.user_lines.get(lineno, lineno),
                            definition.name)
        elif not is_internal_file(filename) and not filename.startswith("<"):
            loc = SourceLoc(filename, lineno, "")
        if loc is not None:
            break
    message = message.splitlines()[-1] if message else type(error).__name__
    if "inconsistent outputs" in message:
        why = ("sets a variable (or returns) in one branch of a per-sample `if` only; DALI "
               "merges both branches for every sample. Set it in every branch (or before the "
               "`if`) to run it as one pipeline")
    else:
        why = ("raised while both branches of its per-sample `if`s were defined (each runs "
               "once for all samples, taken or not)")
    return EagerLoop(f"could not be defined as one pipeline: {why} ({message})", loc)


def trace(function: Callable, converted: Any, parameters: list[str], args: tuple,
          options: dict[str, Any], observe: bool = True) -> tuple[Graph, Definition]:
    """Define the pipeline of these arguments (the rewritten function run by DALI's
    AutoGraph) and record it as a graph: every operator the definition makes, DALI's
    conditional splits and merges included, and its external sources as inputs."""
    code = function.__code__
    definition = Definition(code.co_filename, code.co_name, observe,
                            converted_filename=converted.filename,
                            user_lines=converted.user_lines)
    feeds: dict[str, tuple] = {SAMPLE_INDEX: ("sample_index",)}

    def make_inputs() -> list:
        values = []
        for index, value in enumerate(args):
            if isinstance(value, _dali.Batch):
                meta = _dali.meta_of(value)
                name = parameters[index] if index < len(parameters) else f"arg{index}"
                feeds[name] = ("args", index)
                node = _dali.input_node(name, meta.device, meta.dtype, meta.ndim,
                                        meta.layout)
                definition.input_keys[_dali.node_key(node)] = index
                values.append(node)
            else:
                values.append(value)
        return values

    def outputs(result: Any) -> tuple:
        flat: list = []
        definition.output_tree = _flatten(result, flat)
        definition.num_outputs = len(flat)
        if not flat:  # (Python values alone: the eager loop gathers them, ndd.batch each)
            raise EagerLoop("returns no ndd value, only Python values: there is no pipeline to "
                            "run", call_location(definition))
        return (*flat, *definition.reach_nodes)

    _dali.do_not_convert(make_inputs)
    _dali.do_not_convert(outputs)

    def feed_path(name: str) -> tuple:  # an argument's, the sample index's, a random op's
        if name in feeds:
            return feeds[name]
        return ("random", [site.source for site in definition.random_sites].index(name))

    recorder = GraphRecorder(code.co_name, feed_path, lambda: call_location(definition))
    defined: list = []

    def pipeline_definition():
        defined[:] = outputs(converted.function(*make_inputs()))
        return tuple(defined)

    previous = process_state.per_sample_scope.definition
    process_state.per_sample_scope.definition = definition
    try:
        with _dali.intercept(functools.partial(handler, definition)), \
                _dali.logical_hooks(functools.partial(logical_guess, definition)), \
                _dali.defined_ops(recorder.add):
            _dali.conditional_pipeline(pipeline_definition, **options)
    except Exception as error:
        if process_state.per_sample_scope.raised is not None:
            raise  # ours: a refusal, or the decision to run the eager loop
        raise _not_definable(definition, error) from None
    finally:
        process_state.per_sample_scope.definition = previous
    return recorder.finish(tuple(defined)), definition
