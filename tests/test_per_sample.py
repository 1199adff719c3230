"""Per-sample functions: one pipeline run per batch gives, sample for sample, the eager loop."""

from __future__ import annotations

import functools
import itertools
import warnings

import numpy as np
import nvidia.dali.experimental.dynamic as ndd
import pytest
from harness import (assert_each_matches_eager, assert_matches_eager, assert_runs_match,
                     assert_same, rng_state, run, seeded)

import ndd_trace
from ndd_trace.modes.per_sample import PerSampleError


@pytest.fixture
def images():
    rng = np.random.default_rng(0)
    sizes = [(40, 48), (44, 52), (48, 52), (52, 54), (30, 60)]
    return ndd.batch([rng.integers(0, 200, size=(h, w, 3)).astype(np.uint8) for h, w in sizes],
                     layout="HWC")


# compiled per-sample calls equal the eager per-sample loop (values, RNG state), built once
check = functools.partial(assert_each_matches_eager, mode="per_sample", exact_paths=True)


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


def test_closure_cells_reach_the_rewritten_function(images):
    """A closure is rewritten inside a factory of its cells (built from `ast` nodes)."""
    limit, size = 45, [12, 12]

    def shrink(image):
        if image.shape[0] > limit:
            return ndd.resize(image, size=size)
        return ndd.resize(ndd.flip(image, horizontal=1), size=size)

    compiled = check(shrink, images)
    assert "limit, size):" in compiled.converted_source.split("\n")[0]


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


def test_side_effect_in_branch_runs_the_eager_loop(images):
    """A change to a Python object in a per-sample branch (once refused): the pipeline's one
    definition run would make it once; the eager per-sample loop makes it per sample taking
    the branch, as eagerly, and says so at the line."""
    seen = []

    @ndd.compile(per_sample=True)
    def effect(image):
        if image.shape[0] > 45:
            seen.append(1)
            image = ndd.flip(image)
        return image

    with pytest.warns(ndd_trace.NddTraceWarning, match="eager per-sample loop.*`seen.append`"):
        result = effect(images)
    assert len(seen) == sum(image.shape[0] > 45 for image in images)
    assert_same(effect.eager(images), result)


def test_python_arithmetic_on_per_sample_number_raises(images):
    @ndd.compile(per_sample=True)
    def half(image):
        return ndd.resize(image, size=[image.shape[0] / 2, 8])

    with pytest.raises(PerSampleError, match="Python value"):
        half(images)


def test_random_op_on_per_sample_data_runs_the_eager_loop_and_says_so(images):
    def noisy_some(image):
        if image.shape[0] > 45:
            image = ndd.noise.salt_and_pepper(image, prob=0.1)  # NOISE
        return image

    compiled = ndd.compile(noisy_some, per_sample=True)
    expected = run(noisy_some, images, seed=5, reference="per_sample")
    with seeded(5), pytest.warns(ndd_trace.NddTraceWarning,
                                 match="eager per-sample loop.*per-sample data") as record:
        actual = compiled(images)  # (called here: the warning points at this line's caller)
    assert_same(expected.result, actual)
    assert rng_state() == expected.rng
    line = noisy_some.__code__.co_firstlineno + 2
    assert [(w.filename, w.lineno) for w in record] == [(__file__, line)], \
        [(w.filename, w.lineno, str(w.message)) for w in record]


# ---------------------------------------------------------------------------------------------
# Random ops inside per-sample branches: the per-sample random stream

def headline(image):
    if ndd.random.coin_flip(probability=0.3).item():
        image = ndd.rotate(image, angle=ndd.random.uniform(range=[-10, 10]))
    if image.shape[0] > 45:
        image = ndd.resize(image, resize_shorter=40)
    return image


def make_images(batch_size, seed=0):
    rng = np.random.default_rng(seed)
    return ndd.batch([rng.integers(0, 200, size=(int(rng.integers(30, 60)),
                                                 int(rng.integers(30, 60)), 3)).astype(np.uint8)
                      for _ in range(batch_size)], layout="HWC")


