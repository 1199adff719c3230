"""Transparent mode's report: the regions it compiled, the calls it ran eagerly (with reasons
and lines), the readers it read ahead, and the time each stage took; process-wide, all threads.

    print(ndd_trace.report())      # or python -m ndd_trace --report script.py
    ndd_trace.reset_report()

`bookkeeping` is the bookkeeping the recorder (lazy.py) and the region runner (regions.py) write.
"""

from __future__ import annotations

import dataclasses
import functools
from collections import Counter

from ..core import keys, process_state
from ..core.source import SourceLoc, site_of
from ..execution import tuning, waits
from ..units.cache import LIVE_PIPELINES, REGIONS
from ..units.unit import Unit

def site_full() -> str:
    """Why a call at a line past the regions' site limit runs eagerly."""
    return (f"a new region each time at this line (its arguments keep changing): past "
            f"{REGIONS.site_limit} regions there, new ones run eagerly")


@dataclasses.dataclass(eq=False)
class Region(Unit):
    """One unit of transparent mode: its ops' cached pipeline, and what it did."""

    loc: SourceLoc | None = None
    code: str = ""
    run_count: int = 0  # (not `runs`: a unit's verdict.runs is how its calls run)
    hits: int = 0
    build_s: float = 0.0
    record_s: float = 0.0
    ahead: int = 0  # runs served by a run launched ahead on batches read ahead
    # the region's identity for the speculator's tables (hashing `key` again costs more)
    token: object = dataclasses.field(default_factory=object, compare=False, repr=False)

    @functools.cached_property
    def site(self) -> str:
        """Its first call's `file:line` (site_of), made once: every run counts a call there."""
        return site_of(self.loc)

    @property
    def parts(self) -> list[str]:
        """The region's structure key, one readable line per fed input and op call."""
        return keys.describe(self.key)

    @property
    def op_chain(self) -> str:
        """The op calls of the region, in call order (`decoders.image[cpu] -> resize[cpu]`)."""
        return " -> ".join(op.op for _, op in keys.parts_of(self.key, keys.OpPart))

    @property
    def input_kinds(self) -> list[str]:
        """What the region is fed: data (device, dtype, ndim, layout) and random states, as
        `in0: batch<cpu, UINT8, ndim=3, HWC>`."""
        return [f"{label}: {keys.show(fed)}" for label, fed in keys.parts_of(self.key,
                                                                             keys.FedPart)]


@dataclasses.dataclass
class Report:
    """What transparent mode compiled and what it ran eagerly, with reasons and locations; the
    reader loops' waits for data and the loader verdict."""

    regions: list[Region]
    eager_ops: Counter  # (op name, reason, file:line) -> count
    ops_recorded: int
    readers: Counter  # (reader, file:line) -> epochs read through a reader pipeline
    ops_replayed: int = 0  # of ops_recorded: made from their call site's last call
    releases: int = 0  # pipelines freed as the least recently run (LIVE_PIPELINES)
    # reader loops timed from their consumer's side: its wait for data vs its own step
    loops: list[waits.LoopTimes] = dataclasses.field(default_factory=list)

    def as_dict(self) -> dict:
        splits = _splits(self.regions)
        return {
            "ops_recorded": self.ops_recorded,
            "ops_replayed": self.ops_replayed,
            "ops_eager": sum(self.eager_ops.values()),
            "pipelines_released": self.releases,
            "regions": [
                {"location": str(r.loc) if r.loc else None, "ops": r.num_ops, "runs": r.run_count,
                 "cache_hits": r.hits, "run_ahead": r.ahead,
                 "builds": 1 if r.executable is not None else 0,
                 "build_s": round(r.build_s, 4), "record_s": round(r.record_s, 4),
                 "eager_reason": r.eager_reason, "releases": r.releases, "op_chain": r.op_chain,
                 "inputs": r.input_kinds, "split_by": splits.get(id(r)),
                 "optimizations": [str(applied) for applied in r.optimizations],
                 "tuning": tuning.described(r.executable)}
                for r in self.regions
            ],
            "eager_ops": [
                {"op": op, "reason": reason, "location": where, "count": count}
                for (op, reason, where), count in sorted(self.eager_ops.items())
            ],
            "readers": [
                {"reader": reader, "location": where, "epochs": epochs}
                for (reader, where), epochs in sorted(self.readers.items())
            ],
            "loops": [times.as_dict() for times in self.loops],
        }

    def chart(self, path: str) -> str:
        """A chart of each reader loop's per-step wait for data, written to `path` (needs
        matplotlib: ImportError, saying so, without it)."""
        return waits.chart(path, self.loops)

    def __str__(self) -> str:
        modes = {times.mode for times in self.loops}  # (the header names what ran)
        if self.regions or self.eager_ops or self.ops_recorded or not modes:
            modes.add(waits.TRANSPARENT)
        lines = [f"ndd_trace report ({', '.join(sorted(modes, reverse=True))})",
                 f"  ndd calls recorded: {self.ops_recorded} "
                 f"({self.ops_replayed} from their call site's last call), "
                 f"run eagerly: {sum(self.eager_ops.values())}",
                 f"  compiled regions: {len(self.regions)}"
                 + (f" (pipelines freed as the least recently run: {self.releases}; at most "
                    f"{LIVE_PIPELINES.limit} held, rebuilt when run again)"
                    if self.releases else "")]
        splits = _splits(self.regions)
        for r in sorted(self.regions, key=lambda r: -r.run_count):
            where = r.loc.short if r.loc else "?"
            status = f"eager ({r.eager_reason})" if r.eager_reason else "pipeline"
            if r.releases:
                status += f" (freed {r.releases}x as the least recently run)"
            lines.append(f"    {where:<28} {r.num_ops:3d} ops  runs {r.run_count:6d}  "
                         f"cache hits {r.hits:6d}  run ahead {r.ahead:6d}  "
                         f"build {r.build_s * 1000:7.1f} ms  record {r.record_s * 1000:7.1f} ms  "
                         f"{status}")
            if id(r) in splits:  # several regions start at this line: say what tells them apart
                lines.append(f"      ops: {r.op_chain}")
                lines.append(f"      inputs: {', '.join(r.input_kinds) or '-'}")
                lines.append(f"      split by: {splits[id(r)]}")
            lines += [f"      optimization applied: {applied}" for applied in r.optimizations]
            lines += [f"      {line}" for line in tuning.described(r.executable)]
        if self.readers:
            lines.append("  readers in a read-ahead pipeline:")
            for (reader, where), epochs in sorted(self.readers.items()):
                lines.append(f"    {where}: {reader}, {epochs} epoch(s)")
        if self.eager_ops:
            lines.append("  calls run eagerly:")
            for (op, reason, where), count in sorted(self.eager_ops.items()):
                lines.append(f"    {where}: ndd.{op} x{count}: {reason}")
        if self.loops:
            lines.append("  reader loops (the consumer's wait for data vs its own step):")
            for times in self.loops:
                lines.extend(times.lines())
        return "\n".join(lines)


