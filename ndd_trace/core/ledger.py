"""The one sink of what ndd_trace tells its user: every warning goes out through `warn`.

    warn("ndd_trace: `f` cannot be compiled whole: ...", loc)     # at the user's file:line
    once = WarnOnce(); once.warn(message, loc)                      # each (site, text) once

A warning names the user's line where one is known (`warnings.warn_explicit` at `loc`), so the
user sees their own code in it, not ndd_trace's; without one it is attributed `stacklevel`
frames above the caller, as `warnings.warn` would.
"""

from __future__ import annotations

import warnings

from .errors import NddTraceWarning
from .source import SourceLoc


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
