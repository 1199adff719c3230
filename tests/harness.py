"""The one differential harness: run user code eagerly and through ndd_trace, compare exactly.

    from harness import Fresh, Step, assert_matches_eager, assert_same

    runs = assert_matches_eager(augment, batch, modes=("compiled", "transparent"), seed=3)
    runs["compiled"].function.cache_info()       # what each run made, for further checks

    def scenario(reader, step):                  # the user's eager loop around a step
        return [step(jpegs) for jpegs, _ in reader.next_epoch(batch_size=4)]
    assert_matches_eager(scenario, Fresh(make_reader), Step(augment), modes=("step",))

Every run starts from the same seed (`ndd.random.set_seed`, here only) and is compared with the
eager run by `assert_same`, the one comparator: the values of every sample bit for bit, with
their dtype, shape, layout and device; the structure and Python types of what was returned
(tuple or list, dict key order, OrderedDict, namedtuples and dataclasses) and which of its
Batches and Tensors are one object (`aliases`: `return y, y`); the exception, its
type (ndd_trace may raise its own subclass of eager's, of the same name) and text, or with
`errors="kind"` its built-in type alone, and the call and stage (the call itself, or consuming
its result) it came at; and the default generator's state afterwards.

The modes (`MODES`), each run against the eager one:

- "compiled": `ndd_trace.compile(fn, **options)` called; a generator function is a compiled
  loop ("loop" is the same run, and checks that `fn` is a generator function);
- "step": `fn` runs eagerly, each `Step(function)` argument compiled (a compiled step called
  from the user's own loop), and a `Compiler()` argument is `ndd_trace.compile`;
- "transparent": `fn` called inside `ndd_trace.enabled()`, its results read there;
- "per_sample": `ndd_trace.compile(fn, per_sample=True)` against the eager per-sample loop;
- "X+transparent": mode X run inside `ndd_trace.enabled()` (a compiled function in a
  transparent-mode script).

Results are read (`observe`) right after each call, inside the mode, before the next call can
move a reader on. Arguments made anew for each run (readers, lists a function appends to) are
given as `Fresh(make)`. The parts, for tests that need them: `run` (one run in one mode) and
`assert_runs_match` (two runs: two ways of writing a loop, a compiled call that must run
first); `assert_each_matches_eager` (one compiled function called after each change a test
makes); `seeded` and `rng_state` (a call that must stay on the test's own line, its warning
checked there); `assert_same` (observation logs the training loops and loop shapes keep).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import inspect
import numbers
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import nvidia.dali.experimental.dynamic as ndd

import ndd_trace

MODES = ("eager", "compiled", "loop", "step", "transparent", "per_sample")


# -- reading values ------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Data:
    """What user code can see of an ndd Batch or Tensor, a torch tensor, or a numpy array."""

    kind: str  # "Batch", "Tensor", "torch", "ndarray"
    dtype: str
    layout: str | None
    device: str | None
    shape: Any
    samples: tuple  # numpy arrays: a Batch's samples, or the one array


def to_numpy(value: Any) -> Any:
    """The numpy data of a Batch (a list of its samples), a Tensor, or a structure of them."""
    if isinstance(value, ndd.Batch):
        return [np.asarray(sample.cpu()) for sample in value]
    if isinstance(value, ndd.Tensor):
        return np.asarray(value.cpu())
    if isinstance(value, (list, tuple)):
        return type(value)(to_numpy(v) for v in value)
    if isinstance(value, dict):
        return {k: to_numpy(v) for k, v in value.items()}
    return value


def rng_state() -> str:
    """The default random generator's state, as text."""
    return str(ndd.random.get_default_rng().state)


def observe(value: Any) -> Any:
    """`value` with its DALI and torch data read into `Data` (numpy arrays), the structure kept:
    tuples, lists (their own types: namedtuples, subclasses), dicts (OrderedDict too; their key
    order), dataclasses; other values as they are."""
    if isinstance(value, (Data, _Items, _Mapping, _Fields)):  # observed already
        return value
    if isinstance(value, ndd.Batch):
        samples = tuple(np.asarray(sample.cpu()) for sample in value)
        return Data("Batch", str(value.dtype), str(value.layout), str(value.device.device_type),
                    tuple(value.shape), samples)
    if isinstance(value, ndd.Tensor):
        return Data("Tensor", str(value.dtype), str(value.layout), str(value.device.device_type),
                    tuple(value.shape), (np.asarray(value.cpu()),))
    if type(value).__module__.startswith("torch") and hasattr(value, "numpy"):
        return Data("torch", str(value.dtype), None, str(value.device), tuple(value.shape),
                    (value.detach().cpu().numpy().copy(),))
    if isinstance(value, np.ndarray):
        return Data("ndarray", str(value.dtype), None, None, value.shape, (value.copy(),))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _Fields(type(value), tuple((field.name, observe(getattr(value, field.name)))
                                          for field in dataclasses.fields(value)))
    if isinstance(value, dict):
        items = [(key, observe(item)) for key, item in value.items()]
        return _Mapping(type(value), tuple(items))
    if isinstance(value, (list, tuple)):
        return _Items(type(value), tuple(observe(item) for item in value))
    return value


