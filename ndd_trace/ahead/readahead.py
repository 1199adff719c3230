"""Reader loops of transparent mode: readers read ahead in a pipeline of their own, and the
regions that consume their batches are run ahead of the script, speculatively and checked.

    for jpegs, labels in reader.next_epoch(batch_size=64):   # an unmodified script
        images = ndd.decoders.image(jpegs, device="gpu")      # recorded lazily (lazy.py)
        train(images.torch(), labels.torch())                 # was already run ahead

Under transparent mode, `reader.next_epoch(batch_size=...)` moves the reader's operator into a
pipeline of its own (the very operator instance eager ndd would run: the same samples in the
same order), which a worker thread keeps reading ahead, across epoch boundaries too. The epochs
it hands out are eager ones: as many batches, the shard advanced at the end, a `break` leaving
the rest of the stream for the next epoch.

A region (lazy.py) fed by reader batches is then run ahead. Once it was seen on three
consecutive batches of a reader with the same structure and random states drawn at a steady
stride, its next runs are launched on the batches read ahead, with states drawn from clones of
the generators at the predicted positions. When the script reaches the region, a launched run is
used only if what it was fed is identical to what the script's own calls produced (the same
reader batch object, bit-equal random states, equal constants); otherwise it is dropped and the
region runs as usual. Results are therefore always the plain run's; a loop that does not repeat
itself only loses the running ahead (a region that mostly misses is no longer tried).

The same streams and the same Speculator serve compiled functions called from an eager reader
loop (`run_call`, at the end of this module): a reader whose eager batches fed a compiled
function streams from its next epoch, and the function's calls run ahead by the same rules.
"""

from __future__ import annotations

import atexit
import collections
import dataclasses
import os
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from .. import _dali
from ..codegen.lower import lower
from ..core.errors import LoopError
from ..core.ir import Graph, Node, NodeKind, Ref
from ..execution.runtime import Executable, Options, PendingRun
from ..tracing.trace import add_reader_node
from .runahead import KEEP_BATCHES, READ_AHEAD, RUN_AHEAD, StateForecast, fed_as_eager, gave_up

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
        self.executable = Executable(graph, lower(graph), [], options, {},
                                     before_build=self._move_reader_in)
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
        _watch()
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


def _in_loop() -> bool:
    return getattr(_opening, "active", False)


def _stand_in() -> Callable | None:
    return getattr(_opening, "stand_in", None) if _in_loop() else None


# ---------------------------------------------------------------------------------------------
# Running regions ahead

@dataclasses.dataclass
class _Leaf:
    """What one fed leaf of a region was, as far as predicting it goes."""

    kind: str  # "reader", "state" or "const"
    value: Any  # the reader Batch, the state's words, or the constant
    stream: weakref.ref | None = None  # of the ReaderStream (a dropped reader ends its stream)
    index: int = 0  # reader output
    offset: int = 0  # reader count minus the observation's count
    rng: Any = None
    position: tuple[int, int] = (0, 0)  # the generator's (draws, version) before the draw
    node: Node | None = None  # a constant's leaf


@dataclasses.dataclass
class Observation:
    """A region run fed by reader batches: `count` is its first reader leaf's batch number."""

    count: int
    leaves: list[_Leaf]
    shape: tuple


@dataclasses.dataclass
class _Launch:
    count: int
    run: PendingRun
    fed: list[Any]


@dataclasses.dataclass
class _Pattern:
    previous: Observation | None = None
    strides: list[int] | None = None
    confirmed: bool = False
    launched: dict[int, _Launch] = dataclasses.field(default_factory=dict)
    hits: int = 0
    misses: int = 0


