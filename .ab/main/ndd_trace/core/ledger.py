"""The one sink of what ndd_trace decides and tells its user: verdicts, counters, warnings.

    ledger = Ledger("preprocess")
    ledger.record(Verdict.eager_variant("pipeline build failed: ...", loc), warning="...")
    ledger.counters.hits                                            # what cache_info() reads
    ledger.verdicts[-1]                                             # what explain reads
    warn("ndd_trace: `f` cannot be compiled whole: ...", loc)     # at the user's file:line

Every unit (a compiled function's entry, a transparent-mode region, a per-sample variant) holds
a `Verdict`: its kind (`VerdictKind`: compiled, eager for this variant, eager for this call, a
graph break), why, where (the user's line) and how its calls run (`Runs`). Verdicts are made
here only, by one constructor per kind, which decides the kind and its text together. Every call
that does not run as compiled is recorded in its owner's ledger, which counts it, logs it and
warns once at the user's line.

A warning names the user's line where one is known (`warnings.warn_explicit` at `loc`), so the
user sees their own code in it, not ndd_trace's; without one it is attributed `stacklevel`
frames above the caller, as `warnings.warn` would.
"""

from __future__ import annotations

import collections
import threading
import dataclasses
import enum
import warnings

from . import logs
from .errors import NddTraceWarning
from .source import SourceLoc, site_of


class Runs(enum.Enum):
    """How a unit's calls run (explain's "runs as")."""

    ONE_PIPELINE = "one pipeline"
    COMPILED_LOOP = "compiled loop"
    CHECKED_LOOP = "checked loop"
    CAPTURE_MODE = "DALI's capture mode"
    TRANSPARENT = "transparent mode"
    EAGER = "eager"
    PER_SAMPLE_LOOP = "the eager per-sample loop"


class VerdictKind(enum.Enum):
    """What a verdict decides."""

    COMPILED = "compiled"  # the unit's calls run as compiled
    EAGER_VARIANT = "eager for this variant"  # its unit's calls run otherwise from now on
    EAGER_CALL = "eager for this call"  # this one call runs otherwise; its unit stays compiled
    GRAPH_BREAK = "graph break"  # its unit's trace broke: its calls run otherwise


@dataclasses.dataclass(frozen=True)
class Verdict:
    """How a unit (every call of it) or one call runs: as compiled, or not (its kind), why,
    where (the user's line) and how it runs instead. Made by the constructor of its kind."""

    kind: VerdictKind
    reason: str = ""
    loc: SourceLoc | None = None
    runs: Runs = Runs.EAGER

    @classmethod
    def compiled(cls, runs: Runs = Runs.ONE_PIPELINE) -> Verdict:
        """The unit's calls run as compiled, as `runs` says (one pipeline, a compiled loop)."""
        return cls(VerdictKind.COMPILED, "", None, runs)

    @classmethod
    def eager_variant(cls, reason: str, loc: SourceLoc | None, runs: Runs = Runs.EAGER
                      ) -> Verdict:
        """Every call of this unit (its guard key) runs as `runs` says, from now on."""
        return cls(VerdictKind.EAGER_VARIANT, reason, loc, runs)

    @classmethod
    def eager_call(cls, reason: str, loc: SourceLoc | None, runs: Runs = Runs.EAGER) -> Verdict:
        """This one call runs as `runs` says; its unit stays as it was."""
        return cls(VerdictKind.EAGER_CALL, reason, loc, runs)

    @classmethod
    def graph_break(cls, what: str, loc: SourceLoc | None, runs: Runs) -> Verdict:
        """The unit's trace broke (`what`: the break, with its line): its calls run as `runs`
        says."""
        return cls(VerdictKind.GRAPH_BREAK, f"graph break: {what}", loc, runs)

    @property
    def eager(self) -> bool:
        """Whether the calls it covers do not run as compiled."""
        return self.kind is not VerdictKind.COMPILED

    def __str__(self) -> str:
        return self.reason


class Counters:
    """A compiled function's calls: cache hits, misses, traces, and fallbacks (calls that did
    not run as compiled, each recorded with its verdict)."""

    __slots__ = ("hits", "misses", "traces", "fallbacks")

    def __init__(self) -> None:
        self.hits = self.misses = self.traces = self.fallbacks = 0


def warn(message: str, loc: SourceLoc | None, category: type[Warning] = NddTraceWarning,
         stacklevel: int = 1) -> None:
    """Warn at `loc`, or (no loc) `stacklevel` frames above the caller (1: the caller's line)."""
    if loc is None:
        warnings.warn(message, category, stacklevel=stacklevel + 1)
    else:
        warnings.warn_explicit(message, category, loc.filename, loc.lineno)


class WarnOnce:
    """Warnings of one owner, each (site, text) warned once."""

    __slots__ = ("_warned",)

    def __init__(self) -> None:
        self._warned: set[tuple] = set()

    def warn(self, message: str, loc: SourceLoc | None, category: type[Warning] = NddTraceWarning,
             stacklevel: int = 1, key: tuple | None = None) -> bool:
        """Warn unless this site (`key`, by default the line and the text) has warned; whether
        it did. `stacklevel` as for `warn`, from this method's caller."""
        site = key if key is not None else (
            loc.filename if loc else None, loc.lineno if loc else None, message)
        if site in self._warned:
            return False
        self._warned.add(site)
        warn(message, loc, category, stacklevel + 1)
        return True


class Ledger:
    """One owner's record: its counters, its latest verdicts, its warnings (each once)."""

    KEPT = 32  # verdicts kept for explain

    def __init__(self, name: str, category: type[Warning] = NddTraceWarning):
        self.name = name
        self.category = category
        self.counters = Counters()
        self.verdicts: collections.deque[Verdict] = collections.deque(maxlen=self.KEPT)
        # (what ran eagerly, reason, file:line) -> calls: every one, for transparent mode's report
        self.tallies: collections.Counter = collections.Counter()
        self._once = WarnOnce()
        self._lock = threading.Lock()

    def count(self, verdict: Verdict) -> None:
        """A call that does not run as compiled, for a reason already said (its unit's)."""
        self.counters.fallbacks += 1
        self.verdicts.append(verdict)

    def tally(self, what: str, verdict: Verdict) -> None:
        """A call of `what` (an op, a chain of them) not run as compiled: counted and kept as
        `count` does, and tallied by what, reason and line (all threads)."""
        with self._lock:
            self.count(verdict)
            self.tallies[(what, verdict.reason, site_of(verdict.loc))] += 1

    def record(self, verdict: Verdict, *, warning: str | None = None, once: bool = True,
               log: str | None = None, stacklevel: int = 1, key: tuple | None = None) -> None:
        """A call that does not run as compiled: counted, kept, logged (`log`, default the
        reason) and, with `warning`, warned at the verdict's line (`once`: each site once)."""
        self.count(verdict)
        logs.fallbacks.info("`%s`: %s", self.name, log or verdict.reason)
        if warning is not None:
            if once:
                self._once.warn(warning, verdict.loc, self.category, stacklevel + 1, key)
            else:
                warn(warning, verdict.loc, self.category, stacklevel + 1)

    def warn(self, message: str, loc: SourceLoc | None, stacklevel: int = 1) -> None:
        warn(message, loc, self.category, stacklevel + 1)

    def warn_once(self, message: str, loc: SourceLoc | None, stacklevel: int = 1,
                  key: tuple | None = None) -> bool:
        return self._once.warn(message, loc, self.category, stacklevel + 1, key)

    def clear(self) -> None:
        self.counters = Counters()
        self.verdicts.clear()
        self.tallies.clear()
