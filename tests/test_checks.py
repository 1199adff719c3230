"""core/checks.py: the API's options and arguments checked where they are given (found by the twenty-third
session's sweep of a new user's mistakes): a wrong one raises at the user's line, naming it and
what it takes, where it was taken by its truth (`optimize="no"` was on), failed later deep in
the cache, or decorated a class into an internal AttributeError."""

from __future__ import annotations

import functools
import subprocess
import sys
import traceback

import numpy as np
import pytest
import torch
from conftest import subprocess_env
from harness import Step, assert_compiles_exactly, assert_matches_eager

import nvidia.dali.experimental.dynamic as ndd
import ndd_trace


def _flip(x, size=2):
    return ndd.flip(x, horizontal=1)


async def _async_step(x):
    return ndd.flip(x)


class _Callable:
    def __call__(self, x):
        return ndd.flip(x)


MISTAKES = {
    # what the user wrote: (the call, the exception, words of its text)
    'optimize="no"': (lambda: ndd.compile(_flip, optimize="no"), TypeError,
                      "optimize must be True or False, got 'no'"),
    'fullgraph="False"': (lambda: ndd.compile(fullgraph="False")(_flip), TypeError,
                          "fullgraph must be True or False"),
    'per_sample="no"': (lambda: ndd.compile(_flip, per_sample="no"), TypeError,
                        "per_sample must be True or False"),
    'cache_limit="8"': (lambda: ndd.compile(_flip, cache_limit="8"), TypeError,
                        "cache_limit must be a positive int, got '8'"),
    "cache_limit=0": (lambda: ndd.compile(_flip, cache_limit=0), ValueError,
                      "cache_limit must be a positive int, got 0"),
    "num_threads=-3": (lambda: ndd.compile(_flip, num_threads=-3), ValueError,
                       "num_threads must be a positive int or None"),
    'device_id="cuda"': (lambda: ndd.compile(_flip, device_id="cuda"), TypeError,
                         "device_id must be \"current\", None or a GPU's index"),
    'prefetch_queue_depth="deep"': (lambda: ndd.compile(_flip, prefetch_queue_depth="deep"),
                                    TypeError, "prefetch_queue_depth must be a positive int"),
    "per_sample with fullgraph": (lambda: ndd.compile(_flip, per_sample=True, fullgraph=True),
                                  ValueError, "fullgraph=True is not available with per_sample"),
    "a class": (lambda: ndd.compile(_Callable), TypeError,
                "got the class _Callable: compile its method"),
    "a builtin": (lambda: ndd.compile(len), TypeError, "expects a Python function"),
    "a staticmethod object": (lambda: ndd.compile(staticmethod(_flip)), TypeError,
                              "put @staticmethod above @ndd.compile"),
    "an async function": (lambda: ndd.compile(_async_step), TypeError,
                          "cannot compile the async function"),
    "explain(None)": (lambda: ndd_trace.explain(None), TypeError, "expects a function"),
    "@ndd_trace.enabled": (lambda: ndd_trace.enabled(_flip), TypeError,
                           "used with parentheses"),
    "export to a folder": (lambda: ndd_trace.export(_flip, path="."), IsADirectoryError,
                           "`path` must name a file"),
    "export into a missing folder": (lambda: ndd_trace.export(_flip, path="no/such/f.py"),
                                     FileNotFoundError, "does not exist"),
    "export batch_size=-2": (lambda: ndd_trace.export(_flip, path="f.py", batch_size=-2),
                             ValueError, "batch_size must be a positive int"),
    'export seed="abc"': (lambda: ndd_trace.export(_flip, path="f.py", seed="abc"), TypeError,
                          "seed must be an int or None"),
    'set_cache_dir("")': (lambda: ndd_trace.set_cache_dir(""), ValueError,
                          "must name a directory"),
    "set_cache_dir(a file)": (lambda: ndd_trace.set_cache_dir(__file__), NotADirectoryError,
                              "must name a directory"),
    'enabled(optimize="off")': (lambda: ndd_trace.enabled(optimize="off"), TypeError,
                                "optimize must be True or False"),
}


@pytest.mark.parametrize("mistake", MISTAKES)
def test_a_wrong_option_raises_at_the_users_line_naming_it(mistake):
    call, kind, words = MISTAKES[mistake]
    with pytest.raises(kind, match=words.replace("(", r"\(").replace(")", r"\)")) as caught:
        call()
    last = traceback.extract_tb(caught.value.__traceback__)[-1]
    assert last.filename == __file__, last


