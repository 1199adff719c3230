"""Numbers and lists for tensor arguments, passed the way eager ndd passes them, against eager.

Eager ndd reads the caller's source (DALI's call-site analysis): a number or list written at the
call is a construction argument of the operator, one held in a variable or parameter is a
per-call tensor argument (a number a 0-d tensor). DALI reads the two alike for most ops and
differently for some (a flat affine matrix, a 2x2 coord_transform matrix, a 0-d normalize mean).
Each case runs one op with a value passed in through a parameter, eagerly, in transparent mode
and compiled; the values (bit for bit) or the raised exception's type must agree. A few cases
pass the value written at the call.
"""

from __future__ import annotations

import warnings

import numpy as np
import nvidia.dali.experimental.dynamic as ndd
import pytest
from harness import assert_same, to_numpy

import ndd_trace


def _images():
    return ndd.as_batch([np.arange(6 * 7 * 3, dtype=np.uint8).reshape(6, 7, 3),
                         np.arange(8 * 5 * 3, dtype=np.uint8).reshape(8, 5, 3)], layout="HWC")


def _points():
    return ndd.as_batch([np.arange(8, dtype=np.float32).reshape(4, 2)] * 2)


CASES = {  # name: (op taking the list, the list)
    "crop, empty": (lambda x, v: ndd.crop(x, crop=v), []),
    "crop, tuple": (lambda x, v: ndd.crop(x, crop=v), (3, 4)),
    "crop, one item": (lambda x, v: ndd.crop(x, crop=v), [3]),
    "crop, numpy scalars": (lambda x, v: ndd.crop(x, crop=v),
                            [np.float32(3.0), np.float32(2.0)]),
    "flip, bools": (lambda x, v: ndd.flip(x, horizontal=v), [True]),
    "resize, ints for floats": (lambda x, v: ndd.resize(x, size=v), [3, 4]),
    "cmn mean": (lambda x, v: ndd.crop_mirror_normalize(x, mean=v, std=[1.0, 2.0, 3.0]),
                 [1.0, 2.0, 3.0]),
    "cmn mean, too short": (lambda x, v: ndd.crop_mirror_normalize(x, mean=v, std=[1.0, 2, 3]),
                            [1.0, 2.0]),
    "transpose perm (not a tensor argument)": (lambda x, v: ndd.transpose(x, perm=v), [1, 0, 2]),
    "slice axes": (lambda x, v: ndd.slice(x, [1, 1], [3, 3], axes=v), [0, 1]),
    "rotate size": (lambda x, v: ndd.rotate(x, angle=30.0, size=v), [5, 5]),
    "warp_affine, 2x3": (lambda x, v: ndd.warp_affine(x, matrix=v), [[1.0, 0, 1], [0, 1, 0]]),
    "warp_affine, flat": (lambda x, v: ndd.warp_affine(x, matrix=v), [1.0, 0, 1, 0, 1, 0]),
    "coord_transform, flat 2x2": (lambda x, v: ndd.coord_transform(_points(), M=v),
                                  [1.0, 2.0, 3.0, 4.0]),
    "coord_transform, 2x2": (lambda x, v: ndd.coord_transform(_points(), M=v),
                             [[1.0, 2.0], [3.0, 4.0]]),
    "erase anchor": (lambda x, v: ndd.erase(x, anchor=v, shape=[2.0, 2.0], axis_names="HW"),
                     [1, 1]),
    "resize_crop_mirror crop": (lambda x, v: ndd.resize_crop_mirror(x, crop=v, resize_shorter=8),
                                [4, 4]),
    "color_twist hue": (lambda x, v: ndd.color_twist(x, hue=v), [10.0]),
    "paste fill_value": (lambda x, v: ndd.paste(x, ratio=2.0, fill_value=v), [1, 2, 3]),
    "transforms.scale": (lambda x, v: ndd.transforms.scale(scale=v), [2.0, 3.0]),
    "uniform range": (lambda x, v: ndd.random.uniform(batch_size=2, range=v, shape=[2],
                                                      rng=ndd.random.RNG(seed=3)), [0.0, 5.0]),
    "normal shape": (lambda x, v: ndd.random.normal(batch_size=2, shape=v,
                                                    rng=ndd.random.RNG(seed=3)), [2, 2]),
    "coin_flip probability": (lambda x, v: ndd.random.coin_flip(
        batch_size=2, probability=v, rng=ndd.random.RNG(seed=3)), [0.5]),
    # numbers held in a variable: 0-d tensor arguments eagerly
    "normalize mean, a number": (lambda x, v: ndd.normalize(ndd.cast(x, dtype=ndd.float32),
                                                            mean=v, stddev=57.0), 118.0),
    "normalize mean and stddev, numbers": (
        lambda x, v: ndd.normalize(ndd.cast(x, dtype=ndd.float32), mean=v, stddev=v), 3.0),
    "rotate angle, a number": (lambda x, v: ndd.rotate(x, angle=v), 30.0),
    "flip horizontal, an int": (lambda x, v: ndd.flip(x, horizontal=v), 1),
    "flip horizontal, a bool": (lambda x, v: ndd.flip(x, horizontal=v), True),
    "brightness, a number": (lambda x, v: ndd.brightness(x, brightness=v), 1.5),
    "resize resize_x, an int": (lambda x, v: ndd.resize(x, resize_x=v), 5),
    "coin_flip probability, a number": (lambda x, v: ndd.random.coin_flip(
        batch_size=2, probability=v, rng=ndd.random.RNG(seed=3)), 0.25),
    # numpy's scalars held in a variable: as numbers (found by the twenty-second session's
    # sweep: `mean=arr.mean() - 7` was a construction argument, so normalize ran where eager's
    # raised)
    "normalize mean, a numpy float64": (lambda x, v: ndd.normalize(
        ndd.cast(x, dtype=ndd.float32), mean=v, stddev=2.0), np.float64(3.0)),
    "normalize mean, a numpy float32": (lambda x, v: ndd.normalize(
        ndd.cast(x, dtype=ndd.float32), mean=v, stddev=2.0), np.float32(3.0)),
    "rotate angle, a numpy float32": (lambda x, v: ndd.rotate(x, angle=v), np.float32(30.0)),
    "flip horizontal, a numpy int": (lambda x, v: ndd.flip(x, horizontal=v), np.int64(1)),
    # written at the call: construction arguments
    "normalize mean, literal": (lambda x, v: ndd.normalize(ndd.cast(x, dtype=ndd.float32),
                                                           mean=118.0, stddev=57.0), None),
    "warp_affine, flat, literal": (
        lambda x, v: ndd.warp_affine(x, matrix=[1.0, 0, 1, 0, 1, 0]), None),
    "warp_affine, 2x3, literal": (
        lambda x, v: ndd.warp_affine(x, matrix=[[1.0, 0, 1], [0, 1, 0]]), None),
    "coord_transform, flat, literal": (
        lambda x, v: ndd.coord_transform(_points(), M=[1.0, 2.0, 3.0, 4.0]), None),
}


