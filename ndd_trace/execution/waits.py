"""Is the loader the bottleneck? How long the consumer of each reader loop waited for its data,
and how long it spent in its own step (the report's loader verdict), graded, with what to try.

    for images, labels in train_batches(reader):   # a compiled generator, or under transparent
        train_step(images, labels)                 # mode `reader.next_epoch(...)`
    print(ndd_trace.report())                      # each loop: its waits, its verdict, what to try
    compare_with_replay(train_batches(reader), step)   # measured: live vs the same batches replayed

A loop's batch is timed from the consumer's side: its *wait* is the time `next()` took, plus the
time the consumer then spent blocked on the outputs of ndd_trace pipelines (a compiled step's
outputs are fetched on first use, inside the consumer's step: `images.torch()`); its *step* is
the rest of the time until the consumer's next `next()`. The first batch (tracing, building) is
reported apart. Data loading is `wait / (wait + step)` of the step, graded (`GRADES`) with the
spread of the per-step share (median, p90): a steady wait asks for a faster loader, waits in
bursts for a deeper queue. With data always ready the loop would take its own steps alone: the
estimated speed-up `(wait + step) / step`; `compare_with_replay` measures it, as DALI's
LoaderEvaluator does, by running the step again on the same batches from memory.

Costs three clock reads per batch; epochs opened while a timed loop pulls its next item (the
reader epoch inside a compiled generator) are part of that loop's wait, not loops of their own.
"""

from __future__ import annotations

import dataclasses
import io
import itertools
import os
import threading
import time
from array import array
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from ..core import process_state
from .. import _dali
from ..core import trees
from ..core.files import write_atomic
from ..core.source import hide_own_frames, portable_path

__all__ = ["BOTTLENECK_SHARE", "GRADES", "LoopTimes", "ReplayComparison", "chart",
           "compare_with_replay", "figure", "loops", "note_fetched", "on_behalf_of", "reset",
           "timed"]

BOTTLENECK_SHARE = 0.10  # the consumer waits for data this share of its time or more
KEEP_STEPS = 100_000  # per-step times kept for the chart (totals count every step)
# (share of the step from which, grade, what it means), the first that applies from the end
GRADES = ((0.0, "negligible", "the loader is not the bottleneck"),
          (0.03, "minor", "the loader is not the bottleneck"),
          (BOTTLENECK_SHARE, "partial", "the loader is a bottleneck"),
          (0.5, "severe", "the loader is the bottleneck: the step waits more than it works"))
COMPILED_GENERATOR = "compiled generator"
TRANSPARENT = "transparent mode"



class LoopTimes:
    """The consumer's waits and steps of one reader loop (all its epochs), in `mode` (a
    compiled generator or transparent mode; `optimized`: under optimize=True)."""

    def __init__(self, name: str, where: str, mode: str = TRANSPARENT, optimized: bool = False):
        self.name = name
        self.where = where
        self.mode = mode
        self.optimized = optimized
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

    @property
    def grade(self) -> str | None:
        """How much the loader holds the step back (`GRADES`: negligible, minor, partial,
        severe), None before two timed steps."""
        share = self.share
        return None if share is None else _grade(share)[1]

    def spread(self) -> tuple[float, float] | None:
        """The median and the 90th percentile of the per-step share of waiting for data."""
        shares = sorted(w / (w + s) for w, s in zip(self.waits, self.steps) if w + s > 0)
        if len(shares) < 2:
            return None
        return _quantile(shares, 0.5), _quantile(shares, 0.9)

    @property
    def speedup(self) -> float | None:
        """How much faster the loop would run with its data always ready (its own steps alone):
        an estimate, measured by `compare_with_replay`."""
        return (self.wait + self.step) / self.step if self.share is not None and self.step > 0 \
            else None

    def verdict(self) -> str:
        """The one-line verdict: the share, its spread, the grade, and what it costs."""
        share = self.share
        if share is None:
            return "too few steps to tell whether the loader is the bottleneck"
        _, grade, meaning = _grade(share)
        text = f"data loading is {share:.0%} of the step"
        spread = self.spread()
        if spread is not None:
            text += f" (per step: median {spread[0]:.0%}, p90 {spread[1]:.0%})"
        text += f": {meaning} ({grade})"
        if share >= BOTTLENECK_SHARE and self.speedup is not None:
            text += f"; a loader that kept up would make the loop {self.speedup:.2f}x as fast"
        elif spread is not None and spread[0] < BOTTLENECK_SHARE <= spread[1]:
            text += "; its waits come in bursts (the read-ahead runs dry at times)"
        return text

    def advice(self) -> list[str]:
        """What to try next, most likely first (none where the loader keeps up)."""
        share, spread = self.share, self.spread()
        bursts = spread is not None and spread[0] < BOTTLENECK_SHARE <= spread[1]
        if share is None or (share < BOTTLENECK_SHARE and not bursts):
            return []
        return _advice(self.mode, self.optimized, bursts and share < 0.5)

    def as_dict(self) -> dict:
        total = self.wait + self.step
        spread = self.spread()
        return {
            "loop": self.name, "location": self.where, "mode": self.mode,
            "epochs": self.epochs, "batches": self.batches, "samples": self.samples or None,
            "first_batch_s": None if self.first_wait is None else round(self.first_wait, 6),
            "wait_s": round(self.wait, 6), "step_s": round(self.step, 6),
            "wait_share": None if self.share is None else round(self.share, 4),
            "wait_share_median": None if spread is None else round(spread[0], 4),
            "wait_share_p90": None if spread is None else round(spread[1], 4),
            "batches_per_s": round(self.batches / total, 3) if total > 0 else None,
            "samples_per_s": round(self.samples / total, 3) if total > 0 and self.samples
            else None,
            "bottleneck": self.bottleneck, "grade": self.grade,
            "speedup_if_data_ready": None if self.speedup is None else round(self.speedup, 3),
            "verdict": self.verdict(), "advice": self.advice(),
            "wait_ms_per_step": [round(w * 1000, 3) for w in self.waits[:10_000]],
        }

    def lines(self) -> list[str]:
        """The report's lines for this loop."""
        head = (f"    {self.where}: {self.name} ({self.mode}), {self.epochs} epoch(s), "
                f"{self.batches} batch(es)")
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
        if self.bottleneck:  # (the speed-up is an estimate: a replay needs the step run again)
            lines.append("      measured, not estimated: ndd_trace.execution.waits."
                         "compare_with_replay(loop, step) runs the step again on the same "
                         "batches from memory")
        lines += [f"      try: {tip}" for tip in self.advice()]
        return lines


