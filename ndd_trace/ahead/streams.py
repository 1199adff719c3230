"""Reader streams: a reader's operator in a pipeline of its own, read ahead by a worker thread,
one stream per reader for the whole process; and the epochs a compiled loop opens.

    epoch = reader_epoch(reader, batch_size=64, options=options, on_batch=None)
    for jpegs, labels in epoch: ...            # eager's epoch: as many batches, the same order
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from .. import _dali
from ..core.errors import LoopError
from ..core.ir import Graph, Ref
from ..execution.build import compile_graph
from ..execution.runtime import Executable, Options, PendingRun
from ..tracing.trace import add_reader_node
from .runahead import READ_AHEAD

# a worker thread reads ahead (NDD_TRACE_READER_THREAD=0: the script's thread does, when it takes)
READ_THREAD = os.environ.get("NDD_TRACE_READER_THREAD", "1") != "0"


class ReaderStream:
    """A reader's operator in a pipeline of its own, handing out its batches in order.

    One per reader for the whole process: transparent mode, compiled generators, compiled steps
    called from an eager loop and plain eager code that uses the reader afterwards all read
    through it, so the reader keeps one position, as eagerly. A worker thread keeps
    `READ_AHEAD` batches scheduled and fetched (DALI releases the GIL while it runs and waits),
    so taking a batch costs the script almost nothing. A failed read (a file that cannot be
    mapped) is raised at that batch and at every later one, as eager ndd's reader does."""

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
        self.executable = compile_graph(graph, options,
                                        before_build=self._move_reader_in).executable
        self.count = 0  # batches handed out so far
        self._ready: list[tuple] = []  # the Batches of counts self.count, self.count + 1, ...
        self._cond = threading.Condition()
        self._error: BaseException | None = None
        self._stopping = False
        self._threaded = False
        self._worker: threading.Thread | None = None
        self._in_flight: list[PendingRun] = []  # scheduled, not fetched (without the thread)
        self._meta: dict = {}

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
        self._operator = _dali.claim_reader(reader, self.batch_size)
        self.executable.ensure_built(self.batch_size)
        self._meta = dict(_dali.reader_metadata_of(self.executable.pipeline, reader))
        if not READ_THREAD:
            return
        self._threaded = True
        self._worker = threading.Thread(target=_read_ahead, args=(weakref.ref(self), self._cond),
                                        daemon=True, name=f"ndd_trace reader {self.name}")
        _workers.add(self)
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
        `wait=False`, not read yet)."""
        if count < self.count or count >= self.count + READ_AHEAD:
            return None
        if not wait and self._threaded:
            with self._cond:
                ready = len(self._ready) > count - self.count and self._error is None
                return self._ready[count - self.count] if ready else None
        if not self._threaded:
            with self.executable._lock:
                while len(self._ready) <= count - self.count:
                    _schedule(self.executable, self._in_flight, len(self._ready))
                    batches = _fetch(self._in_flight[0])  # a failed run raises every time
                    self._in_flight.pop(0)
                    self._ready.append(batches)
                return self._ready[count - self.count]
        with self._cond:
            while len(self._ready) <= count - self.count:
                if self._error is not None:
                    raise self._error
                if self._stopping or not self._worker.is_alive():  # type: ignore[union-attr]
                    raise LoopError(f"the read-ahead thread of reader {self.name} "
                                    "has stopped (the process is exiting?)")
                self._cond.wait(timeout=1.0)
            return self._ready[count - self.count]

    def take(self) -> tuple:
        batches = self.peek(self.count)
        with self._cond:
            self._ready.pop(0)
            self.count += 1
            self._cond.notify_all()
        if not self._threaded:  # keep reading ahead, into the next epoch
            _schedule(self.executable, self._in_flight, len(self._ready))
        return batches  # type: ignore[return-value]

    def epoch(self, batch_size: int, on_batch: Callable | None) -> Iterator[Any]:
        """One epoch exactly as `reader.next_epoch(batch_size=...)` gives it: its length is
        counted at its first step from where the reader's shard is then; it advances the shard
        at its end, not after a `break`; epochs open at once share the reader's batches."""
        reader = self._reader()
        _dali.reader_uses_batch_size(reader, batch_size)
        steps = _dali.shard_steps(reader, self._meta["epoch_size_padded"], batch_size)
        for _ in range(steps):
            count = self.count
            batches = self.take()
            if on_batch is not None:
                on_batch(self, count, batches)
            yield dict(zip(self.names, batches)) if self.names else batches
        _dali.advance_shard(reader)