@dataclasses.dataclass(frozen=True, eq=False)
class _Items:
    type: type
    items: tuple

    def __eq__(self, other: Any) -> bool:  # equal to another read, or to what was read
        if isinstance(other, _Items):
            return self.type is other.type and self.items == other.items
        return type(other) is self.type and self.items == tuple(other)

    __hash__ = None

    def __iter__(self):  # an observed tuple or list unpacks as one
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return _Items(self.type, self.items[index])
        return self.items[index]


@dataclasses.dataclass(frozen=True)
class _Mapping:
    type: type
    items: tuple  # (key, value) pairs, in order


@dataclasses.dataclass(frozen=True)
class _Fields:
    type: type
    items: tuple  # (field name, value) pairs


def _lazy_base(kind: type) -> type:
    """Transparent mode's values are lazy subclasses of ndd.Batch and ndd.Tensor (a known
    difference, docs/limitations.md): compared as their DALI base type."""
    for base in (ndd.Batch, ndd.Tensor):
        if issubclass(kind, base):
            return base
    return kind


def _same_type(a: type, b: type) -> bool:
    return a is b or _lazy_base(a) is _lazy_base(b) is not None and \
        _lazy_base(a) in (ndd.Batch, ndd.Tensor)


def _same_error_type(eager: type, other: type) -> bool:
    """ndd_trace raises eager's exception type, or its own subclass of it named as it is (a
    PipelineError that is also the RuntimeError eager raises: `except` and the traceback's
    last line stay eager's)."""
    return issubclass(other, eager) and other.__name__ == eager.__name__


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 300 else text[:300] + "..."


# -- the comparator -----------------------------------------------------------------------------

def first_difference(eager: Any, other: Any, where: str = "") -> str | None:
    """Where and how `other` differs from `eager` (values, results or observation logs), or
    None: see `assert_same`."""
    observed = (Data, _Items, _Mapping, _Fields)
    if isinstance(eager, observed) or isinstance(other, observed):
        pass  # one side read already (`observe`): compared as read
    elif isinstance(eager, (ndd.Batch, ndd.Tensor)) or isinstance(other, (ndd.Batch, ndd.Tensor)):
        if not _same_type(type(eager), type(other)):
            return f"{where}: type {type(eager).__name__} != {type(other).__name__}"
    elif type(eager) is not type(other) and not (isinstance(eager, BaseException) and
                                                 isinstance(other, BaseException)):
        return f"{where}: type {type(eager).__name__} != {type(other).__name__}"
    eager, other = observe(eager), observe(other)
    if type(eager) is not type(other) and not (isinstance(eager, BaseException) and
                                               isinstance(other, BaseException)):
        return f"{where}: {_short(eager)} != {_short(other)}"
    if isinstance(eager, Data):
        for name in ("kind", "dtype", "layout", "device", "shape"):
            if getattr(eager, name) != getattr(other, name):
                return f"{where}: {name} {getattr(eager, name)!r} != {getattr(other, name)!r}"
        if len(eager.samples) != len(other.samples):
            return f"{where}: {len(eager.samples)} samples != {len(other.samples)}"
        for index, (a, b) in enumerate(zip(eager.samples, other.samples)):
            if a.dtype != b.dtype or a.shape != b.shape:
                return f"{where}<{index}>: {a.dtype}{a.shape} != {b.dtype}{b.shape}"
            if a.dtype == object:  # arrays of objects (arrays, numbers): element by element
                for k, (x, y) in enumerate(zip(a.ravel(), b.ravel())):
                    found = first_difference(x, y, f"{where}<{index}>.flat[{k}]")
                    if found:
                        return found
                continue
            if np.ascontiguousarray(a).tobytes() != np.ascontiguousarray(b).tobytes():
                return f"{where}<{index}>: values differ (bit for bit){_where_bits(a, b)}"
        return None
    if isinstance(eager, (_Items, _Mapping, _Fields)):
        if eager.type is not other.type:
            return f"{where}: type {eager.type.__name__} != {other.type.__name__}"
        if len(eager.items) != len(other.items):
            return (f"{where}: {len(eager.items)} items != {len(other.items)}: "
                    f"{_short(_summary(eager))} != {_short(_summary(other))}")
        for index, (a, b) in enumerate(zip(eager.items, other.items)):
            if isinstance(eager, _Items):
                found = first_difference(a, b, f"{where}[{index}]")
            else:
                if a[0] != b[0]:
                    return f"{where}: key {a[0]!r} != {b[0]!r} (at {index})"
                sep = f".{a[0]}" if isinstance(eager, _Fields) else f"[{a[0]!r}]"
                found = first_difference(a[1], b[1], f"{where}{sep}")
            if found:
                return found
        return None
    if isinstance(eager, BaseException):
        if not _same_error_type(type(eager), type(other)) or str(eager) != str(other):
            return (f"{where}: raised {type(eager).__name__}: {str(eager)[:300]}\n"
                    f"   vs {type(other).__name__}: {str(other)[:300]}")
        return None
    if isinstance(eager, float) and isinstance(other, float):
        same = np.float64(eager).tobytes() == np.float64(other).tobytes()
        return None if same else f"{where}: {eager!r} != {other!r}"
    try:
        same = bool(eager == other)
    except Exception as error:  # noqa: BLE001 (an == that cannot answer is a difference)
        return f"{where}: cannot compare {_short(eager)} with {_short(other)}: {error}"
    return None if same else f"{where}: {_short(eager)} != {_short(other)}"


