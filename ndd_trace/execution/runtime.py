"""Runtime: builds a lowered graph into a DALI Pipeline, feeds it per call, wraps outputs lazily.

    executable = Executable(graph, lowered, draws, options)
    run = executable.run(bound_values, batch_size=64)     # feeds inputs, schedules, returns
    batch = run.batch(0)                                  # an ndd.Batch, evaluated when consumed

Outputs are real ndd.Batch / ndd.Tensor objects backed by a lazy result (results.py: the same
protocol as ndd's own `InvocationResult`), so `.torch()`, `np.asarray`, `.shape` or iteration
fetch the pipeline's outputs at the first use, with no copy. Errors met while building or
running are reported at the user's line that created the failing op.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from .. import _dali
from ..codegen.lower import Lowered
from ..core import logs
from ..core.ir import Graph, Node, NodeKind
from .failures import Failures, RunEagerly
from .feed import Feed
from . import building
from .building import Options, SettingsSwap
from .results import PendingRun
# api.py and modes/proxies.py import these from here

# failed pipelines an Executable may leave set aside before its calls run eagerly instead
MAX_FAILED_PIPELINES = 3
# after a failed run, calls run eagerly until this many times the pipeline's build time has
# passed (doubled for each failure that follows closely, at most MAX_REBUILD_WAIT times)
REBUILD_WAIT = 4
MAX_REBUILD_WAIT = 1024
CLOSE_FAILURES = 64  # a failure within this many clean runs of the one before follows closely


class RebuildBackoff:
    """After a failed run (its pipeline dropped), calls run eagerly (at least one) until
    REBUILD_WAIT times the pipeline's build time has passed, twice as long after each failure
    that follows closely: a loop that catches a corrupt file's error every few steps would
    otherwise build a pipeline (on the GPU, hundreds of ms) every few steps; this way builds
    take at most a shrinking share of its time, and its steps run at eager's speed between."""

    def __init__(self) -> None:
        self.failures = 0  # failed runs, in all
        self.build_s = 0.0  # the latest build's seconds
        self._wait = 0  # multiple of build_s to run eagerly after the latest failure
        self._failed_at: float | None = None  # when the latest failure was (None: rebuilt)
        self._eager_calls = 0  # eager calls after the latest failure
        self._clean_runs = 0  # runs that succeeded since the latest failure

    def failed(self) -> None:
        if self._clean_runs > CLOSE_FAILURES:
            self._wait = 0  # failures are rare: back to the first wait
        self._wait = min(2 * self._wait or REBUILD_WAIT, MAX_REBUILD_WAIT)
        self._failed_at = time.perf_counter()
        self._eager_calls = self._clean_runs = 0
        self.failures += 1

    def succeeded(self) -> None:
        self._clean_runs += 1

    def take_eager_call(self) -> str | None:
        """Why this call runs eagerly (counted), or None: the pipeline is built and runs it."""
        if self._failed_at is None:
            return None
        waited = time.perf_counter() - self._failed_at
        if self._eager_calls and waited >= self._wait * self.build_s:
            self._failed_at = None
            return None
        self._eager_calls += 1
        return (f"its pipeline failed {self.failures} time(s); calls run eagerly for "
                f"{self._wait}x its build time ({self.build_s * 1000:.0f} ms) before it is "
                "built again")


