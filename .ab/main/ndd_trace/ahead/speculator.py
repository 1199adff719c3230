"""The speculator: regions and compiled calls fed by reader batches are run ahead on the
batches read ahead, by runahead.py's rules, and a launched run is used only if the call is fed
exactly what it was launched with (see the ahead package's docstring).

    speculator = Speculator()
    observation = speculator.observe(leaves, computed)       # what this run is fed
    run = speculator.take(key, observation)                  # a run launched ahead, or None
    speculator.learn(key, executable, observation, batch_size)   # launch the next ones
"""

from __future__ import annotations

import collections
import dataclasses
import weakref
from typing import Any

from .. import _dali
from ..core.ir import Node, NodeKind
from ..execution.results import PendingRun
from ..execution.runtime import Executable
from .coalescing import Coalescer, coalesced_twin
from .runahead import KEEP_BATCHES, StateForecast, fed_as_eager, gave_up, runs_ahead
from .streams import ReaderStream

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
             executable: Executable | None = None) -> tuple | PendingRun | None:
        """The outputs of the run launched for this observation, if it was fed exactly what the
        script's calls produced (and, given `executable`, launched on it); the run itself where
        it failed on that data (the caller raises its failure: `Executable.failed_again`);
        None otherwise (the region then runs as usual)."""
        launch = self._launch_for(key, observation)
        if launch is None:
            return None
        if (executable is None or launch.run.executable is executable) and \
                all(fed_as_eager(leaf.kind, leaf.value, fed)
                    for leaf, fed in zip(observation.leaves, launch.fed)):
            try:
                outputs = launch.run.result()
            except Exception:  # the region runs as usual, and reports a real error itself
                if launch.run.dali_error is None or launch.run.as_is:
                    return None
                outputs = launch.run  # it failed itself: its failure is this step's
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
        if run.executable is executable and run.error is None and \
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
        twin = coalesced_twin(executable, batch_size)
        if twin is not None and self._launch_coalesced(twin, executable, observation, pattern,
                                                       batch_size):
            return
        ahead = runs_ahead(executable.options.prefetch_queue_depth)
        for count in range(observation.count + 1, observation.count + 1 + ahead):
            if count in pattern.launched:
                continue
            launch = self._launch(executable, observation, pattern.strides, count, batch_size)
            if launch is None:
                break
            pattern.launched[count] = launch

    def _launch_coalesced(self, twin: Coalescer, executable: Executable,
                          observation: Observation, pattern: _Pattern, batch_size: int) -> bool:
        """Keep two groups of `twin.k` calls launched ahead of the group being consumed, each
        as one coalesced run (a group's run takes longer than its calls take to consume: one
        group ahead would leave the pipeline waiting); False where none could be (the calls
        are then launched one by one)."""
        window = observation.count + 3 * twin.k
        count = observation.count + 1
        launched_any = False
        while count + twin.k <= window:
            if count in pattern.launched:
                count += 1
                launched_any = True
                continue
            calls = [self._call_data(executable, observation, pattern.strides, c, batch_size)
                     for c in range(count, count + twin.k)]
            if any(call is None for call in calls):
                break
            runs = twin.launch([data for data, _ in calls], batch_size)
            if runs is None:
                break
            for offset, (run, (_, fed)) in enumerate(zip(runs, calls)):
                pattern.launched[count + offset] = _Launch(count + offset, run, fed)
            count += twin.k
            launched_any = True
        return launched_any

    def _launch(self, executable: Executable, observation: Observation, strides: list[int],
                count: int, batch_size: int) -> _Launch | None:
        call = self._call_data(executable, observation, strides, count, batch_size)
        if call is None:
            return None
        data, fed = call
        run = executable.launch(data, batch_size)
        return _Launch(count, run, fed) if run is not None else None

    def _call_data(self, executable: Executable, observation: Observation, strides: list[int],
                   count: int, batch_size: int) -> tuple[list, list] | None:
        """What the call at `count` would feed (and the values it stands for), predicted from
        the batches read ahead and the generators' strides; None where it cannot be yet."""
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
        return data, fed
