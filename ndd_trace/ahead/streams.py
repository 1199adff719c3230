"""Reader streams: a reader's operator in a pipeline of its own, read ahead by a worker thread,
one stream per reader for the whole process (a pinned unit of the unit cache READER_STREAMS,
keyed by its reader's identity); and the epochs a compiled loop opens.

    epoch = reader_epoch(reader, batch_size=64, options=options, on_batch=None)
    for jpegs, labels in epoch: ...            # eager's epoch: as many batches, the same order
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from ..core import keys, process_state
from .. import _dali
from ..core.errors import LoopError
from ..core.source import hide_own_frames
from ..core.ir import Graph, Ref
from ..units.build import compile_graph
from ..units.cache import LIVE_PIPELINES, READER_STREAMS, Found
from ..units.unit import Unit
from ..execution.results import PendingRun
from ..execution.runtime import Executable, Options
from ..tracing.trace import add_reader_node
from .file_states import ReadTimes
from .stream_files import StreamFiles, fetch_run
from .runahead import READ_AHEAD

# a worker thread reads ahead (NDD_TRACE_READER_THREAD=0: the script's thread does, when it takes)
READ_THREAD = os.environ.get("NDD_TRACE_READER_THREAD", "1") != "0"


class ReaderStream(StreamFiles):
    """A reader's operator in a pipeline of its own, handing out its batches in order.

    One per reader for the whole process: transparent mode, compiled generators, compiled steps
    called from an eager loop and plain eager code that uses the reader afterwards all read
    through it, so the reader keeps one position, as eagerly. A worker thread keeps
    `READ_AHEAD` batches scheduled and fetched (DALI releases the GIL while it runs and waits),
    so taking a batch costs the script almost nothing. A failed read (a file that cannot be
    mapped) is raised at that batch and at every later one, as eager ndd's reader does.

    Files between epochs (runahead.py's rule 5): the worker reads only while an epoch is open,
    and past its end. When the next epoch opens, the batches read before it are the files as
    they were then; each is checked as it is handed out, and the samples eager ndd would read
    from a file changed since are read again, at the step where eager's reader reads them (its
    errors included). A reader whose files ndd_trace cannot name (`_dali.reader_files`) is
    read no further than the open epoch's end."""

    def __init__(self, reader: Any, batch_size: int, options: Options):
        graph = Graph("reader")
        node = add_reader_node(graph, reader, None)
        graph.outputs = [Ref(node, i) for i in range(node.num_outputs)]
        node.payload = None  # the stream holds its reader weakly (the registry's key)
        options = dataclasses.replace(options, prefetch_queue_depth=READ_AHEAD)
        self._reader = weakref.ref(reader)
        self.reader_type = type(reader).__name__
        self.name = _dali.reader_name(reader)
        self.names = node.output_names
        self.batch_size = batch_size
        self._operator: Any = None  # the reader's operator, claimed and moved into the pipeline
        # (held weakly: a bound method would be a cycle, the pipeline alive until a garbage
        # collection, its mapped files reused by a new reader of the same paths)
        move_in = weakref.WeakMethod(self._move_reader_in)
        self.executable = compile_graph(
            graph, options, before_build=lambda pipe, size: move_in()(pipe, size)).executable
        self.count = 0  # batches handed out so far
        self._ready: list[tuple] = []  # the Batches of counts self.count, self.count + 1, ...
        self._cond = threading.Condition()
        self._error: BaseException | None = None
        self._stopping = False
        self._threaded = False
        self._worker: threading.Thread | None = None
        self._in_flight: list[PendingRun] = []  # scheduled, not fetched (without the thread)
        self._meta: dict = {}
        self._times = ReadTimes()
        self._init_files()  # (its files between epochs: stream_files.py)

    def _move_reader_in(self, pipe: Any, batch_size: int) -> None:
        if self._operator is None:
            raise LoopError(f"the pipeline of reader `{self.reader_type}` ({self.name}) failed, "
                            "and its operator went with it")
        _dali.transfer_reader(pipe, self._reader(), self._operator)
        self._operator = None

    def start(self) -> None:
        """Move the reader into the pipeline (eager ndd's checks and errors first, as at the
        first step of an eager epoch), then start reading ahead."""
        reader = self._reader()
        files = _dali.reader_files(reader)
        if files is not None and not files.shuffled:
            # a mapped file cut short under a run's copy is SIGBUS (a shuffle buffer: see rule 5)
            self._operator, self._maps_files = _dali.claim_reader_unmapped(reader,
                                                                          self.batch_size)
        else:
            self._operator = _dali.claim_reader(reader, self.batch_size)
            self._maps_files = files is None or files.mapped
        self._files = files
        self._read_lag = files.prefetch_depth + 1 if files is not None else 0
        self.executable.ensure_built(self.batch_size)
        self._meta = dict(_dali.reader_metadata_of(self.executable.pipeline, reader))
        self._times.restart()
        if not READ_THREAD:
            return
        self._threaded = True
        self._worker = threading.Thread(target=_read_ahead,
                                        args=(weakref.ref(self), self._cond, self._times),
                                        daemon=True, name=f"ndd_trace reader {self.name}")
        process_state.stream_workers.add(self)
        self._worker.start()

    def stop(self) -> None:
        """Stop reading ahead (at exit)."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._worker is not None and self._worker is not threading.current_thread():
            self._worker.join(timeout=5)

    def metadata(self) -> dict:
        """`reader.get_metadata()`: read once, when the reader moved into the pipeline."""
        return dict(self._meta)

    def request(self, args: tuple, kwargs: dict) -> int | None:
        """The batch size of a `next_epoch(*args, **kwargs)` call on this reader; None where
        eager ndd's own method must answer it (a sample epoch, capture=True: it raises eager's
        errors for a reader that gave batches)."""
        return _dali.reader_epoch_request(self._reader(), args, kwargs, any_context=True)

    def peek(self, count: int, wait: bool = True) -> tuple | None:
        """The Batches the stream hands out at `count` (None if not read ahead so far, or, with
        `wait=False`, not read yet). A batch read before its epoch opened may still be replaced
        by `take` (see `_as_eager_reads`)."""
        if count < self.count or count >= self.count + READ_AHEAD:
            return None
        if not wait and (self._threaded or self._failed is not None):
            with self._cond:
                ready = len(self._ready) > count - self.count and self._error is None and \
                    self._failed is None
                return self._ready[count - self.count] if ready else None
        if not self._threaded:
            with self.executable.lock:
                while len(self._ready) <= count - self.count:
                    _schedule(self.executable, self._in_flight, len(self._ready), self._times,
                              max(self._read_limit, count + 1))
                    batches = fetch_run(self._in_flight[0])  # a failed run raises every time
                    self._in_flight.pop(0)
                    self._ready.append(batches)
                return self._ready[count - self.count]
        with self._cond:
            if self._read_limit <= count:  # asked for: read it, epoch or not
                self._read_limit = count + 1
                self._cond.notify_all()
            while len(self._ready) <= count - self.count:
                if self._error is not None:
                    raise self._error
                if self._stopping or not self._worker.is_alive():  # type: ignore[union-attr]
                    raise LoopError(f"the read-ahead thread of reader {self.name} "
                                    "has stopped (the process is exiting?)")
                self._cond.wait(timeout=1.0)
            return self._ready[count - self.count]

    def take(self) -> tuple:
        if self._failed is not None:
            raise self._failed
        try:
            batches = self.peek(self.count)
        except Exception as error:
            files = self._files
            if files is None or self._maps_files == files.mapped:
                raise
            # reading into memory fails with other words than eager's mapping: eager's error
            self._failed = _dali.as_eager_read_error(self._reader(), files, error)
            raise self._failed from None
        if self._files is not None:
            batches = self._as_eager_reads(self.count, batches)  # type: ignore[arg-type]
        with self._cond:
            self._ready.pop(0)
            self.count += 1
            self._cond.notify_all()
        self._forget_handed_out()
        if not self._threaded:  # keep reading ahead, into the next epoch
            _schedule(self.executable, self._in_flight, len(self._ready), self._times,
                      self._read_limit)
        return batches  # type: ignore[return-value]

    def epoch(self, batch_size: int, on_batch: Callable | None,
              given: int = 0) -> Iterator[Any]:
        """One epoch exactly as `reader.next_epoch(batch_size=...)` gives it: its length is
        counted at its first step from where the reader's shard is then; it advances the shard
        at its end, not after a `break`; epochs open at once share the reader's batches.
        `given`: batches of this epoch eager ndd's own epoch gave before (its rest is read
        here, from where the reader's operator is)."""
        reader = self._reader()
        try:
            _dali.reader_uses_batch_size(reader, batch_size)
        except Exception as error:  # eager's error, with eager's traceback
            hide_own_frames(error)
            raise
        steps = _dali.shard_steps(reader, self._meta["epoch_size_padded"], batch_size) - given
        self._open_epoch(steps)
        try:
            for _ in range(steps):
                count = self.count
                batches = self.take()
                if on_batch is not None:
                    on_batch(self, count, batches)
                yield dict(zip(self.names, batches)) if self.names else batches
            _dali.advance_shard(reader)
        finally:
            self._close_epoch()