def test_an_option_set_on_a_compiled_function_is_checked_too():
    compiled = ndd.compile(_flip)
    for name, value in (("cache_limit", "16"), ("optimize", "off"), ("fallback", "zzz")):
        with pytest.raises((TypeError, ValueError), match=name if name == "fallback" else
                           "the value must be"):
            setattr(compiled, name, value)
    assert (compiled.cache_limit, compiled.optimize, compiled.fallback) == (8, False, "lazy")


def test_compiling_a_compiled_function_compiles_its_function_with_the_new_options(batch):
    compiled = ndd.compile(_flip)
    again = ndd.compile(cache_limit=2)(compiled)  # (it wrapped the compiled object: each
    assert again.cache_limit == 2 and again.__wrapped__ is _flip  # trace failed)
    again(batch)
    assert (again.cache_info().traces, again.cache_info().fallbacks) == (1, 0)


def _wrong_calls(step, batch):
    """Each call of `step` with arguments that do not bind: its TypeError's text, and whether
    it was raised at the call (a generator's too) rather than at its first step."""
    seen = []
    for args, kwargs in (((), {}), ((batch, 2, 3), {}), ((batch,), {"sise": 3})):
        try:
            made = step(*args, **kwargs)
        except TypeError as error:
            seen.append(("at the call", str(error)))
            continue
        try:
            next(iter(made))
        except TypeError as error:
            seen.append(("when iterated", str(error)))
    return seen


def _epoch(x, size=2):
    yield ndd.flip(x, horizontal=1)


@pytest.mark.parametrize("function", [_flip, _epoch], ids=["function", "generator"])
def test_a_call_that_does_not_bind_raises_pythons_error_at_the_call(function, batch):
    """As eagerly, at the call (a compiled generator raised only once iterated), ending at the
    user's line, and counted nowhere (each was a miss, a trace and a fallback)."""
    runs = assert_matches_eager(_wrong_calls, Step(function), batch, modes=("step",))
    compiled = runs["step"].steps[0] if runs["step"].steps else None
    if compiled is not None and not compiled.is_generator:
        assert compiled.cache_info().traces == 0
    compiled = ndd.compile(function)
    try:
        compiled(batch, sise=3)
    except TypeError as error:
        assert traceback.extract_tb(error.__traceback__)[-1].filename == __file__


def _same(value):
    return value


def _types_returned(step):
    given = (np.ones((2, 3), np.uint8), torch.ones(2, 3, dtype=torch.uint8))
    return [(type(step(value)).__name__, np.asarray(step(value)).tolist()) for value in given]


def test_torch_and_numpy_arguments_of_the_same_data_key_apart():
    """A torch tensor and a numpy array of equal data were one key: the second call got the
    first one's cached result, of the other type."""
    runs = assert_matches_eager(_types_returned, Step(_same), modes=("step",), warn="ignore")
    assert [name for name, _ in runs["eager"].results[0]] == ["ndarray", "Tensor"]


@pytest.mark.parametrize("value, on", [("on", True), ("disabled", False)])
def test_ndd_trace_environment_variable_values(value, on, tmp_path):
    """NDD_TRACE=disabled (or none, maybe, 2) switched transparent mode on; a value not
    understood now says so on stderr and leaves it off."""
    script = tmp_path / "probe.py"
    script.write_text("import nvidia.dali.experimental.dynamic as ndd\nimport ndd_trace\n"
                      "print(ndd_trace.is_enabled())\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120, env=subprocess_env(NDD_TRACE=value))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(on)
    assert ("is not understood" in done.stderr) == (value == "disabled")


def test_optimize_environment_variable_not_understood_warns(monkeypatch):
    from ndd_trace.codegen import optimize

    monkeypatch.setenv("NDD_TRACE_OPTIMIZE", "maybe")
    with pytest.warns(ndd_trace.NddTraceWarning, match="NDD_TRACE_OPTIMIZE='maybe' is not"):
        assert optimize.requested(None) is False
    monkeypatch.setenv("NDD_TRACE_OPTIMIZE", "yes")
    assert optimize.requested(None) is True


def test_a_functools_partial_and_a_callable_object_still_compile(batch):
    for function in (functools.partial(_flip, size=3), _Callable()):
        assert_compiles_exactly(function, batch)
