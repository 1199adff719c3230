"""Is the loader the bottleneck? How long the consumer of each reader loop waited for its data,
and how long it spent in its own step (the report's loader verdict).

    for images, labels in train_batches(reader):   # a compiled generator, or under transparent
        train_step(images, labels)                 # mode `reader.next_epoch(...)`

A loop's batch is timed from the consumer's side: its *wait* is the time `next()` took, plus the
time the consumer then spent blocked on the outputs of ndd_trace pipelines (a compiled step's
outputs are fetched on first use, inside the consumer's step: `images.torch()`); its *step* is
the rest of the time until the consumer's next `next()`. The first batch (tracing, building) is
reported apart. Data loading is `wait / (wait + step)` of the step; from `BOTTLENECK_SHARE` on,
the consumer spends a real part of its time waiting: the loader is the bottleneck.

Costs three clock reads per batch; epochs opened while a timed loop pulls its next item (the
reader epoch inside a compiled generator) are part of that loop's wait, not loops of their own.
"""

from __future__ import annotations

import io
import os
import threading
import time
from array import array
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..core import process_state
from .. import _dali
from ..core import trees
from ..core.files import write_atomic

__all__ = ["BOTTLENECK_SHARE", "LoopTimes", "chart", "loops", "note_fetched", "on_behalf_of",
           "reset", "timed"]

BOTTLENECK_SHARE = 0.10  # the consumer waits for data this share of its time or more
KEEP_STEPS = 100_000  # per-step times kept for the chart (totals count every step)



class LoopTimes:
    """The consumer's waits and steps of one reader loop (all its epochs)."""

    def __init__(self, name: str, where: str):
        self.name = name
        self.where = where
        self.epochs = 0
        self.batches = 0  # timed steps after the first batch
        self.samples = 0  # in them, where the items tell (ndd batches)
        self.first_wait: float | None = None  # the first batch's wait (tracing, building)
        self.wait = 0.0
        self.step = 0.0
        self.waits = array("d")  # per step (the first KEEP_STEPS)
        self.steps = array("d")

    def _add(self, wait: float, step: float, samples: int | None) -> None:
        with process_state.waits_lock:
            if self.first_wait is None:
                self.first_wait = wait
                return
            self.batches += 1
            self.wait += wait
            self.step += step
            if samples is not None:
                self.samples += samples
            if len(self.waits) < KEEP_STEPS:
                self.waits.append(wait)
                self.steps.append(step)

    @property
    def share(self) -> float | None:
        """Data loading's share of the consumer's time (None before two timed steps)."""
        total = self.wait + self.step
        return self.wait / total if self.batches >= 2 and total > 0 else None

    @property
    def bottleneck(self) -> bool | None:
        share = self.share
        return None if share is None else share >= BOTTLENECK_SHARE

    def verdict(self) -> str:
        """The one-line verdict."""
        share = self.share
        if share is None:
            return "too few steps to tell whether the loader is the bottleneck"
        state = "is" if share >= BOTTLENECK_SHARE else "is not"
        return f"data loading is {share:.0%} of the step: the loader {state} the bottleneck"

    def as_dict(self) -> dict:
        total = self.wait + self.step
        return {
            "loop": self.name, "location": self.where, "epochs": self.epochs,
            "batches": self.batches, "samples": self.samples or None,
            "first_batch_s": None if self.first_wait is None else round(self.first_wait, 6),
            "wait_s": round(self.wait, 6), "step_s": round(self.step, 6),
            "wait_share": None if self.share is None else round(self.share, 4),
            "batches_per_s": round(self.batches / total, 3) if total > 0 else None,
            "samples_per_s": round(self.samples / total, 3) if total > 0 and self.samples
            else None,
            "bottleneck": self.bottleneck, "verdict": self.verdict(),
            "wait_ms_per_step": [round(w * 1000, 3) for w in self.waits[:10_000]],
        }

    def lines(self) -> list[str]:
        """The report's lines for this loop."""
        head = f"    {self.where}: {self.name}, {self.epochs} epoch(s), {self.batches} batch(es)"
        if self.first_wait is not None:
            head += f" after the first ({self.first_wait * 1000:.1f} ms)"
        lines = [head]
        total = self.wait + self.step
        if self.batches and total > 0:
            rate = f"{self.batches / total:.1f} batches/s"
            if self.samples:
                rate += f", {self.samples / total:.1f} samples/s"
            lines.append(f"      waited for data {self.wait * 1000 / self.batches:.2f} ms, own "
                         f"step {self.step * 1000 / self.batches:.2f} ms per batch; {rate}")
        lines.append(f"      {self.verdict()}")
        return lines


def note_fetched(run: Any, started: float) -> None:
    """A pipeline run's outputs were waited for from `started` until now (runtime's fetch on
    first use): counted for this thread, and on the run (ndd may fetch an output for the
    consumer in a thread of its own: its eager ops run asynchronously)."""
    now = time.perf_counter()
    local = process_state.waits_local
    local.blocked = getattr(local, "blocked", 0.0) + now - started
    run.fetched = (now - started, now, threading.get_ident())


