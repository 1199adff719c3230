"""What the process remembers between calls, in one place: every module-level dict, set, weak
set, lock, thread-local and counter of ndd_trace lives here, named for what it holds, except the
units and their live pipelines (units/cache.py) and what the adapter learned of DALI (_dali/).
The modules that own a behaviour read and write its state here (tests/test_architecture.py keeps
it so, I8).

No DALI and no types of the layers above: plain containers, filled by their owners.
"""

from __future__ import annotations

import collections
import itertools
import threading
import weakref
from typing import Any

# -- core: memos of what does not change in a process ------------------------------------------

# filename -> whether it is ndd_trace's, DALI's, makefun's, optree's or generated (source.py)
internal_files: dict[str, bool] = {}
# the internal directories, once DALI, makefun and optree are imported (source.py)
internal_dirs: list[tuple[str, ...]] = []
# built-in exception type -> its PipelineError (errors.py)
pipeline_errors: dict[type, type] = {}
log_handler: list = []  # the one handler printing the ndd_trace loggers (logs.py)
# types optree walks into, and types it does not (trees.py)
container_types: set[type] = {tuple, list, dict}
leaf_types: set[type] = {type(None), int, float, str, bool}
deprecations_warned: set[str] = set()  # deprecated settings said once a process (units/build.py)
# an lru_cache helper -> how many times its cache_clear() ran since ndd_trace first keyed it
# (tracing/guards.py: a cleared helper computes its answers anew)
lru_clears: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# .breaks: every GraphBreakSignal raised while a trace collects them, else None (errors.py)
graph_breaks_raised = threading.local()
# frames source.py made to claim a user's line, kept: making one costs a thread (~100 us).
# raise_at's: (file, line, function, statement) -> (frame, lasti); under_call_stack's:
# (file, function, line) -> frame
made_frames: dict[tuple, Any] = {}

# -- codegen: the numbers that make generated files' names unique in the process --------------

lowered_sources = itertools.count()  # <ndd_trace:name#N>, a lowered pipeline (lower.py)
rewritten_sources = itertools.count()  # <ndd_trace per-sample:name#N> (per_sample/rewrite.py)

# -- execution: the loader's waits and optimize's searches ---------------------------------------

waits_lock = threading.Lock()
# .pulling: timed next() calls in progress; .blocked: seconds blocked in them (waits.py)
waits_local = threading.local()
loop_times: dict[tuple[str, str], Any] = {}  # (loop, file:line) -> waits.LoopTimes
blocked_elsewhere: dict[int, float] = {}  # thread -> seconds other threads waited for it
tuning_lock = threading.RLock()
tuning_search: list[weakref.ref] = []  # the one Tuner searching now (tuning.py)
tuning_stores: dict[str | None, Any] = {}  # directory -> tuning_store.Store

# -- ahead: reader streams and compiled calls run ahead ------------------------------------------

stream_workers: weakref.WeakSet = weakref.WeakSet()  # streams with a worker, stopped at exit
on_new_stream: list = []  # called at a reader's first stream (calls.py watches its epochs)
compiled_calls = threading.local()  # .speculator: this thread's Speculator for compiled calls
compiled_functions: weakref.WeakSet = weakref.WeakSet()  # live ones (the reader watch's owners)
tagged_batches: dict[int, tuple] = {}  # id(batch) -> (batch, reader) weak references
feeding_readers: weakref.WeakSet = weakref.WeakSet()  # readers whose batches fed a compiled call
epoch_wrappers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # reader -> its wrapper
readers_watched: list[bool] = []  # [True] once reader methods are wrapped (calls.py)
# .active: a compiled loop is pulling its next item; .stand_in (loop_epochs.py)
loop_opening = threading.local()

# -- modes and entry points ------------------------------------------------------------------------

loop_describing = threading.local()  # .active: loop.py is describing a generator's loop
compiled_objects: weakref.WeakSet = weakref.WeakSet()  # every compiled function (ndd_trace.reset)
nodes_seated: weakref.WeakSet = weakref.WeakSet()  # readers a nodes.Loop counts the epochs of
reports_registered: set[str] = set()  # report paths written at exit (launch.py)


class PerSampleScope(threading.local):
    """This thread's per-sample pipeline being defined, and the PerSampleError (or EagerLoop)
    raised in it, which DALI's AutoGraph re-raises wrapped (per_sample/conditions.py)."""

    definition: Any = None
    raised: Exception | None = None


per_sample_scope = PerSampleScope()


class TransparentCounts:
    """Transparent mode's bookkeeping (all threads): what its report and step_breakdown say."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.readers: collections.Counter = collections.Counter()
        self.ops_recorded = 0
        self.ops_replayed = 0
        self.local = threading.local()  # this thread's recorder (lazy.py)
        # seconds spent per stage, all threads: record (ndd calls), key (a region's cone and
        # structure), check (run-ahead: observe, use, launch), feed (building, feeding), run
        # (DALI's Run), fetch (waiting for the outputs); see report.step_breakdown()
        self.times = dict.fromkeys(("record", "key", "check", "feed", "run", "fetch"), 0.0)


transparent = TransparentCounts()
