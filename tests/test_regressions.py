"""Regression tests for problems found in review; each once gave a silently wrong result."""

from __future__ import annotations

import collections
import itertools
import random
import warnings

import numpy as np
import nvidia.dali.experimental.dynamic as ndd
import pytest
from harness import (Fresh, Step, assert_compiles_exactly, assert_matches_eager, assert_same,
                     to_numpy)

import ndd_trace


@pytest.fixture
def uniform_batch():
    return ndd.as_batch([np.arange(48, dtype=np.uint8).reshape(4, 4, 3)] * 4, layout="HWC")


def test_one_value_random_op_among_batches(uniform_batch):
    """A random op without batch_size draws one value for all samples, eagerly."""
    def f(x):
        return (ndd.flip(x, horizontal=ndd.random.coin_flip(probability=0.5)),
                ndd.rotate(x, angle=ndd.random.uniform(range=[-90, 90])),
                ndd.cast(x, dtype=ndd.float32) + ndd.random.uniform(range=[0, 1]))

    assert_matches_eager(f, uniform_batch, modes=("compiled", "transparent"), seed=1,
                         warn="ignore")


def test_user_buffers_are_read_at_the_call():
    arrays = [np.full((16, 16, 3), 1, np.float32) for _ in range(4)]
    compiled = ndd.compile(lambda t: t * 2)
    for _ in range(5):
        for a in arrays:
            a[...] = 1
        result = compiled(ndd.as_batch(arrays, layout="HWC"))
        for a in arrays:
            a[...] = 5  # the caller reuses its buffers right after the call
        assert float(np.asarray(result.select(3)).ravel()[-1]) == 2.0


def test_same_rng_in_two_slots_then_different_generators(uniform_batch):
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


def test_lazy_tensor_fields():
    t = ndd.as_tensor(np.arange(6, dtype=np.float32))
    with ndd_trace.enabled():
        u = t * 2
        u.evaluate()
        assert u.dtype == ndd.float32 and (t * 4).shape == (6,)
        np.testing.assert_array_equal(np.asarray(ndd.as_tensor(t * 3)),
                                      np.arange(6, dtype=np.float32) * 3)
        stacked = ndd.batch([t * 3, t * 3 + 1])  # ndd copies the lazy tensors' fields
        np.testing.assert_array_equal(np.asarray(ndd.as_tensor(stacked))[1],
                                      np.arange(6, dtype=np.float32) * 3 + 1)


@pytest.mark.parametrize("use", ["range", "divmod", "pos", "floor", "zeros", "slice", "format",
                                 "round", "bit_length"])
def test_batch_size_uses_in_python_specialize(use, images):
    import math

    uses = {
        "range": lambda n: len(range(n)), "divmod": lambda n: divmod(n, 3)[0],
        "pos": lambda n: +n, "floor": lambda n: math.floor(n),
        "zeros": lambda n: np.zeros(n).size, "slice": lambda n: len(([1] * 9)[:n]),
        "format": lambda n: "%d" % n, "round": lambda n: round(n),
        "bit_length": lambda n: n.bit_length(),
    }

    def f(x):
        return ndd.flip(x), uses[use](x.batch_size)

    compiled = ndd.compile(f)
    for n in (4, 2, 3):
        data = ndd.as_batch(images[:n], layout="HWC")
        assert compiled(data)[1] == f(data)[1]


def test_negative_zero_is_not_zero(batch):
    def g(x, c):
        return 1.0 / (ndd.cast(x, dtype=ndd.float32) * c)

    compiled = ndd.compile(g)
    compiled(batch, 0.0)
    assert_same(g(batch, -0.0), compiled(batch, -0.0))


def test_dict_with_list_of_batches(images):
    @ndd.compile
    def f(inputs):
        return ndd.flip(inputs["xs"][0], horizontal=1)

    for layout in ["HWC", "CHW", "HWC"]:
        data = ndd.as_batch([np.zeros((2, 2, 3), np.float32)] * 2, layout=layout)
        assert f({"xs": [data]}).layout == layout
    assert f.cache_info().traces == 2


