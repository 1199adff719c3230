"""Per-sample functions: one pipeline run per batch gives, sample for sample, the eager loop."""

from __future__ import annotations

import warnings

import numpy as np
import nvidia.dali.experimental.dynamic as ndd
import pytest
from conftest import assert_same

import ndd_trace
from ndd_trace.per_sample import PerSampleError


@pytest.fixture
def images():
    rng = np.random.default_rng(0)
    sizes = [(40, 48), (44, 52), (48, 52), (52, 54), (30, 60)]
    return ndd.batch([rng.integers(0, 200, size=(h, w, 3)).astype(np.uint8) for h, w in sizes],
                     layout="HWC")


def eager_loop(function, *args):
    """The reference: the plain function called on each sample, gathered into batches."""
    results = [function(*[a.select(i) if isinstance(a, ndd.Batch) else a for a in args])
               for i in range(args[0].batch_size)]
    if isinstance(results[0], tuple):
        return tuple(ndd.batch([r[k] for r in results]) for k in range(len(results[0])))
    return ndd.batch(results)


def check(function, *args, seeds=(0, 1, 2)):
    """Compiled per-sample calls equal the eager per-sample loop, values and RNG state."""
    compiled = ndd.compile(function, per_sample=True)
    for seed in seeds:
        ndd.random.set_seed(seed)
        expected = eager_loop(function, *args)
        state = str(ndd.random.get_default_rng().state)
        ndd.random.set_seed(seed)
        with warnings.catch_warnings():
            warnings.simplefilter("error", ndd_trace.NddTraceWarning)
            actual = compiled(*args)
        assert str(ndd.random.get_default_rng().state) == state
        assert_same(expected, actual)
    assert compiled.builds == 1
    return compiled


def augment(image):
    flip = ndd.random.coin_flip(probability=0.5)
    noise = ndd.random.uniform(range=[0, 4], shape=[1])
    if flip.item():
        image = ndd.flip(image, horizontal=1)
    if image.shape[0] > 45:  # per-sample, data-dependent
        image = ndd.resize(image, size=[20, 20])
    elif image.shape[1] > 50 and not image.shape[0] < 35:
        image = ndd.flip(image, vertical=1)
    else:
        image = ndd.resize(image, size=[10, 10])
    return image, flip, noise


def test_branches_and_random_ops_match_the_eager_loop(images):
    compiled = check(augment, images)
    assert "_ndd_condition" in compiled.converted_source


def test_conditional_expression_and_return_in_branch(images):
    def pick(image):
        flip = ndd.random.coin_flip(probability=0.5)
        mirrored = ndd.flip(image, horizontal=1) if flip.item() else image
        if image.shape[1] > 50 or image.shape[0] >= 52:
            return ndd.resize(mirrored, size=[6, 6])
        return ndd.resize(image, size=[6, 6])

    check(pick, images)


def test_python_values_branch_as_python(images):
    def scaled(image, big):
        if big and image.shape[0] > 40:  # `big` is a Python bool: an ordinary branch
            return ndd.resize(image, size=[12, 12])
        return ndd.resize(image, size=[4, 4])

    check(scaled, images, True)
    check(scaled, images, False)


def test_item_comparison_is_pythons(images):
    def threshold(image):
        value = ndd.random.uniform(range=[0, 1])
        if value.item() > 0.1:  # compared in float64, as Python compares the float
            return ndd.flip(image, horizontal=1), value
        return image, value

    check(threshold, images, seeds=range(4))


def test_bare_tensor_in_if_raises_suggesting_item(images):
    @ndd.compile(per_sample=True)
    def trap(image):
        flip = ndd.random.coin_flip()
        if flip:  # TRAP
            image = ndd.flip(image)
        return image

    with pytest.raises(PerSampleError, match=r"\.item\(\)") as info:
        trap(images)
    assert f"test_per_sample.py:{trap.__wrapped__.__code__.co_firstlineno + 3}" in \
        str(info.value)


def test_while_on_per_sample_value_raises(images):
    @ndd.compile(per_sample=True)
    def loop(image):
        while image.shape[0] > 10:
            image = ndd.resize(image, size=[5, 5])
        return image

    with pytest.raises(PerSampleError, match="while") as info:
        loop(images)
    assert f"test_per_sample.py:{loop.__wrapped__.__code__.co_firstlineno + 2}" in \
        str(info.value)


def test_side_effect_in_branch_raises(images):
    seen = []

    @ndd.compile(per_sample=True)
    def effect(image):
        if image.shape[0] > 45:
            seen.append(1)
            image = ndd.flip(image)
        return image

    with pytest.raises(PerSampleError, match="Python object") as info:
        effect(images)
    line = effect.__wrapped__.__code__.co_firstlineno + 3  # (the decorator's line first)
    assert f"at line {line}" in str(info.value)


def test_python_arithmetic_on_per_sample_number_raises(images):
    @ndd.compile(per_sample=True)
    def half(image):
        return ndd.resize(image, size=[image.shape[0] / 2, 8])

    with pytest.raises(PerSampleError, match="Python value"):
        half(images)


def test_random_op_in_branch_runs_the_eager_loop_and_says_so(images):
    def rotate_some(image):
        if ndd.random.coin_flip(probability=0.5).item():
            image = ndd.rotate(image, angle=ndd.random.uniform(range=[-10, 10]))
        return image

    compiled = ndd.compile(rotate_some, per_sample=True)
    ndd.random.set_seed(5)
    expected = eager_loop(rotate_some, images)
    ndd.random.set_seed(5)
    with pytest.warns(ndd_trace.NddTraceWarning, match="eager per-sample loop.*branch"):
        actual = compiled(images)
    assert_same(expected, actual)


def test_explain_shows_the_rewritten_function(images):
    compiled = ndd.compile(augment, per_sample=True)
    code = ndd_trace.explain(compiled, images).code
    assert "def augment(image):" in code
    assert "if _ndd_condition(_ndd_attribute(flip, 'item'" in code.replace("((", "(")


def test_closures_and_second_batch_size(images):
    size = [7, 7]

    def closure(image):
        if image.shape[0] > 45:
            return ndd.resize(image, size=size)
        return ndd.resize(ndd.flip(image), size=size)

    compiled = check(closure, images)
    smaller = ndd.batch([np.asarray(images.select(i)) for i in range(2)], layout="HWC")
    assert_same(eager_loop(closure, smaller), compiled(smaller))
    assert compiled.builds == 1  # a smaller batch reuses the pipeline


@pytest.mark.gpu
def test_gpu_batch_matches_the_eager_loop(images):
    def on_gpu(image):
        flip = ndd.random.coin_flip(probability=0.5)
        if image.shape[0] > 45:
            image = ndd.resize(image, size=[16, 16])
        else:
            image = ndd.resize(ndd.flip(image, vertical=1), size=[16, 16])
        return image, flip

    check(on_gpu, images.gpu())