@pytest.mark.parametrize("batch_size", [1, 3, 8, 17])
def test_headline_random_op_in_branch_compiles(batch_size):
    compiled = check(headline, make_images(batch_size), seeds=range(5))
    # the coin flips are known before the run (last_runs: its former name, documented)
    assert compiled.last_run_count == compiled.last_runs == 1


def test_random_ops_in_nested_branches_elif_and_both_branches(images):
    def nested(image):
        flip = ndd.random.coin_flip(probability=0.5)
        if flip.item():
            if ndd.random.uniform(range=[0, 1]).item() > 0.4:
                image = ndd.rotate(image, angle=ndd.random.uniform(range=[-20, 20]))
                extra = ndd.random.normal(shape=[2])
            else:
                extra = ndd.random.uniform(range=[5, 6], shape=[2])
        elif image.shape[1] > 50:
            extra = ndd.random.normal(shape=[2], mean=10.0)
        else:
            extra = ndd.random.uniform(range=[-6, -5], shape=[2])
        return ndd.resize(image, size=[12, 12]), extra, flip

    compiled = check(nested, images, seeds=range(6))
    assert compiled.last_run_count == 1


def test_random_op_in_branch_on_a_data_predicate(images):
    def by_size(image):
        image = ndd.flip(image, horizontal=1)  # its shape is known in the pipeline only
        if image.shape[0] > 45:
            angle = ndd.random.uniform(range=[-10, 10])
            image = ndd.rotate(image, angle=angle)
        return ndd.resize(image, size=[16, 16])

    compiled = check(by_size, images)
    assert compiled.last_run_count <= 2  # the first run tells the paths, the second is exact


def test_predicate_computed_in_the_pipeline_from_random_values(images):
    def hidden(image):
        noise = ndd.random.uniform(range=[0, 1], shape=[3])
        if ndd.reductions.sum(noise).item() > 1.5:  # no Python guess: resolved by re-runs
            image = ndd.flip(image, vertical=1)
            if ndd.reductions.max(ndd.random.uniform(range=[0, 1], shape=[2])).item() > 0.5:
                image = ndd.flip(image, horizontal=1)
        return image, noise

    compiled = ndd.compile(hidden, per_sample=True)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for seed, batch in itertools.product(range(4), [images, make_images(9, seed=3)]):
            expected = run(hidden, batch, seed=seed, reference="per_sample", warn=None)
            with seeded(seed):
                actual = compiled(batch)  # (here: the warning's line is checked below)
            assert_same(expected.result, actual)
            assert rng_state() == expected.rng
    assert compiled.run_count > 2  # the re-runs are exercised, then the eager loop takes over
    line = hidden.__code__.co_firstlineno + 4  # the random op whose callers were not guessable
    assert [(w.filename, w.lineno) for w in record
            if issubclass(w.category, ndd_trace.NddTraceWarning)] == [(__file__, line)]
    assert "3 pipeline runs" in str(record[-1].message)
    # explain says what the held variant recorded at its run, not what a new trace says
    explanation = ndd_trace.explain(compiled, images)
    assert "3 pipeline runs" in explanation.eager_reason
    assert explanation.path == "the eager per-sample loop"


def test_random_ops_in_logical_operators_and_after_return(images):
    def logic(image):
        if ndd.random.coin_flip().item() and ndd.random.uniform(range=[0, 1]).item() > 0.3:
            image = ndd.flip(image, horizontal=1)
        if not ndd.random.coin_flip(probability=0.4).item() or image.shape[0] < 45:
            return ndd.resize(image, size=[8, 8])
        return ndd.rotate(ndd.resize(image, size=[8, 8]),
                          angle=ndd.random.uniform(range=[-30, 30]), keep_size=True)

    compiled = check(logic, images, seeds=range(6))
    # `and`, `or`, `not` of random values are guessed in Python; the height of the flipped
    # image is known after a first run only
    assert compiled.run_count <= 2 * 6


