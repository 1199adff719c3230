"""The hypothesis driver shared by the long fuzzing runs (fuzz.py, fuzz_loops.py).

    def one(data):                      # draws a program from `data`, checks it
        ...
    run_examples(one, programs=300, seed_value=1)
"""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st


def run_examples(body: Callable, programs: int, seed_value: int) -> None:
    """Call `body(data)` on `programs` examples drawn from `seed_value`: no database, no
    deadline, no health checks (programs are slow and their sizes are chosen on purpose)."""

    @seed(seed_value)
    @settings(max_examples=programs, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(st.data())
    def run(data):
        body(data)

    run()
