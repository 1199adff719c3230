"""DALI's call-site analysis, kept across processes: the warm start.

Eager ndd decides which keyword arguments of a call are construction arguments by reading the
call site's source (`_source_analysis`): its first call from a module parses that module with
libcst and resolves its scopes, ~1 ms a line (about 1 s for a 900-line script on the H200 host),
and recording pays the same to split arguments as eager does. That parse is the bulk of a
trace. It is a function of the module's text alone: what DALI then asks of it (is this name
bound once, to a literal?) is answered against the live frames at each call, as before.

With a cache directory (`NDD_TRACE_CACHE_DIR`, or `ndd_trace.set_cache_dir(path)`), the parse
of each module is saved there (pickled, ~0.8 MB for 900 lines) under a key of the exact text
DALI parses, the DALI, libcst and Python versions, DALI's analysis code and this format's
number; a later process (a restart, torchrun's other ranks) loads it (~20 ms) into DALI's own
per-file cache, where DALI's next call finds it exactly as if it had parsed the file. Anything
that goes wrong (an unreadable file, a corrupt entry) leaves DALI to parse as it does without
the cache.

    where = trusted_directory()     # the directory, or None: none set, or refused (warned once)
    refuse(where, path, reason)     # a file there is not ours: the cache is off in this process

The directory holds pickles, which run code when loaded: it is used only where no other user
can have written to it (`files.foreign_directory_reason`: it is ours, and not writable by
others unless sticky), and an entry is read only if it is a regular file of ours, not a link
(`files.open_owned`). Anything else turns the cache off for the process, with one
NddTraceWarning saying what was refused and why (docs/warm-start.md, "What the cache trusts").
An entry is unpickled with only the classes a parse is made of, and used only if it holds the
tables DALI reads; else it is a miss.
"""

from __future__ import annotations

import copyreg
import functools
import hashlib
import importlib.metadata
import io
import linecache
import os
import pickle
import sys
import threading
import types
from collections.abc import Mapping
from typing import Any

from nvidia.dali.experimental.dynamic import _source_analysis

from ..core import files, ledger, logs
from ..core.source import user_location
from .base import DALI_VERSION

FORMAT = 1  # bump when what is saved changes
try:
    _LIBCST_VERSION = importlib.metadata.version("libcst")
except importlib.metadata.PackageNotFoundError:  # (vendored): its module's file names it
    _LIBCST_VERSION = os.path.dirname(_source_analysis.cst.__file__)
_lock = threading.Lock()
_directory: str | None = (os.path.abspath(os.path.expanduser(os.environ["NDD_TRACE_CACHE_DIR"]))
                          if os.environ.get("NDD_TRACE_CACHE_DIR") else None)
_done: set[str] = set()  # files handled in this process
_parsing: dict[str, threading.Thread] = {}  # file -> the thread parsing it ahead (prefetch)
# directory -> None (checked: only this user can have written to it) or why it is refused
_verdicts: dict[str, str | None] = {}
stats = {"loaded": 0, "saved": 0, "failed": 0}


def _after_fork() -> None:
    global _lock
    _lock = threading.Lock()  # a fork while another thread held it: the child's is free
    _parsing.clear()  # (its threads are not the child's: a call parses as without)


os.register_at_fork(after_in_child=_after_fork)


def set_directory(path: Any) -> None:
    """Keep DALI's parse of each calling module in `path` (None: no cache)."""
    global _directory
    with _lock:
        _directory = (os.path.abspath(os.path.expanduser(os.fspath(path))) if path is not None
                      else None)
        _done.clear()
        _verdicts.clear()  # (a directory whose owner or mode was fixed is checked again)


def directory() -> str | None:
    return _directory


def trusted_directory() -> str | None:
    """The cache directory where this process may use it: made if missing (mode 0o700), checked
    once; None without one, where it cannot be made or read (a file of that name, no
    permission), or where another user could have written to it (each refused, with one
    warning)."""
    where = _directory
    if where is None:
        return None
    if where in _verdicts:
        return where if _verdicts[where] is None else None
    try:
        os.makedirs(where, mode=0o700, exist_ok=True)
        reason = files.foreign_directory_reason(where)
    except OSError as error:
        _warn_once(where, f"ndd_trace: the warm-start cache directory {where} "
                   "(NDD_TRACE_CACHE_DIR, ndd_trace.set_cache_dir) cannot be used: "
                   f"{error.strerror or error}. Nothing is loaded from it or saved to it in "
                   "this process. Name a directory you can write to (such as "
                   "~/.cache/ndd_trace), or unset NDD_TRACE_CACHE_DIR.")
        return None
    if reason is not None:
        refuse(where, where, reason)
        return None
    _verdicts.setdefault(where, None)
    return where if _verdicts[where] is None else None


