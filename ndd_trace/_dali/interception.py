"""Interception of ndd calls: every operator function, the handler between the user's call and
eager's, watched methods, eval modes."""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import nvidia.dali.experimental.dynamic as ndd
from nvidia.dali.experimental.dynamic import (_call_site, _capture, _eval_mode, _invocation,
                                               _ops)

from ..core.source import hide_own_frames, user_location
from .base import EvalMode


_NAMESPACES = ("", "decoders", "random", "math", "reductions", "transforms", "noise",
               "segmentation", "experimental", "experimental.decoders", "experimental.inputs",
               "io", "plugin", "numba", "pytorch", "optical_flow", "audio", "image")


def _namespace_modules() -> Iterator[Any]:
    seen = set()
    for path in _NAMESPACES:
        module = ndd
        for part in filter(None, path.split(".")):
            module = getattr(module, part, None)
            if module is None:
                break
        if module is not None and id(module) not in seen:
            seen.add(id(module))
            yield module


_op_functions_found: tuple[tuple, list[Callable]] | None = None


def op_functions() -> list[Callable]:
    """Every ndd operator function (ndd.resize, ndd.decoders.image, ...), each once. Scanned
    again only when a namespace module gained or lost names (hooks are installed often)."""
    global _op_functions_found
    modules = list(_namespace_modules())
    fingerprint = tuple((id(module), len(vars(module))) for module in modules)
    if _op_functions_found is not None and _op_functions_found[0] == fingerprint:
        return _op_functions_found[1]
    found: dict[int, Callable] = {}
    for module in modules:
        for value in vars(module).values():
            if (callable(value) and getattr(value, "_generated", False)
                    and hasattr(value, "_op_class")
                    and "_func_impl_" in getattr(value, "__globals__", {})):
                found[id(value)] = value
    _op_functions_found = (fingerprint, list(found.values()))
    return _op_functions_found[1]


def op_path(op_class: type) -> str:
    """The pipeline-mode path of an op (`decoders.image`), usable as `fn.<path>`."""
    return op_class._fn_path


def is_random(op_class: type) -> bool:
    return bool(op_class._has_random_state_arg)


def is_stateful(op_class: type) -> bool:
    return bool(op_class._is_stateful) and not op_class._has_random_state_arg


# ops whose call does something besides its result (dump_image writes files): eager starts
# every call at once, so they act whether or not the result is used
_SIDE_EFFECT_SCHEMAS = frozenset({"DumpImage"})


def has_side_effects(op_class: type) -> bool:
    return op_class._schema_name in _SIDE_EFFECT_SCHEMAS


def capture_running() -> bool:
    """Whether DALI's own capture mode (`next_epoch(capture=True)`, `source.captured()`) is
    running a loop body on this thread: its calls are DALI's to record, not ndd_trace's."""
    context = getattr(_capture.CaptureContext._tls, "current", None)
    return context is not None and context.state is not _capture.State.DISABLED


def call_stacks_start_above(launcher_file: str) -> None:
    """The stack eager records at each op call (the traceback an asynchronous run's error shows
    as its cause) starts at the user's script, as in a plain run: the frames of the launcher
    (`launcher_file`, `python -m ndd_trace`) and those below it are left out."""
    captured = _invocation.capture_stack_from_frame
    if getattr(captured, "_ndd_trace_original", None) is not None:
        return

    def capture(frame: Any) -> list:
        stack = captured(frame)
        for index, (code, _) in enumerate(stack):
            if code.co_filename == launcher_file:
                return stack[:index]
        return stack

    capture._ndd_trace_original = captured  # type: ignore[attr-defined]
    _invocation.capture_stack_from_frame = capture


def _plumbing(function: Callable) -> Callable:
    """Mark a hook as plumbing, so DALI's capture mode resolves call sites past it (it keys
    captured calls by the user's frame)."""
    return _call_site.mark_transparent(function)


# Transparent mode's handlers sit between the user's call and the eager op call: marked, DALI's
# call-site analysis of an eager call (constant arguments, a libcst parse of the caller's module)
# looks at the user's line, as a plain eager call does, not at ndd_trace's module (1-2 s).
plumbing = _plumbing


