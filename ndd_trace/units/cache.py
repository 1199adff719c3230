"""The one cache of compiled units: a compiled function's entries, transparent mode's regions
and a per-sample function's variants are each held in a UnitCache (one key, one limit, one
miss explanation, one set of counters: its ledger's), and every unit holding a built pipeline
is in the process's one LRU of live pipelines.

    cache = UnitCache("preprocess", limit=8, ledger=ledger, function=preprocess,
                      positional_names=("jpegs", "size"))
    unit = cache.fast_hit(args, kwargs)                       # the last call's unit, no key
    unit, found = cache.lookup(cache.key(args, kwargs), make)   # Found.HIT, Found.NEW, ...
    LIVE_PIPELINES.note_run(unit)      # past its limit, the least recently run unit is released

It owns no tracing and runs nothing: a miss calls the `make` it is given.
"""

from __future__ import annotations

import enum
import threading
import time
import weakref
from collections import Counter, OrderedDict
from collections.abc import Callable
from typing import NamedTuple

from ..core import keys, logs
from ..core.ledger import Ledger
from ..tracing import guards, plans
from .unit import Unit, batch_sizes


class Found(enum.Enum):
    """How a lookup found its key's unit."""

    HIT = "hit"
    NEW = "new"  # made now
    PAST_LIMIT = "past cache_limit"  # not made: the cache holds its limit
    TRACE_FAILED = "trace failed"  # making it raised (the eager call raises the same way, or not)
    NOT_KEPT = "not kept"  # made, not stored (a region that runs eagerly: see lookup's `keep`)
    NOT_MADE_YET = "not made yet"  # past FREE_UNITS, not worth making yet (Sightings): eager


# Units a cache makes at their key's first call (a compiled function's; transparent mode's,
# at one line); past them a new key's calls run eagerly until making its unit is worth it
# (Sightings): code whose variants never repeat costs eager's time, not a build per call.
FREE_UNITS = 4
SIGHTINGS_KEPT = 1024  # the most keys remembered as not made yet (the oldest forgotten first)
MAX_PERIOD_S = 1.0  # a longer pause between calls counts as this long (the user was away)


class Sightings:
    """Whether a new key's unit is made now or its call runs eagerly, by the ski-rental rule:
    a key's calls run eagerly until the time they took (each counted as the period between
    calls at its site) reaches what making a unit there cost (measured: a trace, its lowering
    and first build); where no cost is measured yet, at its second sighting. A variant that
    repeats is made after about its making's cost in eager calls; one that never does costs
    only eager's time. Sites: None (a compiled function), a file:line (transparent mode)."""

    def __init__(self) -> None:
        self.spent: OrderedDict[tuple, float] = OrderedDict()  # key -> eager seconds so far
        self._last_call: dict = {}  # site -> time of its latest call
        self._period: dict = {}  # site -> seconds between its calls (moving average)
        self._cost: dict = {}  # site -> seconds making a unit cost there (moving average)

    def called(self, site: object = None) -> None:
        now = time.perf_counter()
        last = self._last_call.get(site)
        self._last_call[site] = now
        if last is not None:
            gap = min(now - last, MAX_PERIOD_S)
            before = self._period.get(site)
            self._period[site] = gap if before is None else 0.8 * before + 0.2 * gap

    def made(self, cost_s: float, site: object = None) -> None:
        """A unit at `site` was made (and built) in `cost_s` seconds."""
        before = self._cost.get(site)
        self._cost[site] = cost_s if before is None else 0.5 * (before + cost_s)

    def cost(self, site: object = None) -> float | None:
        """Seconds making a unit at `site` costs (a moving average; None: none made yet)."""
        return self._cost.get(site)

    def would_run_eagerly(self, key: tuple, site: object = None) -> bool:
        """Whether a call of `key` (whose unit is not made) would run eagerly now."""
        spent = self.spent.get(key)
        if spent is None:
            return True
        cost = self.cost(site)
        return cost is not None and spent < cost

    def runs_eagerly(self, key: tuple, site: object = None) -> bool:
        """Whether this call of `key` (whose unit is not made) runs eagerly; if not, its unit is
        made now (and the key forgotten here)."""
        if not self.would_run_eagerly(key, site):
            del self.spent[key]
            return False
        spent = self.spent.pop(key, 0.0)
        self.spent[key] = spent + self._period.get(site, 0.0)
        if len(self.spent) > SIGHTINGS_KEPT:
            self.spent.popitem(last=False)
        return True


