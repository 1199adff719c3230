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
from ..core import logs
from ..core.files import write_atomic
from ..core.ir import Graph, NodeKind
from ..execution import tuning
from ..execution.runtime import Executable, Options


@dataclasses.dataclass
class Program:
    """A graph made runnable: its code, its executable and the rewrites optimize applied."""

    lowered: Lowered
    executable: Executable
    optimizations: list = dataclasses.field(default_factory=list)  # optimize.Applied


DUMP_ENV_VAR = "NDD_TRACE_DUMP"  # a folder: every generated pipeline's source is written there


def dump_source(lowered: Lowered) -> str | None:
    """With NDD_TRACE_DUMP set to a folder, write `lowered`'s source there (`<name>_<n>.py`, as
    torch.compile's TORCH_COMPILE_DEBUG keeps its graphs); the path written, or None."""
    folder = os.environ.get(DUMP_ENV_VAR)
    if not folder:
        return None
    name = re.sub(r"[^A-Za-z0-9_]+", "_", lowered.filename.strip("<>")).strip("_")
    path = os.path.join(folder, f"{name}.py")
    try:
        os.makedirs(folder, exist_ok=True)
        write_atomic(path, lowered.source)
    except OSError as error:  # a debugging aid: said, and the program runs on
        logs.builds.warning("%s=%s: could not write %s (%s)", DUMP_ENV_VAR, folder, path, error)
        return None
    logs.builds.info("wrote %s", path)
    return path


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
    dump_source(lowered)
    executable = Executable(graph, lowered, draws or [], options, rng_objects or {},
                            before_build=before_build)
    executable.feed.cache_constants = cache_constants
    if optimize:
        tuning.attach(executable, applied, lambda: lower(graph, inline_constants=inline_constants),
                      threads_given=threads_given, runs_ahead=runs_ahead or (lambda depth: 1))
    return Program(lowered, executable, applied)