def test_random_ops_with_per_sample_arguments():
    def data_arguments(image):
        level = ndd.reductions.mean(ndd.cast(image, dtype=ndd.float32))
        if ndd.random.coin_flip(probability=level / 255.0).item():
            noise = ndd.random.normal(mean=level, stddev=2.0)
        else:
            noise = ndd.random.uniform(range=[0, 1])
        shift = ndd.random.normal(mean=level)  # every sample, its own mean
        return noise, shift

    for batch_size in (1, 5, 9):
        compiled = check(data_arguments, make_images(batch_size, seed=batch_size))
        assert compiled.last_run_count == 2  # the first run gives the arguments


def test_random_ops_in_conditional_expressions_and_python_loops(images):
    def loops(image, times):
        for _ in range(times):  # a Python loop: unrolled, each call its own random op
            if ndd.random.coin_flip(probability=0.5).item():
                image = ndd.rotate(image, angle=ndd.random.uniform(range=[-10, 10]),
                                   keep_size=True)
        flip = ndd.random.coin_flip(probability=0.5)
        extra = ndd.random.normal(shape=[2]) if flip.item() else \
            ndd.random.uniform(range=[0, 1], shape=[2])
        return image, extra

    compiled = check(loops, images, 3, seeds=range(4))
    assert compiled.run_count == compiled.runs == 4  # (runs: its former name, documented)


def test_two_batch_arguments(images):
    def pair(image, other):
        if other.shape[0] > image.shape[0]:
            image = ndd.rotate(image, angle=ndd.random.uniform(range=[-10, 10]))
        return image

    check(pair, images, make_images(5, seed=7))


def test_sweep_of_seeds_and_batch_sizes():
    side = ndd.random.RNG(seed=0)

    def mixed(image):
        level = ndd.reductions.mean(ndd.cast(image, dtype=ndd.float32))
        if ndd.random.coin_flip(probability=0.6).item():
            if image.shape[1] > 45 and ndd.random.coin_flip(rng=side).item():
                image = ndd.rotate(image, angle=ndd.random.uniform(range=[-15, 15]))
            else:
                image = ndd.flip(image, horizontal=1)
                jitter = ndd.random.normal(mean=level, stddev=1.0, rng=side)
                if jitter.item() > 100.0:
                    image = ndd.flip(image, vertical=1)
        elif ndd.random.uniform(range=[0, 1]).item() < 0.5:
            image = ndd.resize(image, size=[20, 20])
        return ndd.resize(image, size=[16, 16]), ndd.random.uniform(range=[0, 1], shape=[2])

    compiled = ndd.compile(mixed, per_sample=True)
    for seed, batch_size in itertools.product(range(8), (2, 7, 16)):
        images = make_images(batch_size, seed=seed)
        side.seed = 50 + seed
        expected = run(mixed, images, seed=seed, reference="per_sample")
        side_state = str(side.state)
        side.seed = 50 + seed
        with warnings.catch_warnings():
            warnings.simplefilter("error", ndd_trace.NddTraceWarning)
            actual = run(compiled, images, seed=seed)
        assert_runs_match(expected, actual)
        assert str(side.state) == side_state
        assert compiled.last_run_count <= 2  # the jitter's mean is known after a first run


def test_explicit_generators_and_state_afterwards(images):
    first, second = ndd.random.RNG(seed=11), ndd.random.RNG(seed=12)

    def two(image):
        if ndd.random.coin_flip(probability=0.5, rng=first).item():
            image = ndd.rotate(image, angle=ndd.random.uniform(range=[-10, 10], rng=second))
        noise = ndd.random.normal(shape=[2])  # the default generator
        return image, noise

    compiled = ndd.compile(two, per_sample=True)
    for seed in range(3):
        runs, states = [], []
        for _ in range(2):
            first.seed, second.seed = 100 + seed, 200 + seed
            runs.append(run(two, images, seed=seed, reference="per_sample") if not runs
                        else run(compiled, images, seed=seed, warn=None))
            states.append([str(g.state) for g in (first, second)])
        assert states[0] == states[1]
        assert_runs_match(*runs)  # the results, and the default generator's state


