"""Call-site replay (transparent mode) against eager ndd and full recording, step by step.

Each test runs one Python loop three times: eagerly; under `ndd_trace.enabled()` with every
call recorded in full (replay switched off); and under `ndd_trace.enabled()` as shipped, where a
call site given what its last call was given is made from that call (`CallSites.replay`, modes/sites.py).
Every step must agree exactly: the values (bit for bit: NaN signs and -0.0 included), the
metadata read right after the call (`.dtype`, `.ndim`, `.layout`, `.batch_size`, device),
whether the step raised (type, and whether at the call or when its result was read), and the
state of every random generator afterwards. Replayed and fully recorded runs must agree on the
moment of an error too; against eager, the one documented difference is allowed (a run error
of an op on user data raises at the call eagerly, at first use in transparent mode). Each test
also checks that calls were in fact replayed.
"""

from __future__ import annotations

import contextlib
import math
import operator
import threading

import numpy as np
import pytest
from harness import (Step, assert_matches_eager, assert_runs_match, assert_same, builtin_kind,
                     observe, run, to_numpy)

import nvidia.dali.experimental.dynamic as ndd
import nvidia.dali.types as types
import ndd_trace
from ndd_trace.modes import sites

NAN = math.nan
NEG_NAN = -math.nan  # the same float to Python, another one to DALI: its sign bit is set
assert math.copysign(1.0, NEG_NAN) < 0


@pytest.fixture(scope="module")
def samples():
    """Ragged uint8 HWC images."""
    rs = np.random.RandomState(3)
    return [rs.randint(0, 256, (9 + i, 12 + 2 * i, 3)).astype(np.uint8) for i in range(4)]


@pytest.fixture
def data(samples):
    hwc = ndd.as_batch(samples, layout="HWC")
    return {
        "hwc": hwc,
        "hwc3": ndd.as_batch(samples[:3], layout="HWC"),  # a smaller last batch
        "f32": ndd.as_batch([s.astype(np.float32) for s in samples], layout="HWC"),
        "i16": ndd.as_batch([s.astype(np.int16) for s in samples], layout="HWC"),
        "plain": ndd.as_batch(samples),  # no layout
        "grey": ndd.as_batch([np.ascontiguousarray(s[..., 0]) for s in samples], layout="HW"),
        "sample": ndd.as_tensor(samples[1], layout="HWC"),
    }


# -- the runs -----------------------------------------------------------------------------------

def _bits(data):
    """numpy data as (dtype, shape, bytes): NaN signs and -0.0 count."""
    if isinstance(data, np.ndarray):
        return (data.dtype.str, data.shape, data.tobytes())
    if isinstance(data, (tuple, list)):
        return type(data)(_bits(v) for v in data)
    if isinstance(data, dict):
        return {key: _bits(v) for key, v in data.items()}
    return data


def _steps(body, steps, generators):
    """Each step: ("ok", its value read at once) or (where, the error's type): "call" or "use"
    (its value read); and the explicit generators' states after. The type by its name and
    built-in type: ndd_trace's PipelineError for a run error is also the built-in type eager
    ndd raises, and carries its name; its text may be DALI's asynchronous-error text."""
    rngs = [ndd.random.RNG(seed=100 + k) for k in range(generators)]
    record = []
    for step in range(steps):
        try:
            value = body(step, *rngs)
        except Exception as error:  # noqa: BLE001 -- compared with eager's
            record.append(("call", type(error).__name__, builtin_kind(error)))
            continue
        try:
            record.append(("ok", observe(value)))
        except Exception as error:  # noqa: BLE001
            record.append(("use", type(error).__name__, builtin_kind(error)))
    return record, [str(rng.state) for rng in rngs]


@contextlib.contextmanager
def _replay_disabled():
    """Transparent mode recording every call in full (the path replay stands in for)."""
    replay = sites.CallSites.replay
    sites.CallSites.replay = lambda self, *args: None
    try:
        yield
    finally:
        sites.CallSites.replay = replay


