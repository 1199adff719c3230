"""Per-machine tuning under `optimize=True`: a pipeline's `num_threads`, `prefetch_queue_depth` and
GPU decoders' `hw_decoder_load`, measured once the loop has run a while (`SEARCH_AFTER_S`) and
kept per machine.

    tuner = tuning.attach(executable, applied, relower, threads_given=False)  # or None
    # ... the consumer's steps: each run's first result() calls tuner.consumed()
    tuner.describe()    # what `explain` and the report list: "tuning: num_threads 16 -> 8 ..."

The objective is what the loop feels: the consumer's steps per second, counted at the first uses
of the runs of one pipeline, over at least `WINDOW` steps and `WINDOW_S` seconds (the mean,
stalls included: a median leaves out the slow steps a setting causes; `SETTLE` steps after each
change left out). It begins once the loop has run `SEARCH_AFTER_S` seconds, so a short run is
not slowed by tries that could not pay in it. The search is coordinate descent from the starting
settings (the function's, or ndd's current threads; `prefetch_queue_depth` as it runs; the load
`optimize` set): the decoder load along `LOADS` (one up, on up while it pays, else one down and
on down), then the threads halved (again while it pays) or doubled (up to the CPUs this process
may use), then one step deeper where that runs further ahead (`runs_ahead`, ahead/runahead.py's
rule, is passed in). A setting replaces the start only if it beats it by `MARGIN` twice,
measured once in the search and once more, alternating, after it: a loop bound by its own
training step times every setting alike and keeps the start.

Settings change no values but the decoder load's (which images the hardware JPEG decoder
takes, documented under `optimize`): random states are fed per call, and a DALI op gives the
same output on any number of threads. Each setting is a pipeline built by a thread of its own
while the current one runs on (Executable.prepare), swapped in at the first step after it is
built, once the runs in flight are fetched (their outputs are kept); a setting that fails to
build ends the search at the start's settings. DALI holds the GIL while it builds (about 0.5 s
for a GPU-decoder pipeline on the H200), so the loop's Python waits that long all the same; the
runs already queued go on meanwhile, and nothing is drained or freed on the loop's thread.

With a cache directory (`NDD_TRACE_CACHE_DIR`, `ndd_trace.set_cache_dir`), the decision is kept
in `tuning-<machine>.json` there (tuning_store.py), under a key of the generated code (as
traced, before tuning), the batch size and the DALI version: the next run on this kind of
machine (the same GPU and CPU models and CPU count) builds with it from its first step.
`NDD_TRACE_TUNE=0` switches tuning off; it applies only under `optimize`.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import os
import statistics
import threading
import time
import weakref
from collections.abc import Callable, Generator
from typing import Any

from ..core import process_state
from .. import _dali
from ..codegen import optimize as rewrites
from ..core import checks, logs
from ..core.ir import NodeKind
from .tuning_store import FORMAT, Store, current_store, usable_cpus

ENV_VAR = "NDD_TRACE_TUNE"
WINDOW = 12  # steps timed per setting, at least
WINDOW_S = 1.0  # seconds timed per setting, at least (a rate over more than a few steps)
SETTLE = 3  # steps left out after a rebuild (the runs ahead refill)
MIN_STEP_S = 0.002  # shorter steps: a rebuild (over 1 s with a GPU decoder) is not earned back
# the search begins once the loop has run this long on the start's settings: each try holds
# the GIL for its build (about 0.5 s with a GPU decoder on the H200), so a run shorter than the
# search (about 15 s there) would lose more to it than it gains; a run that lasted this long is
# likely a training run, and whatever it ends at, the search's cost stays a fraction of it
SEARCH_AFTER_S = 20.0
MARGIN = 0.03  # a setting replaces the start only this much faster, in both measurements
LOADS = (0.4, 0.65, 0.9, 1.0)  # hw_decoder_load: the start's neighbours tried, on while it pays
DEEPER = 1  # prefetch_queue_depth tried this much above the start's, where it runs further ahead
MAX_DEPTH = 8  # a kept prefetch_queue_depth above this (or below 1) is not used

_Store = Store  # the name ../shared/repros/reliability/03 and earlier scripts use

_UNTIL_BUILT = 1 << 30  # steps left out while a setting is being built
STALE_S = 30.0  # a search whose pipeline was not used this long gives way to another one
# the one search under way (pipelines are tuned one at a time), weakly: a pipeline dropped
# mid-search (its function freed) does not hold up the others


@dataclasses.dataclass(frozen=True)
class Setting:
    num_threads: int
    prefetch_queue_depth: int
    hw_decoder_load: float | None  # None: no decoder whose load is tuned

    def text(self) -> str:
        parts = [f"num_threads={self.num_threads}",
                 f"prefetch_queue_depth={self.prefetch_queue_depth}"]
        if self.hw_decoder_load is not None:
            parts.append(f"hw_decoder_load={self.hw_decoder_load}")
        return ", ".join(parts)


def enabled() -> bool:
    return checks.env_switch(ENV_VAR, default=True)


def attach(executable: Any, applied: list, relower: Callable[[], Any], *,
           threads_given: bool, runs_ahead: Callable[[int], int]) -> Tuner | None:
    """A tuner for `executable` (optimize's `applied` rewrites; `relower()` generates its code
    again after a decoder's load changed; `runs_ahead(depth)`: the runs launched ahead on a
    queue of that depth), or None where there is nothing to tune: tuning off,
    or a pipeline of GPU ops only (threads and loads change nothing there)."""
    if not enabled():
        return None
    graph = executable.graph
    if not any(node.backend in ("cpu", "mixed") for node in graph.nodes_of(NodeKind.OP)):
        return None
    # the load optimize set (not one the call or NDD_TRACE_HW_DECODER_LOAD chose)
    decoders = [] if os.environ.get(rewrites.HW_DECODER_LOAD_ENV_VAR, "").strip() else [
        item.node for item in applied
        if item.rewrite == "hw_decoder_load" and item.node is not None]
    tuner = Tuner(executable, decoders, relower, threads_given, runs_ahead)
    executable.tuner = tuner
    return tuner


class Tuner:
    """The search of one pipeline's settings (see the module's docstring)."""

    def __init__(self, executable: Any, decoders: list, relower: Callable[[], Any],
                 threads_given: bool, runs_ahead: Callable[[int], int]):
        # weakly: the executable holds its tuner, and a search under way must not keep a
        # dropped pipeline alive (or hold up the others: see _begin)
        self._executable_ref = weakref.ref(executable)
        self._start_lowered = executable.lowered  # the start's code, as traced (and the key's)
        self._decoders = decoders
        self._relower = relower
        self._threads_given = threads_given
        self._runs_ahead = runs_ahead
        options = executable.options
        self.start = Setting(options.num_threads, options.prefetch_queue_depth,
                             decoders[0].static["hw_decoder_load"] if decoders else None)
        self.current = self.start
        self.measured: list[tuple[Setting, float]] = []  # (setting, steps/s), in order
        self.state = "waiting"  # "loaded", "searching", "tuned", "kept" or "failed"
        self.reason = ""
        self._plan: Generator[Setting, float, Setting] | None = None
        self._batch_size = 0
        self._last = 0.0  # the last step's time
        self._skip = SETTLE
        self._began = 0.0  # the timing window's start (the last step left out)
        self._count = 0  # steps timed in the window so far
        self._first = 0.0  # the first step's time (the search waits SEARCH_AFTER_S after it)
        self._step_lock = threading.Lock()
        self._abandoned = False  # another search took over while this one's loop stood still
        self._not_built: tuple[Setting, BaseException] | None = None  # a setting DALI refused

    @property
    def _executable(self) -> Any:
        executable = self._executable_ref()
        if executable is None:
            raise ReferenceError("its pipeline is gone")
        return executable

    # -- the executable's hooks ---------------------------------------------------------------

    def before_build(self, batch_size: int) -> None:
        """The first build: a decision kept for this code, batch size and machine applies."""
        if self.state != "waiting":
            return
        self._batch_size = batch_size
        kept = current_store().get(self._key())
        if kept is None:
            return
        setting = _valid(kept, self.start)
        if setting is None:
            logs.tuning.info("%s: the kept settings %r are not usable here: searched again",
                             self._name(), kept)
            return
        self.state, self.reason = "loaded", \
            f"kept in {current_store().path} ({kept.get('date', '?')})"
        self._set(setting, build=False)
        logs.tuning.info("%s: settings kept for this machine: %s", self._name(), setting.text())

    def built(self, batch_size: int, error: BaseException | None) -> bool:
        """A build ended (`error`: it failed). A rebuild the search did not ask for (a larger
        batch, a released pipeline) restarts the timing window; a larger batch than the search
        began with restarts the search. True where the failed build was of kept settings: they
        are dropped (from the file too) and the start's apply, for the caller to build again."""
        if error is not None and self.state == "loaded":
            logs.tuning.info("%s: the kept settings %s did not build (%s): the starting "
                             "settings, and the kept ones dropped", self._name(),
                             self.current.text(), error)
            current_store().drop(self._key())
            self._set(self.start, build=False)
            self.state, self.reason = "failed", f"the kept settings did not build: {error}"
            return True
        self._skip, self._count = SETTLE, 0
        if self.state == "waiting":
            self._batch_size = batch_size
        elif self.state == "searching" and batch_size != self._batch_size:
            self._abandoned = True  # taken up at the next step (under the step lock)
        return False

    def consumed(self) -> None:
        """A run's outputs were used for the first time (one consumer step)."""
        if self.state not in ("waiting", "searching") and self._not_built is None:
            return
        if not self._step_lock.acquire(blocking=False):
            return  # another thread is counting this step (ndd fetches in a thread of its own)
        try:
            self._consumed()
        except Exception as error:  # noqa: BLE001 (tuning never fails the user's step)
            logs.tuning.info("%s: tuning stopped: %r", self._name(), error)
            self._finish("failed", f"tuning stopped: {error!r}")
        finally:
            self._step_lock.release()

    def _consumed(self) -> None:
        if self._not_built is not None:
            (setting, error), self._not_built = self._not_built, None
            self._refused(setting, error)
            return
        if self._abandoned:
            self._restart()
        now = self._last = time.perf_counter()
        self._first = self._first or now
        if self._skip:
            self._skip -= 1
            self._began, self._count = now, 0
            return
        self._count += 1
        elapsed = now - self._began
        if self._count < WINDOW or elapsed < WINDOW_S:
            return
        # the mean over the window: its slow steps are what the loop feels (a median drops them)
        rate = self._count / elapsed
        self._began, self._count = now, 0
        if self.state == "waiting":
            if now - self._first >= SEARCH_AFTER_S:  # (else measured again, later)
                self._begin(rate)
        else:
            self._next(rate)

    # -- the search ---------------------------------------------------------------------------

    def _begin(self, rate: float) -> None:
        with process_state.tuning_lock:
            other = process_state.tuning_search[0]() if process_state.tuning_search else None
            if other is not None and other._executable_ref() is not None and \
                    time.perf_counter() - other._last < STALE_S:
                self._skip = SETTLE  # another pipeline is being tuned: measured again later
                return
            if other is not None:  # its loop stopped: it searches again when it runs again
                other._abandoned = True
            process_state.tuning_search.clear()
            if 1.0 / rate < MIN_STEP_S:
                self._finish("kept", f"steps of {1000 / rate:.2f} ms are too short for a "
                             "rebuild to pay")
                return
            process_state.tuning_search.append(weakref.ref(self))
        self._batch_size = self._batch_size or self._executable.max_batch_size
        self.state = "searching"
        self._plan = coordinate_descent(self.start, self._threads_given, self._deeper_runs_ahead)
        next(self._plan)  # the start, measured already
        self._next(rate)

    def _next(self, rate: float) -> None:
        self.measured.append((self.current, rate))
        logs.tuning.info("%s: %s: %.1f steps/s", self._name(), self.current.text(), rate)
        try:
            setting = self._plan.send(rate)  # type: ignore[union-attr]
        except StopIteration as done:
            self._conclude(done.value)
            return
        self._apply(setting)

    def _deeper_runs_ahead(self, depth: int) -> bool:
        """A deeper queue lets more runs be launched ahead (ahead/runahead.py's `runs_ahead`):
        a transparent-mode region's depth-2 queue, one deeper, still runs as far ahead, and is
        not tried."""
        return self._runs_ahead(depth + DEEPER) > self._runs_ahead(depth)

    def _conclude(self, decision: Setting) -> None:
        rates = [rate for setting, rate in self.measured if setting == self.start]
        start_rate = statistics.median(rates) if rates else 0.0
        ours = [rate for setting, rate in self.measured if setting == decision]
        gain = statistics.median(ours) / start_rate if start_rate and ours else 1.0
        if decision != self.current:
            self._apply(decision)
            if self.state == "failed":
                return
        if decision == self.start:
            self._finish("kept", f"no setting measured {MARGIN:.0%} faster twice ("
                         f"{len(self.measured)} measurements)")
        else:
            self._finish("tuned", f"{gain:.2f}x the starting settings' steps/s "
                         f"({len(self.measured)} measurements)")
        record = {"num_threads": decision.num_threads,
                  "prefetch_queue_depth": decision.prefetch_queue_depth,
                  "hw_decoder_load": decision.hw_decoder_load, "gain": round(gain, 4),
                  "date": datetime.date.today().isoformat(),
                  "measured": [[s.text(), round(r, 2)] for s, r in self.measured]}
        current_store().put(self._key(), record)

    def _finish(self, state: str, reason: str) -> None:
        self.state, self.reason = state, reason
        self._plan = None
        with process_state.tuning_lock:
            if process_state.tuning_search and process_state.tuning_search[0]() is self:
                process_state.tuning_search.clear()
        logs.tuning.info("%s: %s: %s (%s)", self._name(), state, self.current.text(), reason)

    def _restart(self) -> None:
        """Its search was given up (its loop stood still while another one ran, or its batch
        grew): back to the starting settings (built when next run), to search again."""
        self._abandoned = False
        with process_state.tuning_lock:
            if process_state.tuning_search and process_state.tuning_search[0]() is self:
                process_state.tuning_search.clear()
        if self.state != "searching":
            return
        if self.current != self.start:
            self._set(self.start, build=False)
        self.state, self.reason = "waiting", ""
        self.measured = []
        self._plan = None
        self._batch_size = 0
        logs.tuning.info("%s: its search was given up (its loop stood still for %.0f s, or its "
                         "batch grew): the starting settings, searched again", self._name(),
                         STALE_S)

    # -- applying a setting -------------------------------------------------------------------

    def _apply(self, setting: Setting) -> None:
        """Run with `setting` from the first step after it is built (a thread of its own builds
        it while the current settings run on); where it does not build, the search ends at the
        start's settings."""
        try:
            self._set(setting, build=True)
        except Exception as error:  # noqa: BLE001 (its code could not be generated again)
            self._refused(setting, error)

    def _refused(self, setting: Setting, error: BaseException) -> None:
        logs.tuning.info("%s: %s did not build (%s): the starting settings", self._name(),
                         setting.text(), error)
        if self.state == "tuned":  # the decision itself: not kept either
            current_store().drop(self._key())
        self._set(self.start, build=False)
        self._finish("failed", f"{setting.text()} did not build: {error}")

    def _set(self, setting: Setting, *, build: bool) -> None:
        lowered = None
        if setting.hw_decoder_load != self.current.hw_decoder_load:
            for node in self._decoders:
                rewrites.set_hw_decoder_load(node, setting.hw_decoder_load)
            if setting == self.start or setting.hw_decoder_load == self.start.hw_decoder_load:
                lowered = self._start_lowered
            else:
                lowered = self._relower()
                if lowered.feed_names != self._start_lowered.feed_names:  # (the module changed)
                    for node in self._decoders:
                        rewrites.set_hw_decoder_load(node, self.current.hw_decoder_load)
                    raise RuntimeError("the code generated again feeds other names")
        options = dataclasses.replace(self._executable.options,
                                      num_threads=setting.num_threads,
                                      prefetch_queue_depth=setting.prefetch_queue_depth)
        self.current = setting
        if not build:
            self._skip = SETTLE
            self._executable.retune(options, lowered, build=False)
            return
        # the steps until it is swapped in are not its own (built() starts its window)
        self._skip = _UNTIL_BUILT

        def done(error: BaseException | None) -> None:
            if error is not None:  # taken up at the next step (under the step lock)
                self._not_built = (setting, error)

        self._executable.prepare(options, lowered, done=done)

    # -- what it says -------------------------------------------------------------------------

    def describe(self) -> str:
        """One line for `explain` and the report."""
        moved = _moves(self.start, self.current)
        if self.state == "loaded":
            return f"tuning: {moved or 'the starting settings'} ({self.reason})"
        if self.state == "tuned":
            return f"tuning: {moved} (measured on this machine: {self.reason})"
        if self.state in ("kept", "failed"):
            return f"tuning: the starting settings, {self.start.text()} ({self.reason})"
        done = len(self.measured)
        when = (f"searched once the loop has run {SEARCH_AFTER_S:g} s" if self.state ==
                "waiting" else "under way")
        return (f"tuning: {when} ({self.state}; {done} setting(s) measured so far, starting "
                f"from {self.start.text()})")

    def _name(self) -> str:
        return self._executable.lowered.filename

    def _key(self) -> str:
        digest = hashlib.sha256()
        for part in (str(FORMAT), _dali.DALI_VERSION, str(self._batch_size), self.start.text(),
                     str(self._threads_given), self._start_lowered.source):
            digest.update(part.encode())
            digest.update(b"\0")
        return digest.hexdigest()


