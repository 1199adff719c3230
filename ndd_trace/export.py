"""Export: a compiled function as a standalone DALI pipeline, for deployment without ndd_trace.

    ndd_trace.export(preprocess, jpegs, path="preprocess_pipeline.py")             # a .py module
    ndd_trace.export(preprocess, jpegs, path="model.dali", format="serialized")    # Triton's DALI
    ndd_trace.export(train_batches, reader, path="loader.py")   # a compiled generator: the reader
                                                                # goes inside the pipeline
    python -m ndd_trace export mymodule:preprocess --example inputs.npz --out pipe.py

`format="python"` writes the generated `@pipeline_def` (imports DALI only), commented with the
user's `file:line`s, with a `__main__` that builds it and runs one iteration on the example
inputs (saved next to it as `<name>_example.npz`). `format="serialized"` writes
`Pipeline.serialize()`, loadable with `Pipeline.deserialize` and by the Triton DALI backend.
Either way the pipeline's inputs are external sources named after the function's parameters;
batch size and device come from the example arguments (or the options given here).

Random ops: by default (`random="pipeline"`) the exported pipeline draws its own random numbers
from its `seed`: its values differ from eager's, while every deterministic output is the same,
bit for bit. With `random="inputs"` each random op's state is an extra input named
`<variable>_state` (7 uint32 words per sample): fed with states drawn as ndd draws them, the
pipeline gives exactly eager's values. What cannot be exported (a graph break, a Python
callback source, data that cannot be written into the code) raises ExportError at the line.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import importlib
import inspect
import io
import os
import shlex
import sys
import textwrap
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from . import _dali
from .api import CompiledFunction
from .decorator import compile
from .codegen.lower import lower
from .core import checks
from .core.errors import ExportError
from .core.files import path_argument, write_atomic
from .core.ir import Graph, NodeKind, Ref
from .core.source import SourceLoc, docstring, one_line, unparse
from .units.unit import batch_sizes
from .modes.loop import first_step
from .modes.per_sample import PerSampleFunction
from .tracing.trace import add_reader_node

FORMATS = ("python", "serialized")


@dataclasses.dataclass
class Exported:
    """What `export` wrote."""

    path: str
    format: str
    source: str  # the generated @pipeline_def module
    inputs: list[str]  # external-source names, in order: the function's data parameters
    num_outputs: int
    batch_size: int
    device_id: int | None
    example_path: str | None = None  # format="python": the example inputs of its __main__


def _traced_entry(compiled: CompiledFunction, args: tuple, kwargs: dict) -> Any:
    with warnings.catch_warnings():  # a break is reported below, as an error
        warnings.simplefilter("ignore")
        entry = compiled.trace(args, kwargs, raise_errors=True)  # counted nowhere
    if entry.eager_reason is not None:
        record = entry.breaks[0] if entry.breaks else None
        reason = record.reason if record else entry.eager_reason
        raise ExportError(f"`{compiled.__qualname__}` cannot be exported{{where}}: it cannot be "
                          f"compiled whole ({reason}); export needs one whole pipeline",
                          record.loc if record else None)
    return entry


def _loop_graph(compiled: CompiledFunction, args: tuple, kwargs: dict) -> tuple[Any, Graph]:
    """A compiled generator's loop body, traced on stand-ins for what its readers give at the
    first step (nothing is read: the generator's Python runs up to its loop's first step), with
    the readers put back into the graph where they feed it."""
    split = compiled.loop()
    if split is None:
        record = compiled.loop_break
        raise ExportError(f"`{compiled.__qualname__}` cannot be exported{{where}}: its loop body "
                          f"cannot be compiled ({record.reason}); export needs one whole pipeline",
                          record.loc)
    fed: dict[int, tuple[Any, int]] = {}

    def stand_in(reader: Any, batch_size: int) -> Any:
        _, names, metas = _dali.reader_metadata(reader)
        batches = [_dali.stand_in_batch(meta, batch_size) for meta in metas]
        for index, batch in enumerate(batches):
            fed[id(batch)] = (reader, index, batch)
        return dict(zip(names, batches)) if names else tuple(batches)

    step_args = first_step(split, args, kwargs, stand_in)
    if step_args is None:
        raise ExportError(f"`{compiled.__qualname__}` cannot be exported{{where}}: its loop "
                          "gives no step", split.body_loc)
    entry = _traced_entry(compiled.step, step_args, {})
    graph = Graph(entry.graph.name)
    readers: dict[int, Any] = {}
    replaced: dict[int, Ref] = {}
    for node in entry.graph.nodes_of(NodeKind.INPUT):
        value: Any = {"args": step_args}
        for key in node.payload:
            value = value[key]
        found = fed.get(id(value))
        if found is None or found[2] is not value:
            raise ExportError(f"the loop body of `{compiled.__qualname__}`{{where}} is given "
                              f"`{node.name}`, which no reader of its loop gives", split.body_loc)
        reader, index, _ = found
        if id(reader) not in readers:
            readers[id(reader)] = add_reader_node(graph, reader, split.body_loc)
        replaced[id(node)] = Ref(readers[id(reader)], index)

    def mapped(ref: Ref) -> Ref:
        return replaced.get(id(ref.node), ref)

    for node in entry.graph.nodes:
        if node.kind is NodeKind.INPUT:
            continue
        node.inputs = [mapped(ref) for ref in node.inputs]
        node.arg_inputs = {key: mapped(ref) for key, ref in node.arg_inputs.items()}
        graph.nodes.append(node)
    graph.outputs = [mapped(ref) for ref in entry.graph.outputs]
    entry.static_batch_size = next(iter(fed.values()))[2].batch_size if fed else None
    return entry, graph


def export(function: Callable, *example_args: Any, path: str | bytes | os.PathLike,
           format: str = "python", batch_size: int | None = None,
           num_threads: int | None = None, random: str = "pipeline", seed: int | None = None,
           **example_kwargs: Any) -> Exported:
    """Write `function`'s pipeline for these example arguments to `path`, for DALI without
    ndd_trace (docs/export.md).

    `format`: "python" (a module of the generated `@pipeline_def`, with a `__main__` that runs
    it on the example inputs) or "serialized" (`Pipeline.serialize()`, for Triton's DALI
    backend). `path`: a file name (str, bytes or os.PathLike); format="python" writes the
    example inputs beside it (`<path without extension>_example.npz`).
    `batch_size`: the pipeline's maximum batch size (default: that of the example batches, or
    the reader loop's). `random`: "pipeline" (the pipeline draws its own random numbers, from
    `seed`) or "inputs" (random states are inputs, for eager's exact values).
    """
    path = path_argument(path, "path", "export")  # (one str: the module and its inputs alike)
    _check_target(path)
    batch_size = checks.count("export", "batch_size", batch_size, none=True)
    num_threads = checks.count("export", "num_threads", num_threads, none=True)
    if seed is not None and not checks.is_int(seed):
        checks.fail(TypeError(f"export: seed must be an int or None, got {seed!r}"))
    if format not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {format!r}")
    if random not in ("pipeline", "inputs"):
        raise ValueError(f"random must be 'pipeline' or 'inputs', got {random!r}")
    if isinstance(function, PerSampleFunction):
        return _export_per_sample(function, example_args, str(path), format, random,
                                  batch_size, num_threads)
    compiled = function if isinstance(function, CompiledFunction) else compile(function)
    args, kwargs = compiled.normalize(example_args, example_kwargs)
    if compiled.is_generator:
        entry, graph = _loop_graph(compiled, args, kwargs)
    else:
        entry = _traced_entry(compiled, args, kwargs)
        graph = entry.graph
    defaults = compiled.options()
    size = batch_size or max(batch_sizes(args, kwargs), default=None) or \
        entry.static_batch_size or 1
    options = {"batch_size": int(size), "num_threads": num_threads or defaults.num_threads,
               "device_id": defaults.device_id}
    if seed is not None:
        options["seed"] = int(seed)
    return _write(compiled.__name__, compiled.__qualname__, graph, args, kwargs, str(path),
                  format, random, options)


def _check_target(path: str) -> None:
    """Where export writes, checked before anything is written: a file name in a folder that
    exists, not a folder itself."""
    if not path or path.endswith(os.sep) or os.path.isdir(path):
        checks.fail(IsADirectoryError(
            f"export: `path` must name a file (the pipeline module, such as "
            f"{os.path.join(path or '.', 'pipeline.py')!r}), got the folder {path!r}"))
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        checks.fail(FileNotFoundError(
            f"export: the folder of `path` {path!r} does not exist ({folder}): make it first"))


def _write(name: str, qualname: str, graph: Graph, args: tuple, kwargs: dict, path: str,
           format: str, random: str, options: dict) -> Exported:
    """`graph` lowered as a standalone `@pipeline_def` with `options`, written to `path` in
    `format` (with its example inputs beside it, for format="python")."""
    try:
        lowered = lower(graph, inline_constants=True, inline_limit=None, standalone=True,
                        random_states="own" if random == "pipeline" else "fed",
                        decorator_options=options, function_name=f"{name}_pipeline")
    except ExportError as error:
        loc = error.loc
        raise ExportError(f"`{qualname}` cannot be exported{{where}}: {error}",
                          loc) from None
    inputs = lowered.feed_names
    num_outputs = len(graph.outputs)
    exported = Exported(path=str(path), format=format, source=lowered.source, inputs=inputs,
                        num_outputs=num_outputs, batch_size=int(options["batch_size"]),
                        device_id=options["device_id"])
    if format == "serialized":
        pipe = lowered.function()
        write_atomic(path, pipe.serialize())
        return exported
    example = {lowered.feed_names[i]: _input_samples(node, args, kwargs)
               for i, node in enumerate(lowered.external_sources)
               if node.kind is NodeKind.INPUT}
    example_path = os.path.splitext(str(path))[0] + "_example.npz"
    if example:
        buffer = io.BytesIO()  # (np.savez to a path writes in place: a full disk cuts it short)
        np.savez(buffer, **{f"{key}__{i}": sample for key, samples in example.items()
                            for i, sample in enumerate(samples)})
        written = not os.path.exists(example_path)
        write_atomic(example_path, buffer.getbuffer())
        exported.example_path = example_path
    try:
        write_atomic(path, _module_text(name, lowered, inputs, os.path.basename(example_path),
                                        random, str(path)))
    except BaseException:
        if example and written:  # (all or nothing: not the inputs of a module not written)
            with contextlib.suppress(OSError):
                os.unlink(example_path)
        raise
    return exported


def _export_per_sample(function: PerSampleFunction, args: tuple, path: str, format: str,
                       random: str, batch_size: int | None,
                       num_threads: int | None) -> Exported:
    """A per-sample function's pipeline (its branches as DALI's conditional splits and merges),
    written as any compiled function's; its random ops' values are inputs, computed per call."""
    code = function.__wrapped__.__code__
    loc = SourceLoc(code.co_filename, code.co_firstlineno, code.co_name)
    graph, random_inputs, options = function.graph_for_export(args, batch_size, num_threads)
    if random_inputs and random == "pipeline":
        raise ExportError(
            f"per-sample function `{function.__qualname__}`{{where}} has random ops, whose "
            "per-sample values are computed before each run and fed; export it with "
            f"random='inputs' (inputs {', '.join(random_inputs)}, one value per sample)", loc)
    if random_inputs and format == "python":
        raise ExportError(
            f"per-sample function `{function.__qualname__}`{{where}} has random ops: its "
            "module would need their values (computed per call) as example inputs; export it "
            "with format='serialized'", loc)
    return _write(function.__name__, function.__qualname__, graph, args, {}, path, format,
                  "inputs", options)


def _input_samples(node: Any, args: tuple, kwargs: dict) -> list[np.ndarray]:
    """The example data of one input, as a list of host arrays (one per sample)."""
    value: Any = {"args": args, "kwargs": kwargs}
    for key in node.payload:
        value = value[key]
    tensors = list(value) if isinstance(value, _dali.Batch) else [value]
    return [_dali.host_array(tensor) for tensor in tensors]


_MAIN = '''
def main(argv=None):
    """Build the pipeline, feed it the example inputs, run one iteration."""
    import argparse

    import numpy as np

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--example", default=os.path.join(os.path.dirname(
        os.path.abspath(__file__)), EXAMPLE), help="the example inputs (.npz)")
    parser.add_argument("--save", help="write the outputs to this .npz file")
    options = parser.parse_args(argv)
    pipe = PIPELINE()
    pipe.build()
    if INPUTS:
        data = np.load(options.example)
        for name in INPUTS:
            count = len([key for key in data.files if key.rsplit("__", 1)[0] == name])
            pipe.feed_input(name, [data[f"{name}__{i}"] for i in range(count)])
    outputs = pipe.run()
    saved = {}
    for index, output in enumerate(outputs):
        if hasattr(output, "as_cpu"):
            output = output.as_cpu()
        samples = [np.array(output[i]) for i in range(len(output))]
        for i, sample in enumerate(samples):
            saved[f"out{index}__{i}"] = sample
        shapes = sorted({sample.shape for sample in samples})
        print(f"output {index}: {len(samples)} samples of {samples[0].dtype}, shapes {shapes}")
    if options.save:
        np.savez(options.save, **saved)


if __name__ == "__main__":
    main()
'''


class _Fill(ast.NodeTransformer):
    def __init__(self, values: dict[str, ast.expr]):
        self.values = values

    def visit_Name(self, node: ast.Name) -> ast.expr:
        return self.values.get(node.id, node)


def _module_text(name: str, lowered: Any, inputs: list[str], example: str, random: str,
                 path: str) -> str:
    random_text = ("Random ops draw from the pipeline's own generator (its `seed`): "
                   "their values differ from eager ndd's." if random == "pipeline" else
                   "Random ops take their states as inputs `<variable>_state` (7 uint32 "
                   "words per sample), drawn as ndd draws them for eager's exact values.")
    # the user's names are shown on one line each, the file name quoted as a shell would need
    name, script = one_line(name), one_line(shlex.quote(os.path.basename(path)))
    doc = (f"{name}: a DALI pipeline exported by ndd_trace (DALI {_dali.DALI_VERSION}).\n\n"
           f"Inputs, fed with pipe.feed_input(name, samples): {', '.join(inputs) or 'none'}.\n"
           f"{_wrap(random_text)}\n\n"
           f"    python {script}                   # build, run once on the example inputs\n"
           f"    python {script} --save out.npz    # ... and save the outputs\n")
    header = ast.Module(body=[ast.Import(names=[ast.alias(name="os")])], type_ignores=[])
    tail = _Fill({"PIPELINE": ast.Name(id=lowered.function_name, ctx=ast.Load())}).visit(
        ast.parse(_MAIN))
    constants = ast.parse("INPUTS = None\nEXAMPLE = None\n")
    constants.body[0].value = ast.List(elts=[ast.Constant(n) for n in inputs], ctx=ast.Load())
    constants.body[1].value = ast.Constant(example)
    main_text = unparse(ast.fix_missing_locations(tail)).strip()
    main_text = main_text.replace("\nif (__name__ == '__main__'):",
                                  "\n\n\nif __name__ == '__main__':")
    return (docstring(doc) + "\n\n" + unparse(header).strip() + "\n\n" +
            lowered.source + "\n" + unparse(constants).strip() + "\n\n\n" +
            main_text + "\n")


def _wrap(text: str) -> str:
    return "\n".join(textwrap.wrap(text, 95))


def _load_example(spec: str, parameters: list[str]) -> list[Any]:
    """`--example inputs.npz`: arrays named `<parameter>__<sample>` become Batches."""
    data = np.load(spec)
    values = []
    for name in parameters:
        keys = sorted((key for key in data.files if key.rsplit("__", 1)[0] == name),
                      key=lambda key: int(key.rsplit("__", 1)[1]))
        if not keys:
            break
        values.append(_dali.batch_of([data[key] for key in keys]))
    return values


def main(argv: list[str] | None = None) -> None:
    """`python -m ndd_trace export module:function --example inputs.npz --out path`."""
    parser = argparse.ArgumentParser(prog="python -m ndd_trace export",
                                     description="Export a compiled function's DALI pipeline.")
    parser.add_argument("target", help="module:function (the module is imported)")
    parser.add_argument("--example", help=".npz with arrays named <parameter>__<sample index>")
    parser.add_argument("--out", required=True, help="where to write the pipeline")
    parser.add_argument("--format", choices=FORMATS, default="python")
    parser.add_argument("--batch-size", type=int)
    parser.add_argument("--seed", type=int)
    options = parser.parse_args(argv)
    module_name, _, function_name = options.target.partition(":")
    if not module_name or not function_name:
        parser.error(f"target {options.target!r}: give module:function (such as "
                     "train:preprocess)")
    sys.path.insert(0, os.getcwd())
    module = importlib.import_module(module_name)
    function = getattr(module, function_name, None)
    if not callable(function):
        found = "" if function is None else f" ({type(function).__name__} there)"
        parser.error(f"target {options.target!r}: module {module_name} has no function "
                     f"{function_name}{found}")
    wrapped = getattr(function, "__wrapped__", function)
    parameters = list(inspect.signature(wrapped, follow_wrapped=False).parameters)
    try:
        example = _load_example(options.example, parameters) if options.example else []
    except (OSError, ValueError) as error:
        parser.error(f"--example {options.example}: not an .npz file of example inputs ({error})")
    try:
        exported = export(function, *example, path=options.out, format=options.format,
                          batch_size=options.batch_size, seed=options.seed)
    except (TypeError, ValueError, OSError) as error:  # (the command line's: said as argparse)
        hint = "" if options.example else " (its example inputs: --example inputs.npz)"
        parser.error(f"{type(error).__name__}: {error}{hint}")
    print(f"wrote {exported.path} ({exported.format}; inputs: {', '.join(exported.inputs)}; "
          f"batch size {exported.batch_size})")