class Speculator:
    """Runs regions fed by reader batches ahead of the script (one per transparent tracer)."""

    def __init__(self) -> None:
        self._batches: dict[int, tuple[Any, weakref.ref, int, int]] = {}
        self._draws: collections.OrderedDict[int, tuple[Any, Any, tuple[int, int]]] = \
            collections.OrderedDict()
        self._patterns: dict[tuple, _Pattern] = {}
        self._forecast = StateForecast()
        self._recent: dict[weakref.ref, collections.deque] = {}  # stream -> (count, batch ids)
        self.active = False

    # -- what the script does ------------------------------------------------------------------

    def note_batch(self, stream: ReaderStream, count: int, batches: tuple) -> None:
        """A reader handed out `batches` (its `count`-th)."""
        self.active = True
        ref = weakref.ref(stream)
        if ref not in self._recent:  # a new reader: forget what dropped readers left behind
            self._forget_dropped()
        recent = self._recent.setdefault(ref, collections.deque())
        recent.append((count, [id(batch) for batch in batches]))
        for index, batch in enumerate(batches):
            self._batches[id(batch)] = (batch, ref, count, index)
        while recent and recent[0][0] <= count - KEEP_BATCHES:
            for key in recent.popleft()[1]:
                self._batches.pop(key, None)

    def _forget_dropped(self) -> None:
        for ref in [ref for ref in self._recent if ref() is None]:
            for _, keys in self._recent.pop(ref):
                for key in keys:
                    self._batches.pop(key, None)
        self._patterns = {
            key: pattern for key, pattern in self._patterns.items()
            if pattern.previous is None or all(
                leaf.stream() is not None  # type: ignore[misc]
                for leaf in pattern.previous.leaves if leaf.kind == "reader")}
        self._forecast.forget_dropped()

    def is_reader_batch(self, value: Any) -> bool:
        entry = self._batches.get(id(value))
        return entry is not None and entry[0] is value

    def note_draw(self, words: Any, rng: Any, position: tuple[int, int]) -> None:
        """A recorded random op drew `words` from `rng` at `position`."""
        if not self.active:
            return
        self._draws[id(words)] = (words, rng, position)
        if len(self._draws) > 512:
            self._draws.popitem(last=False)

    def observe(self, leaves: list[Node], computed: list[bool]) -> Observation | None:
        """Describe a region's fed leaves; None unless it reads reader batches and every leaf
        can be predicted (values computed by an earlier region cannot)."""
        if not self.active:
            return None
        items: list[tuple] = []
        for leaf, was_computed in zip(leaves, computed):
            if was_computed:
                return None
            if leaf.kind is NodeKind.RANDOM_STATE:
                words = leaf.payload[1]
                entry = self._draws.get(id(words))
                if entry is None or entry[0] is not words:
                    return None
                items.append(("state", words, entry[1], entry[2]))
            else:
                items.append(("value", leaf.payload, leaf))
        return self.describe(items)

    def describe(self, items: list[tuple]) -> Observation | None:
        """An observation of one run's fed leaves, in feeding order: `("state", words, rng,
        position)` for a random state drawn from `rng` at `position`, `("value", value, node)`
        for data (a reader batch, or a constant fed from `node`), `("input", value)` for a
        caller's argument (predictable only as a reader batch). None without reader batches."""
        described: list[_Leaf] = []
        first: tuple[weakref.ref, int] | None = None
        batches = self._batches
        for item in items:
            if item[0] == "state":
                described.append(_Leaf("state", item[1], rng=item[2], position=item[3]))
                continue
            value = item[1]
            entry = batches.get(id(value))
            if entry is not None and entry[0] is value:
                _, stream, count, index = entry
                if first is None:
                    first = (stream, count)
                described.append(_Leaf("reader", value, stream=stream, index=index,
                                       offset=count - first[1]))
            elif item[0] == "input":
                return None  # the caller's own data: not predictable
            else:
                described.append(_Leaf("const", value, node=item[2]))
        if first is None:
            return None
        shape = tuple(
            ("reader", id(leaf.stream()), leaf.index, leaf.offset) if leaf.kind == "reader"
            else ("state", id(leaf.rng)) if leaf.kind == "state"
            else ("const",) for leaf in described)
        return Observation(first[1], described, shape)

    # -- using and launching runs ahead --------------------------------------------------------

    def take(self, key: tuple, observation: Observation,
             executable: Executable | None = None) -> tuple | None:
        """The outputs of the run launched for this observation, if it was fed exactly what the
        script's calls produced (and, given `executable`, launched on it); None otherwise (the
        region then runs as usual)."""
        launch = self._launch_for(key, observation)
        if launch is None:
            return None
        if (executable is None or launch.run._executable is executable) and \
                all(fed_as_eager(leaf.kind, leaf.value, fed)
                    for leaf, fed in zip(observation.leaves, launch.fed)):
            try:
                outputs = launch.run.result()
            except Exception:  # the region runs as usual, and reports a real error itself
                return None
            self._patterns[(key, observation.shape)].hits += 1
            return outputs
        self._missed(key, observation)
        return None

    def take_run(self, key: tuple, observation: Observation,
                 executable: Executable) -> PendingRun | None:
        """`take`, for a caller that consumes the outputs later: the run launched on
        `executable` for this observation, without waiting for it, if it was fed exactly what
        the caller's call feeds and is still in flight on that pipeline (a run lost to an
        earlier failure is run again from its data when asked for)."""
        launch = self._launch_for(key, observation)
        if launch is None:
            return None
        run = launch.run
        if run._executable is executable and run.error is None and \
                all(fed_as_eager(leaf.kind, leaf.value, fed)
                    for leaf, fed in zip(observation.leaves, launch.fed)):
            self._patterns[(key, observation.shape)].hits += 1
            return run
        self._missed(key, observation)
        return None

    def _launch_for(self, key: tuple, observation: Observation) -> _Launch | None:
        pattern = self._patterns.get((key, observation.shape))
        if pattern is None or not pattern.launched:
            return None
        for count in [c for c in pattern.launched if c < observation.count]:
            del pattern.launched[count]  # never consumed (the script skipped that step)
        return pattern.launched.pop(observation.count, None)

    def _missed(self, key: tuple, observation: Observation) -> None:
        pattern = self._patterns[(key, observation.shape)]
        pattern.misses += 1
        pattern.launched.clear()
        pattern.strides = None
        pattern.confirmed = False

    def learn(self, key: tuple, executable: Executable, observation: Observation,
              batch_size: int) -> None:
        """Record the observation; launch the next runs once the pattern is steady."""
        pattern = self._patterns.setdefault((key, observation.shape), _Pattern())
        previous, pattern.previous = pattern.previous, observation
        if previous is not None and observation.count == previous.count + 1:
            strides = [now.position[0] - before.position[0] if now.kind == "state" else 0
                       for now, before in zip(observation.leaves, previous.leaves)]
            steady = all(stride >= _dali.STATE_WORDS and now.position[1] == before.position[1]
                         for stride, now, before
                         in zip(strides, observation.leaves, previous.leaves)
                         if now.kind == "state")
            if not steady or strides != pattern.strides:
                pattern.launched.clear()
            # launched only once the same stride was seen twice: a one-off extra draw costs
            # one missed step, not two
            pattern.confirmed = steady and strides == pattern.strides
            pattern.strides = strides if steady else None
        elif previous is not None and observation.count != previous.count:
            pattern.strides = None
            pattern.confirmed = False
            pattern.launched.clear()
        if not pattern.confirmed or gave_up(pattern.hits, pattern.misses):
            return
        for count in range(observation.count + 1, observation.count + 1 + RUN_AHEAD):
            if count in pattern.launched:
                continue
            launch = self._launch(executable, observation, pattern.strides, count, batch_size)
            if launch is None:
                break
            pattern.launched[count] = launch

    def _launch(self, executable: Executable, observation: Observation, strides: list[int],
                count: int, batch_size: int) -> _Launch | None:
        steps = count - observation.count
        data: list[Any] = []
        fed: list[Any] = []
        for leaf, stride in zip(observation.leaves, strides):
            if leaf.kind == "reader":
                stream = leaf.stream()  # type: ignore[misc]
                try:
                    batches = (stream.peek(count + leaf.offset, wait=False)
                               if stream is not None else None)
                except Exception:  # a reader error: the script meets it at its own step
                    return None
                if batches is None:  # not read yet: launched later, or never
                    return None
                value = batches[leaf.index]
                data.append(_dali.storage_of(value))
            elif leaf.kind == "state":
                value = self._forecast.state_at(leaf.rng, leaf.position[0] + steps * stride,
                                       leaf.position[1])
                if value is None:
                    return None
                data.append(_dali.broadcast_state(value, batch_size))
            else:
                value = leaf.value
                data.append(executable.feed.leaf_data(leaf.node, batch_size))
            fed.append(value)
        run = executable.launch(data, batch_size)
        return _Launch(count, run, fed) if run is not None else None