def test_no_sample_reaches_the_random_op(images):
    def never(image):
        if ndd.random.coin_flip(probability=0.0).item():
            image = ndd.rotate(image, angle=ndd.random.uniform(range=[0, 1]))
        return image

    def always(image):
        if image.shape[0] > 0:
            image = ndd.rotate(image, angle=ndd.random.uniform(range=[-5, 5]))
        return image

    check(never, images)
    check(always, images)


def test_failed_run_is_the_eager_loops_error(images):
    def fails(image):
        if ndd.random.coin_flip().item():
            image = ndd.rotate(image, angle=ndd.random.uniform(range=[-5, 5]))
        return image

    compiled = ndd.compile(fails, per_sample=True)
    compiled(images)
    flat = ndd.batch([np.zeros((4, 4), np.uint8)] * 2, layout="HW")  # rotate refuses it
    eager = run(fails, flat, seed=3, reference="per_sample")
    assert eager.error is not None
    failed = run(compiled, flat, seed=3, warn=None)  # raised by the eager loop, after the run
    assert isinstance(failed.error, type(eager.error)) and failed.rng == eager.rng
    check(fails, images, seeds=[4])  # the other variant still compiled


def test_run_failing_on_a_wrong_guess_runs_the_eager_loop_and_says_so():
    def guarded(image, bounds):
        # a per-sample range: known after a run only; the stand-in fed before is -0.2
        start = ndd.random.uniform(range=bounds) - 1.0
        return ndd.slice(image, start=ndd.stack(start, start), shape=[1, 1], axes=[0, 1],
                         out_of_bounds_policy="error")

    images = ndd.batch([np.full((6, 6, 3), 1, np.uint8)] * 3, layout="HWC")
    bounds = ndd.batch([np.array([2, 5], np.float32)] * 3)
    compiled = ndd.compile(guarded, per_sample=True)
    for seed in range(2):
        expected = run(guarded, images, bounds, seed=seed, reference="per_sample")
        with seeded(seed), warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            actual = compiled(images, bounds)  # CALL
        assert_same(expected.result, actual)
        if seed == 0:  # warned once, at the call
            assert [w.filename for w in record] == [__file__]
            assert "slice" in str(record[0].message) and "guess" in str(record[0].message)
        assert rng_state() == expected.rng


@pytest.mark.gpu
def test_gpu_batch_matches_the_per_sample_loop(images):
    def on_gpu(image):
        flip = ndd.random.coin_flip(probability=0.5)
        if image.shape[0] > 45:
            image = ndd.resize(image, size=[16, 16])
        else:
            image = ndd.resize(ndd.flip(image, vertical=1), size=[16, 16])
        return image, flip

    check(on_gpu, images.gpu())


@pytest.mark.gpu
def test_gpu_random_ops_in_branches_match_the_eager_loop(images):
    def on_gpu(image):
        if ndd.random.coin_flip(probability=0.5).item():
            noise = ndd.random.uniform(range=[0, 1], shape=[3], device="gpu")
            image = ndd.rotate(image, angle=ndd.random.uniform(range=[-10, 10]))
        else:
            noise = ndd.random.normal(shape=[3], device="gpu")
        return ndd.resize(image, size=[16, 16]), noise

    check(on_gpu, images.gpu(), seeds=range(4))
    check(on_gpu, images, seeds=range(2))


@pytest.mark.gpu
def test_gpu_data_per_sample_arguments_match_the_eager_loop():
    def level_noise(image):
        level = ndd.reductions.mean(ndd.cast(image, dtype=ndd.float32))  # on the GPU
        if image.shape[0] > 45:
            noise = ndd.random.normal(mean=level, stddev=3.0, shape=[2], device="gpu")
        else:
            noise = ndd.random.normal(mean=level, shape=[2], device="gpu")
        return noise, ndd.random.uniform(range=[0, 1])

    check(level_noise, make_images(7).gpu(), seeds=range(3))


def test_export_of_random_ops_in_branches(tmp_path):
    compiled = ndd.compile(headline, per_sample=True)
    exported = ndd_trace.export(compiled, make_images(4), path=str(tmp_path / "headline.dali"),
                                format="serialized", random="inputs")
    assert exported.inputs == ["image", "_random_0", "_random_1"]  # no path outputs
    assert exported.num_outputs == 1