def _schedule(executable: Executable, in_flight: list[PendingRun], ready: int,
              times: ReadTimes, limit: int) -> None:
    """Schedule reader runs until `ready` batches and those in flight make READ_AHEAD (none for
    batch numbers from `limit` on)."""
    with executable.lock:
        while ready + len(in_flight) < READ_AHEAD and times.scheduled < limit:
            when = time.time_ns()
            run = executable.launch([], executable.max_batch_size)
            if run is None:  # the pipeline failed: the next fetch raises its error
                break
            in_flight.append(run)
            times.note(when)


def _read_ahead(ref: weakref.ref, cond: threading.Condition, times: ReadTimes) -> None:
    """A stream's worker: keep READ_AHEAD batches scheduled or fetched, in order, within the
    stream's read limit. It holds its stream weakly while it waits, and ends once the stream
    (with its reader) is dropped."""
    in_flight: list[PendingRun] = []
    try:
        while True:
            stream = ref()
            if stream is None or stream._stopping:
                return
            with cond:
                ready = len(stream._ready)
                limit = stream._read_limit
                if not in_flight and (ready >= READ_AHEAD or times.scheduled >= limit):
                    stream = None
                    cond.wait(timeout=0.5)
                    continue
            executable = stream.executable
            stream = None
            _schedule(executable, in_flight, ready, times, limit)
            executable = None
            batches = fetch_run(in_flight.pop(0))  # waits with the GIL released
            stream = ref()
            if stream is None:
                return
            with cond:
                stream._ready.append(batches)
                cond.notify_all()
            stream = None
    except BaseException as error:  # handed to the script at its next batch
        stream = ref()
        if stream is not None:
            with cond:
                stream._error = error
                cond.notify_all()