class CacheInfo(NamedTuple):
    """Counters of a compiled function's cache (`fn.cache_info()`): hits, misses, traces,
    fallbacks (calls not compiled whole) and the entries held."""

    hits: int
    misses: int
    traces: int
    fallbacks: int
    entries: int


class LivePipelines:
    """The units holding a built pipeline, least recently run first: past `limit`, the least
    recently run one's pipeline is freed (its threads go; it is built again if it runs again).
    A pinned unit (a reader stream, whose reader's position lives in its pipeline) counts, and
    is passed over."""

    def __init__(self, limit: int):
        self.limit = limit
        self.releases = 0
        # id -> a weak reference: a unit whose owner is gone (a collected function) drops out
        self._units: OrderedDict[int, weakref.ref] = OrderedDict()
        self._lock = threading.Lock()

    def note_run(self, unit: Unit) -> None:
        """`unit` runs now: it is the most recently run."""
        with self._lock:
            units = self._units
            held = units.get(id(unit))
            if held is None or held() is not unit:
                units[id(unit)] = weakref.ref(unit)
            units.move_to_end(id(unit))
            oldest = self._take_oldest_unpinned() if len(units) > self.limit else None
        if oldest is not None and oldest.release():  # (outside the lock: it waits for runs)
            with self._lock:
                self.releases += 1
            logs.runtime.info("%s: pipeline freed (the least recently run of %d live)",
                              getattr(oldest, "loc", None) or keys.describe(oldest.key)[:1],
                              self.limit)

    def _take_oldest_unpinned(self) -> Unit | None:
        """Past the limit (the lock held): the least recently run unit that is not pinned,
        taken out of the list, the pinned ones passed over left in their place; or None."""
        units, passed, oldest = self._units, [], None
        while units and len(units) + len(passed) > self.limit and oldest is None:
            item = units.popitem(last=False)
            oldest = item[1]()
            if oldest is not None and oldest.pinned:
                passed.append(item)
                oldest = None
        for key, held in reversed(passed):  # (back in their place, oldest first)
            units[key] = held
            units.move_to_end(key, last=False)
        return oldest

    def forget(self, unit: Unit) -> None:
        with self._lock:
            self._units.pop(id(unit), None)

    def clear(self) -> None:
        with self._lock:
            self._units.clear()
            self.releases = 0


# The process's units holding a built pipeline, each with a few OS threads: past 64, the least
# recently run one's pipeline is freed (built again if it runs again).
LIVE_PIPELINES = LivePipelines(64)