def differential(body, steps, generators=0, min_replayed=1):
    """Run `body(step, *rngs)` for every step eagerly, in transparent mode recording every call
    in full, and in transparent mode with call-site replay; compare all three (tests/harness.py:
    each step's value, read at once, or its error (its type, and whether it came at the call
    or when the value was read: an op given user data runs, and raises, at the call in
    transparent mode as in eager ndd); the default and the explicit generators' states)."""
    eager = run(_steps, body, steps, generators)
    with _replay_disabled():
        full = run(_steps, body, steps, generators, mode="transparent", warn=None)
    assert full.report.ops_replayed == 0
    traced = run(_steps, body, steps, generators, mode="transparent", warn=None)
    assert_runs_match(full, traced, context="replayed calls as if recorded in full")
    assert_runs_match(eager, traced)
    assert traced.report.ops_replayed >= min_replayed, traced.report
    return eager.result[0], traced.report


# -- static arguments --------------------------------------------------------------------------

def test_float_argument_nan_sign_and_signed_zero(data):
    """A fill value that is NaN, then NaN with its sign bit set (what `inf - inf` gives on
    x86), then -0.0 and 0.0: equal to Python or not, each is its own DALI argument."""
    computed_nan = math.inf - math.inf  # a NaN computed by the CPU
    values = [NAN, NAN, NEG_NAN, NEG_NAN, NAN, computed_nan, NAN, 0.0, -0.0, -0.0, 0.0, 2.5]
    padded = data["f32"]

    def body(step):
        return ndd.pad(padded, fill_value=values[step], axes=[0], shape=[20])

    eager, _ = differential(body, len(values), min_replayed=3)
    assert _bits(eager[1][1].samples) != _bits(eager[2][1].samples)  # the sign of a NaN shows


def test_float_list_argument_nan_sign(data):
    """The same for list items (crop_mirror_normalize's mean)."""
    means = [[NAN, 1.0, 2.0], [NEG_NAN, 1.0, 2.0], [NEG_NAN, 1.0, 2.0], [NAN, 1.0, 2.0],
             [NAN, 1.0, 2.0], [1.0, NEG_NAN, 2.0], [1.0, NAN, 2.0]]
    image = data["f32"]

    def body(step):
        return ndd.crop_mirror_normalize(image, mean=means[step], std=[1.0, 1.0, 1.0])

    eager, _ = differential(body, len(means), min_replayed=2)
    assert _bits(eager[0][1].samples) != _bits(eager[1][1].samples)  # the sign of a NaN shows


def test_scalars_int_float_bool_of_equal_value(data):
    """1, 1.0 and True (and 0, 0.0, False) at one site, for float and int arguments."""
    values = [1, 1, 1.0, 1.0, True, True, 1, 0, 0.0, False, -0.0, 0]
    image = data["hwc"]

    def body(step):
        value = values[step]
        a = ndd.hsv(image, hue=value * 10, saturation=value)
        b = ndd.flip(image, horizontal=value, vertical=0)
        c = ndd.brightness_contrast(image, brightness=value, contrast_center=value)
        return a, b, c

    differential(body, len(values), min_replayed=6)


def test_lists_tuples_and_their_element_types(data):
    sizes = [[8, 8], [8, 8], (8, 8), (8, 8), [8.0, 8], [8.0, 8], [8.5, 8], [8, 8.0], [8, True],
             [8, 8], (8.0, 8.0), [6, 9], [6, 9]]
    image = data["hwc"]

    def body(step):
        size = sizes[step]
        a = ndd.resize(image, size=size)
        b = ndd.crop(image, crop=size)
        c = ndd.crop_mirror_normalize(image, crop=list(size), mean=list(size) + [0.0],
                                      std=[1, 2.0, 3])
        return a, b, c

    differential(body, len(sizes), min_replayed=10)


def test_nested_lists_are_not_replayed_wrongly(data):
    """A nested list (no replayable token) at a site that also gets flat ones."""
    crops = [[8, 8], [8, 8], [[8, 8]], [[8, 8]], [8, 8], [[8], [8]], [8, 8], [8, 8]]
    image = data["hwc"]

    def body(step):
        return ndd.crop(image, crop=crops[step])

    differential(body, len(crops), min_replayed=2)


