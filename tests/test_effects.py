"""A compiled function's Python side effects (tracing/effects.py): a call known to be impure
(print, next, random, time, logging, numpy.random, a global container appended to) runs in
transparent mode, its Python at every call, and says so at the user's line; pure Python stays
compiled."""

from __future__ import annotations

import bisect
import collections
import copy
import heapq
import operator
import itertools
import random
import re
import warnings

import numpy as np
import nvidia.dali.experimental.dynamic as ndd
import pytest
from harness import Step, assert_compiles_exactly, assert_matches_eager, assert_same

import ndd_trace
from ndd_trace.tracing import effects


# A compiled function's Python runs at its trace only: a call known to be impure (print, next,
# random, time, logging, numpy.random) would run once, silently. It runs in transparent mode
# instead, its Python at every call (found by a differential sweep of ordinary training scripts).
_effects_counter = None


def _step_with_effects(x, printed):
    k = next(_effects_counter)
    printed.append(k)  # (a list the caller sees: the guards alone would re-trace every call)
    if random.random() < 0.5:  # the torchvision idiom: a Python coin for a flip
        x = ndd.flip(x, horizontal=1)
    return ndd.cast(x, dtype=ndd.float32) * float(np.random.uniform(0.5, 1.5)), k


def _effects_run(function, x, calls=6):
    global _effects_counter
    _effects_counter = itertools.count()
    random.seed(7)
    np.random.seed(7)
    printed: list = []
    outputs = [function(x, printed) for _ in range(calls)]
    return outputs, printed, random.random(), np.random.random()


def test_python_effects_in_a_compiled_function_run_at_every_call(uniform_batch):
    """Found by a differential sweep of ordinary training scripts: it once gave a silently wrong
    result."""
    eager = _effects_run(_step_with_effects, uniform_batch)
    compiled = ndd.compile(_step_with_effects)
    with pytest.warns(ndd_trace.NddTraceWarning, match="calls `next`.*transparent mode") as seen:
        result = _effects_run(compiled, uniform_batch)
    assert seen[0].filename == __file__  # at the user's line of the call
    assert_same(eager[0], result[0])
    assert eager[1:] == result[1:]  # the counter's values, the RNG states after
    text = str(ndd_trace.explain(compiled, uniform_batch, []))
    assert "calls `next`" in text and "test_effects.py:" in text


def test_python_effects_in_a_helper_are_found(uniform_batch):
    """Found by a differential sweep of ordinary training scripts: it once gave a silently wrong
    result."""
    import logging
    log = logging.getLogger("ndd_trace.tests.effects")

    def augment(x):
        log.debug("augmenting")
        return ndd.flip(x, horizontal=1)

    def step(x):
        return augment(x)

    with pytest.raises(ndd_trace.GraphBreakError, match="calls `augment`, which calls "
                       "`log.debug`"):
        ndd.compile(step, fullgraph=True)(uniform_batch)
    with pytest.warns(ndd_trace.NddTraceWarning):
        assert_same(step(uniform_batch), ndd.compile(step)(uniform_batch))


_SETTINGS = {"scale": 2.0}
_effects_log = collections.deque(maxlen=100)  # guarded by identity only: a change goes unseen


def _log_step(message):
    _effects_log.append(message)


def test_a_global_deque_appended_to_by_a_helper(uniform_batch):
    """Found by a differential sweep of ordinary training scripts: it once gave a silently wrong
    result."""
    def step(x):
        _log_step("step")
        return ndd.flip(x, horizontal=1)

    _effects_log.clear()
    eager = [step(uniform_batch) for _ in range(3)]
    assert len(_effects_log) == 3
    _effects_log.clear()
    compiled = ndd.compile(step)
    with pytest.warns(ndd_trace.NddTraceWarning, match="calls `_log_step`, which calls "
                      "`_effects_log.append`"):
        results = [compiled(uniform_batch) for _ in range(3)]
    assert len(_effects_log) == 3
    assert_same(eager, results)


def test_pure_python_in_a_compiled_function_stays_compiled(uniform_batch):
    """Found by a differential sweep of ordinary training scripts: it once gave a silently wrong
    result."""
    def helper(x, size):
        return ndd.resize(x, size=[size, size])

    def step(x, size=3):
        scale = float(np.mean(np.array([1.0, 2.0]))) * _SETTINGS.get("scale", 1.0)
        assert ",".join(["a", "b"]) and sorted([2, 1])
        outs = [ndd.flip(v, horizontal=1) for v in (x, x)]
        return ndd.cast(helper(outs[0], size), dtype=ndd.float32) * scale, len(outs), \
            x.batch_size

    assert_compiles_exactly(step, uniform_batch, calls=3)  # (NddTraceWarnings are errors: no break)


