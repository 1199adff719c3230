"""Transparent mode switched on from outside the program: NDD_TRACE=1, NDD_TRACE_REPORT=path.

    NDD_TRACE=1 python train.py                              # transparent mode, no code change
    NDD_TRACE=1 torchrun --nproc_per_node=8 train.py         # every rank
    NDD_TRACE=1 NDD_TRACE_REPORT=report.json torchrun --nproc_per_node=2 train.py
    # at exit: report.rank0.json and report.rank1.json (ndd_trace.report().as_dict())

`ndd_trace.pth` (installed with the package) runs `_ndd_trace_hook` at start-up when NDD_TRACE
is set; it calls `enable_from_environment()` once the process imports DALI's dynamic mode.
`python -m ndd_trace` writes NDD_TRACE_REPORT the same way.

A process started by one that writes a report (a multiprocessing spawn or fork child, a
DataLoader worker, a subprocess), whose report would go to that same file, writes its own
beside it instead, its pid before the extension (report.json -> report.pid4242.json): each
process that registers its report lists the file in CLAIMED_ENV_VAR, which its children inherit.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import threading
from collections.abc import Collection

from .core import process_state
from .core import ledger, logs
from .core.files import write_atomic
from .core.source import importer_location
from .modes import lazy

REPORT_ENV_VAR = "NDD_TRACE_REPORT"
# the report files (absolute paths, a JSON list) that the processes this one descends from write
CLAIMED_ENV_VAR = "NDD_TRACE_REPORTS_CLAIMED"


def rank() -> str | None:
    """This process's rank as launchers set it (torchrun: RANK, then LOCAL_RANK), or None."""
    for name in ("RANK", "LOCAL_RANK"):
        value = os.environ.get(name, "").strip()
        if value:
            return value
    return None


def _file_token(value: str) -> str:
    """The rank as a part of a file name: ASCII letters, digits, `-` and `_` only (a RANK of
    "/../x" must not lead the report out of its folder)."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", value)


def report_path(path: str) -> str:
    """`path` for this rank: "{rank}" in it is replaced; else `.rank<N>` goes before the
    extension (report.json -> report.rank3.json); without a rank, `path` as it is. The rank
    goes in as a file-name token (`_file_token`), so the report stays in `path`'s folder."""
    this_rank = rank()
    if this_rank is not None:
        this_rank = _file_token(this_rank)
    if "{rank}" in path:
        return path.replace("{rank}", this_rank if this_rank is not None else "0")
    if this_rank is None:
        return path
    root, extension = os.path.splitext(path)
    return f"{root}.rank{this_rank}{extension}"


def write_report(path: str, taken: Collection[str] = ()) -> str:
    """Write `ndd_trace.report()` as JSON to this rank's `path`; return the file written. Where
    that file is one another process of this run writes (`taken`: absolute paths), this
    process's pid goes before the extension (report.json -> report.pid4242.json)."""
    target = report_path(path)
    if os.path.abspath(target) in taken:
        root, extension = os.path.splitext(target)
        target = f"{root}.pid{os.getpid()}{extension}"
    directory = os.path.dirname(target)
    if directory:
        os.makedirs(directory, exist_ok=True)
    write_atomic(target, json.dumps({"rank": rank(), "pid": os.getpid(),
                                     **lazy.report().as_dict()}, indent=2))
    return target


def write_report_at_exit(path: str | None = None) -> None:
    """Write the JSON report to `path` (default: $NDD_TRACE_REPORT) when the process exits, to
    a file of its own where a process it descends from writes the same one (see module doc)."""
    path = path or os.environ.get(REPORT_ENV_VAR, "").strip()
    if path and os.path.isdir(path):  # (said now, not as an error at exit)
        ledger.warn(f"ndd_trace: {REPORT_ENV_VAR}={path} is a folder: no report is written; "
                    "give a file name in it", importer_location())
        return
    if path and path not in process_state.reports_registered:
        process_state.reports_registered.add(path)
        taken = _claimed()
        atexit.register(_write_report_at_exit, path, taken, os.getpid())
        # (the file as named at start; a child that inherits this writes beside it)
        os.environ[CLAIMED_ENV_VAR] = json.dumps(
            sorted({*taken, os.path.abspath(report_path(path))}))


def _write_report_at_exit(path: str, taken: tuple[str, ...], registered_by: int) -> None:
    if os.getpid() != registered_by:  # a fork child: its parent's file is in its environment
        taken = _claimed()
    write_report(path, taken)


def _claimed() -> tuple[str, ...]:
    """The report files that the processes this one descends from write ($CLAIMED_ENV_VAR)."""
    try:
        claimed = json.loads(os.environ.get(CLAIMED_ENV_VAR, "") or "[]")
    except ValueError:
        return ()
    return tuple(item for item in claimed if isinstance(item, str)) if isinstance(
        claimed, list) else ()


def enable_from_environment() -> None:
    """NDD_TRACE=1: transparent mode for the calling thread, the report written at exit."""
    lazy.enable()
    logs.transparent.info("NDD_TRACE: transparent mode on (thread %s)",
                          threading.current_thread().name)
    write_report_at_exit()
