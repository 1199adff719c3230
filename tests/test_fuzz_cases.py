"""Differences a differential fuzzer found (shared/repros/fuzz): each case eager vs compiled and
transparent mode, compared exactly; crashes and hangs run in a child process with a timeout."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap
import threading
import warnings

import numpy as np
import pytest
from conftest import ROOT, subprocess_env
from harness import assert_compiles_exactly, assert_runs_match, assert_same, run

import nvidia.dali.experimental.dynamic as ndd
import ndd_trace
from ndd_trace.modes import lazy
from ndd_trace.units.cache import LIVE_PIPELINES, REGIONS


def _transparent(function, *args):
    with ndd_trace.enabled():
        result = function(*args)
        result.evaluate()
    return result


def _child(code: str, *arguments: str) -> subprocess.CompletedProcess:
    script = f"import sys\nsys.path.insert(0, {ROOT!r})\n" + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", script, *arguments], capture_output=True,
                          text=True, timeout=120, env=subprocess_env())


# -- a numpy scalar on the left of an operator ---------------------------------------------------

@pytest.mark.parametrize("operation", [
    lambda y: np.float32(0.5) * y,
    lambda y: np.int32(3) + y,
    lambda y: np.float64(2.0) - y,
    lambda y: np.uint8(7) ** (y & 1),
])
def test_numpy_scalar_on_the_left_of_a_batch_operator(operation):
    x = ndd.as_batch([np.array([1, 5, 3], np.int16), np.array([2, 4], np.int16)])

    def f(x):
        return operation(x >> 1)

    assert_compiles_exactly(f, x)  # compiled whole, no warning
    assert_same(f(x), _transparent(f, x))


def test_batch_proxies_have_no_array_protocol_where_batch_has_none():
    x = ndd.as_batch([np.zeros((2,), np.uint8)])
    seen = {}

    def f(x):
        y = x + 1
        seen["traced"] = [hasattr(y, name) for name in ("__array__", "__dlpack__", "item")]
        return y

    ndd.compile(f)(x)
    with ndd_trace.enabled():
        y = x + 1
        seen["lazy"] = [hasattr(y, name) for name in ("__array__", "__dlpack__", "item")]
    assert seen["traced"] == seen["lazy"] == [False, False, False]
    assert [hasattr(x, name) for name in ("__array__", "__dlpack__", "item")] == [False] * 3


def test_numpy_array_of_a_batch_is_an_object_array_as_eagerly():
    x = ndd.as_batch([np.arange(18, dtype=np.uint8).reshape(2, 3, 3)], layout="HWC")

    def f(x):
        return np.asarray(ndd.flip(x, horizontal=1))

    eager = f(x)
    with pytest.warns(ndd_trace.NddTraceWarning, match="numpy"):
        compiled = ndd.compile(f)(x)
    for result in (compiled, _transparent_value(f, x)):
        assert result.dtype == eager.dtype == object and result.shape == eager.shape == ()
        assert_same(eager.item(), result.item())


def _transparent_value(function, *args):
    with ndd_trace.enabled():
        return function(*args)


# -- tracing and ndd's default generator ---------------------------------------------------------

def test_tracing_does_not_make_the_default_generator_before_eager_would():
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


# -- a Batch used only for its batch size --------------------------------------------------------

def test_batch_used_only_for_its_batch_size_gives_each_calls_size():
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
            assert_same(eager, _transparent(function, x))
        assert compiled.cache_info().traces == 1


# -- ops that crash a pipeline on samples with no elements ---------------------------------------

def test_empty_samples_into_gaussian_blur_and_laplacian_run_eagerly_without_crashing():
    completed = _child("""
        import warnings
        import numpy as np
        import nvidia.dali.experimental.dynamic as ndd
        import ndd_trace

        def blur(x):
            return ndd.gaussian_blur(x, window_size=3)

        def edges(x):  # (empty samples an op made have a null data pointer: eager crashes too)
            return ndd.flip(ndd.laplacian(x, window_size=3), horizontal=1)

        def results(fn, xs, transparent=False):
            out = []
            for x in xs:
                if transparent:
                    ndd_trace.enable()
                y = fn(x)
                out.append([(s.shape, s.tobytes()) for s in (np.asarray(t) for t in y)])
                ndd_trace.disable()
            return out

        for function, layout, shapes in [(blur, "HW", [(3, 3), (1, 0), (3, 3)]),
                                         (edges, "HWC", [(4, 4, 3), (1, 0, 3), (4, 4, 3)])]:
            xs = [ndd.as_batch([np.full(shape, 9, np.uint8)] * 7, layout=layout)
                  for shape in shapes]
            eager = results(function, xs)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                compiled = ndd.compile(function)
                assert results(compiled, xs) == eager
            assert any("no elements" in str(w.message) for w in caught), caught
            assert compiled.cache_info().traces == 1
            assert results(function, xs, transparent=True) == eager
        eager_calls = ndd_trace.report().eager_ops
        assert any("no elements" in reason and where.startswith("<string>:")
                   for (_, reason, where) in eager_calls), eager_calls
        print("SAME")
    """)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "SAME" in completed.stdout


# -- transparent mode keeps its pipelines (and threads) bounded ----------------------------------

def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def test_region_pipelines_are_bounded_and_freed_least_recently_run_first(monkeypatch):
    monkeypatch.setattr(LIVE_PIPELINES, "limit", 3)
    lazy.reset_report()
    images = ndd.as_batch([np.arange(16 * 16 * 3, dtype=np.uint8).reshape(16, 16, 3)] * 2,
                          layout="HWC")

    def step(fill):  # (a fixed argument: a new region per value)
        return ndd.rotate(images, angle=30.0, fill_value=fill)

    counts = []
    for _ in range(2):  # the second pass runs regions whose pipelines were freed
        for i in range(8):
            assert_same(step(0.5 * i), _transparent(step, 0.5 * i))
            counts.append(_threads())
    assert max(counts[4:]) <= counts[3], counts  # no more threads past 3 regions
    report = ndd_trace.report()
    assert len(report.regions) == 8 and report.releases == 16 - 3
    assert "pipelines freed as the least recently run: 13" in str(report)
    assert report.as_dict()["pipelines_released"] == 13
    lazy.reset_report()


def test_a_site_that_keeps_changing_runs_eagerly_past_its_limit(monkeypatch):
    monkeypatch.setattr(REGIONS, "site_limit", 4)
    lazy.reset_report()
    # a copy: user data as it is would run its op at the call, as a region of its own
    images = ndd.batch([np.zeros((16, 16, 3), np.uint8)] * 2, layout="HWC")

    def step(images, fill):  # (a fixed argument: a new region per value)
        return ndd.rotate(ndd.flip(images, horizontal=1), angle=30.0, fill_value=fill)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ndd_trace.NddTraceWarning)
        compiled = ndd.compile(step, cache_limit=2)
        counts = []
        for i in range(12):  # past cache_limit: transparent mode, a new region per value
            assert_same(step(images, 0.25 * i), compiled(images, 0.25 * i))
            counts.append(_threads())
    assert max(counts[6:]) <= counts[5], counts  # 2 entries + 4 regions, then no more
    report = ndd_trace.report()
    assert len(report.regions) == 4
    (chain, reason, where), count = next(iter(report.eager_ops.items()))
    assert chain == "flip[cpu] -> rotate[cpu]" and count == 12 - 2 - 4
    assert "keep changing" in reason and where.endswith(f"test_fuzz_cases.py:"
                                                        f"{step.__code__.co_firstlineno + 1}")
    lazy.reset_report()


# -- a one-value random op among batches ---------------------------------------------------------

def test_one_value_random_op_times_a_batch_of_one_then_larger():
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


# -- a pipeline that fails part-way through a batch ----------------------------------------------

@pytest.mark.parametrize("mode", ["compiled", "transparent"])
def test_process_exits_after_pipeline_runs_fail_part_way_through_a_batch(mode):
    completed = _child("""
        import warnings
        import numpy as np
        import nvidia.dali.experimental.dynamic as ndd
        import ndd_trace

        warnings.simplefilter("ignore")
        MEAN = [1.0, 2.0, 3.0]

        def f(x):
            return ndd.crop_mirror_normalize(x, mean=MEAN, std=[2.0])

        def outcomes(fn, transparent):
            g = np.random.default_rng(0)
            seen = []
            for _ in range(6):
                x = ndd.as_batch([g.normal(size=(int(g.integers(1, 4)), int(g.integers(0, 4)),
                                                  int(g.integers(0, 3)))).astype(np.float32)
                                  for _ in range(6)], layout="CHW")
                if transparent:
                    ndd_trace.enable()
                try:
                    out = fn(x)
                    out.evaluate()
                    seen.append([np.asarray(t).tobytes() for t in out])
                except RuntimeError as error:
                    seen.append(type(error).__name__)
                finally:
                    ndd_trace.disable()
            return seen

        eager = outcomes(f, False)
        compiled = ndd.compile(f)
        mine = outcomes(compiled if sys.argv[1] == "compiled" else f, sys.argv[1] != "compiled")
        assert mine == eager, (mine, eager)
        assert eager.count("RuntimeError") >= 4, eager
        if sys.argv[1] == "compiled":
            assert "failed 3 times" in compiled.entries[0].eager_reason
        print("END OF SCRIPT", flush=True)
    """, mode)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "END OF SCRIPT" in completed.stdout