# a function whose source Python cannot show (`python -c`, exec'd text): its bytecode is read
_NO_SOURCE = '''
def pick_flip(x):
    op = random.choice(FLIPS)
    return op(x)
'''


def _without_source():
    namespace = {"random": random, "ndd": ndd,
                 "FLIPS": [lambda x: ndd.flip(x, horizontal=1), lambda x: ndd.flip(x, vertical=1),
                           lambda x: ndd.transpose(x, perm=[1, 0, 2])]}
    exec(compile(_NO_SOURCE, "<string>", "exec"), namespace)  # noqa: S102 (as `python -c` does)
    return namespace["pick_flip"]


def _six_picks(step, x):
    random.seed(3)
    return [step(x) for _ in range(6)], random.random()


def test_python_effects_in_a_function_without_source_are_found(uniform_batch):
    """Found by this project's own probe: under `python -c` (no source to read) a Python
    `random.choice` went unseen, and the first call's pick came back at every call."""
    from harness import Step, assert_matches_eager
    assert_matches_eager(_six_picks, Step(_without_source()), uniform_batch, modes=("step",),
                         warn="ignore")
    compiled = ndd.compile(_without_source())
    with pytest.warns(ndd_trace.NddTraceWarning, match="calls `random.choice`"):
        compiled(uniform_batch)
    assert compiled.cache_info().fallbacks == 1


# writes a function without source makes: into a global's item and attribute, an argument's
# item, through a local bound to a global; and into objects of its own, which are not effects
_NO_SOURCE_WRITES = '''
def count_item(x):
    STATS["n"] += 1
    return ndd.flip(x, horizontal=1)

def count_attribute(x):
    STATE.calls = STATE.calls + 1
    return ndd.flip(x, horizontal=1)

def into_argument(x, seen):
    seen["last"] = 1
    return ndd.flip(x, horizontal=1)

def through_a_local(x):
    stats = STATS
    stats["n"] = stats["n"] + 1
    return ndd.flip(x, horizontal=1)

def grows_an_argument(x, hist):
    hist += [1]
    return ndd.flip(x, horizontal=1)

def grows_it_through_a_local(x, hist):
    grown = hist
    grown += [1]
    return ndd.flip(x, horizontal=1)

def a_dunder_by_name(x):
    [STATS.__setitem__("n", STATS["n"] + 1) for _ in range(1)]
    return ndd.flip(x, horizontal=1)

def own_objects(x):
    x += 1
    sizes = {"h": 1}
    sizes["w"] = 2
    flags = [0, *[1]]
    flags[0] += 1
    return ndd.flip(x, horizontal=flags[1])
'''


def test_writes_in_a_function_without_source_are_found(uniform_batch):
    """Found by this project's own probe: under `python -c` an exec'd `STATS["n"] += 1` ran at
    the trace only (STATS came back {"n": 1} after six calls, eager's {"n": 6}); its bytecode
    is now read for item and attribute writes, as its source would be."""
    import types
    state = types.SimpleNamespace(calls=0)
    namespace = {"ndd": ndd, "STATS": {"n": 0}, "STATE": state}
    exec(compile(_NO_SOURCE_WRITES, "<string>", "exec"), namespace)  # noqa: S102
    for name, what in (("count_item", "of `STATS`"), ("count_attribute", "of `STATE`"),
                       ("into_argument", "of `seen`, an argument"),
                       ("grows_an_argument", "changes `hist`, an argument, in place"),
                       ("grows_it_through_a_local", "changes `hist`, an argument, in place"),
                       ("a_dunder_by_name", "calls `STATS.__setitem__`"),
                       ("through_a_local", "of `stats`")):
        compiled = ndd.compile(namespace[name])
        namespace["STATS"]["n"] = 0
        with pytest.warns(ndd_trace.NddTraceWarning, match=re.escape(what)):
            for _ in range(3):
                extra = {"into_argument": ({},), "grows_an_argument": ([],),
                         "grows_it_through_a_local": ([],)}.get(name, ())
                args = (uniform_batch, *extra)
                assert_same(namespace[name](*args), compiled(*args))
    assert state.calls == 6 and namespace["STATS"]["n"] == 6  # as six eager calls
    compiled = ndd.compile(namespace["own_objects"])
    with warnings.catch_warnings():
        warnings.simplefilter("error", ndd_trace.NddTraceWarning)
        for _ in range(3):
            assert_same(namespace["own_objects"](uniform_batch), compiled(uniform_batch))
    assert compiled.cache_info()[1:4] == (1, 1, 0)