def _splits(regions: list[Region]) -> dict[int, str]:
    """For regions sharing a `file:line`: id(region) -> what sets it apart from the first of
    them (the most run): the one miss explanation of their keys (REGIONS.explain), as
    "op resize[cpu](in0, size=[16, 16])  ->  op resize[cpu](in0, size=[8, 8])"."""
    groups: dict[str, list[Region]] = {}
    for region in sorted(regions, key=lambda r: -r.run_count):
        groups.setdefault(region.site, []).append(region)
    splits: dict[int, str] = {}
    for group in groups.values():
        if len(group) < 2:
            continue
        first = group[0]
        splits[id(first)] = "(the first region there)"
        for region in group[1:]:
            # equal keys: regions.py looked them up apart (a one-value random op's batches)
            splits[id(region)] = REGIONS.explain(region.key, first.key) \
                if region.key != first.key else (
                    "the batch size (a random op without batch_size draws one value: a "
                    "pipeline of batches of more than one sample would draw one per sample)")
    return splits


# what the recorder (lazy.py) and the region runner (regions.py) count, all threads
bookkeeping = process_state.transparent


def report() -> Report:
    """What transparent mode compiled and ran eagerly so far, and how long the consumer of each
    reader loop waited for its data (the loader verdict; compiled generators too), all threads."""
    with bookkeeping.lock:
        return Report(list(REGIONS.units.values()), Counter(REGIONS.ledger.tallies),
                      bookkeeping.ops_recorded, Counter(bookkeeping.readers),
                      bookkeeping.ops_replayed, LIVE_PIPELINES.releases, waits.loops())


def step_breakdown() -> dict[str, float]:
    """Seconds transparent mode spent so far (all threads): `record` (recording ndd calls),
    `key` (a region's cone and structure key), `check` (run-ahead: describing the fed leaves,
    using a run launched ahead, which may wait for it, and launching the next), `feed`
    (building, feeding), `run` (DALI's Run of the region's own runs), `fetch` (waiting for
    their outputs)."""
    with bookkeeping.lock:
        return dict(bookkeeping.times)


def reset_report() -> None:
    """Forget the regions, eager calls, readers and loop times counted so far (all threads)."""
    with bookkeeping.lock:
        bookkeeping.times = dict.fromkeys(bookkeeping.times, 0.0)
        REGIONS.clear(close=False)  # (a run launched ahead may still use its pipeline)
        LIVE_PIPELINES.clear()
        bookkeeping.readers.clear()
        bookkeeping.ops_recorded = 0
        bookkeeping.ops_replayed = 0
    waits.reset()