def test_dtype_forms_and_dali_enums(data):
    """ndd DTypes and DALIDataType values for the same type; interpolation and image types."""
    dtypes = [ndd.float32, ndd.float32, types.FLOAT, types.FLOAT, ndd.float32, ndd.float16,
              types.FLOAT16, ndd.int32, types.INT32, types.UINT8, ndd.uint8, ndd.float32]
    # resize outputs its input's type or float
    sized = [d if any(d is ok for ok in (ndd.float32, types.FLOAT, ndd.uint8, types.UINT8))
             else types.FLOAT for d in dtypes]
    interps = [types.INTERP_LINEAR, types.INTERP_LINEAR, types.INTERP_NN, types.INTERP_NN,
               types.INTERP_CUBIC, types.INTERP_LINEAR, types.INTERP_TRIANGULAR,
               types.INTERP_NN, types.INTERP_NN, types.INTERP_LINEAR, types.INTERP_CUBIC,
               types.INTERP_CUBIC]
    colours = [types.GRAY, types.GRAY, types.BGR, types.GRAY, types.YCbCr, types.YCbCr,
               types.BGR, types.RGB, types.GRAY, types.BGR, types.BGR, types.GRAY]
    image = data["hwc"]

    def body(step):
        a = ndd.cast(image, dtype=dtypes[step])
        b = ndd.resize(image, size=[7, 9], interp_type=interps[step], dtype=sized[step])
        c = ndd.color_space_conversion(image, image_type=types.RGB, output_type=colours[step])
        return a, b, c

    differential(body, len(dtypes), min_replayed=6)


def test_omitted_none_given_and_reordered_keywords(data):
    """The same call with an argument omitted, given as None, given, and in another order;
    `device` given as a string, as a Device, or omitted."""
    settings = [{}, {}, {"horizontal": 0}, {"horizontal": 0}, {"horizontal": None},
                {"vertical": 1, "horizontal": 0}, {"horizontal": 0, "vertical": 1},
                {"horizontal": 0, "vertical": 1}, {"device": "cpu"}, {"device": "cpu"},
                {"device": ndd.Device("cpu")}, {}, {"horizontal": 1, "device": None}]
    layouts = [{}, {}, {"output_layout": "CHW"}, {"output_layout": "CHW"},
               {"output_layout": None}, {"output_layout": "XYZ"}, {"output_layout": "XYZ"},
               {"transpose_layout": False}, {"transpose_layout": True}, {},
               {"output_layout": "CHW"}, {"output_layout": ""}, {}]
    image = data["hwc"]

    def body(step):
        a = ndd.flip(image, **settings[step])
        b = ndd.transpose(image, perm=[2, 0, 1], **layouts[step])
        return a, b

    differential(body, len(settings), min_replayed=6)


# -- inputs ------------------------------------------------------------------------------------

def test_inputs_change_dtype_ndim_and_layout(data):
    names = ["hwc", "hwc", "i16", "i16", "f32", "plain", "plain", "grey", "grey", "hwc",
             "f32", "hwc"]

    def body(step):
        x = data[names[step]]
        a = ndd.flip(x, horizontal=1)
        b = ndd.cast(a, dtype=ndd.float32) * 2
        c = ndd.reductions.sum(b, axes=[0])
        d = ndd.pad(a, axes=[0], shape=[16])
        return a, b, c, d

    differential(body, len(names), min_replayed=12)


def test_batch_tensor_and_batch_size_changes(data):
    """A Batch, a smaller last Batch and single samples (sample mode) at the same sites; the
    random angle's batch follows the data's."""
    names = ["hwc", "hwc", "hwc3", "hwc3", "sample", "sample", "hwc", "sample", "hwc3", "hwc"]

    def body(step):
        x = data[names[step]]
        size = x.batch_size if isinstance(x, ndd.Batch) else None
        angle = ndd.random.uniform(batch_size=size, range=[-30, 30])
        y = ndd.rotate(ndd.flip(x, horizontal=1), angle=angle, keep_size=True)
        return y, ndd.cast(y, dtype=ndd.float16)

    differential(body, len(names), min_replayed=8)


def test_lazy_concrete_materialized_numpy_and_torch_inputs(data, samples):
    """The same site fed a recorded value, concrete data, a recorded value that has run
    (`.evaluate()`, `.shape` read), numpy and torch data."""
    torch = pytest.importorskip("torch")
    kinds = ["lazy", "lazy", "concrete", "concrete", "evaluated", "lazy", "shape", "shape",
             "numpy", "numpy", "torch", "lazy", "concrete"]

    def body(step):
        kind = kinds[step]
        x = data["hwc"]
        if kind in ("lazy", "evaluated", "shape"):
            x = ndd.flip(x, horizontal=0, vertical=1)
            if kind == "evaluated":
                x = x.evaluate()
            elif kind == "shape":
                assert x.shape is not None
        elif kind == "numpy":
            x = samples[2]
        elif kind == "torch":
            x = torch.from_numpy(samples[2])
        y = ndd.flip(x, horizontal=1)
        return y, ndd.resize(y, size=[6, 6])

    differential(body, len(kinds), min_replayed=6)