# ---------------------------------------------------------------------------------------------
# Compiled steps called from an eager reader loop
#
#     @ndd.compile
#     def preprocess(jpegs): ...
#     for jpegs, labels in reader.next_epoch(batch_size=64):   # eager: the user's own loop
#         images = preprocess(jpegs)
#
# Calling a compiled function is the opt-in. While compiled functions exist, eager batch epochs
# are watched (their batches remembered weakly, nothing else changes). Once a compiled function
# is fed a batch of a reader's eager epoch, that reader's *next* batch epochs go through a
# ReaderStream, exactly as in transparent mode (the same operator, read ahead by a worker
# thread; epoch lengths, breaks and shards as eagerly; checkpointing readers, readers with
# tensor arguments or owned by a compiled loop stay eager). The compiled function is then run
# ahead on the batches read ahead by the same Speculator as transparent mode's regions: a
# launched run is used only if the call is fed exactly what was predicted (the same reader
# batch object, bit-equal random states, the same constants); otherwise the call runs as usual.

_calls = threading.local()  # .speculator: this thread's Speculator for compiled calls
_compiled: weakref.WeakSet = weakref.WeakSet()  # live compiled functions (the watch's owners)
_tagged: dict[int, tuple[weakref.ref, weakref.ref]] = {}  # id(batch) -> (batch, reader) refs
_feeding: weakref.WeakSet = weakref.WeakSet()  # readers whose eager batches fed a compiled call
_watching = False


