"""Compiled loops: a pipeline that owns the loop's readers and runs ahead of the consumer.

    @ndd.compile
    def train_batches(reader, batch_size=64):
        for jpegs, labels in reader.next_epoch(batch_size=batch_size):
            yield ndd.random_resized_crop(ndd.decoders.image(jpegs), size=[224, 224]), labels

    for images, labels in train_batches(reader):      # one epoch per call, prefetched
        ...

The loop body is traced once (one step on placeholders); the readers' operators move into the
pipeline (the same operator instances eager ndd would run, so the same samples in the same
order), and `prefetch_queue_depth` iterations are kept scheduled ahead, into the next epoch too.
Random ops draw their states from a clone of each generator as iterations are scheduled; the
caller's generator is advanced by the same number of words as each step is consumed, so values
and final RNG state are those of the eager loop. Batches read ahead are kept for the next epoch
(or after a `break`); if the generator was reseeded or drawn from meanwhile, those steps are
recomputed eagerly from their reader batches with the new states, so nothing is lost or stale.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

from . import _dali, logs
from .errors import NddTraceError
from .interpret import interpret
from .ir import Graph, NodeKind
from .lower import Lowered
from .runahead import StateForecast
from .runtime import Executable, Options, _PendingRun


class LoopError(NddTraceError, RuntimeError):
    """A compiled loop cannot continue (its generator was used elsewhere, or it failed); a
    RuntimeError, as the errors eager ndd raises for misused readers are."""


class LoopExecutable(Executable):
    """The pipeline of one compiled generator: readers inside, prefetching within an epoch."""

    def __init__(self, graph: Graph, lowered: Lowered, draws: list, options: Options,
                 rng_objects: dict[int, Any], batch_size: int, owner_name: str,
                 externals: list | None = None):
        super().__init__(graph, lowered, draws, options, rng_objects)
        self.batch_size = batch_size
        self.owner_name = owner_name
        self.readers = [node.payload for node in graph.nodes_of(NodeKind.READER)]
        # ExternalSource outputs: pulled in Python as steps are scheduled (all of them, used
        # or not, as the eager loop pulls them), grouped by source
        self.external_sources: dict[int, tuple[Any, list]] = {}
        for node in externals or []:
            source, index = node.payload
            self.external_sources.setdefault(id(source), (source, []))[1].append(node)
        self._exhausted = False  # an ExternalSource ended: the epoch ends after the carry
        self._carry: list[_PendingRun] = []  # iterations read ahead, not yet consumed
        # random states of steps scheduled ahead come from runahead's forecast (clones of the
        # callers' generators): `_next` is where the next scheduled step draws, `_expected`
        # where the generator stands once the steps consumed so far were taken
        self._forecast = StateForecast()
        self._next: dict[int, list[int]] = {}  # id(rng) -> [draws, version]
        self._expected: dict[int, tuple[int, int]] = {}  # id(rng) -> (draws, version)
        self._epoch_lock = threading.Lock()
        self._done = 0  # steps consumed in the current epoch
        self._resume_at = 0  # a restored checkpoint starts its first epoch here
        # after a failed run (a corrupt file), the readers get new operators replayed to where
        # the consumer is: possible when the loop made them (their whole history is its steps)
        self._replayable: bool | None = None
        self._taken = 0  # steps consumed since the readers' operators were made
        self._replay_pulled: list[dict] = []  # ExternalSource items of runs lost in a failure
        self._lost: LoopError | None = None

    # -- building ------------------------------------------------------------------------------

    def _build(self, batch_size: int) -> None:
        started = time.perf_counter()
        options = self.options
        checkpointing = any(_dali.reader_checkpointing(r) for r in self.readers)
        restore = next((r._ndd_trace_restore for r in self.readers
                        if getattr(r, "_ndd_trace_restore", None)), None)
        pipe = self.lowered.function(**_dali.pipeline_options(
            batch_size, options.num_threads, options.device_id, options.prefetch_queue_depth,
            checkpointing, restore[1] if restore else None))
        if self._replayable is None:
            self._replayable = restore is None and not any(
                _dali.reader_has_operator(reader) for reader in self.readers)
        if restore is not None:
            self._resume_at = int(restore[0]["steps_done"])
            for reader in self.readers:
                reader._ndd_trace_restore = None
        for reader in self.readers:
            backend_op = _dali.claim_reader(reader, batch_size)
            _dali.transfer_reader(pipe, reader, backend_op)
            _mark_owned(reader, self)
        pipe.build()
        self.pipeline = pipe
        self.max_batch_size = batch_size
        self.builds += 1
        logs.builds.info("built compiled loop %s for batch size %d in %.1f ms",
                         self.lowered.filename, batch_size, (time.perf_counter() - started) * 1000)

    # -- random states ---------------------------------------------------------------------------

    def _rngs(self, bound: dict) -> list[Any]:
        seen: dict[int, Any] = {}
        for slot, _ in self.draws:
            rng = self._resolve_rng(slot, bound)
            seen[id(rng)] = rng
        return list(seen.values())

    def _sync_forecast(self, bound: dict) -> bool:
        """Start drawing ahead from the callers' generators; False if they moved meanwhile."""
        consistent = True
        for rng in self._rngs(bound):
            expected = self._expected.get(id(rng))
            position = _dali.rng_position(rng)
            if expected is not None and expected != position:
                consistent = False
            if expected != position:
                self._next[id(rng)] = list(position)
                self._expected[id(rng)] = position
        return consistent

    def draw_states(self, bound: dict) -> dict[int, Any]:
        """The states eager draws at the next step scheduled, in eager call order."""
        states: dict[int, Any] = {}
        for slot, node in self.draws:
            rng = self._resolve_rng(slot, bound)
            position = self._next[id(rng)]
            words = self._forecast.state_at(rng, position[0], position[1])
            if words is None:  # reseeded, or drawn from, within the epoch
                raise self._moved_error()
            position[0] += _dali.STATE_WORDS
            states[id(node)] = words
        return states

    def _moved_error(self) -> LoopError:
        return LoopError(
            f"the random generator used by compiled loop `{self.owner_name}` was drawn "
            "from or reseeded while the loop ran; the loop's random ops would no longer "
            "match eager ones. Reseed between epochs, not inside one.")

    def _consume_rng(self, bound: dict) -> None:
        """The consumer takes one step: advance the callers' generators as eager would."""
        words: dict[int, int] = {}
        for slot, _ in self.draws:
            rng = self._resolve_rng(slot, bound)
            words[id(rng)] = words.get(id(rng), 0) + _dali.STATE_WORDS
        for rng in self._rngs(bound):
            if _dali.rng_position(rng) != self._expected[id(rng)]:
                raise self._moved_error()
            _dali.rng_advance(rng, words[id(rng)])
            self._expected[id(rng)] = _dali.rng_position(rng)

    # -- running ---------------------------------------------------------------------------------

    def _pull(self) -> dict[int, Any] | None:
        """One item of every ExternalSource of the loop, or None at the end of one."""
        if self._replay_pulled:  # pulled for runs a failure dropped: eager pulls them now
            return self._replay_pulled.pop(0)
        pulled: dict[int, Any] = {}
        for source, nodes in self.external_sources.values():
            try:
                values = _dali.external_source_pull(source, self.batch_size)
            except StopIteration:
                return None
            for node in nodes:
                pulled[id(node)] = values[node.payload[1]].evaluate()
        return pulled

    def _schedule(self, bound: dict) -> _PendingRun | None:
        pulled = self._pull() if self.external_sources else {}
        if pulled is None:
            self._exhausted = True
            return None
        states = self.draw_states(bound)
        run = _PendingRun(self, self.batch_size)
        run.pulled = pulled
        data = []
        for node in self.lowered.external_sources:
            if node.kind is NodeKind.EXTERNAL:
                data.append(_dali.storage_of(pulled[id(node)]))
            else:
                data.append(self._data_for(node, bound, states, self.batch_size))
        self._feed(data)
        _dali.schedule_one(self.pipeline)
        self._pending.append(run)
        return run

    def _epoch_steps(self) -> int | None:
        if not self.readers:
            return None  # ExternalSources only: until one of them ends
        counts = {}
        for reader in self.readers:
            padded = _dali.reader_metadata_of(self.pipeline, reader)["epoch_size_padded"]
            counts[_dali.reader_name(reader)] = _dali.shard_steps(reader, padded, self.batch_size)
        if len(set(counts.values())) > 1:
            # zip() over readers of different lengths pulls one extra batch from the readers
            # before the shortest, leaving them mid-epoch: lockstep readers cannot do that
            raise LoopError(
                f"compiled loop `{self.owner_name}` zips readers whose epochs have different "
                f"numbers of batches ({sorted(counts.values())}); make them the same length "
                "(e.g. pad_last_batch, matching shards) or iterate them in separate loops")
        return next(iter(counts.values()), 0)

    def epoch(self, bound: dict) -> Iterator[_PendingRun]:
        """Run one epoch; yields each step's run, its outputs already fetched."""
        if not self._epoch_lock.acquire(blocking=False):
            raise LoopError(f"compiled loop `{self.owner_name}` is already running an epoch; "
                            "finish or close the previous one first (like reader.next_epoch)")
        try:
            yield from self._epoch(bound)
        finally:
            self._epoch_lock.release()

    def _epoch(self, bound: dict) -> Iterator[_PendingRun]:
        if self._lost is not None:
            raise self._lost
        with self._lock:
            if self.pipeline is None:
                self.ensure_built(self.batch_size)
            consistent = self._sync_forecast(bound)
            if self._carry and not consistent:
                self._recompute_carry(bound)
            steps = self._epoch_steps()
        done, self._resume_at = self._resume_at, 0
        self._done = done
        self._exhausted = False
        try:
            while steps is None or done < steps:
                with self._lock:
                    # runs on into the next epoch too: the reader reads on seamlessly, and a
                    # reseed in between is handled by recomputing the batches read ahead
                    if self.pipeline is None and not self._carry:  # rebuilt after a failure
                        self.ensure_built(self.batch_size)
                    while len(self._carry) < self.options.prefetch_queue_depth and \
                            not self._exhausted:
                        run = self._schedule(bound)
                        if run is not None:
                            self._carry.append(run)
                    if not self._carry:  # an ExternalSource ended
                        if steps is not None:
                            raise LoopError(
                                f"an ExternalSource of compiled loop `{self.owner_name}` ended "
                                "before its readers' epoch; make them the same length")
                        break
                    run = self._carry.pop(0)
                    try:
                        run.result()
                        failed = False
                    except Exception:
                        failed = True
                    self._consume_rng(bound)  # eager called every op of the step
                    self._taken += 1
                    if failed:
                        self._after_failure(bound)
                done += 1
                self._done = done
                yield run
        finally:
            self._exhausted = False  # the next epoch pulls again (a cycling source restarts)
            if steps is not None and done == steps:
                for reader in self.readers:
                    _dali.advance_shard(reader)


    def _after_failure(self, bound: dict) -> None:
        """A step's run failed (its error reaches the consumer with that step's outputs, where
        eager raises it). The pipeline, and the readers' operators in it, are gone: the runs
        read ahead are dropped, the readers get new operators positioned after the failed
        batch, and the loop goes on from there, as the eager loop does."""
        self.pipeline = None
        self._pending.clear()
        self._replay_pulled = [run.pulled for run in self._carry if run.pulled] + \
            self._replay_pulled
        self._carry = []
        self._forecast.clear()
        self._next.clear()
        self._expected.clear()
        self._sync_forecast(bound)
        if not self._replayable:
            self._lost = LoopError(
                f"a run of compiled loop `{self.owner_name}` failed, and its readers' operators "
                "(which had read batches before the loop took them over, or were restored from "
                "a checkpoint) cannot be put back where they were; create new readers")
            return
        for reader in self.readers:
            _dali.reader_recreate(reader, self.batch_size, self._taken)

    def _recompute_carry(self, bound: dict) -> None:
        """The generator moved (reseeded between epochs, or drawn from after a break) while
        batches were read ahead: their random states are stale. Recompute those steps eagerly
        from their reader batches, with states drawn from the new schedule, in order."""
        user_outputs = len(self.graph.outputs) - sum(
            node.num_outputs for node in self.graph.nodes_of(NodeKind.READER))
        for run in self._carry:
            outputs = run.result()
            leaves: dict[Any, Any] = {}
            position = user_outputs
            for node in self.graph.nodes_of(NodeKind.READER):
                for index in range(node.num_outputs):
                    leaves[(id(node), index)] = _dali.wrap_batch(outputs[position])
                    position += 1
            leaves.update(self._leaves_of(bound, self.draw_states(bound)))
            for node in self.graph.nodes_of(NodeKind.EXTERNAL):
                leaves[id(node)] = run.pulled[id(node)]
            values = interpret(self.graph, leaves)
            run.outputs = tuple(
                _dali.storage_of(values[ref]) if ref.node.kind is NodeKind.OP
                else outputs[i] for i, ref in enumerate(self.graph.outputs))

    def reader_state(self, reader: Any) -> Any:
        """`reader.get_state()` of an owned reader: the loop's position, as a checkpoint."""
        if not _dali.reader_checkpointing(reader):
            raise LoopError(f"reader `{type(reader).__name__}` was created without "
                            "enable_checkpointing=True")
        with self._lock:
            checkpoint = self.pipeline.checkpoint()
        header = {"name": _dali.reader_name(reader), "steps_done": self._done,
                  "shard_id": _dali.reader_shard_id(reader),
                  "owner": self.owner_name}
        return _dali.loop_reader_state(reader, header, checkpoint)


def _mark_owned(reader: Any, loop: LoopExecutable) -> None:
    """A reader whose operator moved into a compiled loop says so when used eagerly, and
    reports the loop's position when asked for its state (checkpoints)."""
    owner = loop.owner_name

    def get_state(*args: Any, **kwargs: Any) -> Any:
        return loop.reader_state(reader)

    reader.get_state = get_state

    def next_epoch(*args: Any, **kwargs: Any) -> Any:
        if _dali.tracing_active():  # tracing: the usual hook decides
            return type(reader).next_epoch(reader, *args, **kwargs)
        raise LoopError(
            f"reader `{type(reader).__name__}` ({_dali.reader_name(reader)}) belongs to compiled "
            f"loop `{owner}` since its first compiled epoch (its operator runs in that loop's "
            "pipeline). Keep iterating it through that function, or create a separate reader.")

    reader.next_epoch = next_epoch
