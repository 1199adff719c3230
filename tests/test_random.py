"""Random ops give eager's values and leave each generator where eager leaves it: one value
drawn for a whole batch, the generators a call is given (one in two places, then two), and the
state a compiled call draws (ndd_trace/_dali/random.py)."""

from __future__ import annotations

import random
import threading
import warnings

import numpy as np
import nvidia.dali.experimental.dynamic as ndd
from harness import assert_matches_eager, assert_runs_match, assert_same, run

import ndd_trace


def test_one_value_random_op_among_batches(uniform_batch):
    """A random op without batch_size draws one value for all samples, eagerly.

    Found in review: it once gave a silently wrong result."""
    def f(x):
        return (ndd.flip(x, horizontal=ndd.random.coin_flip(probability=0.5)),
                ndd.rotate(x, angle=ndd.random.uniform(range=[-90, 90])),
                ndd.cast(x, dtype=ndd.float32) + ndd.random.uniform(range=[0, 1]))

    assert_matches_eager(f, uniform_batch, modes=("compiled", "transparent"), seed=1,
                         warn="ignore")


def _transparent(function, *args):
    with ndd_trace.enabled():
        result = function(*args)
        result.evaluate()
    return result


def test_one_value_random_op_times_a_batch_of_one_then_larger():
    """A random op without `batch_size` (one value a call) times a batch of one sample, then of
    more: eager's values at every size, compiled and in transparent mode (found by an
    independent differential fuzzer, ../shared/repros/fuzz/12: after a first call of batch size
    1, larger batches drew per sample)."""
    def f(x):
        return ndd.random.uniform(range=[0, 1]) * x

    def ones(n):
        return ndd.as_batch([np.ones((2,), np.float32)] * n)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ndd_trace.NddTraceWarning)
        compiled = ndd.compile(f)
        for n in [1, 4, 1, 3]:
            eager = run(f, ones(n), seed=7, warn=None)
            for other in (compiled, lambda x: _transparent(f, x)):
                assert_runs_match(eager, run(other, ones(n), seed=7, warn=None))
    regions = [r for r in ndd_trace.report().regions if "uniform" in r.op_chain]
    # batches of one sample: a pipeline; of more: a region of its own, run eagerly
    assert {r.executable is None for r in regions} == {True, False}


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


def test_tracing_does_not_make_the_default_generator_before_eager_would():
    """Tracing (and `explain`) does not create ndd's default generator, which seeds itself from
    Python's `random`, before eager would: Python's draws after a call, and the generator's
    later values, are eager's (found by an independent differential fuzzer,
    ../shared/repros/fuzz/05)."""
    batch = ndd.as_batch([np.zeros((2, 2, 3), np.uint8)], layout="HWC")

    def step(x):
        return ndd.flip(x, horizontal=1)  # no random op

    def program(fn):
        random.seed(0)
        np.asarray(fn(batch).select(0))
        drawn = random.random()  # Python-side randomness after the call
        noise = ndd.random.uniform(range=[0, 1])  # the default generator, never seeded
        return drawn, float(np.asarray(noise))

    def in_a_new_thread(fn):  # (the default generator is per thread: a new one has none yet)
        result = []
        thread = threading.Thread(target=lambda: result.append(program(fn)))
        thread.start()
        thread.join()
        return result[0]

    compiled = ndd.compile(step)
    assert in_a_new_thread(step) == in_a_new_thread(compiled)
    assert compiled.cache_info().traces == 1

    def explained():
        random.seed(0)
        ndd_trace.explain(ndd.compile(step), batch)
        return random.random()

    def plain():
        random.seed(0)
        return random.random()

    result = []
    for target in (explained, plain):
        thread = threading.Thread(target=lambda t=target: result.append(t()))
        thread.start()
        thread.join()
    assert result[0] == result[1]




def _pick(batch_size, options, p=None):
    return ndd.random.choice(options, p=p, batch_size=batch_size)


def _picks_of_every_kind():
    ndd.random.set_seed(49)
    calls = [(4, [1, 2, 3]), (4, [1, 2, 3], [0.1, 0.1, 0.8]), (4, 5), (4, [1.5, 2.5]),
             (4, np.array([7, 8, 9], dtype=np.int16)), (3, np.array([1, 2], dtype=np.int64))]
    return [_pick(*arguments) for arguments in calls]


def test_choice_of_a_tensor_given_its_batch_size_as_eagerly():
    """Found by the twenty-seventh session's sweep: a random op given a Tensor (options) and a
    batch size, run eagerly by transparent mode (a fifth variant at one line, its first call
    eager), was called without its batch size: one sample, where eager gives four."""
    assert_matches_eager(_picks_of_every_kind, modes=("transparent",))
