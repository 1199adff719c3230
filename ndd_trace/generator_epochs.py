"""A compiled generator's epochs: its own Python as written, its loop body compiled.

    @ndd.compile
    def batches(reader):
        for jpegs, labels in reader.next_epoch(batch_size=64):
            yield augment(jpegs), labels       # the loop body: one compiled call per step

    for images, labels in batches(reader):     # CompiledFunction._epoch (this mixin)
        ...

The generator is taken apart at its first call (modes/loop.py); where its loop body cannot be
compiled it runs as written, each step in transparent mode (checked mode), or in DALI's capture
mode where that mode drives its loop. A mixin of api.CompiledFunction: it reads the compiled
function's function, cache, stage and ledger.
"""

from __future__ import annotations

import threading
import time
import types
from collections.abc import Iterator
from typing import Any

from . import _dali
from .core import logs, trees
from .core.ledger import Runs, Verdict
from .execution import waits
from .modes import lazy
from .units.unit import Entry
from .modes.loop import Split, StepCall, split_generator
from .tracing.stepcheck import Finding
from .tracing.trace import GraphBreakRecord


class GeneratorEpochs:
    """The epochs of a compiled generator (see the module's docstring)."""

    _function: Any

    def _init_epochs(self) -> None:
        self._step_tracers = threading.local()  # .held: (device and threads, checked-mode tracer)
        # a generator, taken apart at its first call (loop.py): False until then, None where
        # its loop body cannot be compiled (it runs in checked mode)
        self._split: Split | None | bool = False
        self._step: Any = None  # its loop body, a CompiledFunction
        self._loop_break: GraphBreakRecord | None = None
        self._loop_entry: Entry | None = None  # its loop body's break, where it is not compiled

    @property
    def loop_verdict(self) -> Verdict | None:
        """The verdict each epoch of a compiled generator records where its loop body is not
        compiled (None: it is)."""
        return self._loop_entry.verdict if self._loop_entry is not None else None

    def _epoch(self, args: tuple, kwargs: dict) -> Iterator[Any]:
        """A compiled generator call: the generator's own Python, its loop body compiled
        (loop.py); or, where the body cannot be compiled, each step in checked mode."""
        split = self._loop()
        if split is None:
            self._ledger.count(self._loop_entry.verdict)
            if self._loop_break.captures:
                epoch = self._function(*args, **kwargs)  # DALI's capture mode runs its loop
            else:
                epoch = self._fallback_epoch(args, kwargs)
        else:
            epoch = split.generator(*args, **kwargs)
        # the report's loader verdict: the consumer's wait for each item vs its own step
        timed = waits.timed(epoch, self.__qualname__, str(self._stage.definition_loc()),
                            waits.COMPILED_GENERATOR, self._stage.optimize)
        if isinstance(timed, types.GeneratorType):  # its repr and name: the function's
            timed.__name__, timed.__qualname__ = self.__name__, self.__qualname__
        return timed

    def _loop(self) -> Split | None:
        """The generator taken apart (None: its loop body runs in checked mode), at its first
        call; a graph break under fullgraph=True raises GraphBreakError there."""
        if self._split is False:
            started = time.perf_counter()
            found = split_generator(self._function)
            apart = (time.perf_counter() - started) * 1000
            logs.trace.info("`%s`: generator taken apart in %.1f ms", self.__qualname__, apart,
                            extra={"ndd_trace_ms": {"apart": apart}})
            if isinstance(found, Finding):
                self._split = None
                if found.captures:
                    self._loop_break = GraphBreakRecord(found.reason, found.loc, captures=True)
                    runs, key = Runs.CAPTURE_MODE, ("capture mode",)
                else:
                    self._loop_break = GraphBreakRecord(
                        f"its loop body's Python may not do the same at every step "
                        f"({found.reason}); each step runs its Python in checked mode", found.loc)
                    runs, key = Runs.CHECKED_LOOP, ("checked loop",)
                # its verdict, set before a GraphBreakError under fullgraph=True, is what each
                # epoch records
                self._loop_entry = Entry(key=key)
                self._cache.store(key, self._stage.break_entry(self._loop_entry,
                                                               self._loop_break, runs))
            else:
                self._step = type(self)(
                    found.step, fullgraph=self.fullgraph, num_threads=self._num_threads,
                    device_id=self._device_id, prefetch_queue_depth=self.prefetch_queue_depth,
                    cache_limit=self.cache_limit, fallback=self.fallback,
                    optimize=self.optimize)
                self._step._run_as_loop_body()
                found.step_cell.cell_contents = StepCall(self._step)
                self._split = found
        return self._split

    def _run_as_loop_body(self) -> None:
        """Its compiled entries run as another compiled generator's loop body (that
        generator's `_loop` makes this function of its body and calls this on it)."""
        self._stage.runs = Runs.COMPILED_LOOP

    def _fallback_epoch(self, args: tuple, kwargs: dict) -> Iterator[Any]:
        """The generator version: transparent mode around each step only, so the consumer's own
        code between steps runs as it would without ndd_trace."""
        generator = self._function(*args, **kwargs)
        if self.fallback != "lazy" or lazy.is_enabled():
            yield from generator
            return
        steps = lazy.Steps(self._step_tracer())
        try:  # each resumption in transparent mode; send() and throw() reach its own `yield`
            return (yield from trees.relay(generator, steps.step))
        finally:
            steps.close()
            generator.close()

    def _step_tracer(self) -> lazy.LazyTracer:
        """This thread's tracer for the function's checked epochs: kept from epoch to epoch,
        so that its run-ahead patterns carry over (a new one if the device or threads moved)."""
        setting = (_dali.current_device_id(), _dali.current_num_threads())
        held = getattr(self._step_tracers, "held", None)
        if held is None or held[0] != setting:
            held = self._step_tracers.held = (setting, lazy.new_tracer(self.optimize))
        return held[1]