# ---------------------------------------------------------------------------------------------
# What a per-sample function reads besides its arguments: guarded as compiled functions are

THRESHOLD = 45  # module globals the functions below read, changed by the tests


class Settings:
    angle = 10.0


class Options:
    def __init__(self):
        self.side = 12


OPTIONS = Options()
SIDE = 10
WIDTH = [8]  # changed in place


def resize_to_side(image):
    return ndd.resize(image, size=[SIDE, SIDE])  # a helper reading a global


def by_threshold(image):
    if image.shape[0] > THRESHOLD:
        image = ndd.rotate(image, angle=ndd.random.uniform(range=[-Settings.angle, 0]))
    return ndd.resize(image, size=[OPTIONS.side, WIDTH[0]])


def through_helper(image):
    if ndd.random.coin_flip(probability=0.5).item():
        image = ndd.flip(image, horizontal=1)
    return resize_to_side(image)


def test_a_changed_module_global_rebuilds(images, monkeypatch):
    monkeypatch.setitem(globals(), "WIDTH", list(WIDTH))  # restored after the test
    compiled = assert_each_matches_eager(by_threshold, images, mode="per_sample", changes=[
        lambda: None, lambda: monkeypatch.setitem(globals(), "THRESHOLD", 40),
        lambda: monkeypatch.setitem(globals(), "THRESHOLD", 50),
        lambda: WIDTH.__setitem__(0, 11)])  # in place
    assert compiled.builds == 4
    assert compiled.last_miss_reason == "WIDTH[0]: 8 -> 11"


def test_a_changed_closure_variable_rebuilds(images):
    size = 8

    def closure(image):
        if image.shape[1] > 50:
            image = ndd.flip(image, vertical=1)
        return ndd.resize(image, size=[size, size + 1])

    def change():
        nonlocal size
        size += 3

    compiled = assert_each_matches_eager(closure, images, mode="per_sample",
                                         changes=[lambda: None, change, change])
    assert compiled.builds == 3
    assert compiled.last_miss_reason == "size: 11 -> 14"


def test_a_changed_attribute_of_a_global_object_or_class_rebuilds(images, monkeypatch):
    compiled = assert_each_matches_eager(by_threshold, images, mode="per_sample", changes=[
        lambda: None, lambda: monkeypatch.setattr(Settings, "angle", 30.0),
        lambda: monkeypatch.setattr(OPTIONS, "side", 6)])
    assert compiled.builds == 3
    assert compiled.last_miss_reason == "OPTIONS.side: 12 -> 6"


def test_a_changed_global_of_a_helper_rebuilds(images, monkeypatch):
    def other_helper(image):
        return ndd.resize(image, size=[SIDE + 2, 5])

    compiled = assert_each_matches_eager(through_helper, images, mode="per_sample", changes=[
        lambda: None, lambda: monkeypatch.setitem(globals(), "SIDE", 14),
        lambda: monkeypatch.setitem(globals(), "resize_to_side", other_helper),
        lambda: monkeypatch.setitem(globals(), "SIDE", 3)])  # read by the new helper
    assert compiled.builds == 4
    assert compiled.last_miss_reason == "other_helper() reads SIDE: 14 -> 3"


def test_unchanged_globals_reuse_the_variant(images, monkeypatch):
    compiled = assert_each_matches_eager(by_threshold, images, mode="per_sample",
                                         changes=[lambda: None] * 3)
    assert compiled.builds == 1 and compiled.variants_held == 1
    monkeypatch.setitem(globals(), "THRESHOLD", 40)
    compiled(images)
    monkeypatch.setitem(globals(), "THRESHOLD", 45)  # back: the first variant again
    for seed in range(2):
        assert_runs_match(run(by_threshold, images, seed=seed, reference="per_sample"),
                          run(compiled, images, seed=seed))
    assert compiled.builds == 2 and compiled.variants_held == 2
    explanation = ndd_trace.explain(compiled, images)
    assert "THRESHOLD == 45" in explanation.guards


