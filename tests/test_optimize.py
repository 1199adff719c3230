"""optimize=True: each rewrite applies and is explained at the user's line, the generated code uses
the fused ops, everything a rewrite does not touch stays exact (random values, RNG state), and a
fused random crop draws its windows from the same distribution as the unfused pipeline."""

from __future__ import annotations

import inspect
import io

import numpy as np
import pytest
from conftest import HAS_GPU
from harness import (Fresh, Step, assert_matches_eager, assert_same, observe, run,
                     to_numpy)

import nvidia.dali.experimental.dynamic as ndd
import nvidia.dali.types as types
import ndd_trace
from ndd_trace import _dali
from ndd_trace.modes import lazy
from ndd_trace.codegen import optimize
from ndd_trace.core.ir import Graph, Ref, TensorMeta
from ndd_trace.codegen.lower import lower
from ndd_trace.core.source import SourceLoc

SEED = 1234


def _line_of(function, text: str) -> str:
    """`test_optimize.py:N`, N the first line of `function` that holds `text`."""
    lines, start = inspect.getsourcelines(function)
    offset = next(i for i, line in enumerate(lines) if text in line)
    return f"test_optimize.py:{start + offset}"


OPTIMIZE = {"optimize": True}


# ---------------------------------------------------------------------------------------------
# decode + random_resized_crop

def rrc_among_random_ops(jpegs):
    angle = ndd.random.uniform(range=[-10.0, 10.0], batch_size=jpegs.batch_size)
    images = ndd.decoders.image(jpegs)
    images = ndd.random_resized_crop(images, size=[40, 56], antialias=False)
    mirror = ndd.random.coin_flip(probability=0.5, batch_size=images.batch_size)
    out = ndd.crop_mirror_normalize(images, mirror=mirror, dtype=ndd.float32,
                                    mean=[120.0, 115.0, 100.0], std=[60.0, 60.0, 60.0])
    return out, mirror, angle


def test_random_resized_crop_becomes_a_fused_decoder(jpegs):
    eager = run(rrc_among_random_ops, jpegs, seed=SEED, calls=2)
    optimized = run(rrc_among_random_ops, jpegs, mode="compiled", seed=SEED, calls=2,
                    options=OPTIMIZE)
    compiled = optimized.function
    # the other random ops, before and after the fused one, and the generator: eager's
    assert optimized.rng == eager.rng
    for (eager_out, eager_mirror, eager_angle), (out, mirror, angle) in zip(eager.results,
                                                                            optimized.results):
        assert_same(eager_mirror, mirror)
        assert_same(eager_angle, angle)
        assert out.shape == eager_out.shape and out.dtype == eager_out.dtype
        assert out.layout == eager_out.layout
    explanation = ndd_trace.explain(compiled, jpegs)
    text = str(explanation)
    rrc_line = _line_of(rrc_among_random_ops, "random_resized_crop(")
    decode_line = _line_of(rrc_among_random_ops, "decoders.image(")
    assert "optimizations applied: 1" in text
    assert (f"{rrc_line}: roi decoding: decoders.image ({decode_line}) + random_resized_crop "
            "-> decoders.image_random_crop + resize") in text
    code = explanation.code
    assert "fn.decoders.image_random_crop(jpegs, _random_state=" in code
    assert "fn.resize(images, antialias=False, size=[40, 56])" in code
    assert "random_resized_crop" not in code and "fn.decoders.image(" not in code


def test_default_stays_exact_and_unrewritten(jpegs):
    compiled = assert_matches_eager(rrc_among_random_ops, jpegs, modes=("compiled",),
                                    seed=SEED, warn=None)["compiled"].function
    explanation = ndd_trace.explain(compiled, jpegs)
    assert "optimizations applied" not in str(explanation)
    assert "fn.random_resized_crop(" in explanation.code
    assert "image_random_crop" not in explanation.code


def _coordinate_png(height: int = 200, width: int = 256) -> np.ndarray:
    """A PNG whose red channel is each pixel's x and green its y: a crop shows where it was."""
    from PIL import Image

    y, x = np.mgrid[0:height, 0:width]
    pixels = np.stack([x, y, np.zeros_like(x)], -1).astype(np.uint8)
    encoded = io.BytesIO()
    Image.fromarray(pixels).save(encoded, format="PNG")
    return np.frombuffer(encoded.getvalue(), dtype=np.uint8)


OUT_SIDE = 48


