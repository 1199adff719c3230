"""Exceptions raised by ndd_trace, each carrying the user's source location.

    try:
        preprocess(jpegs)
    except ndd_trace.GraphBreakError as error:   # only with @ndd.compile(fullgraph=True)
        print(error.reason, error.loc)           # "reads .shape of a traced batch", file.py:12

Every error names what failed, where (the user's ``file:line``), why, and what to do instead.
"""

from __future__ import annotations

import copyreg
from typing import Any

from . import process_state
from .source import SourceLoc


class NddTraceError(Exception):
    """Base class of every error ndd_trace raises on its own account."""


class GraphError(Exception):
    """A graph is malformed (`Graph.validate`): an ndd_trace bug, never a user error."""


class GraphBreakError(NddTraceError):
    """The function does something that cannot be recorded, and ``fullgraph=True`` forbids
    a break."""

    def __init__(self, reason: str, loc: SourceLoc | None = None, function_name: str = "?"):
        self.reason = reason
        self.function_name = function_name
        self.loc = loc
        self.filename = loc.filename if loc else None
        self.lineno = loc.lineno if loc else None
        where = f" at {loc}" if loc else ""
        super().__init__(
            f"graph break in compiled function `{function_name}`{where}: {reason}. "
            "Move this code out of the compiled function, or drop fullgraph=True to let "
            "ndd_trace run it in transparent mode instead (its ndd calls as cached pipeline "
            "regions around the break)."
        )

    def __reduce__(self):  # pickled (multiprocessing, DataLoader workers) as it was made
        return type(self), (self.reason, self.loc, self.function_name), self.__dict__


class NddTraceWarning(UserWarning):
    """ndd_trace ran something eagerly, or keeps re-tracing; the message says where and why."""


class PerSampleError(NddTraceError):
    """A per-sample function uses a construct its pipeline cannot express; names the line."""

    def __init__(self, message: str, loc: SourceLoc | None = None):
        self.message = message
        self.loc = loc
        self.filename = loc.filename if loc else None
        self.lineno = loc.lineno if loc else None
        super().__init__(f"{loc}: {message}" if loc else message)

    def __reduce__(self):
        return type(self), (self.message, self.loc), self.__dict__


class ExportError(NddTraceError):
    """A function cannot be exported as a standalone pipeline; the message says where and why
    (`{where}` in it becomes " at file:line"). `node`: the graph node the pipeline code
    cannot hold (where lowering found it)."""

    def __init__(self, message: str, loc: SourceLoc | None = None, node: Any = None):
        self.node = node
        self.loc = loc if loc is not None else getattr(node, "loc", None)
        where = f" at {self.loc}" if self.loc else ""
        super().__init__(message.replace("{where}", where))

    def __reduce__(self):  # the graph node stays behind: it belongs to this process's trace
        state = {name: value for name, value in self.__dict__.items() if name != "node"}
        return type(self), (self.args[0], self.loc), state


class PipelineError(NddTraceError):
    """An operator failed in a pipeline ndd_trace built or ran; its traceback ends at the op's
    user line.

    Each one raised is also the built-in exception eager ndd raises for the same failure
    (`pipeline_error_type`): a RuntimeError for most operator failures, a ValueError for an
    input layout an operator rejects, and so on; `except PipelineError` catches them all. Its
    text is eager's (DALI's own message); the op (`op_name`), its line (`loc`) and the pipeline
    are in a note."""

    def __init__(self, message: str, loc: SourceLoc | None = None, op_name: str | None = None):
        self.loc = loc
        self.op_name = op_name
        self.at_call = False  # DALI rejects the call itself: eager raises it at the call
        # the user's frames the call was made from (source.call_stack), shown outside the op's
        # line once the error surfaces at a result's first use (failures.surfacing)
        self.call_stack: tuple = ()
        # per output index of its run: the ops eager's evaluation passes from the failing op to
        # that output's, each (its line, its stack), innermost first (failures.consumer_links)
        self.consumers: dict[int, tuple] = {}
        self.own_mode: bool | None = None  # the EvalMode the function set for it: Node.deferred
        super().__init__(message)


class LoopError(NddTraceError, RuntimeError):
    """A reader read through ndd_trace cannot go on (its read-ahead thread stopped, or its
    pipeline failed and took the reader's operator with it); a RuntimeError, as the errors eager
    ndd raises for misused readers are."""


# the built-in types DALI's errors come as: their PipelineErrors exist from import on, so that
# pickle finds them by name in any process (torch's DataLoader workers send the exception's
# type to the main process, which raises it again)
_EAGER_TYPES = (RuntimeError, ValueError, IndexError, TypeError, KeyError, LookupError,
                AttributeError, NotImplementedError, OverflowError, ZeroDivisionError,
                ArithmeticError, MemoryError, OSError, AssertionError)


def pipeline_error_type(builtin: type[BaseException]) -> type[PipelineError]:
    """The PipelineError that is also the built-in exception eager ndd raises for the same
    failure (RuntimeError, IndexError, ValueError, ...), and carries its name, as eager ndd's
    "An error happened during asynchronous execution" does: `except RuntimeError`,
    `except ndd_trace.PipelineError` and `type(error).__name__` all keep working."""
    if not issubclass(builtin, Exception) or issubclass(builtin, NddTraceError):
        builtin = RuntimeError
    found = process_state.pipeline_errors.get(builtin)
    if found is None:  # (reachable as `ndd_trace.PipelineError.RuntimeError`, ...)
        found = _NamedAsBuiltin(builtin.__name__, (PipelineError, builtin), {
            "__module__": builtin.__module__, "__doc__": PipelineError.__doc__,
            "__qualname__": builtin.__qualname__})
        process_state.pipeline_errors[builtin] = found
        if builtin.__name__ not in vars(PipelineError):  # the first of a name keeps it
            setattr(PipelineError, builtin.__name__, found)
    return found


class _NamedAsBuiltin(type):
    """The type of PipelineError's built-in-named classes: named as the built-in is, module
    included, so that a traceback ends as eager's does (`RuntimeError: ...`); pickled (torch's
    DataLoader workers send exception types) as `pipeline_error_type(<the built-in>)`, since
    its name leads to the built-in itself."""


def _builtin_of(error_type: type) -> type:
    return next(cls for cls in error_type.__mro__[1:]
                if issubclass(cls, BaseException) and not issubclass(cls, PipelineError))


copyreg.pickle(_NamedAsBuiltin, lambda cls: (pipeline_error_type, (_builtin_of(cls),)))


# Tracebacks and reprs name the exceptions where users find them (`ndd_trace.GraphBreakError`),
# not the module that defines them
PUBLIC_MODULE = "ndd_trace"
for _public in (NddTraceError, NddTraceWarning, GraphBreakError, PipelineError, ExportError,
                PerSampleError, LoopError):
    _public.__module__ = PUBLIC_MODULE
for _builtin in _EAGER_TYPES:
    pipeline_error_type(_builtin)


class GraphBreakSignal(BaseException):
    """Internal signal: abort the trace. A BaseException so user `except Exception` misses it;
    a bare `except:` could still swallow it, so every instance is also noted in
    `process_state.graph_breaks_raised`."""

    def __init__(self, reason: str, loc: SourceLoc | None):
        super().__init__(reason)
        self.reason = reason
        self.loc = loc
        breaks = getattr(process_state.graph_breaks_raised, "breaks", None)
        if breaks is not None:
            breaks.append(self)