def test_export_reads_the_globals_current_values(images, monkeypatch, tmp_path):
    from nvidia.dali import Pipeline

    compiled = ndd.compile(resize_to_side, per_sample=True)
    compiled(images)
    monkeypatch.setitem(globals(), "SIDE", 7)
    ndd_trace.export(compiled, images, path=str(tmp_path / "side.dali"), format="serialized")
    pipe = Pipeline.deserialize(filename=str(tmp_path / "side.dali"))
    pipe.build()
    pipe.feed_input("image", [np.asarray(sample) for sample in images])
    (output,) = pipe.run()
    assert [np.array(output[i]).shape for i in range(len(output))] == [(7, 7, 3)] * 5


def test_past_cache_limit_runs_the_eager_loop_and_says_so(images, monkeypatch):
    compiled = ndd.compile(by_threshold, per_sample=True, cache_limit=2)
    for seed, threshold in enumerate([45, 40, 35, 45]):
        monkeypatch.setitem(globals(), "THRESHOLD", threshold)
        expected = run(by_threshold, images, seed=seed, reference="per_sample")
        with seeded(seed), warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            actual = compiled(images)  # CALL
        assert_same(expected.result, actual)
        assert rng_state() == expected.rng
        if threshold == 35:  # the third variant: not built
            assert [w.filename for w in record] == [__file__]
            assert "cache_limit" in str(record[0].message)
            assert "last change: THRESHOLD: 40 -> 35; new variants" in str(record[0].message)
        else:
            assert not record
    assert compiled.builds == 2
    # the one call run as the eager loop is recorded as compiled functions' are (issue 32)
    assert compiled.ledger.counters.fallbacks == 1
    assert "cache_limit" in compiled.ledger.verdicts[-1].reason
    assert compiled.ledger.verdicts[-1].loc.filename == __file__


def test_namedtuple_outputs_come_back_as_namedtuples(images):
    """The output structure is kept the one way every mode keeps it (ndd_trace/core/trees.py)."""
    import collections

    Pair = collections.namedtuple("Pair", "flipped small")

    def pair(image):
        if image.shape[0] > 40:
            return Pair(ndd.flip(image, horizontal=1), ndd.resize(image, size=[4, 4]))
        return Pair(image, ndd.resize(image, size=[4, 4]))

    runs = assert_matches_eager(pair, images, modes=("per_sample",))
    assert runs["per_sample"].result.type is Pair  # (the per-sample loop's outputs, batched)


def test_explain_shows_the_pipeline_that_runs(images):
    """The pipeline is the shared graph lowered: DALI's conditional splits and merges spelled
    out, each op with the user's line; the rewritten function beside it."""
    compiled = ndd.compile(augment, per_sample=True)
    explanation = ndd_trace.explain(compiled, images)
    assert "_conditional.split[cpu](" in explanation.graph
    assert "fn._conditional.split(" in explanation.code
    assert "fn._conditional.merge(" in explanation.code
    flip_line = augment.__code__.co_firstlineno + 4  # image = ndd.flip(image, horizontal=1)
    assert "fn.flip(" in explanation.code and f"test_per_sample.py:{flip_line}" in \
        explanation.code
    assert "_ndd_condition" in explanation.rewritten
    assert explanation.path == "one pipeline" and explanation.eager_reason is None
    assert "rewritten function:" in str(explanation)



# -- what a new-user probe of per-sample functions found (silently other values) ---------------

def _compared_with_literals(value):
    if value.item() == 0.1:  # a literal float32 cannot hold
        return value * 0 + 2
    if value.item() > 16777217:  # an int float32 rounds (to 16777216)
        return value * 0 + 1
    return value * 0


def test_literals_are_compared_exactly_as_python_compares_them():
    """The literal was a float32 constant in the pipeline: a float64 sample of 0.1 was not
    `== 0.1`, an int32 sample of 16777217 was `> 16777217`."""
    values = ndd.batch([np.array(0.1), np.array(0.2), np.array(np.float32(0.1), np.float64)])
    check(_compared_with_literals, values, seeds=[0])
    counts = ndd.batch([np.array(16777217, np.int32), np.array(16777218, np.int32)])
    check(_compared_with_literals, counts, seeds=[0])