def _where_bits(a: np.ndarray, b: np.ndarray) -> str:
    """The first differing element, and whether the values are equal as numbers (-0.0 and
    0.0, NaNs of other payloads)."""
    a_bytes = np.ascontiguousarray(a).view(np.uint8).reshape(a.size, -1) if a.size else a
    b_bytes = np.ascontiguousarray(b).view(np.uint8).reshape(b.size, -1) if b.size else b
    index = int(np.flatnonzero((a_bytes != b_bytes).any(axis=-1))[0])
    x, y = a.reshape(-1)[index], b.reshape(-1)[index]
    numeric = bool(x == y or (x != x and y != y))
    return (f": first at flat index {index}, {x!r} != {y!r}"
            + (" (equal as numbers: the sign of a zero, or a NaN's payload)" if numeric else ""))


def _summary(value: Any) -> Any:
    """A value without its arrays (for a readable message)."""
    if isinstance(value, Data):
        return f"<{value.kind} {value.dtype} {value.shape}>"
    if isinstance(value, (_Items, _Mapping, _Fields)):
        return [_summary(item) for item in value.items][:40]
    if isinstance(value, tuple):
        return tuple(_summary(item) for item in value)
    return value


def assert_same(eager: Any, other: Any, context: Any = "") -> None:
    """The one comparator: `other` is exactly `eager`. ndd Batches and Tensors (and torch
    tensors, numpy arrays): the same kind (transparent mode's lazy subclasses count as their
    base), dtype, layout, device, shape, and every sample bit for bit. Containers: the same
    type (tuple is not list; OrderedDict, namedtuples, dataclasses), length, keys in the same
    order, and items. Exceptions: the same type (or ndd_trace's subclass of it, of the same
    name) and text. Floats: bit for bit. Anything else:
    `==`. Raises AssertionError naming the path of the first difference (and `context`)."""
    found = first_difference(eager, other)
    if found is not None:
        raise AssertionError(f"{found}\n{context}" if context else found)


def builtin_kind(error: BaseException) -> str:
    """The built-in exception type an error is (ndd_trace's are subclasses of eager's)."""
    return next(cls.__name__ for cls in type(error).__mro__ if cls.__module__ == "builtins")


# -- the runs ------------------------------------------------------------------------------------

class Fresh:
    """An argument made anew for every run: `Fresh(lambda: ndd.readers.File(...))`."""

    def __init__(self, make: Callable[[], Any]) -> None:
        self.make = make


class Step:
    """A function argument that mode "step" compiles (`Step(fn, **options)`); the others pass
    it as it is."""

    def __init__(self, function: Callable, **options: Any) -> None:
        self.function = function
        self.options = options