def _outcome(function, value):
    try:
        result = function(_images(), value)
        outputs = result if isinstance(result, tuple) else (result,)
        return ("ok", [[np.asarray(ndd.as_tensor(out.select(i))).tobytes()
                        for i in range(out.batch_size)] if isinstance(out, ndd.Batch)
                       else np.asarray(out).tobytes() for out in outputs])
    except Exception as error:  # noqa: BLE001 -- compared with eager's
        return ("raised", type(error))


@pytest.mark.parametrize("case", list(CASES))
def test_list_argument_as_eager_passes_it(case):
    function, value = CASES[case]
    eager = _outcome(function, value)
    with ndd_trace.enabled():
        transparent = _outcome(function, value)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ndd_trace.NddTraceWarning)
        compiled = _outcome(ndd.compile(function), value)
    for traced in (transparent, compiled):
        if eager[0] == "raised":  # the type eager raises (ndd_trace's own is a subclass of it)
            assert traced[0] == "raised" and issubclass(traced[1], eager[1]), (eager, traced)
        else:
            assert traced == eager


def test_list_parameter_for_a_tensor_argument_as_in_eager(uniform_batch):
    """A list passed in through a parameter is a per-call tensor argument eagerly (DALI's call
    site analysis), so a compiled function feeds it as data too: a 2x3 matrix works, a flat
    one is rejected by DALI, and a literal at the call is a construction argument.

    Found in review: it once gave a silently wrong result."""
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
