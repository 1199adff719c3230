"""NDD_TRACE=1: transparent mode in any Python process, with no code change and no wrapper.

    NDD_TRACE=1 python train.py                                 # like python -m ndd_trace train.py
    NDD_TRACE=1 torchrun --nproc_per_node=8 train.py            # every rank, launcher unchanged
    NDD_TRACE=1 NDD_TRACE_REPORT=report.json torchrun ...       # report.rank0.json, ... at exit

ndd_trace installs `ndd_trace.pth` next to itself; Python runs its one line at start-up, which
imports this module only when NDD_TRACE is set (to anything but "", "0", "false", "no", "off";
1, true, yes or on switch transparent mode on, another value is said on stderr and does not):
unset, nothing of ndd_trace is imported and nothing changes. Set, this module imports nothing
heavy either: it waits for the process to import DALI's dynamic mode (or ndd_trace), then imports
ndd_trace and switches transparent mode on for the importing thread (a script's main thread),
so launchers and tools that never touch DALI (torchrun's own process, pip) pay nothing.
Kept outside the `ndd_trace` package because importing a package runs its `__init__`.
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
from typing import Any

ENV_VAR = "NDD_TRACE"
_WATCHED = ("nvidia.dali.experimental.dynamic", "ndd_trace")
_ON = ("1", "true", "yes", "on")
_OFF = ("", "0", "false", "no", "off")
_SAID: list[str] = []


def requested() -> bool:
    """Whether NDD_TRACE asks for transparent mode (1, true, yes, on); another value than those
    and 0, false, no, off (`disabled`, `maybe`) is said on stderr and leaves it off."""
    value = os.environ.get(ENV_VAR, "").strip().lower()
    if value not in _ON and value not in _OFF and not _SAID:
        _SAID.append(value)  # (once: ndd_trace.pth may be on sys.path twice)
        sys.stderr.write(f"ndd_trace: NDD_TRACE={os.environ[ENV_VAR]!r} is not understood (1, "
                         "true, yes or on; 0, false, no or off): transparent mode stays off\n")
    return value in _ON


class _Loader:
    """The watched module's own loader; once the module ran, switch transparent mode on."""

    def __init__(self, loader: Any, finder: _Finder):
        self._loader, self._finder = loader, finder

    def __getattr__(self, name: str) -> Any:  # get_resource_reader, is_package, ...
        return getattr(self._loader, name)

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        module.__loader__ = module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        self._finder.loaded(module.__name__)


class _Finder:
    """A meta path finder that only watches for DALI's dynamic mode and ndd_trace."""

    def __init__(self) -> None:
        self._local = threading.local()

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name not in _WATCHED or getattr(self._local, "busy", False):
            return None
        self._local.busy = True  # the other finders below may ask the import system again
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            self._local.busy = False
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        spec.loader = _Loader(spec.loader, self)
        return spec

    def loaded(self, name: str) -> None:
        if name != "ndd_trace":
            if "ndd_trace" not in sys.modules:  # else ndd_trace is importing DALI: wait for it
                importlib.import_module("ndd_trace")
            return
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        from ndd_trace import launch

        launch.enable_from_environment()


def install() -> None:
    """Called from ndd_trace.pth when NDD_TRACE is set: watch for the import of ndd."""
    if not requested() or any(isinstance(f, _Finder) for f in sys.meta_path):
        return
    if "ndd_trace" in sys.modules:  # imported already (not at start-up): switch on now
        from ndd_trace import launch

        launch.enable_from_environment()
        return
    sys.meta_path.insert(0, _Finder())