class Compiler:
    """An argument that compiles what a scenario hands it: `ndd_trace.compile` (with
    `options`) in mode "step", `lambda f: f` in the others (`def scenario(wrap): step =
    wrap(step)`)."""

    def __init__(self, **options: Any) -> None:
        self.options = options

    def __call__(self, function: Callable) -> Callable:
        return function


@dataclasses.dataclass
class Run:
    """One run of the user's code in one mode."""

    mode: str
    results: list  # per call: its result, observed
    error: BaseException | None  # the exception that ended the run
    error_at: tuple[int, str] | None  # (call index, "call" or "consume")
    rng: str | None  # the default generator's state afterwards (None: not seeded)
    function: Any  # what was called: the compiled function, or `fn`
    args: tuple  # the arguments it was given (Fresh ones made; none kept for the eager run)
    steps: list  # the compiled Step arguments (and what a Compiler compiled)
    report: Any = None  # transparent mode's report, where the mode was transparent
    aliases: list = dataclasses.field(default_factory=list)  # per call: `aliases(result)`

    @property
    def result(self) -> Any:
        """The one call's result."""
        assert len(self.results) == 1 and self.error is None, (self.results, self.error)
        return self.results[0]

    def __iter__(self):  # runs["compiled"] unpacks as its results
        return iter(self.results)


def _compiling(options: dict, steps: list) -> Callable:
    def compiling(function: Callable) -> Any:
        steps.append(ndd_trace.compile(function, **options))
        return steps[-1]
    return compiling


def per_sample_loop(function: Callable, *args: Any, **kwargs: Any) -> Any:
    """The eager reference of a per-sample function (docs/per-sample.md): called on each sample,
    the results gathered in sample 0's structure (tuples, lists, dicts; a namedtuple stays one),
    each Tensor and Python number batched over the samples by `ndd.batch`, any other value
    sample 0's."""
    results = [function(*[a.select(i) if isinstance(a, ndd.Batch) else a for a in args],
                        **kwargs) for i in range(args[0].batch_size)]
    return _gathered(results)


def _gathered(values: list) -> Any:
    first = values[0]
    if isinstance(first, dict):
        return type(first)((key, _gathered([value[key] for value in values])) for key in first)
    if isinstance(first, (tuple, list)):
        items = [_gathered([value[k] for value in values]) for k in range(len(first))]
        return type(first)(*items) if hasattr(first, "_fields") else type(first)(items)
    if isinstance(first, (ndd.Tensor, numbers.Number)):
        return ndd.batch(values)
    return first


def aliases(value: Any) -> tuple:
    """Which Batches and Tensors of a result are one object (`return y, y`): per such value, in
    order, the position of its first occurrence."""
    first: dict[int, int] = {}
    pattern: list[int] = []

    def walk(item: Any) -> None:
        if isinstance(item, (ndd.Batch, ndd.Tensor)):
            pattern.append(first.setdefault(id(item), len(first)))
        elif dataclasses.is_dataclass(item) and not isinstance(item, type):
            for field in dataclasses.fields(item):
                walk(getattr(item, field.name))
        elif isinstance(item, dict):
            for child in item.values():
                walk(child)
        elif isinstance(item, (list, tuple, collections.deque)):
            for child in item:
                walk(child)

    walk(value)
    return tuple(pattern)


def _consume(result: Any) -> Any:
    """A result read: a generator's items (a compiled loop's steps) read one by one."""
    if inspect.isgenerator(result):
        return [observe(item) for item in result]
    return observe(result)


@contextlib.contextmanager
def _warnings(warn: str | None):
    """NddTraceWarnings: "error" (the default: an exact run warns of nothing), "ignore"
    (NddTraceWarnings ignored), "quiet" (every warning ignored), or None (as they are)."""
    assert warn in ("error", "ignore", "quiet", None), warn
    with warnings.catch_warnings():
        if warn == "error":
            warnings.simplefilter("error", ndd_trace.NddTraceWarning)
        elif warn == "ignore":
            warnings.simplefilter("ignore", ndd_trace.NddTraceWarning)
        elif warn == "quiet":
            warnings.simplefilter("ignore")
        yield


