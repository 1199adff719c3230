"""Logging: one `logging.getLogger("ndd_trace")` hierarchy, one channel per kind of event.

    NDD_TRACE_LOGS=recompiles,breaks python train.py      # re-traces with their reason, breaks
    NDD_TRACE_LOGS=all python -m ndd_trace train.py        # every channel at INFO
    NDD_TRACE_LOGS=+builds,-runtime python train.py        # builds at DEBUG, runtime quiet

    import logging                                         # or standard configuration
    logging.basicConfig()
    logging.getLogger("ndd_trace.recompiles").setLevel(logging.INFO)

Channels (loggers `ndd_trace.<channel>`): `trace` (traces and their op counts), `recompiles`
(re-traces with what changed), `breaks` (graph breaks), `fallbacks` (calls not compiled whole:
transparent mode or eager), `builds` (pipeline builds and their times), `runtime` (compiled
calls and loop epochs), `transparent` (regions of transparent mode, calls it ran eagerly,
readers read ahead), `cache` (the warm-start cache of NDD_TRACE_CACHE_DIR: loads, saves).
Warnings stay warnings; these logs are for the curious. Nothing is printed
unless NDD_TRACE_LOGS is set or the application sets a level on the "ndd_trace" logger or a
channel: as torch's loggers under TORCH_LOGS, they stay quiet under a root logger configured
for INFO (`logging.basicConfig(level=logging.INFO)` prints the application's lines only).
"""

from __future__ import annotations

import logging
import os
import sys
from types import MappingProxyType

from . import process_state


CHANNELS = ("trace", "recompiles", "breaks", "fallbacks", "builds", "runtime", "transparent",
            "cache", "tuning")
_ALIASES = MappingProxyType({"recompile": "recompiles", "break": "breaks",
                             "graph_breaks": "breaks", "fallback": "fallbacks", "build": "builds",
                             "traces": "trace"})
ENV_VAR = "NDD_TRACE_LOGS"

root = logging.getLogger("ndd_trace")
root.addHandler(logging.NullHandler())  # a library prints nothing unless asked
if root.level == logging.NOTSET:
    # not the root logger's level: an application that logs its own INFO lines does not get
    # ndd_trace's in its output; a level the user sets on "ndd_trace" (before or after this)
    # or on a channel, or NDD_TRACE_LOGS, switches them on
    root.setLevel(logging.WARNING)
trace = logging.getLogger("ndd_trace.trace")
recompiles = logging.getLogger("ndd_trace.recompiles")
breaks = logging.getLogger("ndd_trace.breaks")
fallbacks = logging.getLogger("ndd_trace.fallbacks")
builds = logging.getLogger("ndd_trace.builds")
runtime = logging.getLogger("ndd_trace.runtime")
transparent = logging.getLogger("ndd_trace.transparent")
cache = logging.getLogger("ndd_trace.cache")
tuning = logging.getLogger("ndd_trace.tuning")



def parse(text: str) -> dict[str, int]:
    """Channel -> level from an NDD_TRACE_LOGS value, in the spirit of TORCH_LOGS:
    `name` logs at INFO, `+name` at DEBUG, `-name` only errors; `all` names every channel.
    Raises ValueError naming an unknown channel and listing the known ones."""
    levels, unknown = parse_known(text)
    if unknown:
        raise ValueError(unknown_text(unknown))
    return levels


def parse_known(text: str) -> tuple[dict[str, int], list[str]]:
    """`parse`, leniently: the levels of the known channels, and the unknown names as given."""
    levels: dict[str, int] = {}
    unknown: list[str] = []
    for item in (part.strip() for part in text.replace(";", ",").split(",")):
        if not item:
            continue
        level = logging.INFO
        if item[0] in "+-":
            level = logging.DEBUG if item[0] == "+" else logging.ERROR
            item = item[1:].strip()
        name = _ALIASES.get(item.lower(), item.lower())
        if name == "all":
            levels.update(dict.fromkeys(CHANNELS, level))
        elif name in CHANNELS:
            levels[name] = level
        else:
            unknown.append(item)
    return levels, unknown


def unknown_text(unknown: list[str]) -> str:
    names = ", ".join(repr(name) for name in unknown)
    return (f"{ENV_VAR}: unknown channel{'s' if len(unknown) > 1 else ''} {names}; known: all, "
            f"{', '.join(CHANNELS)} (prefix + for DEBUG, - to silence)")


def configure(levels: dict[str, int], stream: object | None = None) -> None:
    """Set the channels' levels and print them on `stream` (stderr), one line per event."""
    for name, level in levels.items():
        logging.getLogger(f"ndd_trace.{name}").setLevel(level)
    if not process_state.log_handler:
        handler = logging.StreamHandler(stream or sys.stderr)
        handler.setFormatter(logging.Formatter("[%(name)s] %(message)s"))
        process_state.log_handler.append(handler)
        root.addHandler(handler)
        root.propagate = False  # printed once, even when the application also logs to stderr


def configure_from_environment() -> str | None:
    """Apply NDD_TRACE_LOGS, if set. An unknown channel (a typo) is not a crash, nor does it
    cost the valid ones: they are applied, and the returned text names the unknown ones and
    what was applied (the caller warns at the user's `import ndd_trace`)."""
    text = os.environ.get(ENV_VAR, "")
    if not text.strip():
        return None
    levels, unknown = parse_known(text)
    configure(levels)
    if not unknown:
        return None
    applied = ", ".join(f"{name}{_LEVEL_MARK[level]}" for name, level in levels.items())
    return (f"{unknown_text(unknown)}. Ignored the unknown; applied: {applied or 'none'} "
            f"(from {ENV_VAR}={text!r}).")


_LEVEL_MARK = MappingProxyType({logging.INFO: "", logging.DEBUG: " (DEBUG)",
                               logging.ERROR: " (silenced)"})
