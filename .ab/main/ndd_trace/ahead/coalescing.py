"""Coalesced launches: the speculator launches K calls ahead as one run of batch K x N (issue 34),
opt in with NDD_TRACE_COALESCE=K (docs/tracing.md#coalescing).

    twin = coalesced_twin(executable, batch_size)      # a Coalescer, or None (twin_reason says why)
    runs = twin.launch(per_call_data, batch_size)        # K SliceRuns, call 0's first, or None

The twin runs `codegen/coalesce.py`'s graph: the K calls' values bit for bit. Each call's
SliceRun hands out its N samples of each of the twin run's outputs, as views (no copy). Where the twin run fails, each of its
calls runs on its own from the data it was fed (its error, if any, is then its own, at its own
step, as eagerly), and the twin is not launched again.
"""

from __future__ import annotations

import weakref
from typing import Any

from .. import _dali
from ..codegen.coalesce import CannotCoalesce, coalesce
from ..core import logs
from ..execution.results import PendingRun
from ..execution.runtime import Executable
from ..units.build import compile_graph
from .runahead import CALLS_PER_RUN


class SliceRun(PendingRun):
    """Call `call` of a coalesced run: its outputs are views of that call's samples of the run's."""

    def __init__(self, executable: Executable, batch_size: int, whole: PendingRun, call: int,
                 twin: Coalescer, data: list):
        super().__init__(executable, batch_size)
        self.whole = whole
        self.twin = twin
        self.call = call
        self.data = data  # what this call alone feeds `executable` (run alone on a failure)

    def result(self, index: int | None = None) -> tuple:
        if self.outputs is None and self.error is None:
            try:
                outputs = self.whole.result()
            except Exception:  # noqa: BLE001 (not this call's error: it runs on its own)
                if not self.twin.failed:
                    self.twin.failed = True
                    logs.fallbacks.info("a coalesced run failed: its calls run on their own, "
                                        "and that graph's calls one by one from now on")
                self._run_alone()
            else:
                start = self.call * self.batch_size
                self.outputs = tuple(_dali.sample_range(output, start, start + self.batch_size)
                                     for output in outputs)
            self.whole = self.twin = None
        return super().result(index)

    def _run_alone(self) -> None:
        data = self.data
        alone = self.executable.start(self.batch_size, lambda: data)
        alone.calls, alone.leaves, alone.replay = self.calls, self.leaves, self.replay
        self.executable.fetch(alone)
        self.outputs, self.error, self.failed = alone.outputs, alone.error, alone.failed
        self.dali_error, self.as_is = alone.dali_error, alone.as_is


class Coalescer:
    """An executable's twin for `k` calls of batch `n`, and how each call's data feeds it."""

    def __init__(self, executable: Executable, k: int, n: int):
        coalesced = coalesce(executable.graph, k, n)
        program = compile_graph(coalesced.graph, executable.options)
        self._original = weakref.ref(executable)  # (the original holds its twin)
        self.k, self.n = k, n
        self.executable = program.executable
        position = {id(node): i for i, node in enumerate(executable.lowered.external_sources)}
        # per twin external source: the original's position (its K calls' data, concatenated),
        # "index" (each sample's index) or the twin's own node (a constant the original inlined)
        self.sources: list[Any] = []
        for node in program.lowered.external_sources:
            origin = coalesced.origin.get(id(node))
            if node is coalesced.index_input:
                self.sources.append("index")
            elif origin is not None and id(origin) in position:
                self.sources.append(position[id(origin)])
            elif node.is_batch:  # (a batch each call feeds: only its own data will do)
                raise CannotCoalesce(f"{node.name} is fed a batch the calls' data does not give")
            else:
                self.sources.append(node)
        self._indices = _dali.sample_indices(k * n)
        self.executable.ensure_built(k * n)
        self.failed = False

    def release(self) -> None:  # (with the original's: built again at its next launch)
        self.executable.release()

    def close(self) -> None:
        self.executable.close()

    def launch(self, per_call: list[list], batch_size: int) -> list[SliceRun] | None:
        """Launch the K calls fed `per_call` (each as the original executable's data) as one
        run; None where it cannot be launched now (the caller launches them one by one)."""
        if self.failed or batch_size != self.n or len(per_call) != self.k or any(
                len(call[source]) != self.n for call in per_call
                for source in self.sources if isinstance(source, int)):
            return None  # (an epoch's short last batch among them: launched one by one)
        total = self.k * self.n
        data = []
        for source in self.sources:
            if source == "index":
                data.append(self._indices)
            elif isinstance(source, int):
                data.append(_dali.concatenated([call[source] for call in per_call]))
            else:
                data.append(self.executable.feed.leaf_data(source, total))
        if self.executable.pipeline is None:  # (freed with the original: built again)
            try:
                self.executable.ensure_built(total)
            except Exception:  # noqa: BLE001 (it built before: the calls run one by one)
                self.failed = True
                return None
        whole = self.executable.launch(data, total)
        if whole is None:
            return None
        original = self._original()
        return [SliceRun(original, batch_size, whole, call, self, per_call[call])
                for call in range(self.k)]


class Refused:
    """Why an executable's calls are not coalesced (held among its companions, as a twin is)."""

    def __init__(self, reason: str):
        self.reason = reason

    def release(self) -> None:
        pass

    close = release


def _twin_of(executable: Executable) -> Coalescer | Refused | None:
    return next((companion for companion in executable.companions
                 if isinstance(companion, (Coalescer, Refused))), None)


def coalesced_twin(executable: Executable, batch_size: int) -> Coalescer | None:
    """The executable's twin for CALLS_PER_RUN calls of `batch_size` (made at the first ask,
    and kept among its companions: freed with it), or None: coalescing is off, or the graph
    cannot be coalesced (`twin_reason` says why)."""
    if CALLS_PER_RUN < 2:
        return None
    twin = _twin_of(executable)
    if twin is None:
        try:
            twin = Coalescer(executable, CALLS_PER_RUN, batch_size)
        except CannotCoalesce as reason:
            twin = Refused(str(reason))
        except Exception as error:  # noqa: BLE001 (the twin did not build: the calls run alone)
            twin = Refused(f"its coalesced pipeline did not build ({type(error).__name__}: "
                           f"{error})")
        if isinstance(twin, Refused):
            logs.fallbacks.info("not coalesced: %s", twin.reason)
        executable.companions.append(twin)
    if isinstance(twin, Refused) or twin.n != batch_size:
        return None
    return twin


def twin_reason(executable: Executable) -> str | None:
    """Why the executable's calls are not coalesced (None: they are, or nobody asked yet)."""
    twin = _twin_of(executable)
    if isinstance(twin, Refused):
        return twin.reason
    if twin is not None and twin.failed:
        return "a coalesced run failed: its calls run one by one"
    return None