class UnitCache:
    """Units by key, at most `limit` of them (and `site_limit` made at one source line), with
    the counters of `ledger` and why the last miss missed. Given `function`, its keys are
    guard keys (tracing/guards.py) built from a call's arguments, and the last call's unit is
    checked first through its fast guard."""

    def __init__(self, name: str, limit: float, ledger: Ledger, *,
                 function: Callable | None = None, positional_names: tuple[str, ...] = (),
                 baked: bool = False, site_limit: int | None = None, kind: str = "entries",
                 worth_making: bool = False):
        self.name = name
        self.limit = limit
        self.ledger = ledger  # its counters are the cache's
        self.kind = kind  # what its units are called in logs ("entries", "variants")
        self.units: OrderedDict[tuple, Unit] = OrderedDict()
        self.lock = threading.RLock()
        self.last_key: tuple | None = None
        self.last_miss_reason: str | None = None
        self.site_limit = site_limit
        self.site_units: Counter = Counter()  # file:line -> units made there
        self._function = function
        self._positional_names = positional_names
        self._baked = baked  # argument values are baked into the pipeline (per-sample)
        self.plan = plans.plan_for(function) if function is not None else None
        self.specialized_on_batch_size = False  # keys hold the batch size (a trace read it)
        self._fast: guards.FastGuard | None = None  # the last unit's guard, checked first
        self.worth_making = worth_making  # past free_units, lookup asks its Sightings
        self.free_units = FREE_UNITS
        self.sightings = Sightings()

    # -- guard keys ----------------------------------------------------------------------------

    def replan(self) -> bool:
        """Plan the guards again: the helpers the function calls may have changed; whether
        the plan reads anything else now (keys made before are then keys of another plan)."""
        plan = plans.plan_for(self._function)
        # (the functions reached through arguments are planned again too, at the next key)
        changed = not plan.reads_as(self.plan) or bool(self.plan.helper_plans)
        self.plan = plan
        return changed

    def key(self, args: tuple, kwargs: dict) -> tuple:
        sizes = None
        if self.specialized_on_batch_size:
            found = batch_sizes(args, kwargs)
            sizes = max(found) if found else None
        return guards.build_key(args, kwargs, self.plan, (sizes,) if sizes else None,
                                self._positional_names, baked=self._baked)

    def specialize_on_batch_size(self) -> None:
        """From now on keys hold the batch size (a trace read it as a Python value)."""
        self.specialized_on_batch_size = True
        self._fast = None

    def fast_hit(self, args: tuple, kwargs: dict, count: bool = True) -> Unit | None:
        """The last call's unit where this call matches its fast guard (`count`: as a hit)."""
        if self.worth_making:
            self.sightings.called()  # (every call: the period its eager calls are counted at)
        fast = self._fast
        if fast is None or kwargs or fast.plan is not self.plan or not fast.matches(args):
            return None
        unit = fast.entry
        with self.lock:
            if count:
                self.ledger.counters.hits += 1
            self.last_key = unit.key
        return unit

    def remember_fast(self, args: tuple, kwargs: dict, unit: Unit) -> None:
        """Check this unit first at the next call (calls without keyword arguments)."""
        if not kwargs and not self.specialized_on_batch_size:
            self._fast = guards.FastGuard.of(args, self.plan, unit, baked=self._baked)

    # -- lookups -------------------------------------------------------------------------------

    def explain(self, key: tuple, other: tuple | None) -> str:
        """Where `key` differs from `other` (None: none before it), as a miss is explained:
        `size: 224 -> 256`; of regions, `op resize[cpu](...)  ->  op resize[cpu](...)`."""
        return keys.explain_miss(key, other)

    def note_miss(self, key: tuple) -> None:
        """Count a miss of `key`, say why it missed (against the last key) and log it."""
        self.ledger.counters.misses += 1
        self.last_miss_reason = self.explain(key, self.last_key)
        (logs.recompiles if self.units else logs.trace).info(
            "`%s`: cache miss (%d of cache_limit %s %s held): %s", self.name, len(self.units),
            self.limit, self.kind, self.last_miss_reason)

    def lookup(self, key: tuple, make: Callable[[], Unit | None], *,
               keep: Callable[[Unit], bool] | None = None,
               explain: bool = True) -> tuple[Unit | None, Found]:
        """The unit for this key, made by `make` on a miss, and how it was found. `keep`: made
        units are stored (under `key`, counted as traces) only where it says so, the others
        handed back as Found.NOT_KEPT; `explain=False`: a miss is counted, not explained or
        logged (transparent mode's regions, keyed by structure, not by a call's arguments)."""
        with self.lock:
            unit = self.units.get(key)
            if unit is not None:
                self.ledger.counters.hits += 1
                self.last_key = key
                return unit, Found.HIT
            if explain:
                self.note_miss(key)
            else:
                self.ledger.counters.misses += 1
            if len(self.units) >= self.limit:
                return None, Found.PAST_LIMIT  # (the caller records the verdict)
            if self._past_free_units():
                if self.sightings.runs_eagerly(key):
                    return None, Found.NOT_MADE_YET  # (the caller runs it eagerly)
            if keep is None:
                self.ledger.counters.traces += 1
            started = time.perf_counter()
            unit = make()
            if unit is None:
                return None, Found.TRACE_FAILED  # (the caller records the verdict)
            unit.make_s = time.perf_counter() - started
            self._note_cost(unit)
            if keep is not None:
                if not keep(unit):
                    return unit, Found.NOT_KEPT
                self.ledger.counters.traces += 1
                self.units[key] = unit
                self.last_key = key
            else:  # (its key: made again where the guards' plan changed while it was made)
                self.units[unit.key] = unit
                self.last_key = unit.key
            return unit, Found.NEW

    def _note_cost(self, unit: Unit) -> None:
        """Hand what making `unit` cost, its first build included, to Sightings once known:
        now where it was built while made, else at its first build (by value: no cycle)."""
        executable = unit.executable
        if executable is None:
            return
        if executable.builds:
            self.sightings.made(unit.make_s, unit.site)
            return
        made, make_s, site = self.sightings.made, unit.make_s, unit.site
        executable.on_first_build = lambda build_s: made(make_s + build_s, site)

    def _past_free_units(self) -> bool:
        """Whether a new key's unit waits until making it is worth it (Sightings)."""
        return self.worth_making and self.ledger.counters.traces >= self.free_units

    def next_lookup(self, key: tuple) -> Found:
        """How a lookup of `key` would find it now (HIT, PAST_LIMIT, NOT_MADE_YET or NEW),
        changing nothing: what explain says of a call."""
        if key in self.units:
            return Found.HIT
        if len(self.units) >= self.limit:
            return Found.PAST_LIMIT
        if self._past_free_units() and self.sightings.would_run_eagerly(key):
            return Found.NOT_MADE_YET
        return Found.NEW

    def get(self, key: tuple) -> Unit | None:
        return self.units.get(key)

    def store(self, key: tuple, unit: Unit) -> None:
        self.units[key] = unit

    def drop(self, key: tuple, close: bool = True) -> None:
        """Forget `key`'s unit (a failed one, replaced), its pipeline closed. `close=False`: a
        reader's finalizer's call, which a garbage collection may make inside any lock: it
        takes none, and leaves the pipeline to close when collected (its worker may be reading)
        and the LRU's weak reference to go with it."""
        unit = self.units.pop(key, None)
        if unit is not None and close:
            LIVE_PIPELINES.forget(unit)
            unit.close()
        self._fast = None

    def last(self) -> Unit | None:
        return self.units.get(self.last_key) if self.last_key is not None else None

    def site_verdict(self, site: str, key: tuple) -> Found | None:
        """None where a unit for `key` may be made at `site` (a file:line; counted there), else
        why not: Found.PAST_LIMIT (site_limit made there) or Found.NOT_MADE_YET (past
        free_units made there, `key` not worth making yet: Sightings)."""
        made = self.site_units[site]
        if self.site_limit is not None and made >= self.site_limit:
            return Found.PAST_LIMIT
        if made >= self.free_units and self.sightings.runs_eagerly(key, site):
            return Found.NOT_MADE_YET
        self.site_units[site] += 1
        return None

    # -- the public face -----------------------------------------------------------------------

    def info(self) -> CacheInfo:
        c = self.ledger.counters
        return CacheInfo(c.hits, c.misses, c.traces, c.fallbacks, len(self.units))

    def clear(self, close: bool = True) -> None:
        """Forget every unit (`close`: and close its executable now, not when collected)."""
        with self.lock:
            for unit in self.units.values():
                LIVE_PIPELINES.forget(unit)
                if close:
                    unit.close()
            self.units.clear()
            self.site_units.clear()
            self.sightings = Sightings()
            self._fast = None
            self.ledger.clear()


# Transparent mode's regions, shared by all threads. Past 32 regions made at one line, new ones
# there run eagerly: a value that changes every call (a float argument) would otherwise build
# a pipeline per value.
REGIONS = UnitCache("transparent mode", float("inf"), Ledger("transparent mode"), site_limit=32,
                    kind="regions")

# Reader streams (ahead/streams.py), one per live reader for the whole process: a stream holds
# its reader's position, so it is never freed while its reader lives, nor limited in number.
READER_STREAMS = UnitCache("reader streams", float("inf"), Ledger("reader streams"),
                           kind="streams")