def _torch_picks(x):
    import torch
    if torch.rand(()).item() < 0.5:  # torch's idiom for a coin: another value at each call
        x = ndd.flip(x, horizontal=1)
    return ndd.cast(x, dtype=ndd.float32) * float(torch.randint(1, 4, ()).item())


def _six_torch_picks(step, x):
    import torch
    torch.manual_seed(5)
    return [step(x) for _ in range(6)], torch.rand(()).item()


def test_torch_random_draws_in_a_compiled_function_run_at_every_call(uniform_batch):
    """torch.rand / torch.randint deciding what a step does: each call draws anew, as eagerly
    (once documented as frozen at the trace)."""
    from harness import Step, assert_matches_eager
    assert_matches_eager(_six_torch_picks, Step(_torch_picks), uniform_batch, modes=("step",),
                         warn="ignore")
    compiled = ndd.compile(_torch_picks)
    with pytest.warns(ndd_trace.NddTraceWarning, match="calls `torch.rand`"):
        compiled(uniform_batch)


# -- what a new-user probe found (each gave the first call's value at every call) ----------------

_STEP = 0


def _count_steps(x):
    global _STEP
    _STEP += 1  # a step counter kept in a global
    return x + _STEP


def _three_counted(step, x):
    global _STEP
    _STEP = 0
    return [step(x) for _ in range(3)], _STEP


def _appends_to_its_default(x, seen=[]):  # noqa: B006 (the mutable default is the point)
    seen.append(1)
    return x * len(seen)


def _reads_a_file(x, path):
    with open(path) as file:
        return x * int(file.read())


def test_a_global_the_function_assigns_is_assigned_at_every_call(uniform_batch):
    from harness import Step, assert_matches_eager
    assert_matches_eager(_three_counted, Step(_count_steps), uniform_batch, modes=("step",),
                         warn="ignore")
    with pytest.warns(ndd_trace.NddTraceWarning, match="assigns `_STEP`"):
        ndd.compile(_count_steps)(uniform_batch)


def test_an_argument_changed_in_place_is_changed_at_every_call(uniform_batch):
    from harness import Step, assert_matches_eager

    def three(step, x):
        _appends_to_its_default.__defaults__[0].clear()
        return [step(x) for _ in range(3)], list(_appends_to_its_default.__defaults__[0])

    assert_matches_eager(three, Step(_appends_to_its_default), uniform_batch, modes=("step",),
                         warn="ignore")


def test_open_is_a_call_with_effects(uniform_batch, tmp_path):
    from harness import Fresh, Step, assert_matches_eager
    path = tmp_path / "gain.txt"

    def three(step, x):
        values = []
        for gain in (1, 2, 3):
            path.write_text(str(gain))
            values.append(step(x, str(path)))
        return values

    assert_matches_eager(three, Step(_reads_a_file), uniform_batch, modes=("step",),
                         warn="ignore")


# -- writes into an object the function did not make (found by a new-user probe: each was lost,
# or frozen at the first call's value, after the trace) ---------------------------------------

class _Config:
    def __init__(self) -> None:
        self.on, self.n, self.items = False, 0, []


def _snapshot(value):
    if isinstance(value, _Config):
        return (value.on, value.n, list(value.items))
    if hasattr(value, "tolist"):
        return value.tolist()
    return copy.deepcopy(value)


def _toggles(x, state):
    state["flip"] = not state["flip"]
    return ndd.flip(x, horizontal=int(state["flip"])), _snapshot(state)


def _counts(x, stats):
    stats["n"] += 1
    return x, _snapshot(stats)


def _grows(x, hist):
    hist += [len(hist)]
    return x, _snapshot(hist)


def _toggles_an_attribute(x, cfg):
    cfg.on = not cfg.on
    return ndd.flip(x, horizontal=int(cfg.on)), _snapshot(cfg)


def _changes_a_list_and_a_dict(x, heap, table):
    heapq.heappush(heap, -len(heap))
    bisect.insort(heap, len(heap))
    operator.setitem(table, "k", table.get("k", 0) + 1)
    operator.iadd(heap, [0])
    if len(heap) > 4:
        del heap[0]
    table["n"] += 1
    return x, _snapshot(heap), _snapshot(table)