def _height(image):
    return image.shape[0], image.shape[0] > 40


def test_a_returned_shape_is_batched_as_eager_batches_a_python_int(images):
    """`return image.shape[0]`: the eager loop batches Python ints as int32; the pipeline
    gave int64."""
    check(_height, images, seeds=[0])


# -- what a per-sample probe found: returned numbers and structures (silently other values) ------

def _mean_level(image):
    return ndd.reductions.max(image).item(), ndd.reductions.mean(image).item()


def _labelled(image):
    return image, 1, 0.5


def _listed(image):
    if image.shape[0] > 45:
        return [ndd.flip(image, horizontal=1), image]
    return [image, image]


def _keyed(image):
    return {"image": image, "tall": image.shape[0] > 45, "width": image.shape[1]}


@pytest.mark.parametrize("function", [_mean_level, _labelled, _listed, _keyed])
def test_returned_numbers_and_structures_are_gathered_as_the_eager_loop(images, function):
    """`.item()` came back in the tensor's dtype (uint8 where the loop batches a Python int as
    int32, float64 where it batches a float as float32), a constant not batched at all, a list
    or dict stacked by the reference; and the function's own eager loop gave the first
    sample's number, not a Batch of every sample's."""
    check(function, images, seeds=[0])
    compiled = ndd.compile(function, per_sample=True)
    assert_same(run(function, images, seed=0, reference="per_sample").result,
                compiled.eager(images))


def test_an_int_beyond_int32_raises_as_the_eager_loop_raises():
    """ndd.batch refuses a Python int beyond int32 (after a smaller first one): so does the
    compiled call, where a cast would have wrapped it."""
    def count(value):
        return value.item()

    values = ndd.batch([np.array(1, np.int64), np.array(2**31, np.int64)])
    assert_matches_eager(count, values, modes=("per_sample",), raises=True)


# -- what a per-sample probe found: constructs the eager loop runs, which raised ---------------

def _nested_return(image):
    if image.shape[0] > 41:
        if image.shape[0] > 45:
            return ndd.flip(image, horizontal=1)
        image = ndd.flip(image, vertical=1)
    return image


def _raise_not_taken(image):
    if image.shape[0] > 100:
        raise ValueError("too big")
    return image


def _set_in_one_branch(image):
    if image.shape[0] > 20:  # every sample of `images` takes it
        out = ndd.flip(image, horizontal=1)
    return out


def _set_in_one_branch_not_taken(image):
    if image.shape[0] > 45:  # some samples do not: eager's UnboundLocalError
        out = ndd.flip(image, horizontal=1)
    return out


def _raise_taken(image):
    if image.shape[0] > 45:
        raise ValueError(f"too big: {image.shape}")
    return image


def _is_tall(image):
    return image.shape[0] > 45


def _helper_reads_shape(image):
    if _is_tall(image):
        return ndd.flip(image, horizontal=1)
    return image


def _unpacks_shape(image):
    height, width, channels = image.shape
    if height > 45:
        return ndd.flip(image, horizontal=1)
    return image


@pytest.mark.parametrize("function, line", [
    (_nested_return, 2), (_raise_not_taken, 2), (_set_in_one_branch, 1),
    (_set_in_one_branch_not_taken, 1), (_raise_taken, 2), (_helper_reads_shape, None),
    (_unpacks_shape, 1)])
def test_what_dalis_conditionals_cannot_define_runs_the_eager_loop_and_says_so(
        images, function, line):
    """DALI defines both branches of a per-sample `if` for all samples: a `raise` in a branch,
    a variable or `return` in one branch only, a helper reading `.shape`, a shape unpacked,
    raised DALI's AutoGraph dump where the eager loop returns (or raises its own error at its
    moment). They run as the eager per-sample loop, warned at the user's line."""
    assert_matches_eager(function, images, modes=("per_sample",), warn="ignore")
    compiled = ndd.compile(function, per_sample=True)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        try:
            compiled(images)
        except (ValueError, UnboundLocalError):
            pass
    messages = [str(w.message) for w in record
                if issubclass(w.category, ndd_trace.NddTraceWarning)]
    assert len(messages) == 1 and "eager per-sample loop" in messages[0], messages
    assert "in user code" not in messages[0] and "_ndd_" not in messages[0], messages[0]
    if line is not None:
        where = [(w.filename, w.lineno) for w in record
                 if issubclass(w.category, ndd_trace.NddTraceWarning)]
        assert where == [(__file__, function.__code__.co_firstlineno + line)], where


