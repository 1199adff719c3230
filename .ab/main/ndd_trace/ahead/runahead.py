"""The one set of rules by which ndd_trace runs DALI work ahead of the Python that asks for it.

    forecast = StateForecast()
    draws, version = _dali.rng_position(rng)              # where the generator is now
    words = forecast.state_at(rng, draws + 7, version)    # what the op after next will draw
    ...                                                   # launch a run fed `words`
    if fed_as_eager("state", words, words_drawn_by_the_call):
        use the launched run                              # else: drop it, run as usual

Three ways of using ndd_trace run work ahead, with one engine:

- compiled generators (loop.py): the readers sit inside the generator's pipeline, whose prefetch
  queue keeps `prefetch_queue_depth` steps scheduled, into the next epoch too;
- compiled functions called from an eager reader loop, and transparent mode's regions, including
  the checked mode of compiled generators (ahead/): each reader streams from a pipeline of
  its own, `READ_AHEAD` batches deep, and a `Speculator` launches `RUN_AHEAD` runs on them.

The rules they share:

1. **What is read ahead**: reader batches only, from the very operator instance eager ndd would
   run (the same samples in the same order, epoch lengths, shards and breaks as eager). Items of
   an `ndd.ExternalSource` are pulled ahead only by compiled generators (eager pulls every one of
   them in the same order), and re-fed after a failed run.
2. **How random states are predicted**: never by drawing from the caller's generator, which
   moves only when eager would have drawn, but from a clone of it at the position eager will have
   reached (`StateForecast.state_at`); a reseed (a new version) or a draw the forecast did not
   foresee makes the prediction void.
3. **When a launched run is used**: only if what it was fed is what eager feeds at that step: the
   same reader batch, bit-equal random states, equal constants (`fed_as_eager`). A compiled
   generator, whose loop body stepcheck.py proved step-invariant, checks the states by the
   generator's position, which is the same test at no cost per state. A run that fails the test
   is dropped and the step runs as usual; a compiled generator, which owns its readers and cannot
   drop a batch, recomputes such steps from their reader batches instead.
4. **When running ahead stops**: a pattern of runs that missed `MAX_MISSES` times and more than
   twice as often as it hit is no longer launched ahead; a dropped reader's batches, patterns and
   clones are forgotten.
5. **Files between epochs**: a stream reads only while one of its epochs is open (and, at the
   open epoch's end, into the next one); between epochs, when the script may rewrite, truncate
   or delete files, none of its reads is in flight. A batch read before the open epoch's first
   step is checked as it is handed out: each file eager ndd's reader reads at that step (DALI's
   loader reads one sample, and its prefetch thread `prefetch_queue_depth` batches, ahead of its
   runs) that changed since the stream read it (ctime at or after that read, or its state
   unlike the one noted as the last epoch ended) is read again by a reader of the same kind,
   and the error eager's reader raises for it is raised at that step and every later one.
   Files eager's reader had already read when the epoch began keep the bytes read then, unless
   changed in place under eager's mapping. A File or Numpy reader's stream reads files into
   memory (`dont_use_mmap=True`), so a file truncated under a read fails that read (its error
   told in eager's words) instead of killing the process (SIGBUS); a shuffling one keeps
   eager's mapping (its shuffle buffer loads files long before their batch: read into memory,
   they would be older than the mapping eager copies at the run, and DALI serves a deleted
   file's mapping while it is in use). A reader whose files ndd_trace cannot name reads no
   further than the open epoch's end.
"""

from __future__ import annotations

import dataclasses
import os
import weakref
from typing import Any

from .. import _dali

# calls launched ahead as one coalesced run (NDD_TRACE_COALESCE=K, opt in; 0 or 1: off):
# coalescing.py; two groups are kept launched past the one in use, so readers read 3K ahead
CALLS_PER_RUN = max(int(os.environ.get("NDD_TRACE_COALESCE", "0") or 0), 0)
READ_AHEAD = max(4, 3 * CALLS_PER_RUN + 1)  # reader batches kept scheduled ahead of the script
RUN_AHEAD = 2  # region or call runs kept launched ahead (the region pipelines' queue depth)
KEEP_BATCHES = READ_AHEAD + max(RUN_AHEAD, 3 * CALLS_PER_RUN) + 2  # batches per reader kept known


def runs_ahead(prefetch_queue_depth: int) -> int:
    """Runs the speculator keeps launched ahead on a pipeline of this queue depth: RUN_AHEAD, or
    as many as a deeper queue holds besides the run in use (a tuned one: execution/tuning.py)."""
    return max(RUN_AHEAD, prefetch_queue_depth - 1)
MAX_MISSES = 3  # a pattern is no longer run ahead once it missed this often, and more than
# twice as often as it hit


@dataclasses.dataclass
class _Clone:
    """A clone of one generator, drawing ahead of it."""

    clone: Any
    draws: int  # the position (in words) the clone's next draw comes from
    owner: weakref.ref
    version: int


class StateForecast:
    """Random states a generator will give, drawn ahead of it from one clone per generator."""

    def __init__(self) -> None:
        self._clones: dict[int, _Clone] = {}

    def state_at(self, rng: Any, draws: int, version: int) -> Any:
        """The state a random op will draw from `rng` once the generator has given `draws`
        words, in its `version` (None if it was reseeded since, or is already past that point).
        The clone is made anew when it would have to go back, or the generator was reseeded."""
        now, now_version = _dali.rng_position(rng)
        if now_version != version or now > draws:
            return None
        entry = self._clones.get(id(rng))
        if entry is None or entry.owner() is not rng or entry.draws > draws or \
                entry.version != version:
            entry = self._clones[id(rng)] = _Clone(_dali.rng_clone(rng), now, weakref.ref(rng),
                                                   version)
        if draws > entry.draws:
            _dali.rng_advance(entry.clone, draws - entry.draws)
        entry.draws = draws + _dali.STATE_WORDS
        return _dali.draw_state(entry.clone)

    def forget_dropped(self) -> None:
        """Drop the clones of generators nobody holds any more."""
        self._clones = {key: entry for key, entry in self._clones.items()
                        if entry.owner() is not None}

    def clear(self) -> None:
        self._clones.clear()


def fed_as_eager(kind: str, predicted: Any, fed: Any) -> bool:
    """Whether a run launched with `predicted` for one of its leaves was fed what the eager
    call feeds (`fed`): the same reader batch object, bit-equal state words, equal data."""
    if kind == "reader":
        return predicted is fed
    if kind == "state":
        return predicted.shape == fed.shape and bool((predicted == fed).all())
    return _dali.same_data(predicted, fed)


def gave_up(hits: int, misses: int) -> bool:
    """Rule 4: a pattern that keeps missing is no longer run ahead."""
    return misses >= MAX_MISSES and misses > 2 * hits