def _schedule(executable: Executable, in_flight: list[PendingRun], ready: int) -> None:
    """Schedule reader runs until `ready` batches and those in flight make READ_AHEAD."""
    with executable._lock:
        while ready + len(in_flight) < READ_AHEAD:
            run = executable.launch([], executable.max_batch_size)
            if run is None:  # the pipeline failed: the next fetch raises its error
                break
            in_flight.append(run)


def _fetch(run: PendingRun) -> tuple:
    """A reader run's outputs, as the Batches the stream hands out."""
    return tuple(_dali.wrap_batch(output) for output in run.result())


def _read_ahead(ref: weakref.ref, cond: threading.Condition) -> None:
    """A stream's worker: keep READ_AHEAD batches scheduled or fetched, in order. It holds its
    stream weakly while it waits, and ends once the stream (with its reader) is dropped."""
    in_flight: list[PendingRun] = []
    try:
        while True:
            stream = ref()
            if stream is None or stream._stopping:
                return
            with cond:
                if not in_flight and len(stream._ready) >= READ_AHEAD:
                    stream = None
                    cond.wait(timeout=0.5)
                    continue
                ready = len(stream._ready)
            executable = stream.executable
            stream = None
            _schedule(executable, in_flight, ready)
            executable = None
            batches = _fetch(in_flight.pop(0))  # waits with the GIL released
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


_workers: weakref.WeakSet = weakref.WeakSet()  # streams with a worker, stopped at exit


@atexit.register
def _stop_workers() -> None:
    for stream in list(_workers):
        stream.stop()


# reader -> its stream, for as long as the reader lives (the stream holds it weakly)
_streams: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# called when a reader's first stream is made (calls.py: the readers' methods are then watched,
# so that eager code reads through the stream too)
on_new_stream: list[Callable[[], None]] = []


def stream_of(reader: Any) -> ReaderStream | None:
    return _streams.get(reader)


def reader_epoch(reader: Any, batch_size: int, options: Options,
                 on_batch: Callable | None) -> Iterator[Any]:
    """A batch epoch of `reader` read through its stream: the first one moves the reader into
    it (eager ndd's checks raise here, at the first `next`, as eagerly)."""
    stream = stream_of(reader)
    if stream is None:
        stream = ReaderStream(reader, batch_size, options)
        stream.start()
        _streams[reader] = stream
        for hook in on_new_stream:
            hook()
    yield from stream.epoch(batch_size, on_batch)


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


# ---------------------------------------------------------------------------------------------
# Epochs opened by a compiled generator's loop (loop.py)
#
# While a compiled loop pulls its next item (`opening_loop_epochs`), the reader epochs it opens
# read through streams from the first one (unless the reader must stay eager: checkpointing,
# tensor arguments). A loop over `source.captured(...)` is DALI's capture mode's (loop.py does
# not compile it).

_opening = threading.local()  # .active: a compiled loop is pulling its next item; .stand_in


@contextmanager
def opening_loop_epochs(stand_in: Callable[[Any, int], Any] | None = None) -> Iterator[None]:
    """While active, the epochs this thread opens are a compiled loop's (see above); with
    `stand_in`, each is one step of `stand_in(reader, batch_size)` instead, and nothing is
    read (export describes a loop so)."""
    previous = getattr(_opening, "active", False), getattr(_opening, "stand_in", None)
    _opening.active, _opening.stand_in = True, stand_in or previous[1]
    try:
        yield
    finally:
        _opening.active, _opening.stand_in = previous


def in_compiled_loop() -> bool:
    return getattr(_opening, "active", False)


def loop_stand_in() -> Callable | None:
    return getattr(_opening, "stand_in", None) if in_compiled_loop() else None
