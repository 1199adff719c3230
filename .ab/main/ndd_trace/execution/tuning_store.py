"""The tuning decisions kept per machine: `tuning-<machine digest>.json` in the cache directory,
read once, written whole and atomically, merged with what other processes wrote (tuning.py
decides what is kept).

    current_store().put(key, {"num_threads": 8, "prefetch_queue_depth": 2, ...})
    current_store().get(key)    # the decision kept for this machine, or None
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import hashlib
import json
import os
from collections.abc import Generator

from ..core import process_state
from .. import _dali
from ..core import files, logs

FORMAT = 1  # of the kept decisions: bump when what is kept changes
MERGES = 5  # a decision replaced by a writer that took no lock this often: not kept


def machine() -> str:
    """This kind of machine, as tuning sees it: the GPU and CPU models and the CPU count."""
    gpus = []
    for path in sorted(glob.glob("/proc/driver/nvidia/gpus/*/information")):
        try:
            with open(path, encoding="utf-8", errors="replace") as file:
                gpus += [line.split(":", 1)[1].strip() for line in file
                         if line.startswith("Model:")]
        except OSError:
            continue
    cpu = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as file:
            cpu = next((line.split(":", 1)[1].strip() for line in file
                        if line.startswith("model name")), "")
    except OSError:
        pass
    return f"{' + '.join(gpus) or 'no GPU'}; {cpu or 'CPU'}; {usable_cpus()} CPUs"


def usable_cpus() -> int:
    """The CPUs this process may use."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


class Store:
    """Decisions in `tuning-<machine digest>.json` in the cache directory (in memory without
    one): read once, written whole and atomically (merged with what other processes wrote)."""

    def __init__(self, directory: str | None):
        self.directory = directory
        self.machine = machine()
        name = hashlib.sha256(self.machine.encode()).hexdigest()[:16]
        self.path = os.path.join(directory, f"tuning-{name}.json") if directory else \
            "this process (no cache directory)"
        self._entries: dict | None = None

    def _read(self) -> dict:
        if self.directory is None:
            return {}
        try:
            with files.open_owned(self.path) as file:
                data = json.loads(file.read().decode("utf-8"))
        except files.UntrustedFileError as error:  # the directory is used no more (warned)
            _dali.refuse_cache_dir(self.directory, error.path, error.reason)
            self.directory = None
            return {}
        except (OSError, ValueError):
            return {}
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            return {}
        entries = data.get("entries")
        return entries if isinstance(entries, dict) else {}

    def get(self, key: str) -> dict | None:
        if self._entries is None:
            self._entries = self._read()
        entry = self._entries.get(key)
        return entry if isinstance(entry, dict) else None

    def put(self, key: str, record: dict | None) -> None:
        """Keep `record` under `key` (None: drop it). What other processes wrote since this one
        read the file wins for their keys; the read and the write are one step under the file's
        locks (`_locked`), so processes writing at once (torchrun's ranks) lose none. The file
        is read again after the write: where a writer took no lock (none could be taken, or an
        older ndd_trace) and replaced it with what it read before, the merge is made again."""
        with self._locked():
            for _ in range(MERGES):
                entries = {**(self._entries or {}), **self._read()}
                if record is None:
                    entries.pop(key, None)
                else:
                    entries[key] = record
                self._entries = entries
                if self.directory is None:
                    return
                try:
                    self._write(entries)
                except OSError as error:
                    logs.tuning.info("could not keep the tuning in %s: %s", self.path, error)
                    return
                if self._read().get(key) == record:
                    return
            logs.tuning.info("the tuning of %s was replaced %d times by other processes' as it "
                             "was written: not kept", key, MERGES)

    @contextlib.contextmanager
    def _locked(self) -> Generator[None, None, None]:
        """Locks across processes, held while inside: flock on the cache directory itself and
        on `<file>.lock`, in that order, each where it can be taken. The directory's cannot be
        taken on NFS, where the lock file's can; the lock file cannot be opened where a
        directory or another user's file has its name, where the directory's holds still. A
        process that can take neither writes all the same (atomically; `put` checks the file
        after)."""
        with contextlib.ExitStack() as stack:
            if self.directory is not None:
                with contextlib.suppress(OSError):  # (a failure is the lock's, below)
                    os.makedirs(self.directory, mode=0o700, exist_ok=True)
                for path, flags in ((self.directory, os.O_RDONLY | os.O_DIRECTORY),
                                    # (never a link another user put in its place)
                                    (self.path + ".lock", os.O_WRONLY | os.O_CREAT |
                                     os.O_NOFOLLOW)):
                    try:
                        descriptor = os.open(path, flags | os.O_CLOEXEC, 0o600)
                    except OSError as error:
                        logs.tuning.info("could not open %s to lock it: %s", path, error)
                        continue
                    stack.callback(os.close, descriptor)  # (the lock is released with it)
                    try:
                        fcntl.flock(descriptor, fcntl.LOCK_EX)
                    except OSError as error:
                        logs.tuning.info("could not lock %s: %s", path, error)
            yield

    def _write(self, entries: dict) -> None:
        """The file, written whole and atomically (its temporary file removed if that fails)."""
        files.write_atomic(self.path, json.dumps(
            {"format": FORMAT, "machine": self.machine, "entries": entries}, indent=1),
            mode=0o600)

    def drop(self, key: str) -> None:
        self.put(key, None)




def current_store() -> Store:
    """The store of the cache directory in use (kept in this process only without one)."""
    try:
        directory = _dali.trusted_cache_dir()  # (None where refused: another user's)
    except OSError as error:
        logs.tuning.info("the cache directory %s cannot be used (%s): the tuning is kept in "
                         "this process only", _dali.analysis_cache_dir(), error)
        directory = None
    store = process_state.tuning_stores.get(directory)
    if store is None:
        store = process_state.tuning_stores[directory] = Store(directory)
    return store


def forget() -> None:
    """Drop what this process read or decided (a new cache directory reads its own)."""
    process_state.tuning_stores.clear()
