"""torchdata.nodes for ndd loops: a compiled generator (or any ndd loop) as a node of a
torchdata graph, whose state resumes it mid-epoch exactly.

    import torchdata.nodes as tn
    from ndd_trace.nodes import Loop, to_torch

    @ndd.compile
    def train_batches(reader):
        for jpegs, labels in reader.next_epoch(batch_size=64):
            images = ndd.decoders.image(jpegs)
            yield ndd.random_resized_crop(images, size=[224, 224]), labels

    loader = tn.Loader(tn.Mapper(Loop(train_batches, reader), to_torch))
    for images, labels in loader:       # one epoch: one call of train_batches
        ...
    state = loader.state_dict()         # mid-epoch; later, the same graph in a new process:
    loader.load_state_dict(state)       # the next iter(loader) gives the rest of that epoch

A node's state is what eager ndd's checkpoints hold (each reader's `get_state()`, the random
generators' states: the default one of the thread that pulls, and any RNG given) and what they
do not: the batches left in each reader's open epoch (a restored eager reader counts a full
epoch from where it stands: the node ends the first epoch where the saved one would have
ended), the shard each reader reads next, and the node's epoch and step counts. The readers get
checkpointing switched on (`ndd.checkpoint.Checkpoint.register` does the same), which keeps them
eager: read by the loop, not streamed ahead by ndd_trace, so that `get_state()` is exact.

torchdata is an optional dependency (`pip install ndd_trace[torchdata]`), imported here only.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

from .core import process_state
from . import _dali
from .ahead import calls as ahead_calls
from .modes import lazy

try:
    import torchdata.nodes as tn
except ImportError as error:  # the package works without torchdata; this module needs it
    raise ImportError("ndd_trace.nodes needs torchdata: pip install torchdata "
                      "(or pip install 'ndd_trace[torchdata]')") from error

__all__ = ["STATE_KEY", "Loader", "Loop", "to_torch"]

STATE_KEY = "ndd_trace_loop"  # marks (and versions) a Loop's state
_VERSION = 1
_NOT_COUNTED = "not counted"  # a sample epoch (or one of a context): no batch count




class _Seat:
    """A reader of a node: the batches of its open epoch counted; after a restore, its first
    epoch ends where the saved epoch would have ended."""

    def __init__(self, reader: Any):
        self.reader = reader
        self.left: int | str | None = None  # batches left in its open epoch (None: none open)
        self.cut: int | None = None  # the first epoch after a restore: batches it gives
        self.restored: str | None = None  # the state restored, until the reader starts

    def install(self) -> None:
        """Count this reader's epochs, whoever opens them (calls.wrap_epochs: the reader
        object is left as it is)."""
        if self.reader in process_state.nodes_seated:
            raise ValueError(f"reader {type(self.reader).__name__} "
                             f"({_dali.reader_name(self.reader)}) already belongs to another "
                             "ndd_trace.nodes.Loop")
        process_state.nodes_seated.add(self.reader)
        ahead_calls.wrap_epochs(self.reader, self._epoch)

    def _epoch(self, epoch: Iterator[Any], args: tuple, kwargs: dict) -> Iterator[Any]:
        batch_size = _dali.reader_epoch_request(self.reader, args, kwargs, any_context=True,
                                                check=False)
        return self._counted(epoch, batch_size)

    def _counted(self, epoch: Any, batch_size: int | None) -> Iterator[Any]:
        iterator = iter(epoch)
        cut, self.cut = self.cut, None
        try:
            if cut is not None:  # the rest of the epoch saved: then its end, shard advanced
                self.left = cut
                for _, item in zip(range(cut), iterator):
                    self.left -= 1
                    yield item
                _dali.advance_shard(self.reader)
                return
            if batch_size is None:
                self.left = _NOT_COUNTED
                yield from iterator
                return
            for taken, item in enumerate(iterator):
                if taken == 0:  # (ndd counts the epoch at its first step)
                    self.left = _dali.eager_epoch_steps(self.reader, batch_size)
                self.left -= 1
                yield item
        finally:
            self.left = None
            close = getattr(iterator, "close", None)
            if close is not None:
                close()

    def state(self) -> dict:
        if self.left == _NOT_COUNTED:
            raise ValueError(
                f"reader {type(self.reader).__name__} is in an epoch of single samples (or one "
                "given an explicit ctx): ndd_trace.nodes.Loop saves batch epochs "
                "(next_epoch(batch_size=...)) mid-epoch")
        if _dali.reader_started(self.reader):
            position = str(self.reader.get_state())
        else:
            position = self.restored  # None for a reader that has not read yet
        left = self.cut if self.cut is not None else self.left  # (restored, not opened yet)
        return {"state": position, "batches_left": left,
                "shard_id": _dali.reader_shard_id(self.reader)}

    def restore(self, saved: dict) -> None:
        reader = self.reader
        if _dali.reader_started(reader):
            raise RuntimeError(
                f"ndd_trace.nodes.Loop.reset(initial_state): reader {type(reader).__name__} "
                f"({_dali.reader_name(reader)}) has read already; a saved state restores into "
                "a reader that has not read yet (make the reader and the node again, as in a "
                "new process)")
        if saved["state"] is not None:
            reader.set_state(saved["state"])
        _dali.set_reader_shard_id(reader, saved["shard_id"])
        self.restored = saved["state"]
        self.cut = saved["batches_left"]
        self.left = None


class Loop(tn.BaseNode, metaclass=_dali.cuda_node_meta()):
    """A generator function of ndd batches (a compiled generator, or any ndd loop) as a
    torchdata node: each epoch is one call `function(*args)`, its items the node's items;
    `state_dict()` / `reset(initial_state)` resume it mid-epoch exactly."""

    def __init__(self, function: Callable[..., Iterator[Any]], *args: Any,
                 readers: list | tuple | None = None, rngs: list | tuple = (),
                 transparent: bool = False, checkpointing: bool = True):
        """Args:
            function: a generator function (`@ndd.compile`d or not) making one epoch.
            *args: its arguments (`functools.partial` for keywords).
            readers: the ndd readers it reads (default: the readers among `args`).
            rngs: explicit `ndd.random.RNG`s it draws from, besides those among `args` (the
                default generator of the thread that pulls is always saved).
            transparent: run each step of an uncompiled generator in transparent mode.
            checkpointing: switch checkpointing on in the readers (False keeps them streamed
                ahead by ndd_trace; the node's state then holds its counts only, and cannot
                be restored).
        """
        super().__init__()
        if not callable(function):
            raise TypeError(f"ndd_trace.nodes.Loop: `function` must be a generator function, "
                            f"got {type(function).__name__}")
        self._function = function
        self._args = args
        found = _arguments(function, args)
        if readers is None:
            readers = [value for value in found if isinstance(value, _dali.Reader)]
            if not readers:
                raise ValueError(
                    f"ndd_trace.nodes.Loop: no ndd reader among the arguments of "
                    f"{getattr(function, '__qualname__', function)!r}; pass readers=[...] (the "
                    "readers its loop reads)")
        for reader in readers:
            if not isinstance(reader, _dali.Reader):
                raise TypeError(f"ndd_trace.nodes.Loop: `readers` must hold ndd readers, got "
                                f"{type(reader).__name__}")
        self._checkpointing = checkpointing
        if checkpointing:
            for reader in readers:
                _dali.enable_reader_checkpointing(reader)
        self._seats = [_Seat(reader) for reader in readers]
        for seat in self._seats:
            seat.install()
        explicit = list(rngs) + [value for value in found if isinstance(value, _dali.RNG)]
        for rng in explicit:
            if not isinstance(rng, _dali.RNG):
                raise TypeError(f"ndd_trace.nodes.Loop: `rngs` must hold ndd.random.RNG "
                                f"objects, got {type(rng).__name__}")
        self._rngs = list({id(rng): rng for rng in explicit}.values())
        self._transparent = transparent
        self._generator: Iterator[Any] | None = None
        self._steps: lazy.Steps | None = None
        self._finished = False
        self._default_rng: Any = None  # the default generator of the thread that pulled last
        self._pending_default: str | None = None  # restored, set at the next pull
        self.epoch = -1  # the epoch being given (the first reset() makes it 0)
        self.step = 0  # items given in this epoch

    # -- torchdata's protocol -----------------------------------------------------------------

    def reset(self, initial_state: dict | None = None) -> None:
        """Start the next epoch (the next call of the function); given a state this node's
        kind saved, resume where it was saved, into readers that have not read yet."""
        super().reset(initial_state)
        self._close()
        if initial_state is None:
            self.epoch += 1
            self.step = 0
            self._finished = False
            return
        self._restore(initial_state)

    def next(self) -> Any:
        """The epoch's next item (StopIteration at its end)."""
        if self._finished:
            raise StopIteration
        if self._pending_default is not None:  # in the thread that runs the loop
            _dali.default_rng().set_state(self._pending_default)
            self._pending_default = None
        if self._generator is None:
            self._generator = iter(self._function(*self._args))
            if self._transparent:
                self._steps = lazy.Steps(lazy.new_tracer())
        try:
            if self._steps is not None:
                with self._steps.step():
                    item = next(self._generator)
            else:
                item = next(self._generator)
        except StopIteration:
            self._finished = True
            self._close()
            raise
        finally:
            self._default_rng = _dali.existing_default_rng()
        self.step += 1
        return item

    def get_state(self) -> dict:
        """The state now (JSON-serializable): reader positions, generator states, the batches
        left in each reader's open epoch, shards, the epoch and step counts."""
        if not self._checkpointing:  # (asked for anyway: tn.Prefetcher snapshots every item)
            return {STATE_KEY: _VERSION, "epoch": self.epoch, "step": self.step,
                    "finished": self._finished, "readers": None}
        if self._pending_default is not None:
            default = self._pending_default
        elif self._default_rng is not None:
            default = str(self._default_rng.get_state())
        else:
            default = None
        return {
            STATE_KEY: _VERSION, "epoch": self.epoch, "step": self.step,
            "finished": self._finished,
            "readers": [seat.state() for seat in self._seats],
            "rngs": [str(rng.get_state()) for rng in self._rngs],
            "default_rng": default,
        }

    def close(self) -> None:
        """End the epoch being given, as a `break` does (a loader left mid-epoch is otherwise
        ended whenever Python's garbage collector gets to it)."""
        self._close()

    # -- the rest -----------------------------------------------------------------------------

    def _restore(self, state: dict) -> None:
        if not isinstance(state, dict) or state.get(STATE_KEY) != _VERSION:
            raise ValueError(
                "ndd_trace.nodes.Loop.reset(initial_state): `initial_state` is not a Loop's "
                f"state (version {_VERSION}); got {_summary(state)}. A node between the Loader "
                "and the Loop must save its source's state (tn.Mapper does; DALI's DictMapper "
                "and ToTorch save none)")
        if not self._checkpointing or state["readers"] is None:
            raise ValueError("ndd_trace.nodes.Loop.reset(initial_state): a Loop made with "
                             "checkpointing=False saves no reader positions, and restores none")
        if len(state["readers"]) != len(self._seats) or len(state["rngs"]) != len(self._rngs):
            raise ValueError(
                f"ndd_trace.nodes.Loop.reset(initial_state): the state was saved by a Loop of "
                f"{len(state['readers'])} reader(s) and {len(state['rngs'])} RNG(s); this one "
                f"has {len(self._seats)} and {len(self._rngs)}")
        for seat, saved in zip(self._seats, state["readers"]):
            seat.restore(saved)
        for rng, saved in zip(self._rngs, state["rngs"]):
            rng.set_state(saved)
        self._pending_default = state["default_rng"]
        self.epoch = state["epoch"]
        self.step = state["step"]
        self._finished = state["finished"]

    def _close(self) -> None:
        """End the epoch being given (a `break`, as eagerly: its readers' `finally`s run)."""
        generator, self._generator = self._generator, None
        steps, self._steps = self._steps, None
        try:
            close = getattr(generator, "close", None)
            if close is not None:
                close()
        finally:
            if steps is not None:
                steps.close()