def test_readers_of_different_lengths_zip_as_eager(tmp_path):
    """zip() over readers of different lengths stops at the shortest, having taken one more
    batch from the readers before it; the next epochs go on from there, as eagerly."""
    from benchmarks._data import make_jpeg_dir

    long_root = make_jpeg_dir(tmp_path / "long", n=13)
    short_root = make_jpeg_dir(tmp_path / "short", n=8)

    def two(a, c):
        for (x, lx), (y, ly) in zip(a.next_epoch(batch_size=3), c.next_epoch(batch_size=3)):
            yield lx * 10 + ly

    def readers():
        return ndd.readers.File(file_root=str(long_root)), \
            ndd.readers.File(file_root=str(short_root))

    def three_epochs(function, readers):
        return [list(function(*readers)) for _ in range(3)]

    assert_matches_eager(three_epochs, Step(two), Fresh(readers), modes=("step",))


def test_swallowed_graph_break_is_still_a_break(batch):
    def g(x):
        try:
            h = x.shape[0][0]
        except BaseException:  # noqa: BLE001 (what a careless user writes)
            h = 1
        return ndd.crop(x, crop=(h, h))

    with pytest.warns(ndd_trace.NddTraceWarning):
        result = ndd.compile(g)(batch)
    assert_same(g(batch), result)


class Scale:
    factor = 2.0


def test_class_attribute_guard(batch):
    @ndd.compile
    def f(x):
        return ndd.cast(x, dtype=ndd.float32) * Scale.factor

    f(batch)
    Scale.factor = 3.0
    try:
        assert_same(ndd.cast(batch, dtype=ndd.float32) * 3.0, f(batch))
    finally:
        Scale.factor = 2.0
    assert to_numpy(f(batch)) is not None


def test_a_failed_earlier_run_does_not_break_the_next_call(jpeg_bytes):
    """Found by review: a run that failed and was not consumed yet dropped the pipeline while
    the next call was being fed ('NoneType' has no attribute ...). The next call must succeed,
    and the failed result still raises when consumed."""
    import numpy as np

    @ndd.compile
    def decode(data):
        return ndd.resize(ndd.decoders.image(data), size=[8, 8])

    # copies (ndd.batch): data given as it is (ndd.as_batch) would fail at the call, as eagerly
    good = ndd.batch(jpeg_bytes[:2])
    bad = ndd.batch([np.frombuffer(b"\xff\xd8\xff not a jpeg" * 8, dtype=np.uint8)] * 2)
    decode(good).evaluate()  # traced and built
    failed = decode(bad)  # fails in the pipeline; not consumed yet
    result = decode(good)
    assert_same(ndd.resize(ndd.decoders.image(good), size=[8, 8]), result)
    with pytest.raises(Exception):
        failed.evaluate()


def test_state_draw_matches_eager_words_and_position():
    """The per-call state draw gives the words of seven `rng()` calls, and leaves the
    generator where they do (pending advances applied first, as `rng()` applies them)."""
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


def test_nan_and_infinite_static_arguments_keep_their_bits():
    """A NaN's sign is part of the value DALI pads with: a compiled function called with
    `nan` and then `-nan` (`inf - inf`) must not reuse the first trace (guards), a region must
    not reuse the first pipeline (region keys), and the pipeline must build (NaN literals in
    the generated code) rather than fall back. (rotate's `fill_value` is a fixed argument;
    `pad`'s, a tensor argument, is passed as data when held in a variable, as eagerly.)"""
    import math

    def pad(x, value):
        return ndd.rotate(x, angle=45.0, fill_value=value, keep_size=True)

    data = ndd.as_batch([np.zeros((4, 4, 1), np.float32)], layout="HWC")
    compiled = ndd.compile(pad)
    values = [math.nan, math.inf - math.inf, math.nan, math.inf, -math.inf, -0.0, 0.0]
    ndd_trace.reset_report()
    with warnings.catch_warnings():
        warnings.simplefilter("error", ndd_trace.NddTraceWarning)  # no eager fallback
        for value in values:
            eager = np.asarray(pad(data, value).select(0).cpu()).view(np.uint32)
            traced = np.asarray(compiled(data, value).select(0).cpu()).view(np.uint32)
            with ndd_trace.enabled():
                lazy = np.asarray(pad(data, value).select(0).cpu()).view(np.uint32)
            assert eager.tolist() == traced.tolist() == lazy.tolist(), value
    assert compiled.cache_info().fallbacks == 0
    assert "fill_value=-nan" in str(ndd_trace.report())  # the regions say what tells them apart