def _changes_an_object_and_an_array(x, cfg, arr):
    cfg.n += 1
    cfg.items.append(cfg.n)
    np.copyto(arr, arr + 1)
    arr[0] = 7
    return x, _snapshot(cfg), _snapshot(arr)


def _bump(stats):
    stats["n"] += 1


def _counts_in_a_helper(x, stats):
    _bump(stats)
    return x, _snapshot(stats)


def _changes_a_tensor(x, tensor):
    tensor.add_(1)
    tensor[0] = 5
    return x, _snapshot(tensor)


@pytest.mark.parametrize("function, make", [
    (_toggles, lambda: {"flip": False}),
    (_counts, lambda: {"n": 0}),
    (_grows, list),
    (_toggles_an_attribute, _Config),
    (_counts_in_a_helper, lambda: {"n": 0}),
])
def test_a_write_into_an_argument_is_made_at_every_call(uniform_batch, function, make):
    from harness import Fresh, assert_matches_eager
    assert_matches_eager(function, uniform_batch, Fresh(make), calls=4, warn="ignore",
                         modes=("compiled", "transparent"))
    with pytest.warns(ndd_trace.NddTraceWarning, match="writes|changes") as seen:
        ndd.compile(function)(uniform_batch, make())
    assert seen[0].filename == __file__


def test_writes_through_the_standard_library_numpy_and_torch(uniform_batch):
    from harness import Fresh, assert_matches_eager
    assert_matches_eager(_changes_a_list_and_a_dict, uniform_batch, Fresh(list),
                         Fresh(lambda: {"n": 0}), calls=4, warn="ignore",
                         modes=("compiled", "transparent"))
    assert_matches_eager(_changes_an_object_and_an_array, uniform_batch, Fresh(_Config),
                         Fresh(lambda: np.zeros(3)), calls=4, warn="ignore",
                         modes=("compiled", "transparent"))
    torch = pytest.importorskip("torch")
    assert_matches_eager(_changes_a_tensor, uniform_batch, Fresh(lambda: torch.zeros(3)),
                         calls=3, warn="ignore", modes=("compiled",))


_WRITTEN = {"n": 0}


def _counts_in_a_global(x):
    _WRITTEN["n"] += 1
    return x


def test_a_write_into_a_global_or_closure_item_is_found(uniform_batch):
    box = {"n": 0}

    def counts_in_a_closure(x):
        box["n"] += 1
        return x

    with pytest.warns(ndd_trace.NddTraceWarning, match=r"writes `_WRITTEN\['n'\]`"):
        compiled = ndd.compile(_counts_in_a_global)
        for _ in range(3):
            compiled(uniform_batch)
    with pytest.warns(ndd_trace.NddTraceWarning, match=r"writes `box\['n'\]`"):
        compiled = ndd.compile(counts_in_a_closure)
        for _ in range(3):
            compiled(uniform_batch)
    assert box["n"] == 3


def _normalized(v):
    v -= 1  # a Batch: rebinds the name
    return v


def _fill(out, value):
    out["value"] = value


def test_writes_into_its_own_objects_and_rebinding_stay_compiled(uniform_batch):
    def step(x, n=1, scale=2.0):
        x += 1  # a Batch argument and numbers: rebound, not changed
        n += 1
        scale *= n
        out, seen, arr = {}, [], np.zeros(2)
        out["flip"] = ndd.flip(x, horizontal=1)
        seen += [1]
        seen.append(2)
        arr[0] = scale
        counts = collections.defaultdict(list)
        counts["a"].append(1)
        y = _normalized(ndd.cast(x, dtype=ndd.float32))
        y += float(arr[0])
        _fill(out, _normalized(x))
        return out, y, len(seen), len(counts)

    assert_compiles_exactly(step, uniform_batch, calls=3)


def test_an_argument_rebound_to_a_copy_first_is_its_own_to_write(uniform_batch):
    """An argument rebound to a new object before any other use (`h = list(h)`, `cfg =
    dict(cfg)`, `h = h + [1]`) is the function's own to write into: it stays compiled (the
    first probe of argument writes sent these to transparent mode)."""
    def step(x, hist, cfg):
        hist = list(hist)
        hist += [1]
        cfg = dict(cfg)
        cfg["k"] = 1
        return ndd.flip(x, horizontal=1), len(hist), sorted(cfg)

    assert_compiles_exactly(step, uniform_batch, [0], {"a": 1}, calls=3)