def _call_speculator() -> Speculator:
    speculator = getattr(_calls, "speculator", None)
    if speculator is None:
        speculator = _calls.speculator = Speculator()
    return speculator


def _note_for_calls(stream: Any, count: int, batches: tuple) -> None:
    _call_speculator().note_batch(stream, count, batches)


def _watch() -> None:
    """Readers: their epochs and metadata go through `_on_epoch` and `_on_metadata` from now on
    (class-level wrappers, installed once)."""
    global _watching
    if not _watching:
        _watching = True
        _dali.watch_reader_methods(_on_epoch, _on_metadata)


def watch_reader_epochs(owner: Any) -> None:
    """Called for each compiled function made: eager batch epochs are watched while one lives."""
    _compiled.add(owner)
    _watch()


# reader -> what each of its epochs is handed out through (ndd_trace.nodes counts them so)
_epoch_wrappers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def wrap_epochs(reader: Any, wrap: Callable[[Iterator[Any], tuple, dict], Iterator[Any]]
                ) -> None:
    """From now on, each epoch of `reader`, whoever opens it (eager code, a compiled loop,
    transparent mode), is handed out as `wrap(epoch, args, kwargs)`, `args`/`kwargs` being
    those of its `next_epoch` call. The reader object itself is left as it is."""
    _epoch_wrappers[reader] = wrap
    _watch()


def has_epoch_wrapper(reader: Any) -> bool:
    return bool(_epoch_wrappers) and reader in _epoch_wrappers


def epoch_of(reader: Any, epoch: Any, args: tuple, kwargs: dict) -> Any:
    """`epoch`, through the reader's wrapper where it has one (`wrap_epochs`)."""
    wrap = _epoch_wrappers.get(reader) if _epoch_wrappers else None
    return epoch if wrap is None else wrap(epoch, args, kwargs)


def _on_epoch(reader: Any, original: Any, args: tuple, kwargs: dict) -> Any:
    """`reader.next_epoch(*args, **kwargs)` outside any trace (see `_open_epoch`), through the
    reader's epoch wrapper where it has one."""
    return epoch_of(reader, _open_epoch(reader, original, args, kwargs), args, kwargs)


