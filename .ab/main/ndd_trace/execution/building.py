"""Building a lowered graph's pipeline (`new_pipeline`, the one place it is built), and other
settings built in a thread of their own while the current pipeline runs on, swapped in at the
next run (`SettingsSwap`, a part of Executable that tuning.py drives).

    pipe = new_pipeline(lowered, options, batch_size)
    executable.prepare(options, done=callback)     # built in a thread; swapped in at a run
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Any

from .. import _dali
from ..codegen.lower import Lowered
from ..core import logs


@dataclasses.dataclass(frozen=True)
class Options:
    """Pipeline settings of a compiled function."""

    num_threads: int
    device_id: int | None
    prefetch_queue_depth: int


class _Prepared:
    """A pipeline with other settings, built by a thread of its own while the current one runs
    on (Executable.prepare): swapped in at the first run after it is built."""

    def __init__(self, options: Options, lowered: Lowered, batch_size: int,
                 done: Callable[[BaseException | None], None]):
        self.options = options
        self.lowered = lowered
        self.batch_size = batch_size
        self.done = done  # called at the swap: None, or why it did not build
        self.pipe: Any = None
        self.error: BaseException | None = None
        self.seconds = 0.0
        self.ready = threading.Event()

    def build(self) -> None:
        started = time.perf_counter()
        try:
            self.pipe = new_pipeline(self.lowered, self.options, self.batch_size)
        except Exception as error:  # noqa: BLE001 (handed to `done` at the swap)
            self.error = error
        self.seconds = time.perf_counter() - started
        self.ready.set()


def new_pipeline(lowered: Lowered, options: Options, batch_size: int,
                  before_build: Callable[[Any, int], None] | None = None) -> Any:
    """The generated @pipeline_def itself (what `explain` shows is what runs), built."""
    pipe = lowered.function(**_dali.pipeline_options(
        batch_size, options.num_threads, options.device_id, options.prefetch_queue_depth))
    if before_build is not None:
        before_build(pipe, batch_size)
    pipe.build()
    return pipe


def free_later(holder: list) -> None:
    """Free the pipeline in `holder`, its only reference (its threads joined, its memory given
    back), in a thread of its own."""
    threading.Thread(target=holder.clear, daemon=True, name="ndd_trace free").start()


class SettingsSwap:
    """Executable's settings changes: at once (`retune`) or built in a thread (`prepare`)."""

    lowered: Lowered
    options: Options
    pipeline: Any
    max_batch_size: int
    builds: int
    tuner: Any
    feed: Any
    failures: Any
    before_build: Any
    _lock: Any
    _prepared: _Prepared | None

    def retune(self, options: Options, lowered: Lowered | None = None, *,
               build: bool) -> None:
        """Run with other settings (and code, where a decoder's load changed) from the next run
        on: the runs in flight are fetched first (their outputs kept); `build` builds now, for
        the batch size built before (a failure raises here, the pipeline then left unbuilt)."""
        with self._lock:
            self.release()  # (the lock is re-entrant)
            self._settings(options, lowered)
            if build and self.max_batch_size:
                self._build(self.max_batch_size)

    def prepare(self, options: Options, lowered: Lowered | None = None, *,
                done: Callable[[BaseException | None], None]) -> None:
        """`retune(options, lowered, build=True)` without stopping the runs: a thread of its own
        builds the pipeline while this one runs on (its queued runs go on; DALI holds the GIL
        while it builds), and the next run after it is built swaps it in (the runs in flight
        fetched first, their outputs kept; the old pipeline freed in a thread). `done(error)`
        is called then (`error`: it did not build; this pipeline runs on). Where nothing is
        built yet, or a reader moves in at each build, it is `retune` at once (and `done`
        called)."""
        with self._lock:
            self._swap(wait=True)  # (one at a time)
            if self.pipeline is None or self.before_build is not None:
                try:
                    self.retune(options, lowered, build=True)
                except Exception as error:  # noqa: BLE001 (handed to `done`)
                    done(error)
                else:
                    done(None)
                return
            prepared = self._prepared = _Prepared(options, lowered or self.lowered,
                                                  self.max_batch_size, done)
        threading.Thread(target=prepared.build, daemon=True,
                         name=f"ndd_trace build {self.lowered.filename}").start()

    def _swap(self, wait: bool = False) -> None:
        """Swap a prepared pipeline in once built (`wait`: wait for its build)."""
        prepared = self._prepared
        if prepared is None or not (wait or prepared.ready.is_set()):
            return
        prepared.ready.wait()
        self._prepared = None
        if prepared.error is not None:
            prepared.done(prepared.error)
            return
        # (released, failed or built for a larger batch meanwhile: its settings apply at the
        # next build, which a larger batch needs anyway)
        fits = self.pipeline is not None and prepared.batch_size == self.max_batch_size
        self._drain()
        old, self.pipeline = [self.pipeline], None
        free_later(old)
        self.feed.forget_fed()
        self._settings(prepared.options, prepared.lowered)
        if fits:
            self.pipeline = prepared.pipe
            self.builds += 1
            if self.tuner is not None:
                self.tuner.built(prepared.batch_size, None)
            built = prepared.seconds * 1000
            logs.builds.info("built %s for batch size %d in %.1f ms (in a thread, while the "
                             "previous settings ran)", self.lowered.filename,
                             prepared.batch_size, built, extra={"ndd_trace_ms": {"build": built}})
        prepared.done(None)

    def _settings(self, options: Options, lowered: Lowered | None) -> None:
        if lowered is not None:
            self.lowered = self.failures.lowered = lowered
        if options.prefetch_queue_depth != self.options.prefetch_queue_depth:
            self.feed.keep_fed(options.prefetch_queue_depth)
        self.options = options