@pytest.mark.parametrize("body", [
    "hist += [1]\n    hist = list(hist)",  # changed before the copy
    "if flag:\n        hist = list(hist)\n    hist += [1]",  # a copy on one path only
    "hist = hist\n    hist += [1]",  # not a copy
    "cfg = dict(cfg)\n    cfg['a']['b'] = 1",  # a shallow copy's nested object: the caller's
], ids=["changed before", "copied on one path", "not a copy", "nested in a shallow copy"])
def test_an_argument_not_rebound_to_a_copy_first_is_still_written(uniform_batch, body):
    import linecache
    space = {"ndd": ndd}
    source = (f"def step(x, hist, cfg, flag=True):\n    {body}\n"
              "    return ndd.flip(x, horizontal=1)\n")
    filename = f"<rebinding {body!r}>"  # (its source readable, as a file's: the AST path)
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(compile(source, filename, "exec"), space)  # noqa: S102
    from ndd_trace.tracing.effects import find_effect, source_tree
    assert source_tree(space["step"]) is not None
    found = find_effect(space["step"], {"x": uniform_batch, "hist": [0], "cfg": {"a": {}},
                                        "flag": True})
    assert found is not None and "argument" in found.reason, found


class _RandAugment:
    """torchvision's shape: an object whose `__call__` picks its ops with Python's random."""

    def __init__(self, n):
        self.n = n

    def __call__(self, images):
        for _ in range(self.n):
            if random.choice(["flip", "transpose"]) == "flip":
                images = ndd.flip(images, horizontal=1)
            else:
                images = ndd.transpose(images, perm=[1, 0, 2])
        return images

    def pick(self, images):
        return ndd.flip(images, vertical=random.randint(0, 1))


_AUGMENT = _RandAugment(2)


def _through_an_object(x):
    return _AUGMENT(ndd.cast(x, dtype=ndd.float32))


def _through_a_bound_method(x):
    return _AUGMENT.pick(x)


@pytest.mark.parametrize("step", [_through_an_object, _through_a_bound_method],
                         ids=["callable object", "bound method"])
def test_a_callable_object_or_bound_method_that_draws_runs_at_every_call(uniform_batch, step):
    """Found by the session's differential sweep: a module-level RandAugment object whose
    `__call__` draws from `random`, called from a compiled function, had its first pick frozen
    into the trace (no warning); its `__call__` (a bound method's function) is now read as a
    helper's is."""
    from harness import Step, assert_matches_eager
    assert_matches_eager(_six_picks, Step(step), uniform_batch, modes=("step",), warn="ignore")
    compiled = ndd.compile(step)
    with pytest.warns(ndd_trace.NddTraceWarning, match="random"):
        compiled(uniform_batch)


class _SeededAugment:
    """A generator of its own on the object, as a dataset or transform seeds one per worker."""

    def __init__(self, kind):
        self.rng = np.random.default_rng(0) if kind == "numpy" else random.Random(0)

    def rotated(self, images):
        return ndd.rotate(images, angle=float(self.rng.uniform(0, 90)), keep_size=True)


@pytest.mark.parametrize("kind", ["numpy", "random.Random"])
def test_a_generator_the_object_holds_draws_at_every_call(uniform_batch, kind):
    """Found by the twenty-fourth session's sweep: `self.rng.uniform(...)` in a compiled
    method (numpy's Generator, `random.Random`) drew at the trace only, so every later call
    repeated the first angle (silently); the draw is now found, and runs at every call."""
    from harness import Fresh, Step, assert_matches_eager

    def six_calls(augment, step):
        return [step(augment, uniform_batch) for _ in range(6)]

    assert_matches_eager(six_calls, Fresh(lambda: _SeededAugment(kind)),
                         Step(_SeededAugment.rotated), modes=("step",), warn="ignore")


def _describe_by_class(x):
    kind = type(x).__name__
    doubled = ndd.cast(x, dtype=ndd.float32)
    if type(x) is ndd.Batch:  # the user's "batch" path
        doubled = doubled * 2
    return kind, x.__class__.__qualname__, doubled


def _by_class_attribute(x):
    return ndd.flip(x, horizontal=1) * (2 if x.__class__ is ndd.Batch else 1)


def _counts_with_the_batch_sizes_type(x):
    return type(x.batch_size).__name__, ndd.flip(x, horizontal=1)  # (an int, as eagerly)


def _calls_on_a_batch_and_a_tensor(step, batch):
    return step(batch), step(batch.select(0))


