"""Files ndd_trace writes, whole or not at all; file names given to it, read as `os` reads them.

    write_atomic("pipe.py", source)               # a reader sees the old file or the new one
    write_atomic(entry, pickled, mode=0o600)      # a cache entry only its owner can read
    path = path_argument(path, "path", "export")  # str, bytes or os.PathLike -> str

Every file ndd_trace writes goes through `write_atomic`: the data goes to a temporary file in
the target's folder, flushed and fsynced, then `os.replace`s the target, so a full disk, a
crash or a process writing the same file at once leaves the previous file or the new one, never
a part of either.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

# a temporary file's name: the target's (cut, to stay within a file name's 255 bytes) and a
# random part, with a leading dot so that a glob of the folder's entries does not list it
_TEMPORARY_NAME_KEPT = 120


def path_argument(value: Any, argument: str, function: str) -> str:
    """`value`, a file name given as str, bytes or os.PathLike, as a str (bytes decoded as the os
    module decodes them); a TypeError naming `function`'s `argument` for anything else."""
    try:
        return os.fsdecode(os.fspath(value))
    except TypeError:
        raise TypeError(f"{function}(): `{argument}` must be a file name (str, bytes or "
                        f"os.PathLike), got {type(value).__name__} {value!r:.80}") from None


def write_atomic(path: Any, data: bytes | bytearray | memoryview | str, *,
                 mode: int = 0o666) -> None:
    """Write `data` (str: as UTF-8) to `path` whole or not at all (see the module's docstring).
    A new file gets `mode` less the umask (0o666: as `open(path, "w")` makes it; 0o600: the
    owner's alone); a failed write leaves `path` as it was and removes its temporary file."""
    target = os.fsdecode(os.fspath(path))
    content = data.encode("utf-8") if isinstance(data, str) else data
    folder, name = os.path.split(os.path.abspath(target))
    descriptor, temporary = _create_temporary(folder, name, mode)
    try:
        with os.fdopen(descriptor, "wb") as file:
            file.write(content)
            file.flush()
            os.fsync(file.fileno())  # on disk before it takes the target's name
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    _sync_folder(folder)


def _create_temporary(folder: str, name: str, mode: int) -> tuple[int, str]:
    """A new file beside the target, created exclusively (never a file or link already there)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | \
        getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        temporary = os.path.join(folder, f".{name[:_TEMPORARY_NAME_KEPT]}."
                                         f"{os.urandom(6).hex()}.tmp")
        try:
            return os.open(temporary, flags, mode), temporary
        except FileExistsError:  # (a name drawn twice: another one)
            continue
    raise FileExistsError(f"no free temporary file name beside {os.path.join(folder, name)}")


def _sync_folder(folder: str) -> None:
    """The rename itself on disk too (best effort: some file systems cannot fsync a folder)."""
    try:
        descriptor = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)
