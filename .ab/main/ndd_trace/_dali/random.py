"""Random generators: ndd's default generator, its state words, snapshots and replays."""

from __future__ import annotations

from typing import Any

import numpy as np

from nvidia.dali.experimental.dynamic import random as ndd_random

from .base import RNG, STATE_WORDS


def default_rng() -> RNG:
    return ndd_random.get_default_rng()


def existing_default_rng() -> RNG | None:
    """This thread's default generator if ndd has made it yet, else None (making one draws its
    seed from Python's `random`: eager ndd does that at its first random op, not before)."""
    return getattr(ndd_random._thread_local, "default_rng", None)


def forget_default_rng() -> None:
    """Drop this thread's default generator: the next random op makes a new one, as ndd does."""
    vars(ndd_random._thread_local).pop("default_rng", None)


def resolve_rng(rng: Any) -> RNG:
    return ndd_random._resolve_rng(rng)


def draw_state(rng: RNG) -> np.ndarray:
    """Draw one op call's Philox state exactly as an eager ndd random op does (its
    `_STATE_WORDS` calls of `rng()`, done here in one go for a plain RNG)."""
    if type(rng) is not RNG or STATE_WORDS != 7:
        return np.array(ndd_random._draw_state(rng), dtype=np.uint32)
    rng._on_draw()  # what each rng() call does first: idempotent (capture mode's hook)
    if rng._pending_draws:
        rng._flush_pending()
    word = rng._rng.next
    words = np.array((word(), word(), word(), word(), word(), word(), word()), dtype=np.uint32)
    rng._draws += 7
    return words


def rng_snapshot(rng: RNG) -> Any:
    return str(rng.get_state()), rng._draws, rng._version


def rng_restore(rng: RNG, snapshot: Any) -> None:
    state, draws, version = snapshot
    rng.set_state(state)
    rng._draws = draws
    rng._version = version


def rng_position(rng: RNG) -> tuple[int, int]:
    return rng._draws, rng._version


def rng_clone(rng: RNG) -> RNG:
    return rng.clone()


def rng_advance(rng: RNG, words: int) -> None:
    rng.advance(words)


class ReplayRNG(RNG):
    """A generator that hands out random words drawn earlier: replays one op call's state."""

    def __init__(self, words: np.ndarray):
        super().__init__(seed=0)
        self._words = [int(w) for w in words]

    def __call__(self) -> int:
        return self._words.pop(0)
