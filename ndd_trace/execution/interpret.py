"""Run a graph with eager ndd: the reference semantics, and the fallback when a pipeline fails.

    values = interpret(graph, leaves)      # leaves: node -> concrete Batch/Tensor or words
    values[Ref(node, 0)]                   # an ndd.Batch

Random ops get back the exact state recorded for them (through a generator that replays the
drawn words), so an interpreted graph gives the values the pipeline would, and draws nothing new.
"""

from __future__ import annotations

from typing import Any

from .. import _dali
from ..core import passes
from ..core.ir import Graph, Node, NodeKind, Ref, TensorMeta
from ..tracing.trace import inference_metas


def interpret(graph: Graph, leaves: dict[Any, Any], batch_size: int | None = None,
              failed: list[tuple[Node, bool]] | None = None) -> dict[Ref, Any]:
    """Evaluate every op node of `graph` eagerly; `leaves` maps id(node) (or (id(node), output
    index)) -> value for the other nodes (inputs, constants, random-state words, readers).
    `batch_size`: the batch size of the run being replayed (a pipeline runs every batch op at
    it; the graph holds the batch size it was recorded or traced with). `failed`: where an op
    call raises, (that op, whether DALI rejects the call itself: `rejects_call`) is appended to
    it (in a synchronous EvalMode, the op whose own error it is)."""
    values: dict[Ref, Any] = {}

    def value_of(ref: Ref) -> Any:
        return values[ref] if ref.node.kind is NodeKind.OP else leaf_value(leaves, ref)

    with _dali.eager_inside_trace():
        for node in graph.nodes:
            if node.kind is not NodeKind.OP:
                continue
            function = _dali.op_function_of(node.op_class)
            call_args: dict[str, Any] = {}
            for key, ref in node.arg_inputs.items():
                if key == "_random_state":
                    call_args["rng"] = _dali.ReplayRNG(value_of(ref))
                else:
                    call_args[key] = value_of(ref)
            inputs = [value_of(ref) for ref in node.inputs]
            device = "gpu" if node.backend in ("gpu", "mixed") else "cpu"
            # (a batch op given no Batch input, a Tensor's `choice(options, batch_size=4)`
            # included, was given its batch size)
            own_size = int(node.batch_size if batch_size is None else batch_size) \
                if node.is_batch and not any(isinstance(value, _dali.Batch) for value in inputs) \
                else None
            try:
                if _split_at_call_site(node):  # (its site's split: this line shows no constant)
                    result = _dali.call_split(node.op_class, inputs, device, own_size,
                                              node.static, call_args)
                else:
                    kwargs = {**node.static, **call_args}
                    for name in _dali.required_keywords(function):
                        kwargs.setdefault(name, None)  # (given None: not recorded)
                    if own_size is not None:
                        kwargs["batch_size"] = own_size
                    result = function(*inputs, device=device, **kwargs)
            except Exception:
                if failed is not None:
                    failed.append((node, rejects_call(node, value_of)))
                raise
            if node.num_outputs == 1:
                values[Ref(node, 0)] = result
            else:
                items = list(result.values()) if isinstance(result, dict) else list(result)
                for index, item in enumerate(items):
                    values[Ref(node, index)] = item
    return values


def leaf_value(leaves: dict[Any, Any], ref: Ref) -> Any:
    """The value of an output of a node that is no op (an input, a constant, random-state
    words, a reader) in `interpret`'s `leaves`."""
    if (id(ref.node), ref.index) in leaves:  # one entry per output of multi-output leaves
        return leaves[(id(ref.node), ref.index)]
    return leaves[id(ref.node)]


def _split_at_call_site(node: Node) -> bool:
    """Whether the recorded call passed a tensor argument as a construction argument (a
    number written at the call: `stddev=2.0`), which a call from here would pass per call."""
    return any(_dali.is_tensor_argument(node.op_class, key) for key in node.static)


def rejects_call(node: Node, value_of: Any) -> bool:
    """Whether DALI rejects `node`'s call given the real metadata of what it reads (`value_of`:
    Ref -> the value an op computed): the check eager ndd makes at every call (its operator's
    `_init_spec`, which runs the inputs whose metadata it cannot infer), as opposed to a
    failure of the op's run."""

    def real(ref: Ref) -> TensorMeta:
        if ref.node.kind is not NodeKind.OP:
            return ref.node.meta[ref.index]
        return _dali.meta_of(value_of(ref))

    try:
        input_metas, arg_metas = inference_metas(
            [real(ref) for ref in node.inputs], node.input_devices,
            {key: real(ref) for key, ref in node.arg_inputs.items()}, node.arg_casts)
    except Exception:  # noqa: BLE001 (an input that failed itself: not this call's rejection)
        return False
    try:
        _dali.infer_metadata(node.op_class, node.backend, node.static, input_metas, arg_metas)
    except Exception:  # noqa: BLE001 (DALI's verdict on the call)
        return True
    return False


def interpret_unaffected(graph: Graph, failed: Node, leaves: dict[Any, Any],
                         batch_size: int | None = None) -> list | None:
    """The outputs of `graph` that do not read the op `failed` (a failed pipeline run's), as
    eager ndd gives them: eager fails only the results that use a failing call, and computes
    the others. Their ops are interpreted on the run's `leaves`, each call synchronous; per
    output a TensorList, None where it reads `failed`, or (eager's error, the op) where it
    reads another op that fails on its own (that op's results fail with its own error, as
    eagerly). None where no output is unaffected."""
    failing: dict[int, tuple] = {id(failed): ()}  # id(op) -> (its error, op), () for `failed`
    while True:
        reads: dict[int, tuple] = {}  # id(op) -> the failure it reads (program order)
        for node in graph.nodes:
            found = failing.get(id(node))
            if found is None:
                found = next((reads[id(ref.node)] for ref in (*node.inputs,
                                                              *node.arg_inputs.values())
                              if id(ref.node) in reads), None)
            if found is not None:
                reads[id(node)] = found
        unaffected = [id(ref.node) not in reads for ref in graph.outputs]
        if not any(unaffected):
            return None
        needed = Graph(graph.name)
        # (an output the function returns as it was given, or a constant, is a leaf's value)
        needed.outputs = [ref for ref, keep in zip(graph.outputs, unaffected)
                          if keep and ref.node.kind is NodeKind.OP]
        needed.nodes = list(graph.nodes)
        passes.eliminate_dead_code(needed)
        stopped: list[tuple[Node, bool]] = []
        try:
            with _dali.synchronous():
                values = interpret(needed, leaves, batch_size, stopped)
                data = {id(ref): _dali.storage_of(values[ref] if ref.node.kind is NodeKind.OP
                                                  else leaf_value(leaves, ref))
                        for ref, keep in zip(graph.outputs, unaffected) if keep}
            break
        except Exception as error:  # noqa: BLE001 (another op fails on its own)
            if not stopped or id(stopped[0][0]) in failing:
                return None  # (the run's error stands for all)
            failing[id(stopped[0][0])] = (error.with_traceback(None), stopped[0][0])
    return [data[id(ref)] if keep else (reads[id(ref.node)] or None)
            for ref, keep in zip(graph.outputs, unaffected)]