@contextmanager
def on_behalf_of(thread: int) -> Iterator[None]:
    """The block's waits for pipeline outputs are `thread`'s: ndd reads a transparent-mode
    value for the consumer in a thread of its own (`x.torch()`, `ndd.as_tensor(x)`), while the
    consumer waits for it."""
    if thread == threading.get_ident():
        yield
        return
    local = process_state.waits_local
    before = getattr(local, "blocked", 0.0)
    try:
        yield
    finally:
        waited = getattr(local, "blocked", 0.0) - before
        with process_state.waits_lock:
            elsewhere = process_state.blocked_elsewhere
            elsewhere[thread] = elsewhere.get(thread, 0.0) + waited


def _blocked() -> float:
    """Seconds this thread waited for pipeline outputs so far (others' waits for it included)."""
    return getattr(process_state.waits_local, "blocked", 0.0) + \
        process_state.blocked_elsewhere.get(threading.get_ident(), 0.0)


def timed(iterator: Iterator[Any], name: str, where: str) -> Iterator[Any]:
    """`iterator` (a reader loop's epoch) with its consumer's waits and steps counted under
    (name, where); as it is where it is opened inside a timed loop's `next()`."""
    if getattr(process_state.waits_local, "pulling", 0):
        return iterator
    key = (name, where)
    with process_state.waits_lock:
        times = process_state.loop_times.get(key)
        if times is None:
            times = process_state.loop_times[key] = LoopTimes(name, where)
        times.epochs += 1
    return _timed(iterator, times)


def _timed(iterator: Iterator[Any], times: LoopTimes) -> Iterator[Any]:
    pull = _Pull(times)
    try:  # (send() and throw() reach the iterator's own `yield`: trees.relay)
        return (yield from trees.relay(iterator, pull.around, pull.handed_out))
    finally:
        close = getattr(iterator, "close", None)
        if close is not None:
            close()


class _Pull:
    """The clock of one timed loop: each `next()` (the wait) and the consumer's step after it."""

    def __init__(self, times: LoopTimes):
        self.times = times
        self.started = self.handed = 0.0
        self.blocked = 0.0
        self.thread = 0
        self.item: Any = None
        self.pending = False  # an item was handed out: its step ends at the next pull

    @contextmanager
    def around(self) -> Iterator[None]:
        local = process_state.waits_local
        now = time.perf_counter()
        if self.pending:
            self.pending = False
            in_step = (_blocked() - self.blocked
                       if threading.get_ident() == self.thread else 0.0)
            in_step = min(in_step + _fetched_elsewhere(self.item, self.handed, self.thread),
                          now - self.handed)
            self.times._add(self.handed - self.started + in_step, now - self.handed - in_step,
                            _samples(self.item))
            self.item = None
        self.started = now
        local.pulling = getattr(local, "pulling", 0) + 1
        try:
            yield
        finally:
            local.pulling -= 1

    def handed_out(self, item: Any) -> None:
        self.handed = time.perf_counter()
        self.blocked = _blocked()
        self.thread = threading.get_ident()
        self.item = item
        self.pending = True


def _leaves(item: Any) -> list[Any]:
    if isinstance(item, (tuple, list)):
        return list(item)
    if isinstance(item, dict):
        return list(item.values())
    return [item]


def _fetched_elsewhere(item: Any, since: float, thread: int) -> float:
    """Seconds spent after `since`, outside `thread`, fetching the pipeline runs behind the
    item's batches (a compiled step's outputs, fetched for the consumer by ndd's own thread)."""
    total = 0.0
    seen: set[int] = set()
    for leaf in _leaves(item):
        run = _dali.pending_run_of(leaf)
        fetched = getattr(run, "fetched", None)
        if fetched is not None and id(run) not in seen and fetched[1] > since and \
                fetched[2] != thread:
            seen.add(id(run))
            total += fetched[0]
    return total


def _samples(item: Any) -> int | None:
    """The batch size of an item of ndd batches (its first Batch), without evaluating it."""
    if isinstance(item, (tuple, list)) and item:
        item = item[0]
    elif isinstance(item, dict) and item:
        item = next(iter(item.values()))
    return item.batch_size if isinstance(item, _dali.Batch) else None


def loops() -> list[LoopTimes]:
    """The loops timed so far (all threads), in the order they were first seen."""
    with process_state.waits_lock:
        return list(process_state.loop_times.values())


def reset() -> None:
    with process_state.waits_lock:
        process_state.loop_times.clear()


def chart(path: str, timed_loops: list[LoopTimes] | None = None) -> str:
    """A chart of each loop's per-step wait (ms), written to `path` (matplotlib, optional)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:
        raise ImportError("the wait chart needs matplotlib (pip install matplotlib); the "
                          "report's figures are in ndd_trace.report()") from error
    timed_loops = loops() if timed_loops is None else timed_loops
    figure, axes = plt.subplots(figsize=(9, 4))
    for times in timed_loops:
        axes.plot(range(2, 2 + len(times.waits)), [w * 1000 for w in times.waits],
                  label=f"{times.name} ({times.where}): {times.verdict()}", linewidth=1)
    axes.set_xlabel("step (the first batch, which traces and builds, left out)")
    axes.set_ylabel("consumer's wait for data (ms)")
    axes.set_title("ndd_trace: time each step waited for its batch")
    axes.set_ylim(bottom=0)
    if timed_loops:
        axes.legend(fontsize=7, loc="upper right")
    figure.tight_layout()
    buffer = io.BytesIO()  # (savefig to a path writes in place: a full disk cuts it short)
    figure.savefig(buffer, dpi=120, format=os.path.splitext(path)[1][1:].lower() or None)
    plt.close(figure)
    write_atomic(path, buffer.getbuffer())
    return path
