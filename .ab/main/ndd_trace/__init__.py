"""ndd_trace: compile imperative DALI dynamic-mode (ndd) code into cached DALI pipelines.

    import nvidia.dali.experimental.dynamic as ndd
    import ndd_trace                       # makes ndd.compile available

    @ndd.compile
    def preprocess(jpegs, size=224):
        images = ndd.decoders.image(jpegs)
        images = ndd.random_resized_crop(images, size=[size, size])
        return images * 0.5

    for jpegs, labels in reader.next_epoch(batch_size=64):
        images = preprocess(jpegs)         # traced and built once, then one pipeline run a call
        train_step(images.torch(), labels.torch())

Same results as eager, bit for bit (random ops included); what cannot be compiled whole runs in
transparent mode (cached pipeline regions around the break) with a warning at the user's line.
`ndd_trace.explain(fn, *args)` shows what happens and why. NDD_TRACE_LOGS=recompiles,breaks (or
standard logging configuration of the "ndd_trace" logger) logs traces, breaks and builds.
"""

from __future__ import annotations

from . import _dali
from .api import CacheInfo, CompiledFunction, cache_dir, set_cache_dir
from .decorator import compile
from .core import ledger, logs, process_state, source
from .core.errors import (ExportError, GraphBreakError, LoopError, NddTraceError, NddTraceWarning,
                          PerSampleError, PipelineError)
from .explanation import Explanation, explain
from .export import export
from .modes.lazy import disable, enable, enabled, is_enabled, report, reset_report

__version__ = "0.1.0"

__all__ = [
    "CacheInfo",
    "CompiledFunction",
    "Explanation",
    "ExportError",
    "GraphBreakError",
    "LoopError",
    "NddTraceError",
    "NddTraceWarning",
    "PerSampleError",
    "PipelineError",
    "cache_dir",
    "compile",
    "disable",
    "enable",
    "enabled",
    "explain",
    "export",
    "is_enabled",
    "report",
    "reset",
    "reset_report",
    "set_cache_dir",
]


def reset() -> None:
    """Forget everything compiled so far in this process, as `torch.compiler.reset()` does:
    every compiled and per-sample function's cache (their pipelines closed) and counters, and
    transparent mode's regions, report and live pipelines. The next call traces again."""
    for function in list(process_state.compiled_objects):
        function.cache_clear()
    reset_report()

# The one documented addition to DALI's namespace: `ndd.compile` is `ndd_trace.compile`.
_dali.install_compile(compile)
_logs_error = logs.configure_from_environment()
if _logs_error:  # an unknown channel: the known ones applied, the rest warned at the user's
    # setting's first effect: their `import ndd_trace` (or the NDD_TRACE=1 start-up hook's)
    ledger.warn(_logs_error, source.importer_location(), UserWarning)