def _open_epoch(reader: Any, original: Any, args: tuple, kwargs: dict) -> Any:
    """A reader with a stream reads through it (whoever asks: eager code too); a compiled
    loop's epoch, or one of a reader whose batches fed a compiled function, starts its stream;
    other epochs run eagerly, their batches remembered weakly (so that a compiled call can tell
    it was fed one)."""
    stand_in = _stand_in()
    if stand_in is not None:
        batch_size = _dali.reader_epoch_request(reader, args, kwargs, any_context=True,
                                                check=False)
        return iter([stand_in(reader, batch_size)])
    stream = stream_of(reader)
    if stream is not None:
        batch_size = stream.request(args, kwargs)
        if batch_size is None:  # eager ndd's own answer: its errors for a reader in batches
            return original(reader, *args, **kwargs)
        return stream.epoch(batch_size, _note_for_calls)
    streams = _in_loop() or reader in _feeding
    if streams and can_stream(reader) is None:
        batch_size = _dali.reader_epoch_request(reader, args, kwargs)
        if batch_size is not None:
            options = Options(_dali.current_num_threads(), _dali.current_device_id(), READ_AHEAD)
            return reader_epoch(reader, batch_size, options, _note_for_calls)
    epoch = original(reader, *args, **kwargs)
    if not _compiled or kwargs.get("capture") or len(args) > 2 and args[2]:
        return epoch
    return _tag_epoch(reader, epoch)


def _on_metadata(reader: Any, original: Any, args: tuple, kwargs: dict) -> Any:
    stream = stream_of(reader)
    if stream is not None:
        return stream.metadata()
    return original(reader, *args, **kwargs)


def _tag_epoch(reader: Any, epoch: Iterator[Any]) -> Iterator[Any]:
    ref = weakref.ref(reader)
    for item in epoch:
        if isinstance(item, tuple):
            for batch in item:
                _tag(batch, ref)
        elif isinstance(item, dict):
            for batch in item.values():
                _tag(batch, ref)
        yield item


def _tag(batch: Any, reader: weakref.ref) -> None:
    if isinstance(batch, _dali.Batch):
        key = id(batch)
        _tagged[key] = (weakref.ref(batch, lambda _: _tagged.pop(key, None)), reader)


def _note_inputs(bound: dict) -> None:
    """A compiled call was fed these arguments: readers whose eager batches are among them
    stream from their next epoch on."""
    for value in bound.values():
        entry = _tagged.get(id(value))
        if entry is not None and entry[0]() is value:
            reader = entry[1]()
            if reader is not None:
                _feeding.add(reader)


def run_call(executable: Executable, key: tuple, bound: dict,
             batch_size: int) -> PendingRun | None:
    """One call of a compiled function: a run launched ahead if the call is fed exactly what
    it was launched with (handed over without waiting for it), else a run of its own (and the
    next ones launched ahead once the calls follow a reader steadily)."""
    if _tagged:
        _note_inputs(bound)
    speculator = getattr(_calls, "speculator", None)
    if speculator is None or not speculator.active or executable.pipeline is None or \
            batch_size > executable.max_batch_size or not executable.graph.outputs:
        return executable.run(bound, batch_size)
    states: dict[int, Any] = {}
    drawn: dict[int, tuple] = {}
    for slot, node in executable.draws:  # in eager call order, from the caller's generators
        rng = executable.feed.rng_for(slot, bound)
        position = _dali.rng_position(rng)
        words = states[id(node)] = _dali.draw_state(rng)
        drawn[id(node)] = ("state", words, rng, position)
    items: list[tuple] | None = []
    for node in executable.lowered.external_sources:
        if node.kind is NodeKind.RANDOM_STATE:
            item = drawn.get(id(node))
            if item is None:  # not drawn per call: not predicted
                items = None
                break
        elif node.kind is NodeKind.INPUT:
            item = ("input", bound[node.payload])
        else:
            item = ("value", node.payload, node)
        items.append(item)
    observation = speculator.describe(items) if items is not None else None
    key = (id(executable), key)  # two functions' entries may have equal guard keys
    run = (speculator.take_run(key, observation, executable) if observation is not None
           else None)
    if run is not None:
        executable.ahead += 1
    else:
        run = executable.start(
            batch_size, lambda: executable.feed.call_data(bound, states, batch_size))
    run.replay = lambda: executable.failures.eager_error_of(bound, states, batch_size)
    if observation is not None:
        speculator.learn(key, executable, observation, batch_size)
    return run