class Loader(tn.Loader):
    """torchdata's Loader, with `len()` (batches per epoch) when given `length`.

    A trainer that is not told an epoch's length fetches ahead to see where it ends (Lightning
    fetches one batch ahead): the state it then saves with a checkpoint is one batch past the
    steps it took, and a resumed run skips that batch. Told the length, it fetches nothing
    ahead, and saves the state of the batches its steps consumed."""

    def __init__(self, root: tn.BaseNode, length: int | None = None,
                 restart_on_stop_iteration: bool = True):
        super().__init__(root, restart_on_stop_iteration)
        if length is not None and (not isinstance(length, int) or length < 1):
            raise ValueError(f"ndd_trace.nodes.Loader: `length` must be a positive int (the "
                             f"batches of an epoch), got {length!r}")
        self.length = length

    def __len__(self) -> int:
        if self.length is None:
            raise TypeError("this ndd_trace.nodes.Loader was not given a length")
        return self.length


def _arguments(function: Callable, args: tuple) -> list[Any]:
    """The values a node's function is called with (a partial's included)."""
    values = list(args)
    while isinstance(function, functools.partial):
        values += [*function.args, *function.keywords.values()]
        function = function.func
    return values


def _summary(value: Any) -> str:
    if isinstance(value, dict):
        return f"a dict with keys {sorted(map(str, value))[:6]}" if value else "an empty dict"
    return type(value).__name__


def to_torch(item: Any) -> Any:
    """An item of ndd batches as torch tensors: each Batch or Tensor in a tuple, list or dict
    (nested too) becomes `.torch()` of it; anything else stays (for `tn.Mapper`)."""
    if isinstance(item, (_dali.Batch, _dali.Tensor)):
        return item.torch()
    if isinstance(item, tuple) and hasattr(item, "_fields"):  # a namedtuple
        return type(item)(*(to_torch(value) for value in item))
    if isinstance(item, (tuple, list)):
        return type(item)(to_torch(value) for value in item)
    if isinstance(item, dict):
        return {key: to_torch(value) for key, value in item.items()}
    return item
