"""Generated code: a real `@pipeline_def`, golden text, operator syntax with eager's exact types."""

from __future__ import annotations

import ast
import re
import warnings

import numpy as np
import nvidia.dali.experimental.dynamic as ndd
import pytest
from harness import Fresh, assert_compiles_exactly, assert_matches_eager, seeded

import ndd_trace
from ndd_trace.core import source
from ndd_trace.codegen.lower import lower

SCALE = 3

GOLDEN = """\
import nvidia.dali as dali
from nvidia.dali import fn, pipeline_def, types


@pipeline_def
def golden_pipeline():
    x = fn.external_source(name='x', device='cpu', no_copy=True, dtype=types.UINT8, ndim=3, layout='HWC')
    small = fn.resize(x, size=[8, 8])  # LOC
    flip_state = fn.external_source(name='flip_state', device='cpu', no_copy=True, dtype=types.UINT32, ndim=1)  # LOC
    flip = fn.random.coin_flip(_random_state=flip_state)  # LOC
    normalized = fn.crop_mirror_normalize(small, mean=[0.0], std=[255.0], mirror=flip)  # LOC
    mul = normalized * 2.5  # LOC
    scaled = mul + 1  # LOC
    root = dali.math.sqrt(scaled)  # LOC
    const = fn.constant(idata=[3], shape=[], dtype=types.INT32)  # LOC
    times = root * const  # LOC
    const_2 = fn.constant(fdata=[0.5], shape=[], dtype=types.FLOAT)  # LOC
    bright = times > const_2  # LOC
    clamped = dali.math.clamp(times, 0, 1)  # LOC
    minus = -times  # LOC
    return (minus, bright, clamped)
"""


def golden(x):
    small = ndd.resize(x, size=[8, 8])
    flip = ndd.random.coin_flip(batch_size=x.batch_size)
    normalized = ndd.crop_mirror_normalize(small, mirror=flip, mean=[0.0], std=[255.0])
    scaled = normalized * 2.5 + 1
    root = ndd.math.sqrt(scaled)
    times = root * SCALE
    bright = times > 0.5
    clamped = ndd.math.clamp(times, 0, 1)
    return -times, bright, clamped


def _normalized(source: str) -> str:
    return re.sub(r"  # \S+:\d+", "  # LOC", source)


GOLDEN_GRAPH = """\
graph golden:
  in0 = input x: batch<cpu, UINT8, ndim=3, layout='HWC'>
  v1 = resize[cpu](in0, size=[8, 8])
  rng2 = random_state(('default',))
  v3 = random.coin_flip[cpu](_random_state=rng2)
  v4 = crop_mirror_normalize[cpu](v1, mirror=v3, mean=[0.0], std=[255.0])
  v5 = _arithmetic_generic_op[cpu](v4, expression_desc='mul(&0 $0:float32)', real_constants=[2.5])
  v6 = _arithmetic_generic_op[cpu](v5, expression_desc='add(&0 $0:int32)', integer_constants=[1])
  v7 = _arithmetic_generic_op[cpu](v6, expression_desc='sqrt(&0)')
  const8 = constant <array i32[]>
  v9 = _arithmetic_generic_op[cpu](v7, const8, expression_desc='mul(&0 &1)')
  const10 = constant <array f32[]>
  v11 = _arithmetic_generic_op[cpu](v9, const10, expression_desc='gt(&0 &1)')
  v12 = _arithmetic_generic_op[cpu](v9, expression_desc='clamp(&0 $0:int32 $1:int32)', integer_constants=[0, 1])
  v13 = _arithmetic_generic_op[cpu](v9, expression_desc='minus(&0)')
  return v13, v11, v12"""


def test_golden_graph_and_pipeline_def(batch):
    """The graph a trace records (its nodes, inputs, random state and constants, as `explain`
    prints it), and the `@pipeline_def` it is lowered to: user variable names where a line
    assigns one value (`small`, `times`), op names for intermediates (`mul`) and unassigned
    results (`minus`); a Python scalar that eager ndd types as a constant is written inline
    (`* 2.5`), one it feeds as a tensor (`SCALE`, the comparison's 0.5) becomes an
    `fn.constant` of the same type."""
    entry = ndd_trace.compile(golden).trace((batch,), {})
    assert entry.graph.format(with_locations=False) == GOLDEN_GRAPH
    assert _normalized(entry.lowered.source) == GOLDEN


