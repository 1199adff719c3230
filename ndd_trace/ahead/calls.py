"""Call watching: compiled steps called from an eager reader loop, the readers' methods
watched at class level (from the adapter: no user object is patched), and epoch wrappers.

    for jpegs, labels in reader.next_epoch(batch_size=64):   # eager: the user's own loop
        images = preprocess(jpegs)                           # a compiled step: run_call
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from typing import Any

from ..core import process_state
from .. import _dali
from ..core.ir import NodeKind
from ..execution.results import PendingRun
from ..execution.runtime import Executable, Options, raise_if_an_argument_failed
from .runahead import READ_AHEAD
from .loop_epochs import in_compiled_loop, loop_stand_in
from .speculator import Speculator
from .streams import can_stream, reader_epoch, stream_of

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
# is fed a batch of a reader's eager epoch, the rest of that epoch and the reader's later batch
# epochs go through a ReaderStream, exactly as in transparent mode (the same operator, read
# ahead by a worker thread; epoch lengths, breaks and shards as eagerly; checkpointing readers,
# readers with tensor arguments or owned by a compiled loop stay eager). The compiled function
# is then run ahead on the batches read ahead by the same Speculator as transparent mode's
# regions: a launched run is used only if the call is fed exactly what was predicted (the same
# reader batch object, bit-equal random states, the same constants); otherwise the call runs as
# usual.



def _call_speculator() -> Speculator:
    speculator = getattr(process_state.compiled_calls, "speculator", None)
    if speculator is None:
        speculator = process_state.compiled_calls.speculator = Speculator()
    return speculator


def _note_for_calls(stream: Any, count: int, batches: tuple) -> None:
    _call_speculator().note_batch(stream, count, batches)


def _watch() -> None:
    """Readers: their epochs and metadata go through `_on_epoch` and `_on_metadata` from now on
    (class-level wrappers, installed once)."""
    if not process_state.readers_watched:
        process_state.readers_watched.append(True)
        _dali.watch_reader_methods(_on_epoch, _on_metadata)


def watch_reader_epochs(owner: Any) -> None:
    """Called for each compiled function made: eager batch epochs are watched while one lives."""
    process_state.compiled_functions.add(owner)
    _watch()


# reader -> what each of its epochs is handed out through (ndd_trace.nodes counts them so)


def wrap_epochs(reader: Any, wrap: Callable[[Iterator[Any], tuple, dict], Iterator[Any]]
                ) -> None:
    """From now on, each epoch of `reader`, whoever opens it (eager code, a compiled loop,
    transparent mode), is handed out as `wrap(epoch, args, kwargs)`, `args`/`kwargs` being
    those of its `next_epoch` call. The reader object itself is left as it is."""
    process_state.epoch_wrappers[reader] = wrap
    _watch()


def has_epoch_wrapper(reader: Any) -> bool:
    return bool(process_state.epoch_wrappers) and reader in process_state.epoch_wrappers


def epoch_of(reader: Any, epoch: Any, args: tuple, kwargs: dict) -> Any:
    """`epoch`, through the reader's wrapper where it has one (`wrap_epochs`)."""
    wrap = process_state.epoch_wrappers.get(reader) if process_state.epoch_wrappers else None
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
    stand_in = loop_stand_in()
    if stand_in is not None:
        batch_size = _dali.reader_epoch_request(reader, args, kwargs, any_context=True,
                                                check=False)
        return iter([stand_in(reader, batch_size)])
    stream = stream_of(reader)
    if stream is not None:
        batch_size = stream.request(args, kwargs)
        if batch_size is None:  # eager ndd's own answer: its errors for a reader in batches
            return original(reader, *args, **kwargs)
        return reader_epoch(reader, batch_size, _stream_options(), _note_for_calls)
    streams = in_compiled_loop() or reader in process_state.feeding_readers
    if streams and can_stream(reader) is None:
        batch_size = _dali.reader_epoch_request(reader, args, kwargs)
        if batch_size is not None:
            return reader_epoch(reader, batch_size, _stream_options(), _note_for_calls)
    epoch = original(reader, *args, **kwargs)
    if not process_state.compiled_functions or kwargs.get("capture") or len(args) > 2 and args[2]:
        return epoch
    return _tag_epoch(reader, epoch, args, kwargs)


def _stream_options() -> Options:
    """A new stream's pipeline options: ndd's threads and device now."""
    return Options(_dali.current_num_threads(), _dali.current_device_id(), READ_AHEAD)


def _on_metadata(reader: Any, original: Any, args: tuple, kwargs: dict) -> Any:
    stream = stream_of(reader)
    if stream is not None:
        return stream.metadata()
    return original(reader, *args, **kwargs)


def _tag_epoch(reader: Any, epoch: Any, args: tuple, kwargs: dict) -> Iterator[Any]:
    """An eager batch epoch, its batches tagged; once one of them fed a compiled call, the
    rest of the epoch is read through the reader's stream (read ahead, the calls run ahead),
    from where the reader's operator is: the same batches eager ndd's epoch would give."""
    ref = weakref.ref(reader)
    given = 0
    for item in epoch:
        if isinstance(item, tuple):
            for batch in item:
                _tag(batch, ref)
        elif isinstance(item, dict):
            for batch in item.values():
                _tag(batch, ref)
        yield item
        given += 1
        if reader in process_state.feeding_readers and can_stream(reader) is None:
            batch_size = _dali.reader_epoch_request(reader, args, kwargs)
            if batch_size is not None:
                epoch.close()  # (eager's epoch left at this step: its shard does not advance)
                yield from reader_epoch(reader, batch_size, _stream_options(), _note_for_calls,
                                        given)
                return


def _tag(batch: Any, reader: weakref.ref) -> None:
    if isinstance(batch, _dali.Batch):
        key = id(batch)
        tagged = process_state.tagged_batches
        tagged[key] = (weakref.ref(batch, lambda _: tagged.pop(key, None)), reader)


def _note_inputs(bound: dict) -> None:
    """A compiled call was fed these arguments: readers whose eager batches are among them
    stream from their next batch on (`_tag_epoch`)."""
    for value in bound.values():
        entry = process_state.tagged_batches.get(id(value))
        if entry is not None and entry[0]() is value:
            reader = entry[1]()
            if reader is not None:
                process_state.feeding_readers.add(reader)


def watching() -> bool:
    """Whether a compiled call may be fed a reader's batches or served a run launched ahead
    (then it goes through `run_call`; otherwise straight to its executable)."""
    return bool(process_state.tagged_batches) or \
        getattr(process_state.compiled_calls, "speculator", None) is not None


def run_call(executable: Executable, key: tuple, bound: dict,
             batch_size: int) -> PendingRun | None:
    """One call of a compiled function: a run launched ahead if the call is fed exactly what
    it was launched with (handed over without waiting for it), else a run of its own (and the
    next ones launched ahead once the calls follow a reader steadily)."""
    if process_state.tagged_batches:
        _note_inputs(bound)
    speculator = getattr(process_state.compiled_calls, "speculator", None)
    if speculator is None or not speculator.active or executable.pipeline is None or \
            batch_size > executable.max_batch_size or not executable.graph.outputs:
        return executable.run(bound, batch_size)
    raise_if_an_argument_failed(bound)  # (before any draw, as executable.run checks)
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
    run.leaves = lambda: executable.failures.leaves_of(bound, states)
    run.replay = lambda: executable.failures.eager_error_of(bound, states, batch_size)
    if observation is not None:
        speculator.learn(key, executable, observation, batch_size)
    return run


# a reader's first stream: its epochs are watched from then on
process_state.on_new_stream.append(_watch)