def refuse(where: str, path: str, reason: str) -> None:
    """Use the cache directory `where` no more in this process: `path` (itself, or a file in
    it) may have been written by another user (`reason`). Warned once per directory, at the
    user's line where one is on the stack."""
    if path == where:
        what = "it"
        remedy = ("Name a directory that you own and only you can write to (such as "
                  "~/.cache/ndd_trace), or make this one yours with mode 700 (chown, then "
                  f"chmod 700 {where})")
    else:
        what = f"its file {os.path.basename(path)}"
        remedy = (f"Delete {path} if you did not put it there yourself (ndd_trace writes "
                  "its entries again), or name another directory")
    message = (f"ndd_trace: the warm-start cache directory {where} (NDD_TRACE_CACHE_DIR, "
               f"ndd_trace.set_cache_dir) is not used in this process: {what} {reason}. "
               "Another user could have put files there, and its entries are pickles, "
               "which run code as you when loaded: nothing is loaded from it or saved to "
               f"it. {remedy}.")
    _warn_once(where, message)


def _warn_once(where: str, message: str) -> None:
    """The cache directory `where` is used no more in this process, for `message`'s reason:
    said once, at the user's line where one is on the stack."""
    with _lock:
        if _verdicts.get(where) is not None:
            return  # refused already, and said so
        _verdicts[where] = message
    logs.cache.info("analysis cache: %s refused: %s", where, message)
    ledger.warn(message, user_location(), stacklevel=4)


def _mapping_proxy(mapping: dict) -> types.MappingProxyType:
    return types.MappingProxyType(mapping)


class _Pickler(pickle.Pickler):
    """A libcst scope holds read-only views (mappingproxy), which pickle cannot name: they are
    saved as the dict they show (for this pickler only; nothing global is registered)."""

    dispatch_table = {**copyreg.dispatch_table,
                      types.MappingProxyType: lambda view: (_mapping_proxy, (dict(view),))}


class _Unpickler(pickle.Unpickler):
    """Only what a parse is made of can be named in an entry: libcst's classes, DALI's
    ModuleInfo and a few containers. Anything else (`os.system`, a module's imports reached
    through it) fails the load: a miss, parsed again."""

    _NAMED = {("builtins", "set"), ("builtins", "frozenset"), ("builtins", "dict"),
              ("builtins", "list"), ("builtins", "tuple"), ("collections", "defaultdict"),
              ("collections", "OrderedDict"), (__name__, "_mapping_proxy"),
              (_source_analysis.ModuleInfo.__module__, _source_analysis.ModuleInfo.__name__)}

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self._NAMED:
            return super().find_class(module, name)
        # (a module DALI's parse imported already: nothing is imported for an entry)
        if module.split(".")[0] == "libcst" and module in sys.modules and "." not in name:
            found = super().find_class(module, name)
            if isinstance(found, type) and found.__module__ == module:  # (defined there)
                return found
        raise pickle.UnpicklingError(f"{module}.{name} is not part of a parse")


def _usable(info: Any) -> bool:
    """Whether a loaded entry is a ModuleInfo holding the tables DALI reads, of the types it
    reads them as (one of another shape would fail the user's next ndd call inside DALI)."""
    if type(info) is not _source_analysis.ModuleInfo:
        return False
    try:
        scopes, parents = info.scope_of_node, info.parent_of
        by_position, by_line = info.nodes_by_position, info.nodes_by_line
    except AttributeError:  # (slots the pickle left unset)
        return False
    if not all(isinstance(table, Mapping) for table in (scopes, parents, by_position, by_line)):
        return False
    node, scope = _source_analysis.cst.CSTNode, _source_analysis.cst.metadata.Scope
    return (all(isinstance(key, node) and isinstance(value, scope)
                for key, value in scopes.items()) and
            all(isinstance(key, node) and isinstance(value, node)
                for key, value in parents.items()) and
            all(type(span) is tuple and len(span) == 4 and
                all(type(number) is int for number in span) and
                (found is None or isinstance(found, node))
                for span, found in by_position.items()) and
            all(type(line) is int and type(nodes) is tuple and
                all(isinstance(found, node) for found in nodes)
                for line, nodes in by_line.items()))


@functools.cache
def _analysis_digest() -> str:
    """DALI's analysis code itself: a build that changes it under the same version string (a
    development build) makes other keys."""
    with open(_source_analysis.__file__, "rb") as file:
        return hashlib.sha256(file.read()).hexdigest()