def test_a_value_from_a_previous_step(data):
    """A site fed its own result of the last step (a chain that grows step by step)."""
    state = {}

    def body(step):
        if step % 4 == 0:
            state["x"] = data["f32"]
        state["x"] = ndd.flip(state["x"], horizontal=1) * 0.5 + step
        return state["x"]

    differential(body, 9, min_replayed=4)


def test_variadic_inputs_and_data_positional_inputs(data):
    """cat/stack given two or three inputs at one site; slice given recorded anchors whose
    type changes."""
    image = data["hwc"]
    relative = ndd.as_batch([np.array([0.5, 0.5], np.float32)] * 4)

    def body(step):
        inputs = [image, ndd.flip(image, horizontal=1), image][: 2 + step % 2]
        anchor = ndd.random.uniform(batch_size=4, range=[0.0, 0.3], shape=[2])
        if step % 3 == 2:
            anchor = ndd.cast(anchor, dtype=ndd.float64)
        cut = ndd.slice(image, anchor, relative, axes=[0, 1])
        return ndd.cat(*inputs, axis=0), ndd.stack(*inputs, axis=0), cut

    differential(body, 7, min_replayed=8)


def test_select_and_slices_of_recorded_batches(data):
    """Samples selected from a recorded batch (sample mode), `.slice[...]` and subscripts with
    bounds that change per step, a batch built back from recorded samples."""
    image = data["hwc"]

    def body(step):
        x = ndd.flip(image, horizontal=1)
        sample = ndd.flip(x.select(step % 4), vertical=1)
        rows = x.slice[1:3 + step % 2, :, step % 3]
        part = sample[1:4, ::2]
        samples = [x.select(i) for i in range(4)]
        rebuilt = ndd.as_batch(samples) if step % 2 else ndd.batch(samples)
        return sample, rows, part, x.slice[0], ndd.flip(rebuilt, horizontal=1)

    differential(body, 6, min_replayed=10)


def test_reader_loop_with_a_smaller_last_batch(jpeg_dir):
    """The common loop: a reader's batches (read ahead in transparent mode) through decoding
    and augmentations whose arguments depend on the step; the last batch cut short (the
    reader pads its last batch: a user trims it)."""
    def epoch():
        reader = ndd.readers.File(file_root=jpeg_dir, seed=1)
        out = []
        for step, (jpegs, labels) in enumerate(reader.next_epoch(batch_size=5)):
            if step == 3:
                jpegs = ndd.batch([jpegs.select(i) for i in range(2)])
                labels = ndd.batch([labels.select(i) for i in range(2)])
            images = ndd.decoders.image(jpegs)
            images = ndd.resize(images, size=[12, 12] if step % 2 else [12.0, 12])
            coin = ndd.random.coin_flip(batch_size=jpegs.batch_size)
            images = ndd.flip(images, horizontal=coin)
            images = ndd.cast(images, dtype=ndd.float32) / 255
            out.append((observe(images), observe(labels)))  # (read at once)
        return out

    runs = assert_matches_eager(epoch, modes=("transparent",), seed=21, warn=None)
    assert [len(images.samples) for images, _ in runs["eager"].result] == [5, 5, 5, 2]
    report = runs["transparent"].report
    assert report.ops_replayed >= 5 and report.readers, report


# -- data keyword arguments --------------------------------------------------------------------

