"""Differential fuzzing of compiled generators: Python control flow over loop state
(loopfuzz.py), and the loop's shape and its consumer's plan (loopshapes.py).

A fixed seed and a small budget in CI; `python benchmarks/fuzz_loops.py --programs 300` and
`--shapes 300` run long.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from loopfuzz import LoopProgram, check_loop_program
from loopshapes import LoopShape, check_loop_shape, corrupt_copy, no_stray_modules

from benchmarks._data import make_jpeg_dir


@settings(max_examples=30, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(st.data())
def test_random_loop_bodies_match_eager(jpeg_dir, tmp_path_factory, data):
    folder = str(tmp_path_factory.mktemp("loops"))
    check_loop_program(LoopProgram.draw(data), jpeg_dir, folder)


@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(st.data())
def test_random_loop_shapes_match_eager(loop_shape_dirs, tmp_path_factory, data):
    """Generators varied in their loop's shape and their consumer's plan (loopshapes.py):
    eager, compiled and transparent runs observe the same; `python benchmarks/fuzz_loops.py
    --shapes 300` runs long."""
    folder = str(tmp_path_factory.mktemp("shapes"))
    with no_stray_modules():
        check_loop_shape(LoopShape.draw(data), loop_shape_dirs, folder)


@pytest.fixture(scope="module")
def loop_shape_dirs(jpeg_dir, tmp_path_factory):
    """16 photos, 10 others (a second reader with fewer batches), 15 and a truncated JPEG."""
    return (str(jpeg_dir), str(make_jpeg_dir(tmp_path_factory.mktemp("short"), n=10, seed=1)),
            corrupt_copy(str(jpeg_dir), str(tmp_path_factory.mktemp("corrupt"))))