def test_list_parameter_for_a_tensor_argument_as_in_eager(uniform_batch):
    """A list passed in through a parameter is a per-call tensor argument eagerly (DALI's call
    site analysis), so a compiled function feeds it as data too: a 2x3 matrix works, a flat
    one is rejected by DALI, and a literal at the call is a construction argument."""
    def warp(x, matrix, size):
        moved = ndd.warp_affine(x, matrix=matrix)
        return ndd.resize(ndd.warp_affine(moved, matrix=[1.0, 0, 0, 0, 1, 0]), size=size)

    compiled = ndd.compile(warp)
    for matrix, size in [([[1.0, 0, 1], [0, 1, 2]], [3, 5]), ([[1.0, 0, 2], [0, 1, 1]], (2, 2)),
                         ([[1.0, 0, 2], [0, 1, 1]], (2, 2))]:
        eager = to_numpy(warp(uniform_batch, matrix, size))
        traced = to_numpy(compiled(uniform_batch, matrix, size))
        assert_same(eager, traced)
    with pytest.raises(RuntimeError, match="Affine mapping parameters"):
        to_numpy(warp(uniform_batch, [1.0, 0, 1, 0, 1, 2], [3, 5]))
    with pytest.raises(RuntimeError, match="Affine mapping parameters"):
        to_numpy(compiled(uniform_batch, [1.0, 0, 1, 0, 1, 2], [3, 5]))
    assert compiled.cache_info().fallbacks == 0


# numpy's default float dtype, as a mean or std computed with numpy has it: DALI's Constant holds
# no doubles (found by a differential sweep of ordinary training scripts)
_MEAN_F64 = np.array([100.0, 110.0, 120.0])          # exact in float32: written into the code
_STD_F64 = np.array([58.395, 57.12, 57.375])         # not exact in float32: fed
_WEIGHTS_F64 = np.array([[0.5, 0.25], [2.0, 4.0]])  # 2-D, exact


def _normalize_f64(x):
    a = ndd.crop_mirror_normalize(x, mean=_MEAN_F64, std=_STD_F64)
    b = ndd.cast(x.slice[:2, :2, 0], dtype=ndd.float64) * _WEIGHTS_F64
    return a, b - np.array([1.5, 3.0]), b + np.array([1e-300, 0.1])


def test_float64_numpy_constants(uniform_batch):
    assert_compiles_exactly(_normalize_f64, uniform_batch, calls=2)


def test_float64_numpy_constants_in_a_compiled_generator(jpeg_dir):
    def epochs(reader):
        for jpegs, _ in reader.next_epoch(batch_size=4):
            images = ndd.decoders.image(jpegs)
            images = ndd.resize(images, size=[16, 16])
            yield ndd.crop_mirror_normalize(images, mean=_MEAN_F64, std=_STD_F64)

    runs = assert_matches_eager(epochs, Fresh(lambda: ndd.readers.File(file_root=str(jpeg_dir))),
                                modes=("loop",))
    steps = runs["eager"].result
    assert len(steps) > 1 and all(a.dtype == np.float32 for s in steps for a in s.samples)


def test_float64_numpy_constants_in_transparent_mode(uniform_batch):
    assert_matches_eager(_normalize_f64, uniform_batch, modes=("transparent",))


# A compiled function's Python runs at its trace only: a call known to be impure (print, next,
# random, time, logging, numpy.random) would run once, silently. It runs in transparent mode
# instead, its Python at every call (found by a differential sweep of ordinary training scripts).
_effects_counter = None


def _step_with_effects(x, printed):
    k = next(_effects_counter)
    printed.append(k)  # (a list the caller sees: the guards alone would re-trace every call)
    if random.random() < 0.5:  # the torchvision idiom: a Python coin for a flip
        x = ndd.flip(x, horizontal=1)
    return ndd.cast(x, dtype=ndd.float32) * float(np.random.uniform(0.5, 1.5)), k


def _effects_run(function, x, calls=6):
    global _effects_counter
    _effects_counter = itertools.count()
    random.seed(7)
    np.random.seed(7)
    printed: list = []
    outputs = [function(x, printed) for _ in range(calls)]
    return outputs, printed, random.random(), np.random.random()


