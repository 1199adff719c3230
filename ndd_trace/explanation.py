"""What `ndd_trace.explain` says of a call: graph, generated code, guards, breaks, verdicts.

    print(ndd_trace.explain(preprocess, jpegs))   # traces the call; runs nothing

It reads a compiled function through its public surface (normalize, guard_key, trace,
held_entry: the entry held and how a call finds it, loop, step, ledger) and prints what was
decided and recorded.
"""

from __future__ import annotations

import dataclasses
import types
import textwrap
from collections.abc import Callable
from typing import Any

from .api import CompiledFunction
from .decorator import compile
from .core import checks, keys
from .core.ledger import Runs, Verdict
from .ahead.coalescing import twin_reason
from .ahead.runahead import CALLS_PER_RUN
from .codegen.coalesce import runs_per_call, why_not
from .execution import tuning
from .units.cache import FREE_UNITS, CacheInfo, Found
from .units.unit import Entry
from .modes.per_sample import PerSampleFunction
from .tracing.trace import GraphBreakRecord

__all__ = ["Explanation", "explain"]


@dataclasses.dataclass
class Explanation:
    """What ndd_trace does with one call: graph, generated code, guards, breaks, cache state."""

    function_name: str
    graph: str
    code: str
    guards: list[str]
    breaks: list[GraphBreakRecord]
    eager_reason: str | None
    cache: CacheInfo
    num_ops: int
    miss_reason: str | None
    path: str = ""
    loop: str = ""  # a compiled generator: its Python as it runs, and its loop body
    optimize: bool = False  # compiled with optimize=True
    optimizations: list[str] = dataclasses.field(default_factory=list)  # what was rewritten
    tuning: list[str] = dataclasses.field(default_factory=list)  # per-machine settings (tuning.py)
    # the latest calls not run as compiled, as the function's ledger recorded them
    recorded: list[Verdict] = dataclasses.field(default_factory=list)
    rewritten: str = ""  # a per-sample function: its source as rewritten (what DALI converts)
    coalescing: str = ""  # with NDD_TRACE_COALESCE=K: whether its calls are launched K at a time

    @property
    def optimizations_text(self) -> list[str]:
        """The "optimizations applied:" section and the tuning (empty without optimize=True)."""
        if not self.optimize:
            return []
        return [f"  optimizations applied: {len(self.optimizations) or 'none'}",
                *(f"    - {applied}" for applied in self.optimizations),
                *(f"  {line}" for line in self.tuning)]

    def __str__(self) -> str:
        lines = [f"ndd_trace.explain: `{self.function_name}`"]
        status = f"not compiled whole ({self.eager_reason})" if self.eager_reason else \
            f"compiled: {self.num_ops} ndd calls -> one DALI pipeline"
        lines.append(f"  status: {status}")
        if self.path:
            lines.append(f"  runs as: {self.path}")
        lines.append(f"  cache: {self.cache}")
        if self.miss_reason:
            lines.append(f"  last cache miss: {self.miss_reason}")
        lines.append(f"  graph breaks: {len(self.breaks)}")
        for record in self.breaks:
            lines.append(f"    - {record}")
            if record.fix:
                lines.append(f"      try: {record.fix}")
        if self.recorded:
            lines.append(f"  calls not run as compiled (latest {len(self.recorded)}):")
            lines += [f"    - {verdict.reason} at {verdict.loc or '?'} (runs as "
                      f"{verdict.runs.value})" for verdict in self.recorded[-5:]]
        lines += self.optimizations_text
        if self.coalescing:
            lines.append(f"  coalescing: {self.coalescing}")
        lines.append("  guards (a change in any of these re-traces):")
        lines += [f"    - {guard}" for guard in self.guards]
        if self.loop:
            lines.append("")
            lines.append(self.loop)
        if self.rewritten:
            lines += ["", "rewritten function:", self.rewritten]
        if self.graph:
            lines.append("")
            lines.append(self.graph)
        if self.code:
            lines.append("")
            lines.append("generated pipeline:")
            lines.append(self.code)
        return "\n".join(lines)


