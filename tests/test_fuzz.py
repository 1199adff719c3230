"""Differential fuzzing: random ndd programs run eagerly and compiled must agree bit for bit.

A fixed seed and a small budget in CI; `python benchmarks/fuzz.py --programs 2000` runs long.
"""

from __future__ import annotations

from fuzzing import Program, check_program
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mutationfuzz import WAYS, Case, check_case, check_consumption


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


@settings(max_examples=40, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_what_a_function_reads_changed_between_calls_matches_eager(batch, data):
    """The families behind issue 35's guard holes (partials, bound methods, defaults, numpy
    scalars, in-place changes), mutated between calls at random."""
    check_case(Case.draw(data), batch)


@settings(max_examples=20, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(ways=st.lists(st.sampled_from(WAYS), min_size=1, max_size=4))
def test_results_consumed_every_way_python_offers_match_eager(batch, ways):
    """len, iter, list, [*x], bool, numpy, shape, dtype, torch, containers, repr, type: in any
    order, eagerly, compiled and in transparent mode."""
    check_consumption(ways, batch)
