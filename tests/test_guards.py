"""Regression tests for guard holes found in review: each once gave a stale or wrong result."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from harness import assert_each_matches_eager, assert_runs_match, assert_same, run

import nvidia.dali.experimental.dynamic as ndd
import ndd_trace
from ndd_trace.tracing import guards


@pytest.mark.parametrize("change", ["dtype", "layout", "ndim", "kind", "static"])
def test_guards_retrace_on_change(change, images):
    @ndd.compile
    def double(x, factor=2):
        return x * factor

    base = ndd.as_batch(images, layout="HWC")
    double(base)
    variants = {
        "dtype": (ndd.as_batch([i.astype(np.float32) for i in images], layout="HWC"),),
        "layout": (ndd.as_batch(images, layout="WHC"),),
        "ndim": (ndd.as_batch([np.ascontiguousarray(i[..., 0]) for i in images]),),
        "kind": (ndd.as_tensor(images[0]),),
        "static": (base, 3),
    }
    args = variants[change]
    assert_same(double.__wrapped__(*args), double(*args))
    assert double.cache_info().traces == 2
    assert double.last_miss_reason and "->" in double.last_miss_reason


GLOBAL_SIZE = [10, 10]


def test_global_and_closure_guards(batch):
    global GLOBAL_SIZE
    angle = 10.0

    @ndd.compile
    def transform(x):
        return ndd.rotate(ndd.resize(x, size=GLOBAL_SIZE), angle=angle)

    first = transform(batch)
    assert first.shape[0][:2] != (14, 14)
    GLOBAL_SIZE = [14, 14]
    try:
        second = transform(batch)
        assert_same(transform.__wrapped__(batch), second)
        assert "global `GLOBAL_SIZE`" in transform.last_miss_reason
    finally:
        GLOBAL_SIZE = [10, 10]
    angle = 20.0
    assert_same(transform.__wrapped__(batch), transform(batch))
    assert "closure variable `angle`" in transform.last_miss_reason


class Config:
    def __init__(self):
        self.size = 8


CONFIG = Config()


def test_object_attribute_guard(batch):
    @ndd.compile
    def resize(x):
        return ndd.resize(x, size=[CONFIG.size, CONFIG.size])

    resize(batch)
    CONFIG.size = 9
    try:
        assert resize(batch).shape[0][:2] == (9, 9)
    finally:
        CONFIG.size = 8


def test_batch_size_used_in_python_specializes(images):
    @ndd.compile
    def weighted(x):
        return x * (x.batch_size + 1)

    for n in (4, 3, 4):
        data = ndd.as_batch(images[:n], layout="HWC")
        assert_same(weighted.__wrapped__(data), weighted(data))
    assert weighted.cache_info().traces == 2  # one trace per batch size; the repeat is a hit


def test_method_compilation(batch):
    class Augment:
        def __init__(self, size):
            self.size = size

        @ndd.compile
        def __call__(self, x):
            return ndd.resize(x, size=[self.size, self.size])

    aug = Augment(6)
    assert aug(batch).shape[0][:2] == (6, 6)
    aug.size = 7
    assert aug(batch).shape[0][:2] == (7, 7)


@pytest.mark.parametrize("use", ["range", "divmod", "pos", "floor", "zeros", "slice", "format",
                                 "round", "bit_length"])
def test_batch_size_uses_in_python_specialize(use, images):
    """The batch size used by Python (range, divmod, +n, math.floor, numpy, slicing, %-format,
    round, bit_length) specializes the trace: each batch size gets its own Python values
    (found in review: it once gave a silently wrong result)."""
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


def test_batch_used_only_for_its_batch_size_gives_each_calls_size():
    """A Batch argument used only for its batch size (`ndd.full(..., batch_size=x.batch_size)`):
    each call's result has that call's size, compiled and in transparent mode, from one trace
    (found by an independent differential fuzzer, ../shared/repros/fuzz/06: a later, smaller
    batch gave a result of the old size)."""
    def transparent(function, *args):
        with ndd_trace.enabled():
            result = function(*args)
            result.evaluate()
        return result

    def full(x):
        return ndd.full(np.float32(2.5), batch_size=x.batch_size, shape=[2])

    def zeros(x):
        return ndd.zeros(batch_size=x.batch_size, shape=[2])

    for function in (full, zeros):
        compiled = ndd.compile(function)
        for n in [6, 5, 2, 6]:
            x = ndd.as_batch([np.zeros((3,), np.uint8)] * n)
            eager = function(x)
            assert_same(eager, compiled(x))
            assert_same(eager, transparent(function, x))
        assert compiled.cache_info().traces == 1


def test_negative_zero_is_not_zero(batch):
    """-0.0 after 0.0 re-traces (1 / (x * c) is -inf, not inf), though -0.0 == 0.0 (found in
    review: it once gave a silently wrong result)."""
    def g(x, c):
        return 1.0 / (ndd.cast(x, dtype=ndd.float32) * c)

    compiled = ndd.compile(g)
    compiled(batch, 0.0)
    assert_same(g(batch, -0.0), compiled(batch, -0.0))


def test_dict_with_list_of_batches(images):
    """A batch inside a list inside a dict is guarded like a top-level one: another layout
    re-traces (found in review: it once gave a silently wrong result)."""
    @ndd.compile
    def f(inputs):
        return ndd.flip(inputs["xs"][0], horizontal=1)

    for layout in ["HWC", "CHW", "HWC"]:
        data = ndd.as_batch([np.zeros((2, 2, 3), np.float32)] * 2, layout=layout)
        assert f({"xs": [data]}).layout == layout
    assert f.cache_info().traces == 2


class ScaleByClass:
    factor = 2.0


def test_class_attribute_guard(batch):
    """A class attribute read as a global, changed, re-traces (found in review: it once gave a
    silently wrong result)."""
    @ndd.compile
    def f(x):
        return ndd.cast(x, dtype=ndd.float32) * ScaleByClass.factor

    f(batch)
    ScaleByClass.factor = 3.0
    try:
        assert_same(ndd.cast(batch, dtype=ndd.float32) * 3.0, f(batch))
    finally:
        ScaleByClass.factor = 2.0
    from harness import to_numpy

    assert to_numpy(f(batch)) is not None


def test_nan_and_infinite_static_arguments_keep_their_bits():
    """A NaN's sign is part of the value DALI pads with: a compiled function called with
    `nan` and then `-nan` (`inf - inf`) must not reuse the first trace (guards), a region must
    not reuse the first pipeline (region keys), and the pipeline must build (NaN literals in
    the generated code) rather than fall back. (rotate's `fill_value` is a fixed argument;
    `pad`'s, a tensor argument, is passed as data when held in a variable, as eagerly.)

    Found in review: it once gave a silently wrong result."""
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


def test_global_defined_after_decoration_is_guarded(batch):
    global LATE_ANGLE
    late = ndd.compile(lambda x: ndd.rotate(x, angle=LATE_ANGLE))
    LATE_ANGLE = 10.0
    late(batch)
    LATE_ANGLE = 20.0
    assert_same(ndd.rotate(batch, angle=20.0), late(batch))


HELPER_ANGLE = 10.0


def _helper_angle():
    return HELPER_ANGLE


def test_globals_read_by_helpers_are_guarded(batch):
    global HELPER_ANGLE

    @ndd.compile
    def rotated(x):
        return ndd.rotate(x, angle=_helper_angle())

    rotated(batch)
    HELPER_ANGLE = 25.0
    try:
        assert_same(ndd.rotate(batch, angle=25.0), rotated(batch))
        assert "_helper_angle() reads global `HELPER_ANGLE`" in rotated.last_miss_reason
    finally:
        HELPER_ANGLE = 10.0


def test_batch_size_as_other_argument_specializes(images):
    @ndd.compile
    def per_sample_count(x):
        return ndd.random.uniform(batch_size=x.batch_size, shape=x.batch_size)

    for n in (4, 2):
        data = ndd.as_batch(images[:n], layout="HWC")
        assert_runs_match(run(per_sample_count.__wrapped__, data, seed=1),
                          run(per_sample_count, data, seed=1, warn=None))


flip = None  # a global whose name is also an attribute the function reads (`ndd.flip`)


def test_attribute_names_are_not_guarded_as_globals(batch):
    global flip

    @ndd.compile
    def flipped(x):
        return ndd.flip(x)

    for flip in range(3):  # noqa: B007 (rebinding the global is the point)
        flipped(batch)
    flip = None
    assert flipped.cache_info().traces == 1


def test_compiled_function_used_by_another_hits_the_cache(batch):
    @ndd.compile
    def inner(x):
        return ndd.flip(x, horizontal=1)

    @ndd.compile
    def outer(x):
        return inner(x) * 2

    outer(batch)
    outer(batch)
    assert outer.cache_info().hits == 1


def test_defaults_are_bound(batch):
    @ndd.compile
    def resized(x, size=8):
        return ndd.resize(x, size=[size, size])

    resized(batch)
    resized(batch, 8)
    resized(batch, size=8)
    resized(x=batch)
    assert resized.cache_info().traces == 1


def test_lambda_runtime_error_names_op_and_line(batch):
    compiled = ndd.compile(lambda x: ndd.crop(x, crop=(100, 100)))
    with pytest.raises(ndd_trace.PipelineError) as info:
        compiled(batch).evaluate()
    assert info.value.op_name == "ndd.crop" and info.value.loc is not None


def test_rng_reseed_break_points_at_the_function(batch):
    def reseeds(x):
        ndd.random.set_seed(1)
        return x + ndd.cast(ndd.random.uniform(batch_size=x.batch_size), dtype=ndd.uint8)

    compiled = ndd.compile(reseeds)
    with pytest.warns(ndd_trace.NddTraceWarning) as caught:
        result = compiled(batch)
    assert caught[0].filename == __file__
    assert_same(reseeds(batch), result)


def test_mixed_batch_sizes_warn_and_fullgraph_raises(images):
    def combine(a, b):
        return ndd.flip(a), ndd.flip(b)

    a = ndd.as_batch(images, layout="HWC")
    b = ndd.as_batch(images[:3], layout="HWC")
    with pytest.warns(ndd_trace.NddTraceWarning, match=r"\[3, 4\]"):
        assert_same(combine(a, b), ndd.compile(combine)(a, b))
    with pytest.raises(ndd_trace.GraphBreakError):
        ndd.compile(combine, fullgraph=True)(a, b)


def test_recompiling_applies_new_options(batch):
    first = ndd.compile(lambda x: ndd.flip(x))
    second = ndd.compile(first, fullgraph=True)
    assert second.fullgraph and second is not first


SCALE = 1


def test_generator_past_cache_limit_warns(jpeg_dir):
    """A loop body whose value changes at every epoch: past cache_limit, one warning, and
    eager's values (the new variants run in transparent mode)."""
    def loop(reader):
        for jpegs, labels in reader.next_epoch(batch_size=4):
            yield labels * SCALE

    def run(function):
        global SCALE
        out = []
        reader = ndd.readers.File(file_root=str(jpeg_dir))
        for scale in range(1, 5):
            SCALE = scale
            out += [np.asarray(ndd.as_tensor(x)).tolist() for x in function(reader)]
        return out

    compiled = ndd.compile(loop, cache_limit=1)
    eager = run(loop)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert run(compiled) == eager
    assert sum("cache_limit" in str(w.message) for w in caught) == 1
    assert compiled.cache_info().entries == 1


def test_generator_over_new_readers_traces_once(jpeg_dir):
    """The reader is not part of the loop body's key: a new reader every epoch reuses it."""
    def loop(reader):
        for jpegs, labels in reader.next_epoch(batch_size=4):
            yield labels

    compiled = ndd.compile(loop, cache_limit=1)
    for _ in range(3):
        list(compiled(ndd.readers.File(file_root=str(jpeg_dir))))
    assert compiled.cache_info().traces == 1


def test_tensor_copy_of_traced_tensor(images):
    tensor = ndd.as_tensor(images[0], layout="HWC")
    compiled = ndd.compile(lambda t: ndd.flip(t) * 1)
    assert_same(ndd.flip(tensor) * 1, compiled(tensor))
    np.testing.assert_array_equal(np.asarray(compiled(tensor)), np.asarray(ndd.flip(tensor)))


SIZES = [10, 10]


class Scale:
    factor = 2


def test_last_call_guard_sees_in_place_changes_and_equal_values(batch):
    """The check of the last call's guards (without building its key) still re-traces on
    in-place changes (a global list, a class attribute) and on values equal under `==` but
    frozen differently (True vs 1, 0.0 vs -0.0); equal values in new objects hit the cache."""

    @ndd.compile
    def resize(x, flag):
        return ndd.resize(x, size=SIZES) * Scale.factor + flag

    def check(flag):
        assert_same(resize.__wrapped__(batch, flag), resize(batch, flag))

    check(1000)
    check(1000)
    assert resize.cache_info()[:3] == (1, 1, 1)
    SIZES[0] = 12  # the same list object, changed in place
    try:
        check(1000)
        assert resize.cache_info().traces == 2
        assert "global `SIZES`" in resize.last_miss_reason
    finally:
        SIZES[0] = 10
    Scale.factor = 3
    try:
        check(1000)
        assert resize.cache_info().traces == 3
        assert "Scale" in resize.last_miss_reason
    finally:
        Scale.factor = 2
    hits = resize.cache_info().hits
    check(int("1000"))  # a new int object equal to 1000: the first entry again
    assert resize.cache_info()[:3] == (hits + 1, 3, 3)
    check(1)
    check(True)  # == 1, but another key
    check(0.0)
    check(-0.0)  # == 0.0, but another key
    assert resize.cache_info().traces == 7


def test_repeated_call_skips_building_the_key(batch, monkeypatch):
    @ndd.compile
    def flip(x, size=8):
        return ndd.flip(ndd.resize(x, size=[size, size]), horizontal=1)

    flip(batch)
    built = []
    original = ndd_trace.tracing.guards.build_key
    monkeypatch.setattr(ndd_trace.tracing.guards, "build_key",
                        lambda *args, **kwargs: built.append(1) or original(*args, **kwargs))
    assert_same(flip.__wrapped__(batch), flip(batch))
    assert_same(flip.__wrapped__(batch, 8), flip(batch, 8))
    assert not built and flip.cache_info()[:3] == (2, 1, 1)
    flip(batch, 9)
    assert built and flip.cache_info().traces == 2


def test_baked_arguments_are_keyed_by_value():
    """A per-sample function's non-Batch arguments are part of its pipeline: a Tensor by its
    data (not the object), an RNG by which generator it is."""
    plan = guards.plan_for(lambda image, value: None)
    batch = ndd.batch([np.zeros((2, 2), np.uint8)] * 3)
    first, same, other = (ndd.tensor(np.array(v, np.float32)) for v in (1.5, 1.5, 2.5))

    def key(value):
        return guards.build_key((batch, value), {}, plan, baked=True)

    assert key(first) == key(same) != key(other)
    generators = ndd.random.RNG(seed=1), ndd.random.RNG(seed=1)
    assert key(generators[0]) != key(generators[1])
    assert guards.build_key((batch, generators[0]), {}, plan) == \
        guards.build_key((batch, generators[1]), {}, plan)  # a compiled function's: fed
    assert guards.FastGuard.of((batch, first), plan, None, baked=True) is None


class _BaseSettings:
    angle = 0.0


class _Settings(_BaseSettings):
    size = 32


class _Dataset:
    size = 32

    @ndd.compile
    def load(self, x):
        return ndd.resize(x, size=[self.size, self.size])


def test_class_attributes_read_through_an_argument_are_guarded(batch):
    """`self.size` or `cfg.size` where `size` is a class attribute (not in the instance's
    __dict__): changing it on the class re-traces, as for a class read as a global (found by a
    differential sweep: the result went stale)."""

    @ndd.compile
    def resize(cfg, x):
        return ndd.rotate(ndd.resize(x, size=[cfg.size, cfg.size]), angle=cfg.angle)

    cfg, dataset = _Settings(), _Dataset()
    try:
        for size, angle in ((32, 0.0), (24, 0.0), (24, 10.0)):
            _Settings.size = _Dataset.size = size
            _BaseSettings.angle = angle  # a base class's attribute
            assert_same(resize.__wrapped__(cfg, batch), resize(cfg, batch))
            assert_same(_Dataset.load.__wrapped__(dataset, batch), dataset.load(batch))
        assert resize.cache_info().traces == 3
        assert "cfg" in resize.last_miss_reason
        assert _Dataset.load.cache_info().traces == 2
    finally:
        _Settings.size = _Dataset.size = 32
        _BaseSettings.angle = 0.0


# -- what a function reads, changed between calls (issue 35: each was silently stale) --------------

def _scale(x, k):
    return x * k


SCALE_PARTIAL = None
SCALER = None


def test_a_global_partial_rebound_or_with_other_keywords_retraces(batch):
    import functools

    def call(x):
        return SCALE_PARTIAL(x)

    def bind(k):
        def change():
            global SCALE_PARTIAL
            SCALE_PARTIAL = functools.partial(_scale, k=k)
        return change

    compiled = assert_each_matches_eager(call, batch, changes=[bind(2.0), bind(3.0), bind(3.0)],
                                         warn=None)
    assert compiled.cache_info().traces == 2
    assert "global `SCALE_PARTIAL`" in compiled.last_miss_reason


class _Scaler:
    def __init__(self):
        self.k = 2.0

    def run(self, x):
        return x * self.k


def test_a_global_bound_method_is_guarded_through_its_object(batch):
    global SCALER
    owner = _Scaler()
    SCALER = owner.run

    def call(x):
        return SCALER(x)

    def set_k(k):
        return lambda: setattr(owner, "k", k)

    compiled = assert_each_matches_eager(call, batch, changes=[set_k(2.0), set_k(3.0), set_k(3.0)],
                                         warn=None)
    assert compiled.cache_info().traces == 2


def test_changed_defaults_of_the_compiled_function_are_used_as_eager_uses_them(batch):
    def f(x, m=[2.0]):  # noqa: B006 (a mutable default, as users write them)
        return x * m[0]

    def h(x, *, s=2):
        return x * s

    compiled_f, compiled_h = ndd.compile(f), ndd.compile(h)
    for change in [lambda: None,
                   lambda: setattr(f, "__defaults__", ([4.0],)),
                   lambda: f.__defaults__[0].__setitem__(0, 3.0),
                   lambda: h.__kwdefaults__.__setitem__("s", 5),
                   lambda: setattr(h, "__kwdefaults__", {"s": 7})]:
        change()
        assert_same(f(batch), compiled_f(batch))
        assert_same(h(batch), compiled_h(batch))


def _helper_with_default(x, k=2.0):
    return x * k


def test_changed_defaults_of_a_helper_retrace(batch):
    def call(x):
        return _helper_with_default(x)

    compiled = assert_each_matches_eager(call, batch, changes=[
        lambda: None,
        lambda: setattr(_helper_with_default, "__defaults__", (3.0,)),
        lambda: setattr(_helper_with_default, "__defaults__", (2.0,))], warn=None)
    assert compiled.cache_info().traces == 2


def test_numpy_scalars_and_python_numbers_key_apart(batch):
    def scaled(x, k):
        return x * k

    compiled = ndd.compile(scaled)
    for k in (np.float64(3.0), 3.0, np.float32(3.0), 3, np.int64(3)):
        eager, result = scaled(batch, k), compiled(batch, k)
        assert_same(eager, result)
    assert compiled.cache_info().traces == 5
