"""Epochs opened by a compiled generator's loop (modes/loop.py).

    with opening_loop_epochs():       # the loop pulls its next item
        next(generator)               # reader epochs it opens read through their streams
    in_compiled_loop()                # True in there (calls.py asks)

While a compiled loop pulls its next item, the reader epochs it opens read through streams from
the first one (unless the reader must stay eager: checkpointing, tensor arguments). A loop over
`source.captured(...)` is DALI's capture mode's (loop.py does not compile it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from ..core import process_state



@contextmanager
def opening_loop_epochs(stand_in: Callable[[Any, int], Any] | None = None) -> Iterator[None]:
    """While active, the epochs this thread opens are a compiled loop's (see above); with
    `stand_in`, each is one step of `stand_in(reader, batch_size)` instead, and nothing is
    read (export describes a loop so)."""
    opening = process_state.loop_opening
    previous = getattr(opening, "active", False), getattr(opening, "stand_in", None)
    opening.active, opening.stand_in = True, stand_in or previous[1]
    try:
        yield
    finally:
        process_state.loop_opening.active, process_state.loop_opening.stand_in = previous


def in_compiled_loop() -> bool:
    return getattr(process_state.loop_opening, "active", False)


def loop_stand_in() -> Callable | None:
    return getattr(process_state.loop_opening, "stand_in", None) if in_compiled_loop() else None