def run(fn: Callable, *args: Any, mode: str = "eager", seed: int | None = 1234, calls: int = 1,
        options: dict | None = None, warn: str | None = "error", stop_on_error: bool = True,
        reference: str = "plain", **kwargs: Any) -> Run:
    """`fn(*args, **kwargs)` called `calls` times in `mode` from `seed` (None: not reseeded),
    `options` given to `ndd_trace.compile` (or, in mode "transparent", `ndd_trace.enabled`),
    each result read at once; the first exception ends the run (`stop_on_error=False`: it is
    recorded as that call's result, and the calls go on). `reference="per_sample"`: the eager
    run is the per-sample loop (`per_sample_loop`)."""
    assert mode == "eager" or reference == "plain", (mode, reference)
    parts = mode.split("+")
    base, transparent = parts[0], "transparent" in parts[1:] or parts[0] == "transparent"
    assert base in MODES and set(parts[1:]) <= {"transparent"}, mode
    options = options or {}
    if seed is not None:  # (before the arguments are made: a reader's making may draw)
        ndd.random.set_seed(seed)
    made = [arg.make() if isinstance(arg, Fresh) else arg for arg in args]
    steps = []
    if base == "step":
        for index, arg in enumerate(made):
            if isinstance(arg, Step):
                made[index] = ndd_trace.compile(arg.function, **arg.options)
                steps.append(made[index])
            elif isinstance(arg, Compiler):
                made[index] = _compiling(arg.options, steps)
    made = [arg.function if isinstance(arg, Step) else arg for arg in made]
    function: Any = fn
    if base in ("compiled", "loop"):
        assert base != "loop" or inspect.isgeneratorfunction(fn), f"{fn} is not a generator"
        function = ndd_trace.compile(fn, **options)
    elif base == "per_sample":
        function = ndd_trace.compile(fn, per_sample=True, **options)
    results: list = []
    shared: list = []  # per call: its result's aliases
    error = error_at = report = None
    if transparent:
        ndd_trace.reset_report()
    with _warnings(warn), \
            ndd_trace.enabled(**(options if base == "transparent" else {})) if transparent \
            else contextlib.nullcontext():
        for index in range(calls):
            stage = "call"
            try:
                if reference == "per_sample":
                    result = per_sample_loop(fn, *made, **kwargs)
                else:
                    result = function(*made, **kwargs)
                stage = "consume"
                found = () if inspect.isgenerator(result) else aliases(result)
                results.append(_consume(result))
                shared.append(found)
            except Exception as caught:  # noqa: BLE001 (compared with the other runs')
                if not stop_on_error:
                    results.append(caught)
                    continue
                error, error_at = caught, (index, stage)
                break
        state = rng_state() if seed is not None else None
    if transparent:
        report = ndd_trace.report()
        ndd_trace.reset_report()
    # the eager run keeps no argument alive: an eager File reader alive past its run makes the
    # next reader of the same (rewritten) files read other bytes (DALI 2.4, seen with
    # test_streams' files changed between epochs, read by a compiled generator)
    kept = () if mode == "eager" else tuple(made)
    return Run(mode, results, error, error_at, state, function, kept, steps, report, shared)


def assert_runs_match(eager: Run, other: Run, errors: str = "exact", context: Any = "") -> None:
    """`other` saw what `eager` saw: each call's result, the exception (`errors="exact"`: its
    type and text; `"kind"`: its built-in type, as ndd_trace may raise its own subclass with
    its own text) and where it came, and the generator's state afterwards."""
    label = f"{other.mode} vs eager" + (f"\n{context}" if context else "")
    if eager.error is not None or other.error is not None:
        assert eager.error is not None and other.error is not None, (
            f"only one side raised ({label}):\neager: {eager.error!r}\n"
            f"{other.mode}: {other.error!r}")
        assert eager.error_at == other.error_at, (
            f"raised at another moment ({label}): {eager.error_at} != {other.error_at}\n"
            f"eager: {eager.error!r}\n{other.mode}: {other.error!r}")
        if errors == "exact":
            assert_same(eager.error, other.error, label)
        else:
            assert builtin_kind(eager.error) == builtin_kind(other.error), (
                f"raised differently ({label}):\neager: {eager.error!r}\n"
                f"{other.mode}: {other.error!r}")
    assert_same(eager.results, other.results, label)
    # (the per-sample loop batches each output anew: its reference has no aliases to compare)
    assert eager.aliases == other.aliases or other.mode == "per_sample", (
        f"other values are one object ({label}): {eager.aliases} != {other.aliases}")
    assert eager.rng == other.rng, f"the generator's state afterwards differs ({label})"


