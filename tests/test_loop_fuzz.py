"""Differential fuzzing of compiled generators with Python control flow over loop state.

A fixed seed and a small budget in CI; `python benchmarks/fuzz_loops.py --programs 300` runs long.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from loopfuzz import LoopProgram, check_loop_program


@settings(max_examples=30, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(st.data())
def test_random_loop_bodies_match_eager(jpeg_dir, tmp_path_factory, data):
    folder = str(tmp_path_factory.mktemp("loops"))
    check_loop_program(LoopProgram.draw(data), jpeg_dir, folder)
