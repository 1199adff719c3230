"""Random ops give eager's values and leave each generator where eager leaves it: one value
drawn for a whole batch, the generators a call is given (one in two places, then two), and the
state a compiled call draws (ndd_trace/_dali/random.py)."""

from __future__ import annotations

import numpy as np
import nvidia.dali.experimental.dynamic as ndd
from harness import assert_matches_eager, assert_same

import ndd_trace  # noqa: F401 (ndd.compile)


def test_one_value_random_op_among_batches(uniform_batch):
    """A random op without batch_size draws one value for all samples, eagerly.

    Found in review: it once gave a silently wrong result."""
    def f(x):
        return (ndd.flip(x, horizontal=ndd.random.coin_flip(probability=0.5)),
                ndd.rotate(x, angle=ndd.random.uniform(range=[-90, 90])),
                ndd.cast(x, dtype=ndd.float32) + ndd.random.uniform(range=[0, 1]))

    assert_matches_eager(f, uniform_batch, modes=("compiled", "transparent"), seed=1,
                         warn="ignore")


def test_same_rng_in_two_slots_then_different_generators(uniform_batch):
    """One generator given for two parameters, then two generators: the second call does not
    reuse the first's trace, and each generator is left where eager leaves it (found in review:
    it once gave a silently wrong result)."""
    def f(x, r1, r2):
        return (ndd.random.uniform(batch_size=x.batch_size, rng=r1),
                ndd.random.uniform(batch_size=x.batch_size, rng=r2))

    compiled = ndd.compile(f)
    shared = ndd.random.RNG(seed=3)
    compiled(uniform_batch, shared, shared)
    eager_a, eager_b = ndd.random.RNG(seed=10), ndd.random.RNG(seed=20)
    a, b = ndd.random.RNG(seed=10), ndd.random.RNG(seed=20)
    assert_same(f(uniform_batch, eager_a, eager_b), compiled(uniform_batch, a, b))
    assert str(a.state) == str(eager_a.state) and str(b.state) == str(eager_b.state)


def test_state_draw_matches_eager_words_and_position():
    """The per-call state draw gives the words of seven `rng()` calls, and leaves the
    generator where they do (pending advances applied first, as `rng()` applies them).

    Found in review: it once gave a silently wrong result."""
    from ndd_trace import _dali

    rng = ndd.random.RNG(seed=1234)
    rng.advance(5)  # pending: applied by the next draw
    twin = rng.clone()
    draws, version = _dali.rng_position(rng)
    words = _dali.draw_state(rng)
    assert words.dtype == np.uint32
    assert [int(w) for w in words] == [twin() for _ in range(7)]
    assert _dali.rng_position(rng) == (draws + 7, version)
    assert rng() == twin()
