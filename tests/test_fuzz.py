"""Differential fuzzing: random ndd programs run eagerly and compiled must agree bit for bit.

A fixed seed and a small budget in CI; `python benchmarks/fuzz.py --programs 2000` runs long.
"""

from __future__ import annotations

from fuzzing import Program, check_program
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st


@settings(max_examples=40, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(st.data())
def test_random_programs_match_eager(data):
    check_program(Program.draw(data))


@settings(max_examples=25, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(st.data())
def test_random_programs_match_eager_in_transparent_mode(data):
    check_program(Program.draw(data), transparent=True)