def _grade(share: float) -> tuple[float, str, str]:
    return next(grade for grade in reversed(GRADES) if share >= grade[0])


def _quantile(ordered: list[float], q: float) -> float:
    """The `q` quantile of sorted values, linearly between the two nearest."""
    at = (len(ordered) - 1) * q
    low = int(at)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)


def _advice(mode: str, optimized: bool, bursts: bool) -> list[str]:
    """What to try for a loader that holds the step back, in `mode`'s own spelling: waits in
    bursts (the read-ahead runs dry at times) first ask for a deeper queue; a steady wait for a
    loader that produces more per second."""
    compiled = mode == COMPILED_GENERATOR
    queue = ("a deeper queue: `@ndd.compile(prefetch_queue_depth=4)` (the steps kept "
             "scheduled ahead; default 2)" if compiled else
             "a deeper read-ahead: `optimize=True` tunes the queue depth on this machine")
    tips = [queue] if bursts else []
    if not optimized:
        tips.append("`@ndd.compile(optimize=True)`: ROI decoding, threads and queue depth tuned "
                    "on this machine" if compiled else "`ndd_trace.enable(optimize=True)` "
                    "(`NDD_TRACE_OPTIMIZE=1`): ROI decoding, threads and queue depth tuned")
    tips += [("more threads: `@ndd.compile(num_threads=...)`" if compiled else
              "more threads: `ndd.set_num_threads(...)`") + ", for the reader and CPU ops",
             "a faster decode: `ndd.decoders.image(..., device=\"gpu\")` (nvJPEG, the "
             "hardware decoder), or smaller files",
             "more workers: shard the reader (`shard_id=`, `num_shards=`) over more processes "
             "or ranks"]
    if not bursts:
        tips.append(queue)
    return tips


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


def timed(iterator: Iterator[Any], name: str, where: str, mode: str = TRANSPARENT,
          optimized: bool = False) -> Iterator[Any]:
    """`iterator` (a reader loop's epoch, run in `mode`) with its consumer's waits and steps
    counted under (name, where); as it is where it is opened inside a timed loop's `next()`."""
    if getattr(process_state.waits_local, "pulling", 0):
        return iterator
    key = (name, where)
    with process_state.waits_lock:
        times = process_state.loop_times.get(key)
        if times is None:
            times = process_state.loop_times[key] = LoopTimes(name, where, mode, optimized)
        times.epochs += 1
    return _timed(iterator, times)


def _timed(iterator: Iterator[Any], times: LoopTimes) -> Iterator[Any]:
    pull = _Pull(times)
    try:  # (send() and throw() reach the iterator's own `yield`: trees.relay)
        return (yield from trees.relay(iterator, pull.around, pull.handed_out))
    except Exception as error:  # DALI's (a batch size eager refuses): as eager's traceback
        hide_own_frames(error)
        raise
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


def _portable(where: str) -> str:
    """A loop's `file:line` as a chart shows it: no machine's absolute path."""
    filename, _, line = where.rpartition(":")
    return f"{portable_path(filename)}:{line}" if filename and line.isdigit() else where