def explain(function: Callable, *args: Any, **kwargs: Any) -> Explanation:
    """Trace `function` for these arguments (running nothing) and report what would happen."""
    if isinstance(function, PerSampleFunction):  # its rewritten source, then its pipeline
        guard_lines = keys.describe(function.guard_key(args))
        graph, code, num_ops, eager_reason = function.describe(args)
        return Explanation(function.__qualname__, graph, code, guard_lines, [], eager_reason,
                           function.cache_info(), num_ops, function.last_miss_reason,
                           path=(Runs.ONE_PIPELINE if eager_reason is None
                                 else Runs.PER_SAMPLE_LOOP).value,
                           recorded=list(function.ledger.verdicts),
                           rewritten=function.converted_source)
    if isinstance(function, types.MethodType) and isinstance(function.__func__, CompiledFunction):
        function, args = function.__func__, (function.__self__, *args)  # a compiled method
    if not isinstance(function, CompiledFunction):
        checks.compilable(function)  # (None: what compile(None) would make is no function)
    compiled = function if isinstance(function, CompiledFunction) else compile(function)
    if compiled.is_generator:
        return _explain_generator(compiled)
    args, kwargs = compiled.normalize(args, kwargs)
    entry = compiled.trace(args, kwargs)  # counted nowhere: explaining is not calling
    guard_lines = keys.describe(compiled.guard_key(args, kwargs))
    if entry is None:
        error = compiled.take_trace_error()
        return Explanation(compiled.__qualname__, "", "", guard_lines, [],
                           f"tracing raised {error!r}; the eager call runs instead",
                           compiled.cache_info(), 0, compiled.last_miss_reason)
    # the entry the cache holds for this key runs the calls (the one traced here does not): its
    # code, tuning and verdict (recorded when it was traced or at a run) are what explain says
    held, found = compiled.held_entry(entry.key)
    shown = held or entry
    path = shown.path
    if found is Found.NOT_MADE_YET:
        path = (f"{Runs.EAGER.value} for this call: a variant not compiled yet past the first "
                f"{FREE_UNITS}, compiled once its calls have taken as long as compiling it")
    elif found is Found.PAST_LIMIT:
        runs = Runs.TRANSPARENT if compiled.fallback == "lazy" else Runs.EAGER
        path = f"{runs.value}: past cache_limit ({compiled.cache_limit})"
    return Explanation(
        function_name=compiled.__qualname__,
        graph=entry.graph_text,
        code=_code(shown),
        guards=guard_lines,
        breaks=list(shown.breaks),
        eager_reason=shown.eager_reason,
        cache=compiled.cache_info(),
        num_ops=entry.num_ops,
        miss_reason=compiled.last_miss_reason,
        path=path,
        optimize=compiled.optimize,
        optimizations=[str(applied) for applied in entry.optimizations],
        tuning=_tuning(held),
        recorded=list(compiled.ledger.verdicts),
        coalescing=_coalescing(shown),
    )


def _coalescing(entry: Entry) -> str:
    """With NDD_TRACE_COALESCE=K (ahead/coalescing.py): whether the entry's calls fed reader
    batches are launched K at a time as one run, and if not, why not."""
    if CALLS_PER_RUN < 2 or entry.graph is None:
        return ""
    reason = why_not(entry.graph) or (twin_reason(entry.executable)
                                      if entry.executable is not None else None)
    if reason is not None:
        return f"not coalesced: {reason}"
    random_ops = sum(map(runs_per_call, entry.graph.nodes))
    return (f"{CALLS_PER_RUN} calls fed reader batches launched ahead as one run of "
            f"{CALLS_PER_RUN} x their batch size (NDD_TRACE_COALESCE); {random_ops} random "
            "op(s) run once per call on its slice")


_LOOP_PATH = ("compiled loop: the generator's Python runs as written, its loop body as one "
              "compiled call per step, run ahead on the batches its readers read ahead")


def _explain_generator(compiled: CompiledFunction) -> Explanation:
    """A compiled generator: how it runs, and its loop body's latest variant (traced at the
    first step of an epoch: nothing runs here)."""
    split = compiled.loop()
    if split is None:
        verdict = compiled.loop_verdict
        return Explanation(compiled.__qualname__, "", "", [], [compiled.loop_break],
                           verdict.reason, compiled.cache_info(), 0, None,
                           path=verdict.runs.value)
    loop = "\n".join([
        "the generator, as it runs:", textwrap.indent(split.generator_source, "    "), "",
        f"its loop body ({split.body_loc}), compiled:",
        textwrap.indent(split.step_source, "    ")])
    entry = compiled.step.last_entry()
    if entry is None:
        return Explanation(compiled.__qualname__, "(not traced yet: the loop body is traced at "
                           "its first step)", "", [], [], None, compiled.cache_info(), 0,
                           None, path=_LOOP_PATH, loop=loop)
    guard_lines = keys.describe(entry.key)
    return Explanation(
        function_name=compiled.__qualname__, graph=entry.graph_text,
        code=_code(entry), guards=guard_lines,
        breaks=list(entry.breaks), eager_reason=entry.eager_reason,
        cache=compiled.cache_info(), num_ops=entry.num_ops,
        miss_reason=compiled.last_miss_reason,
        path=_LOOP_PATH if not entry.eager else
        f"{Runs.CHECKED_LOOP.value} ({entry.path})", loop=loop,
        optimize=compiled.optimize,
        optimizations=[str(applied) for applied in entry.optimizations], tuning=_tuning(entry),
        recorded=list(compiled.ledger.verdicts), coalescing=_coalescing(entry))


def _code(entry: Entry) -> str:
    """The code that runs: the executable's (tuning may have generated it again)."""
    if entry.executable is not None:
        return entry.executable.lowered.source
    return entry.lowered.source if entry.lowered else ""


def _tuning(entry: Entry | None) -> list[str]:
    return tuning.described(entry.executable) if entry is not None else []