def test_python_effects_in_a_compiled_function_run_at_every_call(uniform_batch):
    eager = _effects_run(_step_with_effects, uniform_batch)
    compiled = ndd.compile(_step_with_effects)
    with pytest.warns(ndd_trace.NddTraceWarning, match="calls `next`.*transparent mode") as seen:
        result = _effects_run(compiled, uniform_batch)
    assert seen[0].filename == __file__  # at the user's line of the call
    assert_same(eager[0], result[0])
    assert eager[1:] == result[1:]  # the counter's values, the RNG states after
    text = str(ndd_trace.explain(compiled, uniform_batch, []))
    assert "calls `next`" in text and "test_regressions.py:" in text


def test_python_effects_in_a_helper_are_found(uniform_batch):
    import logging
    log = logging.getLogger("ndd_trace.tests.effects")

    def augment(x):
        log.debug("augmenting")
        return ndd.flip(x, horizontal=1)

    def step(x):
        return augment(x)

    with pytest.raises(ndd_trace.GraphBreakError, match="calls `augment`, which calls "
                       "`log.debug`"):
        ndd.compile(step, fullgraph=True)(uniform_batch)
    with pytest.warns(ndd_trace.NddTraceWarning):
        assert_same(step(uniform_batch), ndd.compile(step)(uniform_batch))


_SETTINGS = {"scale": 2.0}
_effects_log = collections.deque(maxlen=100)  # guarded by identity only: a change goes unseen


def _log_step(message):
    _effects_log.append(message)


def test_a_global_deque_appended_to_by_a_helper(uniform_batch):
    def step(x):
        _log_step("step")
        return ndd.flip(x, horizontal=1)

    _effects_log.clear()
    eager = [step(uniform_batch) for _ in range(3)]
    assert len(_effects_log) == 3
    _effects_log.clear()
    compiled = ndd.compile(step)
    with pytest.warns(ndd_trace.NddTraceWarning, match="calls `_log_step`, which calls "
                      "`_effects_log.append`"):
        results = [compiled(uniform_batch) for _ in range(3)]
    assert len(_effects_log) == 3
    assert_same(eager, results)


def test_pure_python_in_a_compiled_function_stays_compiled(uniform_batch):
    def helper(x, size):
        return ndd.resize(x, size=[size, size])

    def step(x, size=3):
        scale = float(np.mean(np.array([1.0, 2.0]))) * _SETTINGS.get("scale", 1.0)
        assert ",".join(["a", "b"]) and sorted([2, 1])
        outs = [ndd.flip(v, horizontal=1) for v in (x, x)]
        return ndd.cast(helper(outs[0], size), dtype=ndd.float32) * scale, len(outs), \
            x.batch_size

    assert_compiles_exactly(step, uniform_batch, calls=3)  # (NddTraceWarnings are errors: no break)


@pytest.mark.gpu
def test_float64_numpy_constants_on_the_gpu(uniform_batch):
    """float64 numpy constants given to GPU ops as eager takes them: as a CPU argument input
    (normalize's mean and std) and as a GPU tensor; a numpy array mixed into GPU arithmetic
    raises eager's ValueError in both (it ran on the H200 before landing; its first version
    mixed them and failed there, eagerly too)."""
    def on_gpu(x, scale):
        x = x.gpu()
        normalized = ndd.crop_mirror_normalize(x, mean=_MEAN_F64, std=_STD_F64)
        return normalized, ndd.cast(x, dtype=ndd.float64) * scale

    assert_compiles_exactly(on_gpu, uniform_batch,
                            ndd.as_tensor(np.array([0.5, 2.0, 4.0]), device="gpu"), calls=2)

    def mixed(x):
        return ndd.cast(x.gpu(), dtype=ndd.float64) * np.array([0.5, 2.0, 4.0])

    with pytest.raises(ValueError, match="Cannot mix GPU and CPU inputs") as eager:
        mixed(uniform_batch).evaluate()
    with pytest.raises(ValueError) as compiled:
        ndd.compile(mixed)(uniform_batch).evaluate()
    assert str(compiled.value) == str(eager.value)
