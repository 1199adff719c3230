"""Epochs opened by a compiled generator's loop (modes/loop.py).

    with opening_loop_epochs():       # the loop pulls its next item
        next(generator)               # reader epochs it opens read through their streams
    in_compiled_loop()                # True in there (calls.py asks)

While a compiled loop pulls its next item, the reader epochs it opens read through streams from
the first one (unless the reader must stay eager: checkpointing, tensor arguments). A loop over
`source.captured(...)` is DALI's capture mode's (loop.py does not compile it).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

_opening = threading.local()  # .active: a compiled loop is pulling its next item; .stand_in


@contextmanager
def opening_loop_epochs(stand_in: Callable[[Any, int], Any] | None = None) -> Iterator[None]:
    """While active, the epochs this thread opens are a compiled loop's (see above); with
    `stand_in`, each is one step of `stand_in(reader, batch_size)` instead, and nothing is
    read (export describes a loop so)."""
    previous = getattr(_opening, "active", False), getattr(_opening, "stand_in", None)
    _opening.active, _opening.stand_in = True, stand_in or previous[1]
    try:
        yield
    finally:
        _opening.active, _opening.stand_in = previous


def in_compiled_loop() -> bool:
    return getattr(_opening, "active", False)


def loop_stand_in() -> Callable | None:
    return getattr(_opening, "stand_in", None) if in_compiled_loop() else None