class _Interceptor:
    """Swaps each operator function's implementation for a hook, reference-counted per process.

    The hook consults a thread-local handler, so threads that are not tracing run eagerly as if
    nothing were installed; so do the loop bodies DALI's capture mode is recording or replaying
    (ndd_trace steps aside there: results, warnings and errors are capture mode's own).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0
        self._originals: dict[int, tuple[Callable, Callable]] = {}
        self._local = threading.local()
        # hooks made once per patched place and reused: a checked loop installs them at every
        # epoch, and making ~1,500 hooks anew took 3-4 ms each time
        self._hooks: dict[Any, tuple[Callable, Callable]] = {}

    def handler(self) -> Callable | None:
        return getattr(self._local, "handler", None)

    def _make_hook(self, original: Callable, op_class: type) -> Callable:
        local = self._local

        def hook(*inputs: Any, **kwargs: Any) -> Any:
            handler = getattr(local, "handler", None)
            if handler is None or capture_running():
                return original(*inputs, **kwargs)
            try:
                return handler(op_class, original, inputs, kwargs)
            except Exception as error:  # the eager call's error, with the eager traceback
                hide_own_frames(error, user_location())
                raise

        hook._ndd_trace_original = original  # type: ignore[attr-defined]
        return _plumbing(hook)

    def _make_reader_hook(self, original: Callable) -> Callable:
        local = self._local

        def next_epoch(reader: Any, *args: Any, **kwargs: Any) -> Any:
            on_reader = getattr(local, "on_reader", None)
            if on_reader is not None:
                replacement = on_reader(reader, *args, **kwargs)
                if replacement is not None:
                    return replacement
            return self._beneath(_ops.Reader, "next_epoch", original)(reader, *args, **kwargs)

        next_epoch._ndd_trace_original = original  # type: ignore[attr-defined]
        return _plumbing(next_epoch)

    def _make_method_hook(self, original: Callable, kind: str) -> Callable:
        """Operator objects (`ndd.ops.X(...)(x)`, readers called directly) and ExternalSource
        pulls are not recorded: while tracing, `on_reader(kind, object)` decides (a trace
        breaks; transparent mode lets them run eagerly and counts them)."""
        local = self._local

        def method(obj: Any, *args: Any, **kwargs: Any) -> Any:
            on_reader = getattr(local, "on_reader", None)
            if on_reader is not None and not capture_running():
                replacement = on_reader(obj, *args, _ndd_trace_kind=kind, **kwargs)
                if replacement is not None:
                    return replacement
            try:
                return original(obj, *args, **kwargs)
            except Exception as error:  # as without the hook (below an op hook: done there)
                hide_own_frames(error)
                raise

        method._ndd_trace_original = original  # type: ignore[attr-defined]
        return _plumbing(method)

    def _beneath(self, owner: type, name: str, original: Callable) -> Callable:
        """What the class holds beneath the hook: a `watch_method` wrapper installed since (a
        reader streamed in one thread is read through its stream in the others too)."""
        for cls, attribute, saved in self._patched:
            if cls is owner and attribute == name:
                return saved
        return original

    def _patch(self, owner: type, name: str, hook: Callable) -> None:
        original = owner.__dict__.get(name)
        if original is None or hasattr(original, "_ndd_trace_original"):
            return
        made = self._hooks.get((owner, name))
        if made is not None and made[0] is original:
            patched = made[1]
        else:
            patched = hook(original)
            # help(), IDEs and DALI's own docs tests read these off the class while the hook is
            # in place; no `__wrapped__`: DALI's call-site marking would follow it to ndd's method
            for attribute in ("__module__", "__name__", "__qualname__", "__doc__"):
                if hasattr(original, attribute):
                    setattr(patched, attribute, getattr(original, attribute))
            try:  # inspect.signature() answers ndd's own (hooks are made once: ~0.1 ms each)
                patched.__signature__ = inspect.signature(original)
            except (TypeError, ValueError):
                pass
            self._hooks[(owner, name)] = (original, patched)
        setattr(owner, name, patched)
        self._patched.append((owner, name, original))

    def _install(self) -> None:
        self._patched = []
        self._patch(_ops.Reader, "next_epoch", self._make_reader_hook)
        for op_class in _ops._all_ops:
            self._patch(op_class, "__call__", lambda o: self._make_method_hook(o, "operator"))
        self._patch(ndd.ExternalSource, "__call__",
                    lambda o: self._make_method_hook(o, "external_source"))
        self._patch(ndd.ExternalSource, "captured",
                    lambda o: self._make_method_hook(o, "external_source.captured"))
        for function in op_functions():
            namespace = function.__globals__
            original = namespace["_func_impl_"]
            if hasattr(original, "_ndd_trace_original"):
                continue
            made = self._hooks.get(id(function))
            if made is None or made[0] is not original:
                made = self._hooks[id(function)] = (
                    original, self._make_hook(original, function._op_class))
            namespace["_func_impl_"] = made[1]
            self._originals[id(function)] = (function, original)

    def _uninstall(self) -> None:
        for owner, name, original in self._patched:
            setattr(owner, name, original)
        self._patched = []
        for function, original in self._originals.values():
            function.__globals__["_func_impl_"] = original
        self._originals.clear()

    @contextmanager
    def active(self, handler: Callable, on_reader: Callable | None = None) -> Iterator[None]:
        release = self.hold()
        try:
            with self._handlers(handler, on_reader):
                yield
        finally:
            release()

    def hold(self) -> Callable[[], None]:
        """Keep the hooks installed, with no handler of its own, until the returned function is
        called: a loop that switches interception on and off at every step does not reinstall
        them each time (ops called in between run eagerly: their thread has no handler)."""
        with self._lock:
            if self._count == 0:
                self._install()
            self._count += 1
        released = False

        def release() -> None:
            nonlocal released
            if released:
                return
            released = True
            with self._lock:
                self._count -= 1
                if self._count == 0:
                    self._uninstall()

        return release

    @contextmanager
    def suspended(self) -> Iterator[None]:
        """Run eagerly inside a trace (used to evaluate constants the user computes)."""
        with self._handlers(None, None):
            yield

    @contextmanager
    def _handlers(self, handler: Callable | None, on_reader: Callable | None) -> Iterator[None]:
        """This thread's handlers for the block, the previous ones back after it."""
        previous = getattr(self._local, "handler", None), getattr(self._local, "on_reader", None)
        self._local.handler, self._local.on_reader = handler, on_reader
        try:
            yield
        finally:
            self._local.handler, self._local.on_reader = previous