def test_data_arguments_and_their_types(data):
    """angle= from a random op, cast to other types, or a Python number; mirror= and
    horizontal= from coin_flip, cast or not."""
    forms = ["f32", "f32", "f64", "f64", "i32", "python", "python", "f32", "concrete",
             "i16", "evaluated", "evaluated", "sample", "sample", "f32"]
    image = data["hwc"]

    def body(step):
        form = forms[step]
        angle = ndd.random.uniform(batch_size=4, range=[-40, 40])
        if form == "f64":
            angle = ndd.cast(angle, dtype=ndd.float64)
        elif form == "i32":
            angle = ndd.cast(angle, dtype=ndd.int32)
        elif form == "i16":
            angle = ndd.cast(angle, dtype=ndd.int16)
        elif form == "python":
            angle = 12.5
        elif form == "concrete":
            angle = ndd.as_batch([np.float32(5 * i) for i in range(4)])
        elif form == "evaluated":  # one that has run
            angle = angle.evaluate()
        elif form == "sample":  # one angle for the batch
            angle = ndd.random.uniform(range=[-40, 40])
        coin = ndd.random.coin_flip(batch_size=4)
        if step % 3 == 1:
            coin = ndd.cast(coin, dtype=ndd.uint8)
        a = ndd.rotate(image, angle=angle, keep_size=True)
        b = ndd.flip(image, horizontal=coin)
        c = ndd.crop_mirror_normalize(image, mirror=coin, crop=[8, 8], mean=[1.0, 2.0, 3.0])
        return a, b, c

    differential(body, len(forms), min_replayed=15)


def test_random_ops_alternate_generators(data):
    """rng= alternating between two generators and the default one (omitted or None), in
    batch and sample mode, for ops with and without data inputs."""
    picks = [None, None, 0, 0, 1, "omit", 1, 0, None, "omit", "omit", 1, 1, None]
    image = data["hwc"]

    def body(step, *rngs):
        pick = picks[step]
        kw = {} if pick == "omit" else {"rng": None if pick is None else rngs[pick]}
        a = ndd.random.uniform(batch_size=4, range=[0, 1], **kw)
        b = ndd.random.coin_flip(probability=0.3, **kw)  # one value (sample mode)
        c = ndd.random.normal(batch_size=2, shape=[3], **kw)
        d = ndd.random_resized_crop(image, size=[6, 6], **kw)
        return a, b, c, d

    differential(body, len(picks), generators=2, min_replayed=20)