def test_a_function_reading_its_arguments_class_runs_as_eager():
    """Found by the twenty-seventh session's sweep: `type(x)` of a traced argument is the
    trace's proxy class, so `type(x) is ndd.Batch` took the other branch, silently, and
    `type(x).__name__` named the proxy. `type(...)` and `.__class__` keep a function from being
    compiled whole, said at the line; `type(x.batch_size)` stays compiled."""
    from harness import Step, assert_matches_eager
    batch = ndd.as_batch([np.arange(4, dtype=np.uint8).reshape(2, 2, 1)] * 2, layout="HWC")
    for function in (_describe_by_class, _by_class_attribute):
        assert_matches_eager(_calls_on_a_batch_and_a_tensor, Step(function), batch,
                             modes=("step", "transparent"), warn="ignore")
        compiled = ndd_trace.compile(function)
        with pytest.warns(ndd_trace.NddTraceWarning, match="a proxy of a class of its own"):
            compiled(batch)
    assert_compiles_exactly(_counts_with_the_batch_sizes_type, batch, calls=2)


# Found by the twenty-eighth session's sweep of new-user programs, each a silent difference.

def _jitter():
    return random.uniform(-10, 10)


_AUGMENTS = {"jitter": _jitter}


def _rotate_by_a_held_helper(x):
    return ndd.rotate(x, angle=_AUGMENTS["jitter"](), fill_value=0)


def _warn_when_large(x, k):
    if k > 1:
        warnings.warn(f"k={k} is large")
    return x * k


def _three_calls(x, step):
    random.seed(0)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        results = [step(x) for _ in range(3)]
    return results, [str(warning.message) for warning in seen
                     if not issubclass(warning.category, ndd_trace.NddTraceWarning)]


def _class_names_through_a_lambda(reads):
    def step(x):
        return x * 2, reads(x)
    return step


@pytest.mark.parametrize("function", [
    _rotate_by_a_held_helper,
    lambda x: _warn_when_large(x, 2),
    _class_names_through_a_lambda(lambda v: v.__class__.__name__),
    _class_names_through_a_lambda(lambda v: sorted(vars(v))[0]),
    _class_names_through_a_lambda(lambda v: [n for n in dir(v) if not n.startswith("__")][0])],
    ids=["helper-in-a-dict", "warnings.warn", "lambda-__class__", "vars", "dir"])
def test_effects_and_class_reads_found_where_the_sweep_found_them(function):
    """A helper called out of a global dict that draws from `random`; `warnings.warn`; a
    lambda (no source of its own: its bytecode is read) reading `.__class__`, `vars()` or
    `dir()` of a traced value: each runs at every call, in transparent mode, as eagerly."""
    x = ndd.as_batch([np.arange(48, dtype=np.uint8).reshape(4, 4, 3)] * 2, layout="HWC")
    runs = assert_matches_eager(_three_calls, x, Step(function), modes=("step",),
                                warn="ignore")
    assert runs["step"].steps[0].cache_info().fallbacks == 3


def _sum_what_it_gives(x, it):
    for value in it:
        x = x + value
    return x


def _one_iterator_twice(x, step):
    it = iter([1.0, 2.0])
    return step(x, it), step(x, it)


def test_an_iterator_argument_is_advanced_at_every_call():
    """An iterator given as an argument: eager's loop consumes it, so the second call sees it
    exhausted; a compiled call's Python runs at its trace only, so it runs in transparent
    mode, said at the function."""
    x = ndd.as_batch([np.zeros((2,), np.float32)])
    assert_matches_eager(_one_iterator_twice, x, Step(_sum_what_it_gives), modes=("step",),
                         warn="ignore")
    with pytest.warns(ndd_trace.NddTraceWarning, match="is given an iterator as `it`"):
        ndd_trace.compile(_sum_what_it_gives)(x, iter([1.0]))


def _kind_of_failure(x):
    try:
        return ndd.rotate(x, angle=None)
    except Exception as error:  # noqa: BLE001
        return type(error).__name__


def test_type_of_a_caught_exception_stays_compiled():
    """`type(e)` of an exception the function caught is no traced value: no graph break for it
    (the sweep found the warning blaming a proxy's class)."""
    x = ndd.as_batch([np.zeros((4, 4, 3), np.uint8)], layout="HWC")
    finding = effects.find_effect(_kind_of_failure, {"x": x})
    assert finding is None or "type(" not in finding.reason, finding
