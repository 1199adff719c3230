"""The static check that decides whether a compiled generator's loop body may be traced once."""

from __future__ import annotations

import warnings

import numpy as np
import nvidia.dali.experimental.dynamic as ndd
import pytest
from harness import Fresh, Step, assert_matches_eager
import stepcheck_cases as cases

import ndd_trace
from ndd_trace.tracing.stepcheck import check_generator


@pytest.mark.parametrize("function", [cases.plain, cases.plain_zip_branch_on_argument,
                                      cases.after_loop])
def test_step_invariant_bodies_are_proved(function):
    assert check_generator(function) is None


@pytest.mark.parametrize("function, reason", [
    (cases.counter, "reads `i`"),
    (cases.appends, "out.append"),
    (cases.augassign_break, "step += 1"),
    (cases.calls_impure_helper, "print"),
    (cases.python_random, "random.randint"),
    (cases.method_of_argument, "self.aug"),
])
def test_per_step_python_is_found_with_its_line(function, reason):
    finding = check_generator(function)
    assert finding is not None and reason in finding.reason, finding
    assert finding.loc.filename == cases.__file__


def test_checked_loop_is_exact_warned_and_explained(jpeg_dir):
    """Two epochs of a loop body that reads its step index: eager's values (the harness), a
    warning at the user's line, and explain saying it runs as a checked loop."""
    assert_matches_eager(cases.counter, Fresh(lambda: ndd.readers.File(file_root=jpeg_dir,
                                                                       seed=1)),
                         modes=("loop",), calls=2, warn="ignore")
    compiled = ndd.compile(cases.counter)
    with pytest.warns(ndd_trace.NddTraceWarning, match="checked mode") as caught:
        list(compiled(ndd.readers.File(file_root=jpeg_dir, seed=1)))
    assert caught[0].filename == cases.__file__
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        explanation = ndd_trace.explain(compiled, ndd.readers.File(file_root=jpeg_dir))
    assert explanation.path == "checked loop" and "runs as: checked loop" in str(explanation)


def test_proved_loop_is_compiled(jpeg_dir):
    compiled = ndd.compile(cases.plain)
    reader = ndd.readers.File(file_root=jpeg_dir, seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ndd_trace.NddTraceWarning)
        for _ in compiled(reader):
            pass
    assert compiled.entries[0].path == "compiled loop"


def test_checked_loop_runs_ahead_across_steps_and_epochs(jpeg_dir):
    """Checked mode keeps one tracer for the function's epochs: the steps after the first
    three of a steady body are served by runs launched ahead, with eager's values, side
    effects and generator state; the hooks go when an epoch ends."""
    def two_epochs(function):
        reader = ndd.readers.File(file_root=jpeg_dir, seed=1)
        seen, out = [], []
        for _ in range(2):
            out += [np.asarray(ndd.as_tensor(x, pad=True)).copy()
                    for x in function(reader, seen)]
        return out, seen, np.asarray(ndd.random.uniform(range=[0, 1], batch_size=4)).copy()

    ndd_trace.reset_report()  # (values, side effects, a draw after, the generator's state)
    runs = assert_matches_eager(two_epochs, Step(cases.counted_augment), modes=("step",),
                                seed=5, warn="ignore")
    assert len(runs["eager"].result[0]) == 16
    ahead = sum(region.ahead for region in ndd_trace.report().regions)
    assert ahead >= 8, ndd_trace.report()
    assert not ndd_trace._dali.tracing_active() and ndd_trace._dali.interceptor._count == 0
