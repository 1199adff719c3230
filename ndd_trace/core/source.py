"""Source locations: finding the user's frame, registering generated code, raising at user lines.

    loc = user_location()                 # first frame outside DALI and ndd_trace
    str(loc)                              # "/home/me/project/train.py:42"
    loc.portable                          # "train.py:42" (generated code's comments)
    register_source("<ndd_trace:f#1>", code_text)   # tracebacks show generated lines
    raise_at(error, loc)                  # the traceback ends at the user's line
    names = NameTable({"fn"}); names.claim("d_ｙ")   # "_k0_d_y": a valid ASCII identifier
    "# " + one_line(str(loc))             # a comment that ends where it should

Kept free of DALI imports: everything above it in the layering may use it.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import itertools
import keyword
import linecache
import os
import re
import sys
import threading
import types
import unicodedata
import warnings
from collections.abc import Callable

import astunparse

from . import process_state

# the package (ndd_trace/), not this module's folder (ndd_trace/core/)
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _internal_dirs() -> tuple[str, ...]:
    dirs = [_PACKAGE_DIR]
    for name in ("nvidia.dali", "makefun", "optree"):  # (optree: core/trees.py walks outputs)
        module = sys.modules.get(name)
        if module is not None and getattr(module, "__file__", None):
            dirs.append(os.path.dirname(os.path.abspath(module.__file__)))
    return tuple(dirs)


@dataclasses.dataclass(frozen=True)
class SourceLoc:
    """Where the user called something: file, line and function name."""

    filename: str
    lineno: int
    function: str = "?"
    # the calling code and instruction, for the call's columns (a traceback's carets), read
    # only where an error needs them: not part of its identity (file, line, function)
    code: types.CodeType | None = dataclasses.field(default=None, compare=False, repr=False)
    lasti: int = dataclasses.field(default=-1, compare=False, repr=False)

    def __reduce__(self) -> tuple:  # (a code object does not pickle; the columns are not kept)
        return SourceLoc, (self.filename, self.lineno, self.function)

    def columns(self) -> tuple[int, int] | None:
        """The call's first and end columns on its line, where known."""
        if self.code is None or self.lasti < 0:
            return None
        for first, last, col, end_col in itertools.islice(
                self.code.co_positions(), self.lasti // 2, self.lasti // 2 + 1):
            if first == last == self.lineno and col is not None and end_col is not None:
                return col, end_col
        return None

    def __str__(self) -> str:
        return f"{self.filename}:{self.lineno}"

    @property
    def short(self) -> str:
        return f"{os.path.basename(self.filename)}:{self.lineno}"

    def line_text(self) -> str:
        return linecache.getline(self.filename, self.lineno).strip()

    @property
    def portable(self) -> str:
        """`file:line` as generated and exported code write it (`portable_path`)."""
        return f"{portable_path(self.filename)}:{self.lineno}"


def portable_path(filename: str) -> str:
    """A source file as code ndd_trace writes names it, never by a machine's absolute path:
    relative to the current directory where the file is under it (`src/train.py`), else to
    the deepest `sys.path` entry that holds it (its module's path: `mypackage/augment.py`),
    else by its base name. Names that are not paths (`<stdin>`) stay as they are. (Tracebacks
    and warnings keep the real file: they read the code objects and `SourceLoc.filename`.)"""
    if not os.path.isabs(filename):
        return filename
    try:
        cwd = [os.getcwd()]
    except OSError:  # (the current directory was removed)
        cwd = []
    roots = [*cwd, *sorted({os.path.abspath(entry) for entry in sys.path if entry},
                           key=len, reverse=True)]
    for root in roots:
        root = root.rstrip(os.sep)
        if root and filename.startswith(root + os.sep):  # (not "/": that names every file)
            return filename[len(root) + 1:]
    return os.path.basename(filename)


def is_internal_file(filename: str) -> bool:
    """True for files of ndd_trace, DALI, makefun and optree, and for generated code (memoized
    in process_state.internal_files once DALI, makefun and optree are imported: every recorded call
    walks the stack through the same few files)."""
    known = process_state.internal_files.get(filename)
    if known is not None:
        return known
    dirs = process_state.internal_dirs
    if not dirs or len(dirs[0]) < 4:
        dirs[:] = [_internal_dirs()]
    internal = filename.startswith(("<makefun", "<ndd_trace", *dirs[0]))
    if len(dirs[0]) >= 4 and len(process_state.internal_files) < 4096:
        process_state.internal_files[filename] = internal
    return internal


def user_frame(start: types.FrameType | None = None) -> types.FrameType | None:
    """The innermost frame that belongs to user code."""
    frame = start if start is not None else sys._getframe(1)
    while frame is not None and is_internal_file(frame.f_code.co_filename):
        frame = frame.f_back
    return frame


def call_stack(frame: types.FrameType | None) -> tuple:
    """(code, line) of `frame` and of each frame it was called from, innermost first: what
    eager ndd keeps of an op call (~1.5 us for 17 frames; ndd_trace's, DALI's and makefun's
    are left out only where an error shows them, by under_call_stack) for the traceback of an
    error that surfaces at a later use of its result."""
    stack = []
    while frame is not None:
        stack.append((frame.f_code, frame.f_lineno))
        frame = frame.f_back
    return tuple(stack)


def frames_within(frame: types.FrameType | None) -> tuple:
    """call_stack of the user frames `frame` (an op call's) was called from, up to the first
    frame of DALI, makefun or ndd_trace (a traced function's own frame is the outermost):
    the helpers between a compiled function and its op calls."""
    stack = []
    frame = frame.f_back if frame is not None else None
    while frame is not None and not is_internal_file(frame.f_code.co_filename):
        stack.append((frame.f_code, frame.f_lineno))
        frame = frame.f_back
    return tuple(stack)


def may_be_caught(filename: str, line: int) -> bool:
    """Whether the statement at `line` of `filename` is in the body of a `try` with handlers or
    of a `with` (whose exit may swallow an exception) of that file: an error raised there may
    be handled by the user's own code (True where the source cannot be read: the safe answer)."""
    spans = _guarded_spans(filename)
    return spans is None or any(first <= line <= last for first, last in spans)


@functools.lru_cache(maxsize=64)  # (asked on a failure's path only; a file parsed once)
def _guarded_spans(filename: str) -> tuple[tuple[int, int], ...] | None:
    """The first and last lines of each `try` body (with handlers) and `with` body of a file;
    None where its source cannot be read."""
    text = "".join(linecache.getlines(filename))
    try:
        tree = ast.parse(text) if text else None
    except (SyntaxError, ValueError):
        tree = None
    if tree is None:
        return None
    return tuple(
        (node.body[0].lineno, max(statement.end_lineno or statement.lineno
                                  for statement in node.body))
        for node in ast.walk(tree)
        if (isinstance(node, (ast.Try, getattr(ast, "TryStar", ast.Try))) and node.handlers)
        or isinstance(node, (ast.With, ast.AsyncWith)))


def callers_stack() -> tuple:
    """call_stack of the user's frames the caller of this function was called from."""
    return call_stack(sys._getframe(1))


# a code object that returns its own frame: made to claim a (file, function, line) of a stack
_FRAME_TEMPLATE = (lambda: sys._getframe(0)).__code__


# in the globals of under_call_stack's frames (not raise_at's _MADE_UP: those stand for a line
# whose own frame may follow, and give way to it; these are a stack's, shown as they are)
_STACK_FRAME = "__ndd_trace_call_stack__"


def _on_a_thread_of_its_own(work: Callable[[], None], name: str) -> None:
    """Run `work` on a thread of its own, and wait: the frames it makes lead back (`f_back`)
    to that thread's frames, not to the caller's, whose locals may hold an error (a cycle)."""
    thread = threading.Thread(target=work, name=name, daemon=True)
    thread.start()
    thread.join()


def under_call_stack(error: BaseException, stack: tuple) -> None:
    """Put the frames of `stack` (call_stack's, innermost first) outside `error`'s traceback,
    as eager ndd's traceback of a deferred error shows the op call's whole stack (its frames
    made up: a file, function and line each, holding nothing of the user's)."""
    stack = tuple(entry for entry in stack if not is_internal_file(entry[0].co_filename))
    lines = [(code.co_filename, code.co_name, lineno) for code, lineno in stack]
    frames = {line: process_state.made_frames.get(line) for line in lines}
    missing = [line for line, frame in frames.items() if frame is None]

    def make() -> None:  # (on a thread of its own: see below)
        for filename, function, lineno in missing:
            code = _FRAME_TEMPLATE.replace(co_filename=filename, co_name=function,
                                           co_firstlineno=lineno)
            frames[filename, function, lineno] = types.FunctionType(
                code, {"sys": sys, _STACK_FRAME: True})()

    if missing:
        # a made frame's f_back is the frame that made it: made here, it would lead back to
        # this one, which holds `error` (a cycle keeping it, and what it holds, until a
        # collection)
        _on_a_thread_of_its_own(make, "ndd_trace call stack")
        _keep_made_frames({line: frames[line] for line in missing})
    tb = error.__traceback__
    for filename, function, lineno in lines:
        tb = types.TracebackType(tb, frames[filename, function, lineno], 0, lineno)
    error.__traceback__ = tb


_MADE_FRAMES_KEPT = 512  # lines a process keeps a made frame for (the oldest go first)


def _keep_made_frames(made: dict) -> None:
    """Keep the frames just made for the next error at the same line (a made frame holds
    nothing of the user's: its namespace is emptied)."""
    kept = process_state.made_frames
    kept.update(made)
    while len(kept) > _MADE_FRAMES_KEPT:
        kept.pop(next(iter(kept)), None)


def without_call_stack(error: BaseException) -> BaseException:
    """`error` without under_call_stack's frames: raised at its call after all (as eager
    raises an error at the call, from the call's own frames)."""
    error.__traceback__ = traceback_of([
        entry for entry in traceback_entries(error.__traceback__)
        if _STACK_FRAME not in entry.tb_frame.f_globals])
    return error


def site_of(loc: SourceLoc | None) -> str:
    """A call site's `file:line`, as keys and reports name it ("?" where it is unknown)."""
    return str(loc) if loc else "?"


def user_location(start: types.FrameType | None = None) -> SourceLoc | None:
    """The user's call site, skipping frames of DALI, makefun and ndd_trace."""
    frame = user_frame(start if start is not None else sys._getframe(1))
    if frame is None:
        return None
    return SourceLoc(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name,
                     frame.f_code, frame.f_lasti)


def importer_location() -> SourceLoc | None:
    """The user's line that is importing ndd_trace now (`import ndd_trace`): the first user
    frame outside the import machinery."""
    frame = user_frame(sys._getframe(1))
    while frame is not None and frame.f_code.co_filename.startswith("<frozen importlib"):
        frame = user_frame(frame.f_back)
    return None if frame is None else user_location(frame)


def unparse(node: ast.AST) -> str:
    """Python source of an AST node, printed by astunparse. Its printer reads `ast.Num` and
    `.n`, deprecated since Python 3.12: those warnings are ndd_trace's affair, and would
    otherwise reach the user's own warning filters (a script recording its warnings saw one
    more with ndd_trace on)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return astunparse.unparse(node)


class NameTable:
    """Unique, valid ASCII identifiers for whatever names reach generated code (parameters,
    dict keys, the user's variables, function names): the one place such names are made.

    An ASCII name keeps its letters, digits and underscores (others become `_`; `v` before a
    leading digit, `_` after a keyword or a reserved name); any other name becomes
    `_k<n>_<its ASCII letters>`, `n` counting those in this table. `_2`, `_3`... make each name
    unique. Every identifier given is ASCII, which NFKC normalization (how Python reads
    identifiers) leaves as it is: two names given never read as one variable.
    """

    def __init__(self, reserved: set[str] | frozenset[str] = frozenset()):
        self.reserved = reserved
        self.taken: set[str] = set()
        self.mangled = 0

    def claim(self, name: str) -> str:
        """A new identifier for `name`, unlike any other of this table."""
        if name.isascii():
            base = re.sub(r"[^A-Za-z0-9_]", "_", name) or "v"
        else:  # fullwidth, superscript, accented letters: their ASCII look-alikes, if any
            letters = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode()
            base = f"_k{self.mangled}_" + re.sub(r"[^A-Za-z0-9_]", "_", letters)
            self.mangled += 1
        if base[0].isdigit():
            base = "v" + base
        if keyword.iskeyword(base) or base in self.reserved:
            base += "_"
        identifier, suffix = base, 2
        while identifier in self.taken:
            identifier, suffix = f"{base}_{suffix}", suffix + 1
        self.taken.add(identifier)
        return identifier


def one_line(text: str) -> str:
    """`text` for a comment or docstring of generated code: every character that is not
    printable (line breaks above all) written as its Python escape, so the text ends nowhere
    early."""
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else repr(char)[1:-1] for char in text)


def docstring(text: str) -> str:
    """The triple-quoted literal of `text` (a module docstring): backslashes, quotes and
    characters that are not printable escaped, so that nothing in it closes the string or
    ends a line early; its own line breaks stay line breaks."""
    body = "".join("\\" + char if char in '\\"' else
                   char if char == "\n" or char.isprintable() else repr(char)[1:-1]
                   for char in text)
    literal = f'"""{body}"""'
    assert ast.literal_eval(literal) == text, "a docstring literal that does not read back"
    return literal


def register_source(filename: str, text: str) -> None:
    """Make generated code visible to tracebacks and `inspect` (as torch.fx does)."""
    lines = text.splitlines(keepends=True)
    linecache.cache[filename] = (len(text), None, lines, filename)


def innermost_user_loc(error: BaseException | None) -> SourceLoc | None:
    """The innermost user frame of an exception's traceback."""
    loc = None
    tb = error.__traceback__ if error is not None else None
    while tb is not None:
        code = tb.tb_frame.f_code
        if not is_internal_file(code.co_filename):
            loc = SourceLoc(code.co_filename, tb.tb_lineno, code.co_name)
        tb = tb.tb_next
    return loc


def traceback_entries(tb: types.TracebackType | None) -> list[types.TracebackType]:
    """The entries of a traceback, outermost first."""
    entries = []
    while tb is not None:
        entries.append(tb)
        tb = tb.tb_next
    return entries


def traceback_of(entries: list[types.TracebackType]) -> types.TracebackType | None:
    """A traceback of `entries` (outermost first), each frame and line as it was."""
    rebuilt = None
    for entry in reversed(entries):
        rebuilt = types.TracebackType(rebuilt, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    return rebuilt


def hide_own_frames(error: BaseException, at: SourceLoc | None = None) -> None:
    """Drop ndd_trace's frames from the traceback of an error that is not ndd_trace's own (DALI's
    or the user's, raised below a hook or at the user's line by `raise_at`): it reads as the
    traceback of the eager call. An error raised in ndd_trace's code keeps them (a bug to find).
    Called where the error leaves ndd_trace, before a bare `raise`; `at`: the user's line it
    leaves to (a hook's caller), whose own frame follows: raise_at's frame for it is dropped."""
    entries = traceback_entries(error.__traceback__)
    if not entries or entries[-1].tb_frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        return
    kept = [entry for entry in entries
            if not entry.tb_frame.f_code.co_filename.startswith(_PACKAGE_DIR)]
    real = {(entry.tb_frame.f_code.co_filename, entry.tb_lineno) for entry in kept
            if _MADE_UP not in entry.tb_frame.f_globals}
    if at is not None:
        real.add((at.filename, at.lineno))
    # (raise_at's frame left out where the line's own is there)
    error.__traceback__ = traceback_of([
        entry for entry in kept if _MADE_UP not in entry.tb_frame.f_globals
        or (entry.tb_frame.f_code.co_filename, entry.tb_lineno) not in real])


_MADE_UP = "__ndd_trace_raise_at__"  # in the globals of the frames raise_at makes


def _raising_statement(loc: SourceLoc) -> tuple[str, str]:
    """A statement for `loc`'s line that raises the error, and the name it calls: a call
    spanning the user's call's columns where they are known (a traceback's carets fall under
    it, as under eager's), else `raise`."""
    columns = loc.columns()
    if columns is None or columns[1] - columns[0] < 3:
        return "raise __ndd_trace_error__", "__ndd_trace_raiser__"
    col, end_col = columns
    name = "_" * (end_col - col - 2)
    if not col:
        return f"{name}()", name
    return "(" + " " * (col - 1) + f"{name}())", name


def raise_at(error: BaseException, loc: SourceLoc | None) -> None:
    """Raise `error` from a frame that claims the user's `file:line`, so tracebacks end there.

    The same trick Jinja2 uses for template tracebacks: compile a `raise` statement under the
    user's file name, padded so that it lands on the user's line; its frame is made once a
    line (`_frame_at`) and put in front of the error's traceback.
    """
    if loc is None:
        raise error
    frame, lasti = _frame_at(loc)
    tb = types.TracebackType(error.__traceback__, frame, lasti, loc.lineno)
    try:
        raise error.with_traceback(tb)
    finally:
        del error, tb


class _FrameWanted(Exception):
    """Raised by the statement _frame_at runs, for the frame it leaves in its traceback."""


def _frame_at(loc: SourceLoc) -> tuple[types.FrameType, int]:
    """A finished frame of code claiming `loc`'s file, function and line, and the offset of
    its raising call (a traceback's carets fall under the user's call, as under eager's).

    Made on a thread of its own: the frame then leads back (`f_back`) to that thread's
    frames, not to this package's callers, whose locals may hold an error (a cycle that only a
    garbage collection frees, keeping DALI's operator instances of the failed call from
    eager ndd's next call, which then makes them anew: ~270 ms for a GPU decoder). Kept for
    the next error at that line: a thread costs ~100 us, a raise from a kept frame ~1 us.
    """
    statement, name = _raising_statement(loc)
    key = (loc.filename, loc.lineno, loc.function, statement)
    made = process_state.made_frames.get(key)
    if made is not None:
        return made
    code = compile("\n" * (loc.lineno - 1) + statement, loc.filename, "exec")
    code = code.replace(co_name=loc.function)

    def raiser() -> None:  # (its frame is this package's: not the one kept)
        raise _FrameWanted

    found: list = []

    def run() -> None:
        namespace = {"__ndd_trace_error__": _FrameWanted, name: raiser}
        try:
            exec(code, namespace)
        except _FrameWanted as raised:
            found.extend((entry.tb_frame, entry.tb_lasti)
                         for entry in traceback_entries(raised.__traceback__)
                         if entry.tb_frame.f_code is code)
            raised.__traceback__ = None
        finally:
            namespace.clear()
            namespace[_MADE_UP] = True  # (its frame, kept in tracebacks, says so)

    _on_a_thread_of_its_own(run, "ndd_trace raise_at")
    _keep_made_frames({key: found[0]})
    return found[0]
