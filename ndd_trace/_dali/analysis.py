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

The directory holds pickles: name one only you can write to, as for any pickle cache.
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
from typing import Any

from nvidia.dali.experimental.dynamic import _source_analysis

from ..core import files, logs
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
stats = {"loaded": 0, "saved": 0, "failed": 0}


def _after_fork() -> None:
    global _lock
    _lock = threading.Lock()  # a fork while another thread held it: the child's is free


os.register_at_fork(after_in_child=_after_fork)


def set_directory(path: Any) -> None:
    """Keep DALI's parse of each calling module in `path` (None: no cache)."""
    global _directory
    with _lock:
        _directory = (os.path.abspath(os.path.expanduser(os.fspath(path))) if path is not None
                      else None)
        _done.clear()


def directory() -> str | None:
    return _directory


def _mapping_proxy(mapping: dict) -> types.MappingProxyType:
    return types.MappingProxyType(mapping)


class _Pickler(pickle.Pickler):
    """A libcst scope holds read-only views (mappingproxy), which pickle cannot name: they are
    saved as the dict they show (for this pickler only; nothing global is registered)."""

    dispatch_table = {**copyreg.dispatch_table,
                      types.MappingProxyType: lambda view: (_mapping_proxy, (dict(view),))}


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


def prepare(code: types.CodeType | None) -> None:
    """Before DALI analyses a call site in `code`'s file: that file's parse loaded from the
    cache directory into DALI's cache, or, on a miss, made now (as the call is about to) and
    saved there. Once per file and process; nothing without a cache directory."""
    if _directory is None or code is None:
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
    if held is not None and held[0] is entry:
        return  # DALI has parsed it already in this process
    path = os.path.join(where, f"analysis-{_key(''.join(lines))}.pickle")
    try:
        with open(path, "rb") as file:
            info = pickle.load(file)  # noqa: S301 (the user's own cache directory)
    except FileNotFoundError:
        info = None
    except Exception as error:  # noqa: BLE001 (a corrupt entry: made again below)
        logs.cache.info("analysis cache: %s unreadable (%s), parsed again", path, error)
        info = None
    if isinstance(info, _source_analysis.ModuleInfo):
        _source_analysis._file_cache[filename] = (entry, info)
        stats["loaded"] += 1
        logs.cache.info("analysis cache: %s loaded from %s", filename, path)
        return
    info = _source_analysis._get_module_info(code)  # DALI's own parse, due at this call
    if info is None:
        return
    os.makedirs(where, exist_ok=True)
    buffer = io.BytesIO()
    _Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(info)
    # atomic: ranks writing at once leave one whole entry; the owner's alone to read
    files.write_atomic(path, buffer.getbuffer(), mode=0o600)
    stats["saved"] += 1
    logs.cache.info("analysis cache: %s saved to %s", filename, path)
