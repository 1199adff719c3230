"""Files ndd_trace writes, whole or not at all; file names given to it, read as `os` reads them;
the cache's files, read only where no other user can have put them.

    write_atomic("pipe.py", source)               # a reader sees the old file or the new one
    write_atomic(entry, pickled, mode=0o600)      # a cache entry only its owner can read
    path = path_argument(path, "path", "export")  # str, bytes or os.PathLike -> str
    reason = foreign_directory_reason(folder)     # None, or why another user controls it
    with open_owned(entry) as file: ...           # UntrustedFileError: a link, another's file

Every file ndd_trace writes goes through `write_atomic`: the data goes to a temporary file in
the target's folder, flushed and fsynced, then `os.replace`s the target, so a full disk, a
crash or a process writing the same file at once leaves the previous file or the new one, never
a part of either.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from typing import IO, Any

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
    temporary = None
    try:
        descriptor, temporary = _create_temporary(folder, name, mode)
        with os.fdopen(descriptor, "wb") as file:
            file.write(content)
            file.flush()
            os.fsync(file.fileno())  # on disk before it takes the target's name
        os.replace(temporary, target)
    except BaseException as error:
        if temporary is not None:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
        if isinstance(error, OSError) and error.errno is not None:  # named by the target,
            raise type(error)(error.errno, error.strerror, target) from None  # not our file
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


class UntrustedFileError(Exception):
    """A file that another user may have written (`reason` says why, as a predicate: "is a
    symbolic link (to '/x')"): not to be read."""

    def __init__(self, path: str, reason: str):
        self.path = path
        self.reason = reason
        super().__init__(f"{path} {reason}")


def _user() -> int | None:
    """This process's effective user id (None where the platform has none: no checks)."""
    return os.geteuid() if hasattr(os, "geteuid") else None


def foreign_directory_reason(path: str) -> str | None:
    """Why a user other than this process's could put files into the directory `path`, as a
    predicate ("is owned by uid 1001, and ..."), or None where it is ours and only we write to
    it. Its group may write to it where that group is our private one (`_users_own_group`).
    With the sticky bit (as /tmp has it), others may add files but not rename or remove ours,
    and what they add is refused file by file (`open_owned`): accepted. The directory a
    symbolic link names is the one checked, not its parents. OSError where it cannot be read."""
    user = _user()
    if user is None:
        return None
    status = os.stat(path)
    if not stat.S_ISDIR(status.st_mode):
        return "is not a directory"
    if status.st_uid != user:
        return f"is owned by uid {status.st_uid}, and this process runs as uid {user}"
    writers = [who for who, bit in (("its group", stat.S_IWGRP), ("other users", stat.S_IWOTH))
               if status.st_mode & bit and not (bit == stat.S_IWGRP and
                                                _users_own_group(status.st_gid, user))]
    if writers and not status.st_mode & stat.S_ISVTX:
        return (f"may be written to by {' and '.join(writers)} (mode "
                f"{stat.S_IMODE(status.st_mode):04o}), with no sticky bit to keep them from "
                "replacing its files")
    return None


def _users_own_group(gid: int, user: int) -> bool:
    """Whether group `gid` is the user's private group (Debian's, Ubuntu's and Fedora's
    convention, whose umask 002 makes every new directory group-writable): named as the user,
    no other member listed."""
    try:
        import grp
        import pwd

        name = pwd.getpwuid(user).pw_name
        group = grp.getgrgid(gid)
    except (ImportError, KeyError):
        return False
    return group.gr_name == name and set(group.gr_mem) <= {name}


def open_owned(path: str) -> IO[bytes]:
    """`path` opened to read, if it is a regular file of this process's user with no other name
    (hard link). FileNotFoundError where there is none; UntrustedFileError for a symbolic link
    (never followed), another user's file, a FIFO or device, a file with other names."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0) | \
        getattr(os, "O_NONBLOCK", 0)  # (a FIFO put in its place does not block the open)
    try:
        descriptor = os.open(path, flags)
    except OSError as error:
        if error.errno == errno.ELOOP and os.path.islink(path):
            raise UntrustedFileError(path, f"is a symbolic link (to "
                                           f"{os.readlink(path)!r})") from None
        raise
    try:
        reason = _foreign_file_reason(os.fstat(descriptor))
        if reason is not None:
            raise UntrustedFileError(path, reason)
        return os.fdopen(descriptor, "rb")
    except BaseException:
        os.close(descriptor)
        raise


def _foreign_file_reason(status: os.stat_result) -> str | None:
    if not stat.S_ISREG(status.st_mode):
        return "is not a regular file"
    user = _user()
    if user is not None and status.st_uid != user:
        return f"is owned by uid {status.st_uid}, and this process runs as uid {user}"
    if status.st_nlink > 1:  # (0: replaced since it was opened, by a writer of ours)
        return f"has {status.st_nlink} names (hard links): it may be another file's content"
    return None
