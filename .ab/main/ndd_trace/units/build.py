"""The one way from a graph to a runnable pipeline: optimize (opt-in), lower, make the Executable,
attach the tuner.

    program = compile_graph(graph, options, optimize=False)
    program.executable.start(...)            # runtime.py builds it at its first run
    program.lowered.source                   # the readable @pipeline_def it runs

Every compiled unit goes through here: a compiled function's entry (modes/stage.py), a transparent
mode region (modes/regions.py), a per-sample function's variant (modes/per_sample/function.py)
and a reader's stream (ahead/streams.py).
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable
from typing import Any

from ..codegen.lower import Lowered, lower
from ..codegen.optimize import optimize as optimize_graph
from ..core import ledger, logs, process_state
from ..core.files import write_atomic
from ..core.ir import Graph, NodeKind
from ..core.source import user_location
from ..execution import tuning
from ..execution.runtime import Executable, Options


@dataclasses.dataclass
class Program:
    """A graph made runnable: its code, its executable and the rewrites optimize applied."""

    lowered: Lowered
    executable: Executable
    optimizations: list = dataclasses.field(default_factory=list)  # optimize.Applied


DEBUG_DIR_ENV_VAR = "NDD_TRACE_DEBUG_DIR"  # a folder: every generated pipeline is written there
DEPRECATED_DUMP_ENV_VAR = "NDD_TRACE_DUMP"  # its name before (one release: warned once)


def debug_dir() -> str | None:
    """The folder NDD_TRACE_DEBUG_DIR names (or NDD_TRACE_DUMP, its deprecated name, said once
    a process), or None."""
    folder = os.environ.get(DEBUG_DIR_ENV_VAR)
    old = os.environ.get(DEPRECATED_DUMP_ENV_VAR)
    if old and DEPRECATED_DUMP_ENV_VAR not in process_state.deprecations_warned:
        process_state.deprecations_warned.add(DEPRECATED_DUMP_ENV_VAR)
        instead = (f"ignored: {DEBUG_DIR_ENV_VAR}={folder!r} is set" if folder
                   else f"set {DEBUG_DIR_ENV_VAR}={old!r} instead")
        ledger.warn(f"ndd_trace: {DEPRECATED_DUMP_ENV_VAR} is deprecated and goes in the next "
                    f"release; {instead} (every generated pipeline's source and graph are "
                    f"written there)", user_location(), FutureWarning)
    return folder or old or None


def dump_program(graph: Graph, lowered: Lowered) -> list[str]:
    """With NDD_TRACE_DEBUG_DIR set to a folder, write there what a program was made of, as
    torch.compile's TORCH_COMPILE_DEBUG keeps its graphs: `<name>.py`, the generated source
    (what runs), and `<name>.graph.txt`, the graph it was generated from (after the passes and
    optimize's rewrites, as `graph.format()` prints it). Each file is written whole; the paths
    written (none where the variable is unset or a write failed: said, and the program runs)."""
    folder = debug_dir()
    if not folder:
        return []
    name = re.sub(r"[^A-Za-z0-9_]+", "_", lowered.filename.strip("<>")).strip("_")
    files = ((os.path.join(folder, f"{name}.py"), lowered.source),
             (os.path.join(folder, f"{name}.graph.txt"), graph.format() + "\n"))
    written = []
    try:
        os.makedirs(folder, exist_ok=True)
        for path, text in files:
            write_atomic(path, text)
            written.append(path)
    except OSError as error:  # a debugging aid: said, and the program runs on
        logs.builds.warning("%s=%s: could not write %s (%s)", DEBUG_DIR_ENV_VAR, folder,
                            files[len(written)][0], error)
    if written:
        logs.builds.info("wrote %s", ", ".join(written))
    return written


def compile_graph(graph: Graph, options: Options, *, draws: list | None = None,
                  rng_objects: dict | None = None, optimize: bool = False,
                  inline_constants: bool = False, cache_constants: bool = True,
                  threads_given: bool = False,
                  runs_ahead: Callable[[int], int] | None = None,
                  before_build: Callable[[Any, int], None] | None = None) -> Program:
    """`graph` (after its passes) as a Program. `optimize`: optimize.py's rewrites, applied to
    `graph` in place, and the per-machine tuning (`runs_ahead` tells it how deep runs are
    launched ahead). `cache_constants=False`: constants are fed again at every run (a region's
    constants change from run to run)."""
    applied = optimize_graph(graph) if optimize else []
    for node in graph.nodes_of(NodeKind.INPUT):
        # a batch argument in host memory is read in place: DALI's outputs (a reader's
        # batches, an op's results) as they are, user data as a copy made at the call (Feed)
        node.feed_in_place = node.is_batch and node.meta[0].device == "cpu"
    lowered = lower(graph, inline_constants=inline_constants)
    dump_program(graph, lowered)
    executable = Executable(graph, lowered, draws or [], options, rng_objects or {},
                            before_build=before_build)
    executable.feed.cache_constants = cache_constants
    if optimize:
        tuning.attach(executable, applied, lambda: lower(graph, inline_constants=inline_constants),
                      threads_given=threads_given, runs_ahead=runs_ahead or (lambda depth: 1))
    return Program(lowered, executable, applied)