interceptor = _Interceptor()


_WATCHED: dict[tuple[type, str], Callable] = {}  # (class, method) -> ndd's own function


def watch_method(owner: type, name: str, callback: Callable,
                 during_traces: bool = False) -> None:
    """From now on, `obj.name(*args, **kwargs)` (a method of `owner`) called outside any trace
    returns `callback(obj, original, args, kwargs)`, `original` being ndd's own function. The
    class gets one wrapper, installed once (user objects are never patched). Where the
    interceptor hooks the method too (it goes on top while tracing), the wrapper steps aside
    while a trace or transparent mode runs; `during_traces`: it never does (a method the
    interceptor leaves alone)."""
    with interceptor._lock:
        if (owner, name) in _WATCHED:
            return
        current = owner.__dict__[name]
        original = getattr(current, "_ndd_trace_original", current)

        def watched(obj: Any, *args: Any, **kwargs: Any) -> Any:
            if not during_traces and interceptor.handler() is not None:
                return original(obj, *args, **kwargs)
            return callback(obj, original, args, kwargs)

        for attribute in ("__module__", "__name__", "__qualname__", "__doc__"):
            setattr(watched, attribute, getattr(original, attribute, None))
        try:
            watched.__signature__ = inspect.signature(original)  # type: ignore[attr-defined]
        except (TypeError, ValueError):
            pass
        _WATCHED[(owner, name)] = original
        if current is original:
            setattr(owner, name, watched)
        else:  # the interceptor's hook is on top: it restores the watch when it goes
            interceptor._patched = [
                (cls, attribute, watched if saved is original else saved)
                for cls, attribute, saved in interceptor._patched]


def unwatched(owner: type, name: str) -> Callable:
    """ndd's own function of a method that `watch_method` (or the interceptor) wraps."""
    found = _WATCHED.get((owner, name))
    if found is not None:
        return found
    current = owner.__dict__[name]
    return getattr(current, "_ndd_trace_original", current)


def intercept(handler: Callable, on_reader: Callable | None = None) -> Any:
    """Context manager: while active, this thread's ndd operator calls go to `handler`, and
    `reader.next_epoch()` calls to `on_reader(reader)`."""
    return interceptor.active(handler, on_reader)


def hold_interception() -> Callable[[], None]:
    """Keep the ndd hooks installed until the returned function is called (see `intercept`)."""
    return interceptor.hold()


def eager_inside_trace() -> Any:
    return interceptor.suspended()


def tracing_active() -> bool:
    """Whether this thread's ndd calls go to a handler (a trace or transparent mode)."""
    return interceptor.handler() is not None


def schema_name(op_class: type) -> str:
    return op_class._schema_name


def synchronous() -> Any:
    """Context manager: ndd calls run, and raise, at the call (EvalMode.sync_full)."""
    return EvalMode.sync_full


def synchronous_cpu() -> Any:
    """Context manager: CPU ndd calls run at the call, on the calling thread
    (EvalMode.sync_cpu): for many small calls, cheaper than handing each to a worker thread."""
    return EvalMode.sync_cpu


def eval_mode_is_sync() -> bool:
    return EvalMode.current().value >= EvalMode.sync_cpu.value


def eager_mode_entered() -> bool:
    """Whether `with ndd.EvalMode.eager:` (or `.default`) is entered on this thread, not merely
    the default mode: its calls are to start at once ("The evaluation starts immediately")."""
    stack = _eval_mode._tls.eval_mode_stack
    return len(stack) > 1 and stack[-1] is EvalMode.eager


_OPERATOR_ATTRIBUTES = _ops.Operator.__dict__
_PROCESS_PARAMS = _OPERATOR_ATTRIBUTES["_process_params"]


def process_params_replaced() -> bool:
    """Whether `Operator._process_params` (ndd's per-call argument processing, which a recorded
    call does not go through) has been replaced, by a test's spy for example: transparent mode
    then runs calls eagerly, so that the replacement sees each call at the call, as in ndd."""
    return _OPERATOR_ATTRIBUTES.get("_process_params") is not _PROCESS_PARAMS
