"""The files-between-epochs half of a reader stream (runahead.py's rule 5): the worker reads only
while an epoch is open, and past its end; when the next epoch opens, the batches read before it
are checked as they are handed out, and the samples eager ndd's reader would read from a file
changed since are read again, at the step where eager's reader reads them (its errors included).

    class ReaderStream(StreamFiles): ...      # streams.py
    stream._open_epoch(steps)   stream._close_epoch()   stream._as_eager_reads(step, batches)
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

from .. import _dali
from ..execution.results import PendingRun
from .file_states import (ReadTimes, changed_before, changed_in_place, eager_reads, file_state,
                          read_before_changed)


def fetch_run(run: PendingRun) -> tuple:
    """A reader run's outputs, as the Batches the stream hands out."""
    return tuple(_dali.wrap_batch(output) for output in run.result())



class StreamFiles:
    """A ReaderStream's files between epochs: when epochs open and close, the states of the files
    it read ahead, and the samples it reads again as eager ndd's reader would read them."""

    batch_size: int
    count: int
    executable: Any
    _reader: Any
    _ready: list
    _cond: threading.Condition
    _times: ReadTimes
    _threaded: bool
    _worker: threading.Thread | None
    _in_flight: list
    _error: BaseException | None
    _stopping: bool

    def _init_files(self) -> None:
        self._read_limit = 0  # batch numbers the worker may schedule (see _open_epoch)
        self._open_epochs = 0  # epochs between their first step and their end
        self._epochs = 0  # epochs opened so far
        self._opened_ns = 0  # when the open epoch's first step came (reads before it: checked)
        self._epoch_first = 0  # the open epoch's first batch number
        self._closed_ns = 0  # when the last epoch ended (the script's code between epochs began)
        self._files: Any = None  # _dali.ReaderFiles: the reader's files, where it can name them
        self._maps_files = True  # the operator maps its files (a read may overlap a truncation)
        self._read_lag = 0  # batches before its own run the reader may have read a batch's files
        self._failed: BaseException | None = None  # eager's reader error: raised at every batch
        self._sources: dict[int, list[str]] = {}  # batch number -> its samples' source infos
        self._lengths: dict[int, list[int]] = {}  # batch number -> its samples' lengths (File)
        self._states_at_end: dict[int, list] = {}  # batch number -> its files' states then
        self._read_again: dict[int, tuple] = {}  # sample number -> (source, state, samples)

    def _open_epoch(self, steps: int) -> None:
        """An epoch's first step: the script's code before it has run (it may have rewritten
        files), so what was read before now is checked as it is handed out; reading goes on."""
        with self._cond:
            self._opened_ns = self._times.started_ns if self._epochs == 0 else time.time_ns()
            self._epochs += 1
            self._open_epochs += 1
            self._epoch_first = self.count
            # a reader whose files cannot be checked reads no further than this epoch's end
            end = sys.maxsize if self._files is not None else self.count + steps
            self._read_limit = max(self._read_limit, end)
            self._cond.notify_all()

    def _close_epoch(self) -> None:
        """An epoch ended (or was left by a `break`): nothing more is read until the next one
        opens, so no read overlaps the script's code in between."""
        with self._cond:
            self._open_epochs -= 1
            if self._open_epochs > 0:
                return
            self._read_limit = self._times.scheduled
            self._closed_ns = time.time_ns()
        if self._maps_files or self._files is not None:
            self._finish_reading()
        if self._files is not None:
            self._note_file_states()

    def _finish_reading(self) -> None:
        """Wait for the reads in flight: a mapped file the script truncates under a read's copy
        kills the process (SIGBUS), and the files of all that was read are noted as the script's
        code between epochs begins (`_note_file_states`)."""
        if not self._threaded:
            with self.executable.lock:
                while self._in_flight and self._in_flight[0].error is None:
                    try:
                        batches = fetch_run(self._in_flight[0])
                    except Exception:  # noqa: BLE001 (raised again when its batch is taken)
                        return
                    self._in_flight.pop(0)
                    self._ready.append(batches)
            return
        if self._worker is threading.current_thread():
            return
        deadline = time.monotonic() + 10
        with self._cond:
            while self._times.scheduled > self.count + len(self._ready) and \
                    self._error is None and not self._stopping and \
                    self._worker is not None and self._worker.is_alive():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                self._cond.wait(timeout=min(remaining, 1.0))

    def _note_file_states(self) -> None:
        """The states of the files of the batches read ahead, as the script's code between
        epochs begins: a later difference is a change, whatever the file clocks say, and what
        eager's reader, which reads its next samples then, read."""
        with self._cond:
            ready = list(enumerate(self._ready, self.count))
        for number, outputs in ready:
            self._states_at_end[number] = [
                file_state(_dali.file_path(self._files, source))
                for source in self._sources_of(number, outputs)]

    def _lengths_of(self, number: int, outputs: tuple) -> list[int]:
        lengths = self._lengths.get(number)
        if lengths is None:
            lengths = self._lengths[number] = _dali.sample_lengths(
                outputs[self._files.content_outputs[0]])
        return lengths

    def _sources_of(self, number: int, outputs: tuple) -> list[str]:
        sources = self._sources.get(number)
        if sources is None:
            content = outputs[self._files.content_outputs[0]]
            sources = self._sources[number] = _dali.sample_sources(content)
        return sources

    def _as_eager_reads(self, step: int, batches: tuple) -> tuple:
        """The Batches of `step` as eager ndd's reader gives them at this step. The stream read
        some batches before the open epoch's first step (the script's code ran after); for the
        samples eager's reader reads at this step (file_states.eager_reads), a file changed
        since is read again now, as eager reads it, and the error eager's reader raises for a
        file it cannot read is raised here (and at every later step)."""
        files = self._files
        last = step if files.shuffled else step + files.prefetch_depth
        # an empty file reads into memory, but eager's reader fails to map it
        empties_fail = files.whole_files and files.mapped and not self._maps_files
        due: list[tuple] = []  # (sample number, source, file state) to read again at this step
        for number in range(step, last + 1):
            read_from = self._times.reading_from(number - self._read_lag)
            early = read_from < self._opened_ns  # maybe read before the code between epochs ran
            if not early and not empties_fail:
                continue
            outputs = batches if number == step else self._peek_read(number)
            if outputs is None:
                break
            lengths = self._lengths_of(number, outputs) if files.whole_files else None
            if not early and 0 not in lengths:  # type: ignore[operator]
                continue
            at_end = self._states_at_end.get(number)
            for index, source in enumerate(self._sources_of(number, outputs)):
                sample = number * self.batch_size + index
                when = eager_reads(files, self.batch_size, self._epochs, self._epoch_first,
                                   sample, step)
                if when is None or sample in self._read_again:
                    continue
                if empties_fail and when == "now" and lengths[index] == 0:  # type: ignore[index]
                    due.append((sample, source, None))
                    continue
                if not early:
                    continue
                state = file_state(_dali.file_path(files, source))
                ended = at_end[index] if at_end is not None else state  # as the last epoch ended
                if state is not None and ended == state and \
                        changed_before(state, read_from) and \
                        (lengths is None or lengths[index] == state[2]):
                    continue  # as it was when the stream read it
                if when == "before" and not read_before_changed(
                        files, self._closed_ns, state, at_end, ended):
                    continue
                due.append((sample, source, state))
        if due:
            try:
                samples = _dali.read_files_again(self._reader(), files,
                                                 [source for _, source, _ in due])
            except Exception as error:
                self._failed = error  # eager's reader fails at this step and every later one
                raise
            for (sample, source, state), read in zip(due, samples):
                self._read_again[sample] = (source, state, read)
        first = step * self.batch_size
        replaced = {index: self._read_again.pop(first + index)
                    for index in range(self.batch_size) if first + index in self._read_again}
        if not replaced:
            return batches
        if files.mapped:  # eager maps a file as it loads it, and copies it out at this step
            changed = [index for index, (source, state, _) in replaced.items()
                       if changed_in_place(state, file_state(_dali.file_path(files, source)))]
            if changed:
                again = _dali.read_files_again(self._reader(), files,
                                               [replaced[index][0] for index in changed])
                for index, read in zip(changed, again):
                    replaced[index] = (None, None, read)
        batches = _dali.with_samples(batches, files,
                                     {index: read for index, (_, _, read) in replaced.items()})
        with self._cond:
            self._ready[0] = batches
        return batches

    def _peek_read(self, number: int) -> tuple | None:
        """The batch `number`, read (waiting for it); None where it is not to be had now."""
        try:
            return self.peek(number)
        except Exception:  # noqa: BLE001 (the stream's own error, raised at its own batch)
            return None

    def _forget_handed_out(self) -> None:
        self._times.forget_before(self.count - self._read_lag)
        tables = (self._sources, self._lengths, self._states_at_end)
        if not any(tables) and not self._read_again:
            return
        for table in tables:
            for number in [number for number in table if number < self.count]:
                del table[number]
        first = self.count * self.batch_size
        for sample in [sample for sample in self._read_again if sample < first]:
            del self._read_again[sample]