def figure(timed_loops: list[LoopTimes] | None = None) -> Any:
    """A matplotlib `Figure` of each loop's per-step wait: above, in ms, with the loop's median
    own step as the scale it is read against; below, as a share of the step, against the 10%
    from which the loader is a bottleneck. A Figure of its own (no pyplot, no backend chosen):
    `figure().savefig(path)`, or shown as it is in a notebook."""
    try:
        from matplotlib.figure import Figure
    except ImportError as error:
        raise ImportError("the wait chart needs matplotlib (pip install matplotlib); the "
                          "report's figures are in ndd_trace.report()") from error
    timed_loops = loops() if timed_loops is None else timed_loops
    result = Figure(figsize=(9, 5.5), layout="constrained")
    waited, shares = result.subplots(2, 1, sharex=True, height_ratios=(3, 2))
    for times in timed_loops:
        steps = range(2, 2 + len(times.waits))
        grade = f"{times.share:.0%}, {times.grade}" if times.share is not None else "too few"
        line, = waited.plot(steps, [w * 1000 for w in times.waits], linewidth=1,
                            label=f"{times.name} ({_portable(times.where)}, {times.mode}): "
                                  f"{grade}")
        if times.steps:
            own = _quantile(sorted(times.steps), 0.5) * 1000
            waited.axhline(own, color=line.get_color(), linestyle="--", linewidth=0.8,
                           label=f"its own step, median ({own:.1f} ms)")
        shares.plot(steps, [100 * w / (w + s) if w + s > 0 else 0.0
                            for w, s in zip(times.waits, times.steps)],
                    color=line.get_color(), linewidth=1)
    shares.axhline(100 * BOTTLENECK_SHARE, color="black", linestyle=":", linewidth=0.8,
                   label=f"a bottleneck from {BOTTLENECK_SHARE:.0%}")
    waited.set_ylabel("wait for data (ms)")
    waited.set_ylim(bottom=0)
    waited.set_title("ndd_trace: time each step waited for its batch")
    shares.set_ylabel("share of the step (%)")
    shares.set_ylim(0, 100)
    shares.set_xlabel("step (the first batch, which traces and builds, left out)")
    if timed_loops:
        waited.legend(fontsize=7, loc="upper right")
    shares.legend(fontsize=7, loc="upper right")
    return result


def chart(path: str, timed_loops: list[LoopTimes] | None = None) -> str:
    """`figure(timed_loops)` written to `path` (its format by its extension; matplotlib,
    optional), whole or not at all."""
    drawn = figure(timed_loops)
    buffer = io.BytesIO()  # (savefig to a path writes in place: a full disk cuts it short)
    drawn.savefig(buffer, dpi=120, format=os.path.splitext(path)[1][1:].lower() or "png")
    write_atomic(path, buffer.getbuffer())
    return path


# -- a measured comparison: the same batches, replayed -------------------------------------------

@dataclasses.dataclass(frozen=True)
class ReplayComparison:
    """`steps` steps of a loop as it ran (`live_s`) and on the same batches from memory
    (`replay_s`): what a loader that always kept up would give."""

    steps: int
    live_s: float
    replay_s: float

    @property
    def speedup(self) -> float:
        return self.live_s / self.replay_s if self.replay_s > 0 else float("inf")

    @property
    def loader_share(self) -> float:
        """The share of the live loop's time that replaying saved: what the loader costs."""
        return max(0.0, 1 - self.replay_s / self.live_s) if self.live_s > 0 else 0.0

    def __str__(self) -> str:
        live, replay = self.steps / self.live_s, self.steps / self.replay_s
        text = (f"{self.steps} steps: {live:.1f} batches/s as loaded, {replay:.1f} batches/s "
                f"replayed from memory")
        if self.speedup < 1 + BOTTLENECK_SHARE:
            return f"{text}: the loader keeps up"
        return (f"{text}: a loader that kept up would make the loop {self.speedup:.2f}x as "
                f"fast (the loader costs {self.loader_share:.0%} of its time)")


def compare_with_replay(batches: Iterable[Any], step: Callable[[Any], Any], *,
                        steps: int = 20) -> ReplayComparison:
    """Run `step(item)` on `steps` items of `batches` as they are loaded (after a first item,
    which traces and builds), keeping them; then on the same items again from memory; and
    compare the two, as DALI's LoaderEvaluator does. `step` trains on each item twice: run it
    apart from real training, and have it wait for its own work (a GPU step: synchronize)."""
    iterator = iter(batches)
    kept: list[Any] = []
    try:
        for item in itertools.islice(iterator, 1):
            step(item)
        started = time.perf_counter()
        for item in itertools.islice(iterator, steps):
            step(item)
            kept.append(item)
        live = time.perf_counter() - started
    finally:
        close = getattr(iterator, "close", None)
        if close is not None:
            close()  # (a compiled generator's epoch: ended as a `break` ends it)
    if not kept:
        raise ValueError("compare_with_replay: the loop gave no item after its first")
    started = time.perf_counter()
    for item in kept:
        step(item)
    return ReplayComparison(len(kept), live, time.perf_counter() - started)