def coordinate_descent(start: Setting, threads_given: bool, deeper_pays: Callable[[int], bool]
                       ) -> Generator[Setting, float, Setting]:
    """The search: coordinate descent from `start` (the decoder's load, then the threads unless
    given, then a deeper queue where `deeper_pays(depth)`); each setting yielded is sent back
    its steps/s; returns the decision."""
    start_rate = yield start
    best, best_rate = start, start_rate

    def better(rate: float) -> bool:
        return rate > best_rate * (1 + MARGIN / 3)

    if start.hw_decoder_load is not None:
        # along the loads in order: up from the start while that pays, else down
        loads = sorted(set(LOADS) | {start.hw_decoder_load})
        at = loads.index(start.hw_decoder_load)
        for step in (1, -1):
            moved = False
            index = at + step
            while 0 <= index < len(loads):
                candidate = dataclasses.replace(best, hw_decoder_load=loads[index])
                rate = yield candidate
                if not better(rate):
                    break
                best, best_rate, moved = candidate, rate, True
                index += step
            if moved:
                break
    if not threads_given:
        cpus = usable_cpus()
        threads = best.num_threads
        moved = False
        while threads // 2 >= 1:
            candidate = dataclasses.replace(best, num_threads=threads // 2)
            rate = yield candidate
            if not better(rate):
                break
            best, best_rate, threads, moved = candidate, rate, threads // 2, True
        if not moved and threads * 2 <= cpus:
            candidate = dataclasses.replace(best, num_threads=threads * 2)
            rate = yield candidate
            if better(rate):
                best, best_rate = candidate, rate
    if deeper_pays(best.prefetch_queue_depth):
        candidate = dataclasses.replace(best, prefetch_queue_depth=best.prefetch_queue_depth
                                        + DEEPER)
        rate = yield candidate
        if better(rate):
            best, best_rate = candidate, rate
    if best == start:
        return start
    # measured once more, alternating: a setting that won by drift does not stay
    again_start = yield start
    again_best = yield best
    if best_rate > start_rate * (1 + MARGIN) and again_best > again_start * (1 + MARGIN):
        return best
    return start


def described(executable: Any) -> list[str]:
    """The tuning line of `executable` (explain's and the report's), if it is tuned."""
    tuner = getattr(executable, "tuner", None)
    return [tuner.describe()] if tuner is not None else []


def _valid(kept: dict, start: Setting) -> Setting | None:
    """The setting a kept entry holds, if it can be used for a pipeline starting at `start`."""
    try:
        threads, depth = int(kept["num_threads"]), int(kept["prefetch_queue_depth"])
        load = kept.get("hw_decoder_load")
        load = None if load is None else float(load)
    except (KeyError, TypeError, ValueError):
        return None
    if (load is None) != (start.hw_decoder_load is None) or not 1 <= depth <= MAX_DEPTH or \
            not 1 <= threads <= max(usable_cpus(), start.num_threads) or \
            (load is not None and not 0.0 <= load <= 1.0):  # (a NaN fails too)
        return None
    return Setting(threads, depth, load)


def _moves(start: Setting, now: Setting) -> str:
    moves = [f"{name} {before} -> {after}" for name, before, after in (
        ("num_threads", start.num_threads, now.num_threads),
        ("prefetch_queue_depth", start.prefetch_queue_depth, now.prefetch_queue_depth),
        ("hw_decoder_load", start.hw_decoder_load, now.hw_decoder_load)) if before != after]
    return ", ".join(moves)