def test_comments_point_at_user_lines(batch):
    entry = ndd_trace.compile(golden).trace((batch,), {})
    line = golden.__code__.co_firstlineno + 1
    assert entry.lowered.source.splitlines()[7].endswith(f"test_codegen.py:{line}")


def test_explain_shows_what_runs(batch):
    compiled = ndd_trace.compile(golden)
    code = ndd_trace.explain(compiled, batch).code
    with seeded(3):
        compiled(batch)
    assert compiled.entries[0].lowered.source == code
    assert code.startswith("import nvidia.dali as dali\n")
    assert "_arithmetic_generic_op" not in code and "consts" not in code


def test_golden_runs_and_matches_eager(batch):
    assert_compiles_exactly(golden, batch, calls=2)


def test_the_code_runs_standalone(batch):
    """The printed source, executed on its own (DALI only), builds the same pipeline."""
    entry = ndd_trace.compile(lambda x: ndd.math.sqrt(x * 0.5 + 1)).trace((batch,), {})
    namespace: dict = {}
    exec(compile(entry.lowered.source, "<standalone>", "exec"), namespace)  # noqa: S102
    function = namespace[entry.lowered.function_name]
    pipe = function(batch_size=batch.batch_size, num_threads=1, device_id=None)
    pipe.build()
    pipe.feed_input("x", [np.asarray(sample) for sample in batch])
    (out,) = pipe.run()
    expected = ndd.math.sqrt(batch * 0.5 + 1)
    for a, b in zip(out, expected):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# float16 arithmetic has no CPU implementation in DALI (eager fails too)
DTYPES = [np.uint8, np.int16, np.int32, np.int64, np.float32, np.float64]


def _operands(dtype):
    rng = np.random.default_rng(0)
    if dtype is np.bool_:
        return [rng.integers(0, 2, size=(3, 4)).astype(dtype) for _ in range(2)]
    return [(rng.uniform(-50, 200, size=(3, 4)) if np.issubdtype(dtype, np.floating)
             else rng.integers(0, 100, size=(3, 4))).astype(dtype) for _ in range(2)]


def _arithmetic(x, y):
    return (x * 2.5, x + 1, 1 - x, x / 3, x * 2, x - True, x > 0.5, x <= 3, x == y, -x,
            x * y, ndd.math.abs(x), ndd.math.clamp(x, 0, 100), ndd.math.max(x, 7.25),
            x * np.float64(0.1), 3 ** (x * 0 + 1))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_operator_syntax_keeps_eager_types(dtype):
    x = ndd.batch(_operands(dtype))
    y = ndd.batch(_operands(dtype)[::-1])
    compiled = assert_compiles_exactly(_arithmetic, x, y)
    code = compiled.entries[0].lowered.source
    assert "x * 2.5" in code and "dali.math.clamp(x, 0, 100)" in code


def test_boolean_operators_keep_eager_types():
    x, y = (ndd.batch(values) for values in (_operands(np.bool_), _operands(np.bool_)[::-1]))
    assert_compiles_exactly(
        lambda a, b: (a * 2.5, a & b, a | True, a ^ b, a == b, a * b, a + 1), x, y)


@pytest.mark.parametrize("operation", [
    lambda y: np.float32(0.5) * y,
    lambda y: np.int32(3) + y,
    lambda y: np.float64(2.0) - y,
    lambda y: np.uint8(7) ** (y & 1),
])
def test_numpy_scalar_on_the_left_of_a_batch_operator(operation):
    """A numpy scalar on the left of an operator (`np.float32(k) * value`) compiles whole and
    gives eager's types, compiled and in transparent mode (found by an independent differential
    fuzzer, ../shared/repros/fuzz/02: AttributeError under ndd_trace)."""
    x = ndd.as_batch([np.array([1, 5, 3], np.int16), np.array([2, 4], np.int16)])

    def f(x):
        return operation(x >> 1)

    assert_matches_eager(f, x, modes=("compiled", "transparent"), exact_paths=True)  # whole