def _key(text: str) -> str:
    digest = hashlib.sha256()
    for part in (str(FORMAT), DALI_VERSION, _analysis_digest(), _LIBCST_VERSION, sys.version,
                 text):
        digest.update(part.encode("utf-8", "surrogatepass"))
        digest.update(b"\0")
    return digest.hexdigest()


def prefetch(code: types.CodeType | None) -> None:
    """Start parsing `code`'s file on a thread of its own, as `prepare` and then DALI's first
    call from it would: a compiled function's module at its decoration, a launched script
    before it runs. The first call finds the parse made (or waits for it) instead of making
    it then: the first batch comes up to its parse's time sooner (~1 s for 900 lines)."""
    if code is None or code.co_filename in _parsing or code.co_filename.startswith("<"):
        return
    filename = code.co_filename
    thread = threading.Thread(target=_parse_ahead, args=(code,), daemon=True,
                              name=f"ndd_trace parse {os.path.basename(filename)}")
    _parsing[filename] = thread
    thread.start()


def _entry_path(lines: list[str], where: str) -> str:
    return os.path.join(where, f"analysis-{_key(''.join(lines))}.pickle")


def _parse_ahead(code: types.CodeType) -> None:
    """DALI's parse alone: the cache directory's checks, loads and saves (and their warnings,
    at the user's line) stay with the first call's `prepare`."""
    try:
        where = _directory
        lines = linecache.getlines(code.co_filename)
        if where is not None and lines and os.path.exists(_entry_path(lines, where)):
            return  # (loaded by the first call: a parse made here would be wasted)
        _source_analysis._get_module_info(code)
    except Exception as error:  # noqa: BLE001 (the first call parses it, as without)
        logs.cache.info("parse ahead of %s failed (%s: %s)", code.co_filename,
                        type(error).__name__, error)


def prepare(code: types.CodeType | None) -> None:
    """Before DALI analyses a call site in `code`'s file: its parse made ahead waited for
    (prefetch), or that file's parse loaded from the cache directory into DALI's cache, or,
    on a miss, made now (as the call is about to) and saved there. Once per file and process;
    nothing without a cache directory."""
    if code is None:
        return
    ahead = _parsing.get(code.co_filename)
    if ahead is not None and ahead is not threading.current_thread():
        ahead.join()
    _prepare(code)


def _prepare(code: types.CodeType) -> None:
    if _directory is None:
        return
    filename = code.co_filename
    if filename in _done:
        return
    with _lock:  # (held only to claim the file: threads on other files do not wait)
        where = _directory
        if filename in _done or where is None:
            return
        _done.add(filename)
    try:
        _load_or_save(code, where)
    except Exception as error:  # noqa: BLE001 (DALI parses the file itself, as without)
        stats["failed"] += 1
        logs.cache.info("analysis cache: %s not cached (%s: %s)", filename,
                        type(error).__name__, error)


def _load_or_save(code: types.CodeType, where: str) -> None:
    filename = code.co_filename
    lines = linecache.getlines(filename)  # (as DALI reads it, before taking the entry)
    entry = linecache.cache.get(filename)
    if not lines or entry is None:
        return
    held = _source_analysis._file_cache.get(filename)
    if held is not None and held[0] is entry and filename not in _parsing:
        return  # DALI has parsed it already in this process (not ahead: saved as below)
    if trusted_directory() != where:  # refused (warned), or another one set meanwhile
        return
    path = _entry_path(lines, where)
    try:
        with files.open_owned(path) as file:
            info = _Unpickler(file).load()
    except FileNotFoundError:
        info = None
    except files.UntrustedFileError as error:
        refuse(where, error.path, error.reason)
        return
    except Exception as error:  # noqa: BLE001 (a corrupt entry: made again below)
        logs.cache.info("analysis cache: %s unreadable (%s), parsed again", path, error)
        info = None
    if info is not None and not _usable(info):
        logs.cache.info("analysis cache: %s holds no parse DALI can use, parsed again", path)
        info = None
    if info is not None:
        _source_analysis._file_cache[filename] = (entry, info)
        stats["loaded"] += 1
        logs.cache.info("analysis cache: %s loaded from %s", filename, path)
        return
    info = _source_analysis._get_module_info(code)  # DALI's own parse, due at this call
    if info is None:
        return
    if trusted_directory() != where:  # (refused meanwhile, by another thread's entry)
        return
    buffer = io.BytesIO()
    _Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(info)
    # atomic: ranks writing at once leave one whole entry; the owner's alone to read
    files.write_atomic(path, buffer.getbuffer(), mode=0o600)
    stats["saved"] += 1
    logs.cache.info("analysis cache: %s saved to %s", filename, path)