def test_reseeded_and_new_generators_between_steps(data):
    """The default generator reseeded at some steps, a new generator made at others: a
    replayed random call draws from the generator current at this call."""
    image = data["hwc"]

    def body(step, kept):
        if step in (2, 5):
            ndd.random.set_seed(step)
        rng = ndd.random.RNG(seed=step // 2) if step % 3 else kept
        a = ndd.random.uniform(batch_size=4, range=[0, 1], rng=rng)
        b = ndd.random.uniform(batch_size=4, range=[0, 1])
        return a, b, ndd.random_resized_crop(image, size=[6, 6])

    differential(body, 8, generators=1, min_replayed=12)


def test_a_synchronous_step_between_replayed_ones(data):
    """A step run under EvalMode.sync_cpu (eager, at the call), between replayed steps; its
    error (a wrong perm) at the call, as eagerly."""
    image = data["hwc"]
    perms = [[2, 0, 1], [2, 0, 1], [2, 0, 1], [0, 1], [2, 0, 1], [2, 0, 1]]

    def body(step):
        mode = ndd.EvalMode.sync_cpu if step in (2, 3) else contextlib.nullcontext()
        with mode:
            a = ndd.transpose(image, perm=perms[step])
            b = ndd.random.coin_flip(batch_size=4)
            return ndd.flip(a, horizontal=b)

    differential(body, len(perms), min_replayed=4)


def test_wrong_generator_at_one_step(data):
    """A generator of the wrong type at one step: the same error at the same step, and the
    site goes on afterwards."""
    bad = np.random.default_rng(0)

    def body(step, rng):
        r = bad if step == 3 else rng
        return ndd.random.uniform(batch_size=4, range=[0, 1], rng=r)

    differential(body, 7, generators=1, min_replayed=3)


# -- several calls from one line or one helper -------------------------------------------------

def _helper(x, size, dtype):
    y = ndd.resize(x, size=[size, size])
    return ndd.cast(y, dtype=dtype)


def test_helper_called_from_several_places(data):
    """One helper (one frame and instruction per op) called from three places with other
    arguments and data."""
    def body(step):
        a = _helper(data["hwc"], 8, ndd.float32)
        b = _helper(data["i16"] if step % 2 else data["hwc"], 8, ndd.float32)
        c = _helper(data["f32"], 6 + step % 3, types.FLOAT16 if step % 4 else ndd.float16)
        return a, b, c

    differential(body, 8, min_replayed=8)


def test_arithmetic_and_subscripts_on_one_line(data):
    """Several ops of one class on one line, with constants of changing types, a changing
    operator, and subscripts / `.slice`."""
    image = data["f32"]
    numbers = [2, 2, 2.0, 2.0, True, -0.0, 0.0, NEG_NAN, NAN, 3]
    ops = [operator.add, operator.add, operator.mul, operator.add, operator.sub,
           operator.mul, operator.mul, operator.add, operator.add, operator.truediv]

    def body(step):
        k = numbers[step]
        a = (image * k + k)[1:5, ::2] - k
        b = ops[step](image, k)
        c = ops[step](image.slice[1:3, :, 0], image.slice[2:4, :, 1])
        d = -abs(ndd.flip(image, horizontal=1) - 100)[..., 0]
        return a, b, c, d

    differential(body, len(numbers), min_replayed=10)


def test_integer_constants_of_changing_type(data):
    """Integer data with integer, float and bool constants: the result type follows them."""
    image = data["hwc"]
    constants = [3, 3, 3.0, 3.0, True, True, 3, -1, 2 ** 20]

    def body(step):
        k = constants[step]
        return image + k, image * k, k - image

    differential(body, len(constants), min_replayed=6)


def test_multiple_output_ops(data):
    """Ops with several outputs (a tuple): resize's attributes and random_bbox_crop."""
    boxes = ndd.as_batch([np.array([[0.1, 0.1, 0.5, 0.6], [0.2, 0.3, 0.9, 0.8]], np.float32)
                          for _ in range(4)])
    labels = ndd.as_batch([np.array([1, 2], np.int32) for _ in range(4)])
    sizes = [[8, 8], [8, 8], [8, 10], [8, 10.0], [8, 10.0], [8, 8]]

    def body(step):
        resized, attrs = ndd.resize(data["hwc"], size=sizes[step], save_attrs=True)
        crop = ndd.random_bbox_crop(boxes, labels, aspect_ratio=[0.5, 2.0], thresholds=[0.1],
                                    scaling=[0.3, 1.0], bbox_layout="xyXY")
        return resized, attrs, crop

    differential(body, len(sizes), min_replayed=4)


# -- rejected calls ----------------------------------------------------------------------------

def test_a_call_rejected_at_one_step(data):
    """Arguments DALI rejects at one step only (a wrong perm, an unknown output layout, a
    string for a number, a wrong interpolation type): the same error at the same step, and
    the sites work again afterwards."""
    perms = [[2, 0, 1], [2, 0, 1], [0, 1], [2, 0, 1], [2, 0, 1], [1, 0, 2], [2, 0, 1]]
    hues = [10.0, 10.0, 10.0, "red", 10.0, 10.0, 10.0]
    casts = [ndd.float32, ndd.float32, ndd.float32, ndd.float32, "float33", ndd.float32,
             ndd.float32]
    image = data["hwc"]

    def body(step):
        a = ndd.transpose(image, perm=perms[step])
        b = ndd.hsv(image, hue=hues[step])
        c = ndd.cast(image, dtype=casts[step])
        return a, b, c

    differential(body, len(perms), min_replayed=6)


def test_run_time_error_at_one_step(data):
    """A call DALI accepts but whose run fails (a crop outside the image without padding)
    at one step: the same error, then the site goes on."""
    image = data["hwc"]
    crops = [[6, 6], [6, 6], [60, 60], [60, 60], [6, 6], [6, 6], [7, 7]]

    def body(step):
        return ndd.crop(image, crop=crops[step], out_of_bounds_policy="error")

    differential(body, len(crops), min_replayed=3)


# -- threads and compiled generators -----------------------------------------------------------

def _thread_helper(x, rng, hue):
    angle = ndd.random.uniform(batch_size=x.batch_size, range=[-20, 20], rng=rng)
    return ndd.hsv(ndd.rotate(x, angle=angle, keep_size=True), hue=hue)


def test_two_threads_share_a_helper(data):
    """Two threads, each in transparent mode with its own generator, call one helper (the
    same frames and instructions) with their own arguments and data."""
    def work(x, seed, hues, out):
        rng = ndd.random.RNG(seed=seed)
        values = [to_numpy(_thread_helper(x, rng, hue)) for hue in hues]
        out.append((values, str(rng.state)))

    plans = [(data["hwc"], 5, [10.0, 10.0, 10, 20.0, 20.0, True]),
             (data["i16"], 6, [10.0, 10.0, 1.0, 1.0, 10.0, 10.0])]
    eager = []
    for x, seed, hues in plans:
        work(x, seed, hues, eager)

    results = [[] for _ in plans]
    errors = []

    def thread(index):
        try:
            with ndd_trace.enabled():
                x, seed, hues = plans[index]
                work(x, seed, hues, results[index])
        except Exception as error:  # noqa: BLE001
            errors.append(error)

    ndd_trace.reset_report()
    threads = [threading.Thread(target=thread, args=(i,)) for i in range(len(plans))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert_same(eager, [r[0] for r in results])  # values (bit for bit) and generators' states
    assert ndd_trace.report().ops_replayed >= 4


def checked_body(reader, seen):
    """A compiled generator with per-step Python (a counter picks the arguments): checked
    mode runs each step's Python in transparent mode."""
    for i, (jpegs, labels) in enumerate(reader.next_epoch(batch_size=4)):
        seen.append(i)
        images = ndd.decoders.image(jpegs)
        size = [16, 16] if i % 3 else [16.0, 16]
        images = ndd.resize(images, size=size)
        dtype = ndd.float32 if i % 2 else types.FLOAT
        coin = ndd.random.coin_flip(batch_size=4)
        yield ndd.flip(ndd.cast(images, dtype=dtype), horizontal=coin) * (i % 2 or 1.0), labels


def test_checked_generator_body_with_a_step_counter(jpeg_dir):
    def two_epochs(function):
        reader = ndd.readers.File(file_root=jpeg_dir, seed=1)
        seen, out = [], []
        for _ in range(2):
            for images, labels in function(reader, seen):
                out.append((observe(images), observe(labels)))  # (read at once)
        return out, seen

    ndd_trace.reset_report()
    runs = assert_matches_eager(two_epochs, Step(checked_body), modes=("step",), seed=9,
                                warn="ignore")
    assert runs["step"].steps[0].entries[0].path == "checked loop"
    assert len(runs["eager"].result[0]) == 8
    assert ndd_trace.report().ops_replayed > 0, ndd_trace.report()


# -- mismatches outside call-site replay (the full recording path does the same) ------------

def test_inconsistent_batch_sizes_raise_as_in_eager(data):
    image = data["hwc"]

    def body(step):
        angle = ndd.random.uniform(batch_size=3 if step == 2 else 4, range=[-30, 30])
        return ndd.rotate(image, angle=angle, keep_size=True)

    eager, _ = differential(body, 4)
    assert tuple(eager[2]) == ("call", "ValueError", "ValueError")


def test_list_variable_for_a_tensor_argument(data):
    matrix = [1.0, 0.0, 0.0, 0.0, 1.0, 0.0]

    def body(step):
        return ndd.warp_affine(data["hwc"], matrix=matrix, size=[8, 8])

    differential(body, 3)


def test_list_variables_change_and_repeat_between_steps(data):
    """Lists the call site does not show to be constant (a variable's, an indexed one) are
    per-call tensor arguments in eager ndd, converted to the argument's type every call; a
    site replayed with such a list converts it again. The values change, repeat and change
    shape; one of each kind is rejected by DALI as a tensor argument (flat affine matrix)."""
    sizes = [[6, 7], [6, 7], (5, 9), [6, 7], [6.5, 7], [6, 7]]
    matrices = [[[1.0, 0, 1], [0, 1, 2]], [[1.0, 0, 1], [0, 1, 2]], [[1.0, 0, 2], [0, 1, 1]],
                [1.0, 0, 1, 0, 1, 2], [[1.0, 0, 1], [0, 1, 2]], [[1.0, 0, 1], [0, 1, 2]]]
    anchors = [[1.0, 2.0], [1.0, 2.0], [0, 3], [1.0, 2.0], [2, 2], [2, 2]]
    shapes = [[3], [3], [2, 2], [3], [3], [1]]
    image = data["hwc"]

    def body(step, rng):
        size, matrix, anchor, shape = sizes[step], matrices[step], anchors[step], shapes[step]
        resized = ndd.resize(image, size=size)
        warped = ndd.warp_affine(resized, matrix=matrix)
        erased = ndd.erase(warped, anchor=anchor, shape=[2.0, 3.0], axis_names="HW")
        noise = ndd.random.uniform(batch_size=4, range=[0, 1], shape=shape, rng=rng)
        return erased, noise

    eager, _ = differential(body, len(sizes), generators=1, min_replayed=4)
    assert eager[3][0] != "ok"  # DALI rejects the flat matrix as a tensor argument


def test_converted_arguments_across_batch_sizes_and_values(data):
    """Per-call tensor arguments from variables (converted as ndd converts them) on replayed
    sites: the batch size changes and comes back, the value changes and comes back, on two
    sites of one op."""
    batches = [data["hwc"], data["hwc"], data["hwc3"], data["hwc3"], data["hwc"], data["hwc"]]
    angles = [10.0, 10.0, 10.0, 25.0, 25.0, 10.0]
    mean = [10.0, 20.0, 30.0]

    def body(step):
        angle = angles[step]
        rotated = ndd.rotate(batches[step], angle=angle, keep_size=True)
        twice = ndd.rotate(rotated, angle=angle, keep_size=True)
        return ndd.normalize(ndd.cast(twice, dtype=ndd.float32), mean=mean, stddev=2.0)

    differential(body, len(batches), min_replayed=6)


def test_eager_operator_instances_are_left_as_eager_leaves_them(data):
    """Code that reads `EvalContext._instance_cache` (DALI's own tests do) finds the instances
    eager calls leave: keyed by which arguments the call site shows to be constant
    (construction arguments) and which are per-call, with every call's metadata."""
    image = data["hwc"]

    def loop(steps):
        with ndd.EvalContext() as ctx:
            for step in range(steps):
                angle = 10 * step
                size = [8, 8 + step % 2]
                out = ndd.rotate(image, angle=angle, fill_value=0, size=size)
                noise = ndd.random.uniform(batch_size=2 + step % 3, range=[0, 1])
                flipped = ndd.flip(data["sample"], horizontal=1)
                out.evaluate(), noise.evaluate(), flipped.evaluate()
            del out, noise, flipped
            return sorted(repr((key[0].__name__, *key[1:])) for key in ctx._instance_cache)

    eager = loop(5)
    with ndd_trace.enabled():
        traced = loop(5)
    assert eager == traced
    assert any("('angle', 'size')" in key for key in eager)


def test_eager_operator_instances_per_context_and_after_a_purge(data):
    """Replayed calls leave their instances in the context current at the call, also after
    the context's cache was emptied, and for a new batch size (a new `max_batch_size`)."""
    image, smaller = data["hwc"], ndd.as_batch([data["sample"]], layout="HWC")  # 4, then 1

    def loop():
        first, second = ndd.EvalContext(), ndd.EvalContext()
        seen = []
        for step in range(6):
            context = first if step % 2 == 0 else second
            with context:
                if step == 4:
                    context._purge_operator_cache()
                out = ndd.flip(image if step < 5 else smaller, horizontal=1)
                out.evaluate()
                del out
                seen.append([sorted(repr((key[0].__name__, *key[1:]))
                                    for key in ctx._instance_cache)
                             for ctx in (first, second)])
        return seen

    eager = loop()
    with ndd_trace.enabled():
        traced = loop()
    assert eager == traced


def test_list_argument_mutated_in_place_between_steps(data):
    """A list passed as a per-call tensor argument is converted when the call is made (a kept
    conversion is found by the list's value, not its identity): changing it in place between
    steps, or after a call before its result is read, gives eager's values."""
    mean = [10.0, 20.0, 30.0]
    image = data["hwc"]

    def body(step):
        if step == 0:
            mean[:] = [10.0, 20.0, 30.0]  # (each of the three runs starts from the same)
        if step in (2, 3, 5):
            mean[step % 3] += 1.0  # in place: the same list object
        out = ndd.crop_mirror_normalize(image, mean=mean, std=[2.0, 2.0, 2.0])
        if step == 4:
            mean[0] = -5.0  # after the call, before the result is read
        return out

    _, report = differential(body, 7, min_replayed=2)
    assert report.ops_replayed >= 2