def test_constants_inline_exactly_or_fed():
    small = np.float64(0.1)  # not a float32 value: fed, as its value must stay exact
    table = np.arange(6, dtype=np.int32).reshape(2, 3)

    def function(x):
        return x * np.float32(0.5), x + small, x + ndd.as_tensor(table)

    x = ndd.batch([np.ones((2, 3), np.float32)] * 2)
    compiled = assert_compiles_exactly(function, x)
    lowered = compiled.entries[0].lowered
    assert "fn.constant(fdata=[0.5], shape=[], dtype=types.FLOAT)" in lowered.source
    assert "fn.constant(idata=[0, 1, 2, 3, 4, 5], shape=[2, 3], dtype=types.INT32)" in \
        lowered.source
    assert [node.kind.value for node in lowered.external_sources] == ["input", "constant"]


# numpy's default float dtype, as a mean or std computed with numpy has it: DALI's Constant holds
# no doubles (found by a differential sweep of ordinary training scripts)
_MEAN_F64 = np.array([100.0, 110.0, 120.0])          # exact in float32: written into the code
_STD_F64 = np.array([58.395, 57.12, 57.375])         # not exact in float32: fed
_WEIGHTS_F64 = np.array([[0.5, 0.25], [2.0, 4.0]])  # 2-D, exact


def _normalize_f64(x):
    a = ndd.crop_mirror_normalize(x, mean=_MEAN_F64, std=_STD_F64)
    b = ndd.cast(x.slice[:2, :2, 0], dtype=ndd.float64) * _WEIGHTS_F64
    return a, b - np.array([1.5, 3.0]), b + np.array([1e-300, 0.1])


def test_float64_numpy_constants(uniform_batch, jpeg_dir):
    """float64 numpy arrays (a mean or std computed with numpy) as op arguments and arithmetic
    constants: eager's values, compiled (each written into the code where exact in float32, fed
    where not), in transparent mode, and in a compiled generator's loop body (found by a
    differential sweep of ordinary training scripts: each once gave a silently wrong
    result)."""
    assert_matches_eager(_normalize_f64, uniform_batch, modes=("compiled", "transparent"),
                         calls=2, exact_paths=True)

    def epochs(reader):
        for jpegs, _ in reader.next_epoch(batch_size=4):
            images = ndd.decoders.image(jpegs)
            images = ndd.resize(images, size=[16, 16])
            yield ndd.crop_mirror_normalize(images, mean=_MEAN_F64, std=_STD_F64)

    runs = assert_matches_eager(epochs, Fresh(lambda: ndd.readers.File(file_root=str(jpeg_dir))),
                                modes=("loop",))
    steps = runs["eager"].result
    assert len(steps) > 1 and all(a.dtype == np.float32 for s in steps for a in s.samples)


@pytest.mark.gpu
def test_float64_numpy_constants_on_the_gpu(uniform_batch):
    """float64 numpy constants given to GPU ops as eager takes them: as a CPU argument input
    (normalize's mean and std) and as a GPU tensor; a numpy array mixed into GPU arithmetic
    raises eager's ValueError in both (it ran on the H200 before landing; its first version
    mixed them and failed there, eagerly too; see test_float64_numpy_constants for its story)."""
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


def test_transparent_regions_feed_their_constants(batch):
    entry = ndd_trace.compile(lambda x: x * np.float32(0.5)).trace((batch,), {})
    region = lower(entry.graph)  # a transparent-mode region: keyed without data
    assert "fn.external_source(name='const'" in region.source


def test_code_generation_warns_nothing():
    """astunparse reads `ast.Num` (deprecated since Python 3.12) while printing: that warning
    stays inside ndd_trace, out of a script that records its own warnings."""
    tree = ast.parse("(1).real + 1.5 * y[0]")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        text = source.unparse(tree)
    assert "1.5" in text
    assert [str(w.message) for w in caught] == []


def _resize_with(x, interp):
    return ndd.resize(x, size=[2, 2], interp_type=interp)


@pytest.mark.parametrize("interp", [1, 999], ids=["linear", "unknown"])
def test_an_int_for_an_enum_argument_held_in_a_parameter(interp):
    """Found by the twenty-eighth session's sweep: `interp_type=it` with `it = 1` made an
    enum-typed constant, which lowering read as a number and crashed (TypeError at the call);
    it is fed instead, and an unknown value raises eager's error."""
    x = ndd.as_batch([np.zeros((4, 4, 3), np.uint8)], layout="HWC")
    assert_matches_eager(_resize_with, x, interp, modes=("compiled", "transparent"),
                         warn="ignore", raises=interp == 999)