def random_crops(encoded, rng):
    images = ndd.decoders.image(encoded)
    return ndd.random_resized_crop(images, size=[OUT_SIDE, OUT_SIDE], rng=rng)


def narrower_random_crops(encoded, rng):
    images = ndd.decoders.image(encoded)
    return ndd.random_resized_crop(images, size=[OUT_SIDE, OUT_SIDE], random_area=[0.25, 1.0],
                                   rng=rng)


def _windows(batch, height: int = 200, width: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """Each sample's crop window as (area fraction, aspect ratio w/h), read from the resized
    coordinate image: inside the output, x and y grow linearly, by the window's size over the
    output's per pixel (the same estimate for both pipelines)."""
    pixels = np.stack([np.asarray(sample) for sample in to_numpy(batch)]).astype(np.float64)
    first, last = 6, OUT_SIDE - 7  # away from the edges, where resampling clamps
    scale = OUT_SIDE / (last - first)
    window_width = (pixels[:, :, last, 0] - pixels[:, :, first, 0]).mean(axis=1) * scale
    window_height = (pixels[:, last, :, 1] - pixels[:, first, :, 1]).mean(axis=1) * scale
    return window_width * window_height / (width * height), window_width / window_height


def _ks_pvalue(a: np.ndarray, b: np.ndarray) -> float:
    from scipy.stats import ks_2samp

    return float(ks_2samp(a, b).pvalue)


@pytest.fixture(scope="module")
def coordinate_pngs():
    return ndd.as_batch([_coordinate_png()] * 400)


def test_fused_random_crop_has_the_unfused_distribution(coordinate_pngs):
    """Two-sample Kolmogorov-Smirnov test over 400 windows each, independent seeds: area and
    aspect ratio of the fused decoder's windows are distributed as the unfused pipeline's."""
    pytest.importorskip("scipy")
    unfused = ndd.compile(random_crops)  # the pipeline of the code as written (exact)
    fused = ndd.compile(random_crops, optimize=True)
    area, aspect = _windows(unfused(coordinate_pngs, ndd.random.RNG(seed=101)))
    fused_area, fused_aspect = _windows(fused(coordinate_pngs, ndd.random.RNG(seed=202)))
    assert "image_random_crop" in fused.entries[0].lowered.source
    # (estimates, within a pixel: random_area [0.08, 1], random_aspect_ratio [3/4, 4/3])
    assert 0.07 < area.min() and area.max() < 1.02 and 0.73 < aspect.min() < aspect.max() < 1.36
    assert _ks_pvalue(area, fused_area) > 0.01
    assert _ks_pvalue(aspect, fused_aspect) > 0.01
    # the test tells distributions apart: a narrower random_area is rejected
    narrower, _ = _windows(ndd.compile(narrower_random_crops)(coordinate_pngs,
                                                              ndd.random.RNG(seed=101)))
    assert _ks_pvalue(narrower, fused_area) < 1e-6


def test_fused_random_crop_is_deterministic_and_draws_eager_windows(coordinate_pngs):
    """For one seed the fused decoder gives the same values every time, and (DALI 2.4: one crop
    window generator) the very windows random_resized_crop draws from the same state."""
    batch = coordinate_pngs
    fused = ndd.compile(random_crops, optimize=True)
    first = fused(batch, ndd.random.RNG(seed=7))
    assert_same(first, fused(batch, ndd.random.RNG(seed=7)))
    eager_area, eager_aspect = _windows(random_crops(batch, ndd.random.RNG(seed=7)))
    area, aspect = _windows(first)
    np.testing.assert_allclose(area, eager_area, atol=0.01)
    np.testing.assert_allclose(aspect, eager_aspect, atol=0.02)


# ---------------------------------------------------------------------------------------------
# decode + crop / slice / crop_mirror_normalize(crop=...)

def decode_crop(jpegs):
    images = ndd.decoders.image(jpegs)
    return ndd.crop(images, crop=[40, 52], crop_pos_x=0.25, crop_pos_y=0.75)


def decode_slice(jpegs):
    images = ndd.decoders.image(jpegs)
    return ndd.slice(images, rel_start=[0.1, 0.2], rel_shape=[0.5, 0.4])


def decode_crop_mirror_normalize(jpegs):
    images = ndd.decoders.image(jpegs)
    mirror = ndd.random.coin_flip(probability=0.5, batch_size=images.batch_size)
    position = ndd.random.uniform(range=[0.0, 1.0], batch_size=images.batch_size)
    return ndd.crop_mirror_normalize(images, crop=[32, 48], crop_pos_x=position, mirror=mirror,
                                     dtype=ndd.float32, mean=[1.0, 2.0, 3.0],
                                     std=[50.0, 50.0, 50.0]), mirror


@pytest.mark.parametrize("function, consumer, fused", [
    (decode_crop, "crop(", "decoders.image_crop"),
    (decode_slice, "slice(", "decoders.image_slice"),
    (decode_crop_mirror_normalize, "crop_mirror_normalize(", "decoders.image_crop"),
])
def test_window_decoding_is_exact_on_the_cpu(jpegs, function, consumer, fused):
    """The window decoded alone has the values of the whole image decoded and cropped (the
    CPU's libjpeg-turbo), random window positions and flips included."""
    compiled = assert_matches_eager(function, jpegs, modes=("compiled",), seed=SEED, calls=2,
                                    options=OPTIMIZE)["compiled"].function
    explanation = ndd_trace.explain(compiled, jpegs)
    line = _line_of(function, f"ndd.{consumer}")
    assert f"{line}: roi decoding: decoders.image (" in str(explanation)
    assert f"fn.{fused}(jpegs" in explanation.code
    assert "fn.decoders.image(" not in explanation.code
    if function is decode_crop_mirror_normalize:  # the crop went to the decoder
        assert "crop=[32, 48]" in explanation.code.split("fn.decoders.image_crop(")[1].split(
            "\n")[0]
        cmn = explanation.code.split("fn.crop_mirror_normalize(")[1].split("\n")[0]
        assert "crop" not in cmn.replace("crop_mirror_normalize", "")


def decoded_twice_used(jpegs):
    images = ndd.decoders.image(jpegs)
    return ndd.crop(images, crop=[16, 16]), ndd.resize(images, size=[8, 8])


def decoded_and_returned(jpegs):
    images = ndd.decoders.image(jpegs)
    return ndd.random_resized_crop(images, size=[8, 8]), images


def padded_crop(jpegs):
    images = ndd.decoders.image(jpegs)
    return ndd.crop(images, crop=[16, 16], out_of_bounds_policy="pad")


@pytest.mark.parametrize("function", [decoded_twice_used, decoded_and_returned, padded_crop])
def test_no_fusion_where_the_decoded_image_is_used_otherwise(jpegs, function):
    compiled = assert_matches_eager(function, jpegs, modes=("compiled",), seed=SEED, calls=2,
                                    options=OPTIMIZE)["compiled"].function
    explanation = ndd_trace.explain(compiled, jpegs)
    assert "optimizations applied: none" in str(explanation)
    assert "fn.decoders.image(jpegs" in explanation.code


# ---------------------------------------------------------------------------------------------
# Exact rewrites

def redundant_cast(batch):
    scaled = ndd.cast(batch, dtype=ndd.float32) * 0.5
    return ndd.cast(scaled, dtype=ndd.float32), ndd.cast(batch, dtype=ndd.uint8)


def test_a_cast_to_the_dtype_a_value_has_is_dropped(batch):
    compiled = assert_matches_eager(redundant_cast, batch, modes=("compiled",), seed=SEED,
                                    calls=2, options=OPTIMIZE)["compiled"].function
    explanation = ndd_trace.explain(compiled, batch)
    line = _line_of(redundant_cast, "return ndd.cast(scaled")
    assert f"{line}: redundant cast: cast to FLOAT, which its input already is, dropped; " \
           "values: exact" in str(explanation)
    # the cast of the argument itself is kept: dropping it would return the caller's batch
    assert explanation.code.count("fn.cast(") == 2


# ---------------------------------------------------------------------------------------------
# Compiled generators and transparent mode

def augmented_epoch(reader, batch_size=4):
    for jpegs, labels in reader.next_epoch(batch_size=batch_size):
        images = ndd.decoders.image(jpegs)
        images = ndd.random_resized_crop(images, size=[16, 16])
        flip = ndd.random.coin_flip(batch_size=images.batch_size)
        yield ndd.crop_mirror_normalize(images, mirror=flip, mean=[0.0], std=[1.0]), flip, labels


def test_compiled_generator_optimizes_its_loop_body(jpeg_dir):
    def two_epochs(generator_function, reader):
        return [observe(step) for _ in range(2) for step in generator_function(reader)]

    arguments = (Step(augmented_epoch, **OPTIMIZE),
                 Fresh(lambda: ndd.readers.File(file_root=str(jpeg_dir))))
    eager = run(two_epochs, *arguments, seed=SEED)
    optimized = run(two_epochs, *arguments, mode="step", seed=SEED)
    compiled = optimized.steps[0]
    assert optimized.rng == eager.rng and len(optimized.result) == len(eager.result) == 8
    for (eager_images, eager_flip, eager_labels), (images, flip, labels) in zip(
            eager.result, optimized.result):
        assert_same((eager_flip, eager_labels), (flip, labels))
        assert [a.shape for a in eager_images.samples] == [b.shape for b in images.samples]
    assert compiled.cache_info().traces == 1
    explanation = ndd_trace.explain(compiled)
    line = _line_of(augmented_epoch, "random_resized_crop(")
    assert f"{line}: roi decoding" in str(explanation)
    assert "fn.decoders.image_random_crop(" in explanation.code


def test_transparent_mode_optimizes_its_regions(jpegs, monkeypatch):
    # a copy, as a reader's batches are: an op given user data as it is runs at its call, as
    # a region of its own (eager runs it there), which leaves nothing to fuse it with
    jpegs = ndd.batch(jpegs)
    eager = run(rrc_among_random_ops, jpegs, seed=SEED)
    optimized = run(rrc_among_random_ops, jpegs, mode="transparent", seed=SEED,
                    options=OPTIMIZE)
    (eager_out, eager_mirror, eager_angle), (out, mirror, angle) = eager.result, optimized.result
    assert_same((eager_mirror, eager_angle), (mirror, angle))
    assert out.shape == eager_out.shape
    assert optimized.rng == eager.rng
    report = optimized.report
    region = next(r for r in report.regions if r.optimizations)
    assert "fn.decoders.image_random_crop(" in region.code
    line = _line_of(rrc_among_random_ops, "random_resized_crop(")
    assert f"optimization applied: {line}: roi decoding" in str(report)
    assert report.as_dict()["regions"][report.regions.index(region)]["optimizations"]
    # the same code without optimize: its own regions, exact
    assert_matches_eager(rrc_among_random_ops, jpegs, modes=("transparent",), seed=SEED,
                         warn=None)
    monkeypatch.setenv(optimize.ENV_VAR, "1")
    assert lazy.new_tracer().optimize and not lazy.new_tracer(optimize=False).optimize
    monkeypatch.setenv(optimize.ENV_VAR, "0")
    assert not lazy.new_tracer().optimize
    ndd_trace.reset_report()


def test_per_sample_functions_do_not_take_optimize():
    with pytest.raises(ValueError, match="optimize=True is not available with per_sample"):
        ndd.compile(lambda x: x, per_sample=True, optimize=True)


# ---------------------------------------------------------------------------------------------
# GPU graphs, rewritten and lowered here (building needs a GPU: see the gpu test below)

def _op(graph, function, backend, inputs, input_devices, device, line, static=None,
        arg_inputs=None, dtype="UINT8", ndim=3, layout="HWC"):
    op_class = function._op_class
    return graph.add_op(_dali.op_path(op_class), _dali.schema_name(op_class), op_class=op_class,
                        backend=backend, inputs=inputs, input_devices=input_devices,
                        static=static or {}, arg_inputs=arg_inputs or {},
                        meta=[TensorMeta(device, dtype, ndim, layout)], batch_size=4,
                        loc=SourceLoc("train.py", line, "f"))


def test_gpu_decode_and_random_resized_crop_fuse_with_hw_decoder_load():
    graph = Graph("gpu")
    jpegs = graph.add_input("jpegs", ("args", 0), TensorMeta("cpu", "UINT8", 1, None), True)
    decoded = _op(graph, ndd.decoders.image, "mixed", [Ref(jpegs)], ["cpu"], "gpu", 3)
    state = graph.add_random_state(("default",), SourceLoc("train.py", 4, "f"))
    cropped = _op(graph, ndd.random_resized_crop, "gpu", [Ref(decoded)], ["gpu"], "gpu", 4,
                  static={"size": [224, 224]}, arg_inputs={"_random_state": Ref(state)})
    other = _op(graph, ndd.decoders.image, "mixed", [Ref(jpegs)], ["cpu"], "gpu", 5,
                static={"hw_decoder_load": 0.5})
    graph.outputs = [Ref(cropped), Ref(other)]
    applied = optimize.optimize(graph)
    assert [(item.rewrite, item.loc.lineno) for item in applied] == [
        ("hw_decoder_load", 3), ("roi decoding", 4)]
    code = lower(graph).source
    assert (f"fn.decoders.image_random_crop(jpegs, device='mixed', hw_decoder_load="
            f"{optimize.HW_DECODER_LOAD}, _random_state=") in code
    assert "fn.resize(image_random_crop, device='gpu', size=[224, 224])" in code
    assert "hw_decoder_load=0.5)" in code  # the user's own value stays


def test_hw_decoder_load_comes_from_the_environment(monkeypatch):
    def graph_with_a_gpu_decoder() -> Graph:
        graph = Graph("gpu")
        jpegs = graph.add_input("jpegs", ("args", 0), TensorMeta("cpu", "UINT8", 1, None), True)
        graph.outputs = [Ref(_op(graph, ndd.decoders.image, "mixed", [Ref(jpegs)], ["cpu"],
                                 "gpu", 3))]
        return graph

    monkeypatch.setenv(optimize.HW_DECODER_LOAD_ENV_VAR, "0.75")
    graph = graph_with_a_gpu_decoder()
    optimize.optimize(graph)
    assert "hw_decoder_load=0.75)" in lower(graph).source
    monkeypatch.setenv(optimize.HW_DECODER_LOAD_ENV_VAR, "most")
    with pytest.raises(ValueError, match="NDD_TRACE_HW_DECODER_LOAD must be a number"):
        optimize.optimize(graph_with_a_gpu_decoder())


def test_cpu_ops_read_only_on_the_gpu_move_there():
    """flip and a widening cast between a CPU decoder and `.gpu()`: they run on the GPU, the
    narrow uint8 data moves; an op also read on the CPU stays."""
    graph = Graph("placement")
    jpegs = graph.add_input("jpegs", ("args", 0), TensorMeta("cpu", "UINT8", 1, None), True)
    decoded = _op(graph, ndd.decoders.image, "cpu", [Ref(jpegs)], ["cpu"], "cpu", 3)
    flipped = _op(graph, ndd.flip, "cpu", [Ref(decoded)], ["cpu"], "cpu", 4)
    widened = _op(graph, ndd.cast, "cpu", [Ref(flipped)], ["cpu"], "cpu", 5,
                  static={"dtype": types.FLOAT}, dtype="FLOAT")
    moved = _op(graph, ndd.copy, "gpu", [Ref(widened)], ["cpu"], "gpu", 6, dtype="FLOAT")
    resized = _op(graph, ndd.resize, "gpu", [Ref(moved)], ["gpu"], "gpu", 7,
                  static={"size": [8, 8]}, dtype="FLOAT")
    kept = _op(graph, ndd.transpose, "cpu", [Ref(decoded)], ["cpu"], "cpu", 8,
               static={"perm": [2, 0, 1]}, layout="CHW")
    graph.outputs = [Ref(resized), Ref(kept)]
    applied = optimize.optimize(graph)
    assert [(item.rewrite, item.loc.lineno) for item in applied] == [
        ("placement", 4), ("placement", 5)]
    assert moved not in graph.nodes  # a copy from the GPU to the GPU: gone
    code = lower(graph).source
    assert "fn.flip(image.gpu(), device='gpu')" in code
    assert "fn.cast(flip, device='gpu', dtype=types.FLOAT)" in code
    assert "fn.transpose(image, perm=[2, 0, 1])" in code and "copy" not in code


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="needs an NVIDIA GPU")
def test_gpu_fused_decoder_keeps_other_random_ops_exact(jpegs):
    def on_gpu(jpegs):
        images = ndd.decoders.image(jpegs, device="gpu")
        images = ndd.random_resized_crop(images, size=[32, 32])
        mirror = ndd.random.coin_flip(probability=0.5, batch_size=images.batch_size)
        return ndd.crop_mirror_normalize(images, mirror=mirror, dtype=ndd.float32), mirror

    eager = run(on_gpu, jpegs, seed=SEED, calls=2)
    optimized = run(on_gpu, jpegs, mode="compiled", seed=SEED, calls=2, options=OPTIMIZE)
    compiled = optimized.function
    assert optimized.rng == eager.rng
    for (eager_out, eager_mirror), (out, mirror) in zip(eager.results, optimized.results):
        assert_same(eager_mirror, mirror)
        assert out.shape == eager_out.shape
    explanation = ndd_trace.explain(compiled, jpegs)
    assert "fn.decoders.image_random_crop(jpegs, device='mixed'" in explanation.code
    assert "hw_decoder_load" in str(explanation)