def assert_matches_eager(fn: Callable, *args: Any, modes: Iterable[str] = ("compiled",
                                                                         "transparent"),
                         seed: int | None = 1234, calls: int = 1, errors: str = "exact",
                         options: dict | None = None, warn: str | None = "error",
                         exact_paths: bool = False, stop_on_error: bool = True,
                         raises: bool | None = None, context: Any = "",
                         **kwargs: Any) -> dict[str, Run]:
    """Run `fn(*args, **kwargs)` (`calls` times) eagerly and in each of `modes` from the same
    seed, and assert that each run saw exactly what the eager run saw (`assert_runs_match`).
    `exact_paths`: compiled and per-sample functions also traced once and ran nothing eagerly.
    `raises`: the eager run raised (True) or did not (False). Returns the runs by mode ("eager"
    included) for the test's own further checks."""
    modes = tuple(modes)
    reference = "per_sample" if "per_sample" in modes else "plain"
    assert reference == "plain" or modes == ("per_sample",), "per_sample is compared alone"
    runs = {"eager": run(fn, *args, mode="eager", seed=seed, calls=calls, warn=warn,
                         stop_on_error=stop_on_error, reference=reference, **kwargs)}
    if raises is not None:
        assert (runs["eager"].error is not None) == raises, (
            f"eager {'did not raise' if raises else 'raised'}: {runs['eager'].error!r}")
    for mode in modes:
        runs[mode] = run(fn, *args, mode=mode, seed=seed, calls=calls, options=options,
                         warn=warn, stop_on_error=stop_on_error, **kwargs)
        assert_runs_match(runs["eager"], runs[mode], errors, context)
        if exact_paths and mode.split("+")[0] in ("compiled", "loop"):
            info = runs[mode].function.cache_info()
            assert info.fallbacks == 0 and info.traces == 1, info
        if exact_paths and mode == "per_sample":
            assert runs[mode].function.builds == 1
    return runs


def assert_compiles_exactly(fn: Callable, *args: Any, seed: int | None = 1234, calls: int = 1,
                            **kwargs: Any) -> Any:
    """`assert_matches_eager` in mode "compiled" alone, `exact_paths` (one trace, nothing run
    eagerly, no NddTraceWarning); returns the compiled function."""
    runs = assert_matches_eager(fn, *args, modes=("compiled",), seed=seed, calls=calls,
                                exact_paths=True, **kwargs)
    return runs["compiled"].function


def assert_each_matches_eager(function: Callable, *args: Any, mode: str = "compiled",
                              seeds: Iterable[int] | None = None,
                              changes: Iterable[Callable[[], Any]] | None = None,
                              options: dict | None = None, warn: str | None = "error",
                              exact_paths: bool = False) -> Any:
    """One compiled (`mode="per_sample"`: per-sample) function called once per seed (None: 0, 1,
    2, or one per change), each call
    after its change (`changes`: what the test changes first, `change()`: a global rebound, a
    default changed, ...): each call's result and the generator's state afterwards equal an
    eager call's (the eager per-sample loop's) made after the same change from the same seed.
    `exact_paths`: built (per-sample) or traced (compiled) once, nothing run eagerly. Returns
    the compiled function."""
    assert mode in ("compiled", "per_sample"), mode
    compiled = ndd_trace.compile(function, per_sample=mode == "per_sample", **(options or {}))
    changes = list(changes) if changes is not None else None
    seeds = list(seeds) if seeds is not None else \
        list(range(len(changes))) if changes is not None else [0, 1, 2]
    changes = changes if changes is not None else [lambda: None] * len(seeds)
    assert len(changes) == len(seeds), (len(changes), len(seeds))
    for seed, change in zip(seeds, changes):
        change()
        eager = run(function, *args, seed=seed, warn=warn,
                    reference="per_sample" if mode == "per_sample" else "plain")
        other = run(compiled, *args, seed=seed, warn=warn)
        other.mode = mode
        assert_runs_match(eager, other, context=f"the call from seed {seed}")
    if exact_paths and mode == "per_sample":
        assert compiled.builds == 1, compiled.builds
    elif exact_paths:
        info = compiled.cache_info()
        assert info.fallbacks == 0 and info.traces == 1, info
    return compiled


@contextlib.contextmanager
def seeded(seed: int):
    """A block run from `seed`, for scenarios that drive their own modes and observation log:
    `with seeded(3): log = scenario(...)`, then `assert_same(eager_log, log)`."""
    ndd.random.set_seed(seed)
    yield


__all__ = ["MODES", "Compiler", "Data", "Fresh", "Run", "Step", "aliases", "assert_compiles_exactly",
           "assert_each_matches_eager",
           "assert_matches_eager", "assert_runs_match", "assert_same", "builtin_kind",
           "first_difference", "observe", "per_sample_loop", "rng_state", "run", "seeded",
           "to_numpy"]