class Executable(SettingsSwap):
    """One cache entry's pipeline: built lazily, rebuilt for a larger batch or after a failure."""

    def __init__(self, graph: Graph, lowered: Lowered, draws: list, options: Options,
                 rng_objects: dict[int, Any],
                 before_build: Callable[[Any, int], None] | None = None):
        self.graph = graph
        self.lowered = lowered
        self.draws = draws
        self.options = options
        self.pipeline: Any = None
        self.max_batch_size = 0
        self.builds = 0
        self._pending: list[PendingRun] = []
        self._lock = threading.RLock()
        # what it feeds, and DALI's errors mapped to eager's
        self.feed = Feed(graph, lowered, draws, options.prefetch_queue_depth, rng_objects)
        self.failures = Failures(graph, lowered, self.feed)
        self._devices: dict[int, Any] = {}  # output index -> ndd Device (cached per entry)
        # called with the pipeline and its batch size before it is built (a reader stream moves
        # its reader's operator in); such a pipeline's runs are not run again after a failure
        self.before_build = before_build
        self.ahead = 0  # calls served by a run launched ahead (ahead/calls.run_call)
        self.run_s = 0.0  # seconds in DALI's Run (scheduling) so far, for step breakdowns
        self.failed_pipelines = 0  # pipelines whose run failed (set aside: see _park)
        self.backoff = RebuildBackoff()  # calls run eagerly after failed runs
        self.tuner: Any = None  # tuning.Tuner, under optimize (tuning.attach)
        self.on_first_build: Callable[[float], None] | None = None  # (units/cache.py: once)
        self.companions: list[Any] = []  # released and closed with it (ahead/coalescing.py)
        self._prepared = None  # other settings, being built (building.SettingsSwap.prepare)

    @property
    def lock(self) -> threading.RLock:
        """The (reentrant) lock its runs are scheduled, fetched and released under: a reader
        stream holds it across launches and fetches that must stay in order."""
        return self._lock

    # -- building ------------------------------------------------------------------------------

    def _build(self, batch_size: int) -> None:
        started = time.perf_counter()
        self.pipeline = None
        if self.tuner is not None:  # settings kept for this machine apply from the first build
            self.tuner.before_build(batch_size)
        try:
            pipe = building.new_pipeline(self.lowered, self.options, batch_size, self.before_build)
        except Exception as error:
            if self.tuner is not None and self.tuner.built(batch_size, error):
                self._build(batch_size)  # kept settings that do not build: the starting ones
                return
            raise
        self.pipeline = pipe
        self.max_batch_size = batch_size
        self.builds += 1
        if self.tuner is not None:
            self.tuner.built(batch_size, None)
        self.backoff.build_s = time.perf_counter() - started
        if self.on_first_build is not None:
            self.on_first_build(self.backoff.build_s)
            self.on_first_build = None
        built = self.backoff.build_s * 1000
        logs.builds.info("built %s for batch size %d in %.1f ms", self.lowered.filename,
                         batch_size, built, extra={"ndd_trace_ms": {"build": built}})

    def ensure_built(self, batch_size: int) -> None:
        """Build for `batch_size` (a smaller batch later reuses it; a larger one rebuilds)."""
        if self.pipeline is None or batch_size > self.max_batch_size:
            self._drain()
            self._build(max(batch_size, self.max_batch_size))
        elif batch_size != self.max_batch_size and not self.feed.names:
            # nothing is fed (`ndd.zeros(batch_size=x.batch_size)`): the pipeline runs its
            # maximum batch size, so it is built for this one
            self._drain()
            self._build(batch_size)

    def output_device(self, index: int) -> Any:
        """The ndd Device of output `index` (one object per entry, made once)."""
        device = self._devices.get(index)
        if device is None:
            meta = self.graph.outputs[index].node.meta[self.graph.outputs[index].index]
            device = self._devices[index] = _dali.device(
                meta.device, self.options.device_id if meta.device == "gpu" else None)
        return device

    def run(self, bound: dict, batch_size: int) -> PendingRun | None:
        """Draw, feed and schedule one iteration; outputs are fetched when first used."""
        if not self.graph.outputs:
            with self._lock:
                # nothing to run, but the generators advance as eagerly
                self.feed.draw_states(bound)
            return None

        raise_if_an_argument_failed(bound)  # (before any draw: the eager call draws them)
        drawn: dict = {}

        def data() -> list:
            # drawn after the build: a failed one draws nothing
            states = drawn["states"] = self.feed.draw_states(bound)
            return self.feed.call_data(bound, states, batch_size)

        run = self.start(batch_size, data)
        leaves = run.leaves = lambda: self.failures.leaves_of(bound, drawn["states"])
        # (not `run.leaves`: a replay holding the run, its error and data, would be a cycle)
        run.replay = lambda: self.failures.eager_error(leaves(), batch_size)
        return run

    def run_leaves(self, leaves: list[Node], batch_size: int,
                   calls: list[Node] | None = None) -> PendingRun:
        """Run with the data of `leaves` (a structurally equal graph's leaves, in order), for
        the op calls `calls` (in order; their lines are the ones errors name)."""
        run = self.start(batch_size,
                          lambda: [self.feed.leaf_data(leaf, batch_size) for leaf in leaves])
        run.calls = calls
        run.leaves = lambda: self._values_of(leaves)
        run.replay = lambda: self.failures.eager_error(self._values_of(leaves), batch_size)
        return run

    def failed_again(self, failed: PendingRun, leaves: list[Node], batch_size: int,
                     calls: list[Node] | None = None) -> PendingRun:
        """`run_leaves(leaves, batch_size, calls)` where `failed`, a run launched ahead on
        this very data, failed itself (`dali_error`): its failure, as that run's, without
        running the failing ops again (they log on stderr once, as eager's one call does)."""
        run = PendingRun(self, batch_size)
        run.calls = calls
        run.leaves = lambda: self._values_of(leaves)
        eager = self.failures.eager_error(self._values_of(leaves), batch_size)
        run.error = self.failures.pipeline_error(failed.dali_error, "running", eager, calls)
        run.dali_error, run.failed, run.as_is = failed.dali_error, failed.failed, failed.as_is
        return run

    def _values_of(self, leaves: list[Node]) -> dict:
        """The data of `leaves` (a structurally equal graph's, in lowering order) as
        `interpret` takes this graph's."""
        values = self.failures.leaves_of({}, {})
        for node, leaf in zip(self.lowered.external_sources, leaves):
            values[id(node)] = leaf.payload[1] if leaf.kind is NodeKind.RANDOM_STATE \
                else leaf.payload
        return values

    def start(self, batch_size: int, data: Any) -> PendingRun:
        """Build if needed, then feed `data()` and schedule one iteration."""
        with self._lock:
            self._swap()
            # earlier runs first: one that failed (kept for whoever consumes it) drops the
            # pipeline, which is then rebuilt for this run
            self._drain()
            try:
                if self.pipeline is None and self.retired is not None:
                    raise RuntimeError(f"ndd_trace: not rebuilt: {self.retired}")
                self.ensure_built(batch_size)
            except Exception as error:
                self.pipeline = None
                building_error = self.failures.pipeline_error(error, "building")
            else:
                building_error = None
            if building_error is not None:
                try:  # (outside the handler: DALI's report is its dali_error)
                    raise building_error
                finally:  # (its traceback holds this frame: no cycle through it)
                    del building_error
            run = PendingRun(self, batch_size)
            try:
                run.data = data()
                self.feed.into(self.pipeline, run.data)
                started = time.perf_counter()
                _dali.schedule_one(self.pipeline)
                self.run_s += time.perf_counter() - started
            except Exception as error:
                self.pipeline = None
                feeding_error = self.failures.pipeline_error(error, "feeding")
            else:
                feeding_error = None
            if feeding_error is not None:
                try:
                    raise feeding_error
                finally:  # (its traceback holds this frame: no cycle through it)
                    del feeding_error
            self._pending.append(run)
            return run

    def launch(self, data: list, batch_size: int) -> PendingRun | None:
        """Feed `data` (one item per fed leaf, in lowering order) and schedule one iteration
        ahead of the previous ones, without waiting for them; None where the pipeline is not
        built for this batch, its queue is full, or it refuses the data."""
        with self._lock:
            self._swap()
            if self.pipeline is None or batch_size > self.max_batch_size or \
                    len(self._pending) >= self.options.prefetch_queue_depth or \
                    (batch_size != self.max_batch_size and not self.feed.names) or \
                    (self.feed.empty_sample_unsafe and any(map(_dali.has_empty_sample, data))):
                return None
            try:
                self.feed.into(self.pipeline, data)
                _dali.schedule_one(self.pipeline)
            except Exception:
                self._pending.clear()
                self.pipeline = None  # rebuilt by the next run, which reports any real error
                return None
            run = PendingRun(self, batch_size)
            run.data = data
            self._pending.append(run)
            return run

    def fetch(self, run: PendingRun) -> None:
        with self._lock:
            if run.lost:
                self._run_again(run)
                return
            while run.outputs is None and run.error is None and self._pending:
                self._fetch_oldest()
            if run.outputs is None and run.error is None:
                run.error = RuntimeError("ndd_trace: this result's pipeline run was discarded")

    def _fetch_oldest(self) -> None:
        oldest = self._pending.pop(0)
        try:
            oldest.outputs = _dali.pipeline_outputs(self.pipeline)
            self.backoff.succeeded()
        except Exception as error:
            self._park(error)  # a failed pipeline is rebuilt, after a few eager calls
            self.backoff.failed()
            eager = oldest.replay() if oldest.replay is not None else None
            oldest.error = self.failures.run_error(error, eager, oldest)
            oldest.failed = self.failures.node_for_error(error)
            oldest.dali_error = error
            oldest.as_is = _dali.pipeline_failure(error).from_reader
            for other in self._pending:
                if self.before_build is None and other.data is not None:
                    other.lost = True  # run again when asked for: it did not fail itself
                else:
                    other.error, other.failed, other.as_is = \
                        oldest.error, oldest.failed, oldest.as_is
            self._pending.clear()
            del oldest, eager  # (the error's traceback holds this frame: no cycle through it)

    def _run_again(self, run: PendingRun) -> None:
        """Run a lost run (see `PendingRun.lost`) on its own, from the data it was fed."""
        run.lost = False
        self._drain()
        try:
            self.ensure_built(run.batch_size)
            self.feed.into(self.pipeline, run.data)
            _dali.schedule_one(self.pipeline)
        except Exception as error:  # noqa: BLE001 (the run's error, raised where it is used)
            self._park(error)
            self.backoff.failed()
            run.error = self.failures.run_error(error, None, run)
            return
        self._pending.append(run)
        while run.outputs is None and run.error is None and self._pending:
            self._fetch_oldest()

    def _park(self, error: BaseException) -> None:
        """Drop the pipeline after a failed run, set aside for good where freeing it can hang
        the process (_dali.park_failed_pipeline)."""
        node = self.failures.node_for_error(error)
        if self.pipeline is not None and not (
                node is not None and _dali.frees_after_failure(node.schema)):
            _dali.park_failed_pipeline(self.pipeline)
            self.failed_pipelines += 1
        self.pipeline = None

    def eager_after_failure(self) -> str | None:
        """Why this call runs eagerly, its pipeline dropped by a failed run lately (see
        RebuildBackoff), or None."""
        with self._lock:
            return self.backoff.take_eager_call() if self.pipeline is None else None

    @property
    def retired(self) -> str | None:
        """Why this variant no longer builds pipelines (then it runs eagerly), or None."""
        if self.failed_pipelines < MAX_FAILED_PIPELINES:
            return None
        return (f"its pipeline failed {self.failed_pipelines} times; DALI cannot free a "
                "pipeline that failed part-way through a batch (each one is kept until exit)")

    def _drain(self) -> None:
        while self._pending:
            self._fetch_oldest()

    def release(self) -> bool:
        """Free the pipeline once the runs in flight are done (built again if run again);
        whether there was one. Settings being built in a thread apply to that next build."""
        with self._lock:
            self._swap(wait=True)
            self._drain()
            had = self.pipeline is not None
            self.pipeline = None
            self.feed.forget_fed()  # what DALI read in place: nothing reads it any more
        for companion in self.companions:
            companion.release()
        return had

    def close(self) -> None:
        for companion in self.companions:
            companion.close()
        with self._lock:
            self._prepared = None  # (its thread's build is discarded)
            self._pending.clear()
            self.pipeline = None


def raise_if_an_argument_failed(bound: dict) -> None:
    """RunEagerly where a data argument is a result whose own run fails: eager fails only the
    results that read it, at their first use, and computes the others."""
    if _dali.failed_argument(bound):
        raise RunEagerly("an argument's own run failed (eager fails only the results that "
                         "read it, at their first use)")