def test_a_chained_comparison_says_what_to_write_instead(images):
    @ndd.compile(per_sample=True)
    def middle(image):
        if 40 < image.shape[0] < 50:
            return ndd.flip(image, horizontal=1)
        return image

    with pytest.raises(PerSampleError, match=r"chained comparison.*x.item\(\) and") as info:
        middle(images)
    assert f"test_per_sample.py:{middle.__wrapped__.__code__.co_firstlineno + 2}" in \
        str(info.value)


# Found by the twenty-eighth session's sweep of new-user programs (per-sample functions).

_SEEN: list = []


def _noting_each_sample(x):
    _SEEN.append(1)
    return x * 2


def _jitter_from_its_own_generator(x):
    rng = ndd.random.RNG(seed=3)
    return x + ndd.random.uniform(range=[0.0, 1.0], rng=rng)


def _reseeding(x):
    ndd.random.set_seed(3)
    return x + ndd.random.uniform(range=[0.0, 1.0])


@pytest.mark.parametrize("function", [_noting_each_sample, _jitter_from_its_own_generator,
                                      _reseeding], ids=["append", "RNG", "set_seed"])
def test_python_that_eager_runs_per_sample_runs_as_the_eager_loop(function):
    """A per-sample function's Python runs once per call when compiled: an effect (a global
    list's append) or a generator made or reseeded in it would happen once, not once per
    sample, silently. Such a function runs as the eager per-sample loop, said at its line."""
    batch = ndd.as_batch([np.full((2,), i, np.float32) for i in range(3)])
    _SEEN.clear()
    runs = assert_matches_eager(function, batch, modes=("per_sample",), warn="ignore")
    assert len(_SEEN) == (6 if function is _noting_each_sample else 0)
    assert runs["per_sample"].function.builds == 0


def _branch_on_the_whole_shape(x):
    if x.shape == (5, 3):
        y = x + 1
    else:
        y = x - 1
    return y


def test_a_whole_per_sample_shape_compared_is_refused():
    """`x.shape == (5, 3)` compared the shape object by identity: always False, the other
    branch for every sample, silently. It is refused at the line, saying how to write it."""
    batch = ndd.as_batch([np.zeros((5, 3), np.int32), np.zeros((2, 3), np.int32)])
    with pytest.raises(PerSampleError, match="compares a whole per-sample shape"):
        ndd.compile(_branch_on_the_whole_shape, per_sample=True)(batch)


def _above(x, threshold=4):
    if x.shape[0] > threshold:
        y = x * 2
    else:
        y = x // 2
    return y


def test_a_per_sample_function_takes_keyword_arguments():
    """`f(batch, threshold=3)`: bound as the function binds it (the sweep found a TypeError);
    a keyword it has no parameter for raises eager's TypeError, at the call."""
    batch = ndd.as_batch([np.ones((5, 2), np.int32), np.ones((2, 2), np.int32)])
    assert_matches_eager(_above, batch, modes=("per_sample",), threshold=3)
    assert_matches_eager(_above, batch, modes=("per_sample",), limit=3, raises=True)
    compiled = ndd.compile(_above, per_sample=True)
    assert_same(compiled.eager(batch, threshold=3), compiled(batch, 3))


def _count(x):
    return 1


def test_a_per_sample_function_returning_python_values_runs_the_eager_loop():
    """Found by the sweep: refused before, though the eager loop gathers such values (a
    Tensor per sample, batched); there is no pipeline to run, so the loop runs, said once."""
    batch = ndd.as_batch([np.zeros(3, np.uint8)] * 2)
    assert_matches_eager(_count, batch, modes=("per_sample",), warn="ignore")
