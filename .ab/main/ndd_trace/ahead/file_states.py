"""What a reader stream knows of the files it read ahead: when each run read, the files' states,
and whether eager ndd's reader would see a file as it is now (runahead.py's rule 5).

    state = file_state(path)                       # (device, inode, size, mtime, ctime)
    changed_before(state, read_from_ns)            # it last changed before that read, surely
    eager_reads(files, 8, epochs, first, sample, step)   # "now", "before" or None

Pure functions of the states and times a stream (streams.py) records; no DALI.
"""

from __future__ import annotations

import os
import stat
import time
from typing import Any


class ReadTimes:
    """When each run of a stream's reader was scheduled (batch number -> wall-clock ns), shared
    with its worker thread, which holds the stream itself only weakly."""

    def __init__(self) -> None:
        self.started_ns = time.time_ns()
        self.scheduled = 0  # runs scheduled so far (the next one's batch number)
        self._at: dict[int, int] = {}

    def restart(self) -> None:
        self.started_ns = time.time_ns()

    def note(self, when_ns: int) -> None:
        self._at[self.scheduled] = when_ns
        self.scheduled += 1

    def reading_from(self, number: int) -> int:
        """When run `number` was scheduled (before the first run: when the stream started)."""
        return self._at.get(number, self.started_ns) if number >= 0 else self.started_ns

    def forget_before(self, number: int) -> None:
        for key in [key for key in list(self._at) if key < number]:
            del self._at[key]


# file times tick coarsely (whole seconds on some filesystems), as git's "racily clean" knows
_TICK_SLACK_NS = 50_000_000
_SECOND_SLACK_NS = 2_000_000_000


def file_state(path: str) -> tuple[int, int, int, int, int] | None:
    """(device, inode, size, mtime, ctime) of the file at `path`, through a symlink (ctime: the
    later of the link's and the file's); None if there is none."""
    try:
        link = os.lstat(path)
        state = os.stat(path) if stat.S_ISLNK(link.st_mode) else link
    except OSError:
        return None
    return (state.st_dev, state.st_ino, state.st_size, state.st_mtime_ns,
            max(state.st_ctime_ns, link.st_ctime_ns))


def changed_in_place(before: tuple | None, now: tuple | None) -> bool:
    """Whether a file changed from `before` to `now`, the same file (a mapping of it shows the
    change; one deleted or replaced keeps showing what it was)."""
    return before is not None and now is not None and before != now and before[:2] == now[:2]


def changed_before(state: tuple, read_from_ns: int) -> bool:
    """Whether a file in `state` last changed, for certain, before `read_from_ns` (its ctime,
    which no user call can set back)."""
    changed = state[4]
    slack = _SECOND_SLACK_NS if changed % 1_000_000_000 == 0 else _TICK_SLACK_NS
    return changed < read_from_ns - slack


def read_before_changed(files: Any, closed_ns: int, state: tuple | None, at_end: list | None,
                        ended: tuple | None) -> bool:
    """Whether eager's reader, which loaded a sample before the open epoch began (as the
    last one ended; a shuffling one, into its buffer, maybe long before), gives its file as
    it is now (`state`): it loaded it after its last change, or maps it and it was changed
    in place since; not a file deleted or replaced since (eager keeps what it loaded, as
    the stream does)."""
    in_place = files.mapped and state is not None and (
        at_end is None or changed_in_place(ended, state) or ended == state)
    if files.shuffled:
        return in_place
    if state is None:  # gone: eager's reader failed on it only if it was gone already
        return at_end is not None and ended is None
    since = ended != state if at_end is not None else \
        not changed_before(state, closed_ns)
    return not since or in_place  # changed before the last epoch ended: read as it is


def eager_reads(files: Any, size: int, epochs: int, epoch_first: int, sample: int,
                step: int) -> str | None:
    """Whether eager ndd's reader (`files`: `_dali.reader_files`'s) reads `sample` (numbered from
    the stream's first) at `step`: "now"; "before" at the open epoch's first step for those it
    had read before the epoch began (it reads them as the last one ended); None at another step.
    A shuffling reader loads in its buffer's order, which ndd_trace does not know: a sample read
    before the epoch began counts as loaded before it by eager's reader too, at the step that
    hands it out."""
    depth = files.prefetch_depth
    if files.shuffled:  # (loaded before this epoch began, as far as can be told)
        return "before" if sample // size == step else None
    loaded_by = (sample - 1) // size  # the batch whose loading reads it (one sample ahead)
    if epochs > 1 and loaded_by < epoch_first + depth:  # before this epoch
        return "before" if step == epoch_first else None
    # (a new operator's first run loads its first batches)
    return "now" if max(loaded_by - depth + 1, 0) == step else None