@atexit.register
def _stop_workers() -> None:
    for stream in list(process_state.stream_workers):
        stream.stop()


@dataclasses.dataclass(eq=False)
class StreamUnit(Unit):
    """A reader stream as the unit cache holds it, under its reader's identity: pinned (its
    reader's position lives in its pipeline, which is never freed while the reader lives)."""

    stream: ReaderStream | None = None
    pinned = True

    def release(self) -> bool:
        return False


def stream_key(reader: Any) -> tuple:
    """A reader stream's key: its reader, by identity (equal only while that reader lives)."""
    name = f"{type(reader).__name__} {_dali.reader_name(reader)}"
    return (("reader", keys.Identity(reader, name)),)


def stream_of(reader: Any) -> ReaderStream | None:
    unit = READER_STREAMS.get(stream_key(reader))
    return unit.stream if unit is not None else None  # type: ignore[attr-defined]


def reader_epoch(reader: Any, batch_size: int, options: Options,
                 on_batch: Callable | None, given: int = 0) -> Iterator[Any]:
    """A batch epoch of `reader` read through its stream: the first one moves the reader into
    it (eager ndd's checks raise here, at the first `next`, as eagerly). `given`: the batches
    of this epoch an eager epoch gave before (see ReaderStream.epoch)."""
    key = stream_key(reader)

    def make() -> StreamUnit:
        stream = ReaderStream(reader, batch_size, options)
        stream.start()
        return StreamUnit(key=key, executable=stream.executable, stream=stream)

    unit, found = READER_STREAMS.lookup(key, make)
    if found is Found.NEW:
        LIVE_PIPELINES.note_run(unit)  # (a live pipeline: counted, never freed)
        # forgotten with its reader (the key, which holds the reader weakly, found as itself)
        weakref.finalize(reader, READER_STREAMS.drop, key, close=False)
        for hook in process_state.on_new_stream:
            hook()
    yield from unit.stream.epoch(batch_size, on_batch, given)  # type: ignore[union-attr]


def can_stream(reader: Any) -> str | None:
    """Why this reader's epochs stay eager, or None if it can stream."""
    if stream_of(reader) is not None:
        return None
    if _dali.reader_transferred(reader):
        return "the reader's operator belongs to another pipeline (DALI's capture mode)"
    if _dali.reader_has_tensor_args(reader):
        return "the reader was constructed with tensor arguments"
    if _dali.reader_checkpointing(reader):
        return "a checkpointing reader stays eager so that get_state() is exact"
    try:
        _dali.reader_metadata(reader)
    except Exception as error:
        return f"cannot describe the reader to a pipeline ({type(error).__name__})"
    return None
