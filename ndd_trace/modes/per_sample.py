"""Per-sample functions: code written for one sample runs on a whole batch in one pipeline.

    @ndd.compile(per_sample=True)
    def augment(image):                              # written for one sample (a Tensor)
        if ndd.random.coin_flip(probability=0.3).item():
            image = ndd.rotate(image, angle=ndd.random.uniform(range=[-10, 10]))
        if image.shape[0] > 512:                     # per-sample, data-dependent
            image = ndd.resize(image, resize_shorter=512)
        return image

    out = augment(batch)                             # a whole Batch, one pipeline run
    print(augment.converted_source)                  # the rewritten function

The function's AST is rewritten (printed with astunparse): the tests of `if`/`elif`/`while`,
the operands of `and`/`or`/`not` and conditional expressions go through `_ndd_condition`, which
turns a per-sample value into the predicate of DALI's conditional execution (Python values pass
through unchanged); `x.shape`, `x.item()` and friends go through `_ndd_attribute`. The
rewritten function then runs inside `@pipeline_def(enable_conditionals=True)` (DALI's AutoGraph),
its ndd calls becoming the same operators in pipeline mode, so each sample takes its own branch.

Random ops (the per-sample random stream, docs/per-sample.md): the eager loop
`[augment(sample) for sample in batch]` draws one state per random op call, sample 0's calls in
order, then sample 1's...; which calls a sample makes depends on its path. A pipeline's random
op cannot reproduce that (it reads one state per batch), so each call's values are computed
before the run by the eager op, for a guess of every sample's path (`_RandomStream`); the run
also outputs which samples reached each random op inside a branch (and the values of per-sample
arguments), and the call runs again, with the paths settled so far, until the run confirms the
guess: then the values are exactly the eager loop's, and the generators advance by its draws.
A call not settled in `_MAX_RUNS` runs switches the function to the eager loop (warned).
Random ops with a data input (noise, random crops) run the function as the eager per-sample
loop (with a warning at the line).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import itertools
import operator
import sys
import textwrap
import threading
import types
from collections.abc import Callable
from typing import Any


from .. import _dali
from ..core import keys, ledger, logs, trees
from ..core.ledger import Runs, Verdict
from ..core.errors import PerSampleError
from ..core.source import SourceLoc, register_source, unparse, user_frame, user_location
from ..tracing import guards

_counter = itertools.count()


def _error(message: str, loc: SourceLoc | None = None) -> PerSampleError:
    """The PerSampleError to raise, noted in this thread's scope: DALI's AutoGraph re-raises it
    wrapped, and it is unwrapped where caught."""
    error = PerSampleError(message, loc)
    _scope.raised = error
    return error


class _RunFailed(Exception):
    """Internal: a pipeline run raised `error`."""

    def __init__(self, error: Exception):
        super().__init__(str(error))
        self.error = error


class _EagerCall(Exception):
    """Internal: this call runs as the eager per-sample loop (the variant says why)."""


class _EagerLoop(Exception):
    """Internal: this function runs as the eager per-sample loop (the reason, where)."""

    def __init__(self, reason: str, loc: SourceLoc | None):
        super().__init__(reason)
        self.reason = reason
        self.loc = loc
        _scope.raised = self


# ---------------------------------------------------------------------------------------------
# The AST rewrite

_ATTRIBUTES = {"shape", "item", "dtype", "ndim", "layout", "tolist", "torch", "evaluate",
               "cpu", "gpu", "select", "batch_size", "size"}


class _Rewriter(ast.NodeTransformer):
    """Routes truth tests and tensor attributes of one function through the runtime helpers."""

    def __init__(self, filename: str):
        self.filename = filename

    def _wrap(self, test: ast.expr, helper: str = "_ndd_condition") -> ast.expr:
        if helper == "_ndd_condition" and (isinstance(test, ast.BoolOp) or (
                isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not))):
            return test  # its operands are tested already
        return ast.Call(func=ast.Name(id=helper, ctx=ast.Load()),
                        args=[test, ast.Constant(test.lineno)], keywords=[])

    def visit_If(self, node: ast.If) -> ast.If:
        self.generic_visit(node)
        side_effect = _side_effect_line(node)
        node.test = self._wrap(node.test)
        if side_effect is not None:
            node.test.args.append(ast.Constant(side_effect))
        return node

    def visit_While(self, node: ast.While) -> ast.While:
        self.generic_visit(node)
        node.test = self._wrap(node.test, "_ndd_loop_condition")
        return node

    def visit_BoolOp(self, node: ast.BoolOp) -> ast.BoolOp:
        self.generic_visit(node)
        node.values = [self._wrap(value) for value in node.values]
        return node

    def visit_UnaryOp(self, node: ast.UnaryOp) -> ast.expr:
        self.generic_visit(node)
        if isinstance(node.op, ast.Not):
            node.operand = self._wrap(node.operand)
        return node

    def visit_IfExp(self, node: ast.IfExp) -> ast.expr:
        self.generic_visit(node)

        def thunk(body: ast.expr) -> ast.Lambda:
            return ast.Lambda(args=ast.arguments(posonlyargs=[], args=[], kwonlyargs=[],
                                                 kw_defaults=[], defaults=[]), body=body)

        return ast.copy_location(ast.Call(
            func=ast.Name(id="_ndd_if_exp", ctx=ast.Load()),
            args=[self._wrap(node.test), thunk(node.body), thunk(node.orelse)], keywords=[]),
            node)

    def visit_Attribute(self, node: ast.Attribute) -> ast.expr:
        self.generic_visit(node)
        if node.attr in _ATTRIBUTES and isinstance(node.ctx, ast.Load):
            return ast.copy_location(ast.Call(
                func=ast.Name(id="_ndd_attribute", ctx=ast.Load()),
                args=[node.value, ast.Constant(node.attr), ast.Constant(node.lineno)],
                keywords=[]), node)
        return node

    def visit_Global(self, node: ast.Global) -> Any:
        raise _error("`global` is not supported in a per-sample function",
                             SourceLoc(self.filename, node.lineno, ""))

    visit_Nonlocal = visit_Global


def _side_effect_line(node: ast.If) -> int | None:
    """The first statement in a branch that changes a Python object (attribute or item
    assignment, a method call whose result is dropped): both branches of a per-sample `if` run
    while the pipeline is defined, so its effects would happen for every sample."""
    for statement in [*node.body, *node.orelse]:
        for inner in ast.walk(statement):
            if isinstance(inner, (ast.Assign, ast.AugAssign)) and any(
                    isinstance(t, (ast.Attribute, ast.Subscript))
                    for t in getattr(inner, "targets", [getattr(inner, "target", None)])):
                return inner.lineno
            if isinstance(inner, ast.Expr) and isinstance(inner.value, ast.Call) and \
                    isinstance(inner.value.func, ast.Attribute):
                return inner.lineno
    return None


_HELPERS = '''
def _ndd_if_exp(condition, if_true, if_false):
    if condition:
        value = if_true()
    else:
        value = if_false()
    return value
'''


@dataclasses.dataclass
class Converted:
    """A rewritten per-sample function."""

    function: Callable
    source: str  # the rewritten function (and the conditional-expression helper)
    filename: str
    user_lines: dict[int, int] = dataclasses.field(default_factory=dict)  # source -> user line


def convert(function: Callable) -> Converted:
    """Rewrite `function`'s truth tests and tensor attributes (see the module docstring)."""
    code = function.__code__
    try:
        source = textwrap.dedent(inspect.getsource(function))
    except (OSError, TypeError) as error:
        raise _error(f"the source of `{function.__qualname__}` is not available "
                             f"({error}); per-sample functions are rewritten from their source",
                             SourceLoc(code.co_filename, code.co_firstlineno, code.co_name))
    tree = ast.parse(source)
    ast.increment_lineno(tree, code.co_firstlineno - 1)
    definition = tree.body[0]
    if not isinstance(definition, ast.FunctionDef):
        raise _error("per_sample=True needs a function defined with `def`",
                             SourceLoc(code.co_filename, code.co_firstlineno, code.co_name))
    definition.decorator_list = []
    if any(isinstance(node, (ast.Yield, ast.YieldFrom)) for node in ast.walk(definition)):
        raise _error("a per-sample function cannot be a generator",
                             SourceLoc(code.co_filename, definition.lineno, code.co_name))
    uses_if_exp = any(isinstance(node, ast.IfExp) for node in ast.walk(definition))
    definition = _Rewriter(code.co_filename).visit(definition)
    helpers = ast.parse(_HELPERS).body if uses_if_exp else []
    # The rewritten function is made inside a factory whose parameters are the runtime helpers
    # and the function's closure variables: it then reads the helpers from cells of its own,
    # and everything else where the original reads it, live (its globals, its closure cells).
    helper_names = [*_RUNTIME_HELPERS, *(["_ndd_if_exp"] if uses_if_exp else [])]
    factory = ast.FunctionDef(
        name="_ndd_factory",
        args=ast.arguments(posonlyargs=[], args=[ast.arg(arg=name) for name in
                                                 [*helper_names, *code.co_freevars]],
                           kwonlyargs=[], kw_defaults=[], defaults=[]),
        body=[definition, ast.Return(value=ast.Name(id=definition.name, ctx=ast.Load()))],
        decorator_list=[], returns=None)
    module = ast.fix_missing_locations(ast.Module(body=[*helpers, factory], type_ignores=[]))
    text = unparse(module).strip() + "\n"
    user_lines: dict[int, int] = {}
    for printed, original in zip(ast.walk(ast.parse(text)), ast.walk(module)):
        if isinstance(printed, ast.stmt) and hasattr(original, "lineno"):
            user_lines.setdefault(printed.lineno, original.lineno)
    filename = f"<ndd_trace per-sample:{code.co_name}#{next(_counter)}>"
    register_source(filename, text)
    scratch: dict[str, Any] = {}
    exec(compile(text, filename, "exec"), scratch)  # noqa: S102 (the rewritten function)
    values = {**scratch, **_RUNTIME_HELPERS}  # (`_ndd_if_exp` is defined in the text)
    cells = dict(zip(code.co_freevars, function.__closure__ or ()))
    inner = next(const for const in scratch["_ndd_factory"].__code__.co_consts
                 if isinstance(const, types.CodeType) and const.co_name == definition.name)
    # made from its code, not by calling the factory: defaults and annotations are the
    # original's, evaluated once where it was defined, not again here
    converted = types.FunctionType(
        inner, function.__globals__, function.__name__, function.__defaults__,
        tuple(cells[name] if name in cells else types.CellType(values[name])
              for name in inner.co_freevars) or None)
    converted.__kwdefaults__ = function.__kwdefaults__
    return Converted(converted, text, filename, user_lines)


# ---------------------------------------------------------------------------------------------
# Per-sample values while the pipeline is defined

class _Scope(threading.local):
    definition: Any = None
    raised: Exception | None = None


_scope = _Scope()


def _loc(lineno: int) -> SourceLoc | None:
    definition = _scope.definition
    if definition is None:
        return None
    return SourceLoc(definition.filename, lineno, definition.name)


class Item:
    """A per-sample Python number (`x.item()`, `x.shape[i]`): comparisons and truth tests are
    computed as Python computes them (in float64), and the value can be passed to an op.
    `python`, where known, computes the number in Python from one sample's random values and
    input shapes: a guess of the sample's path, checked by the run (see `_RandomStream`)."""

    __slots__ = ("lineno", "node", "python")

    def __init__(self, node: Any, lineno: int, python: Callable[[_Sample], Any] | None = None):
        self.node = node
        self.lineno = lineno
        self.python = python

    def _wide(self) -> Any:
        return _dali.fn.cast(self.node, dtype=_dali.types.DALIDataType.FLOAT64)

    def _compare(self, other: Any, name: str) -> Item:
        if isinstance(other, Item):
            right = other._wide()
        elif isinstance(other, (bool, int, float)) and not isinstance(other, Item):
            right = _dali.float64_constant(other)
        else:
            raise _error(f"compares a per-sample number with {type(other).__name__}",
                                 _loc(self.lineno))
        left = self._wide()
        result = {"eq": lambda: left == right, "ne": lambda: left != right,
                  "lt": lambda: left < right, "le": lambda: left <= right,
                  "gt": lambda: left > right, "ge": lambda: left >= right}[name]()
        compare = getattr(operator, name)
        python = None
        if self.python is not None and isinstance(other, Item) and other.python is not None:
            mine, theirs = self.python, other.python
            python = lambda sample: compare(mine(sample), theirs(sample))  # noqa: E731
        elif self.python is not None and not isinstance(other, Item):
            mine = self.python
            python = lambda sample: compare(mine(sample), other)  # noqa: E731
        return Item(result, self.lineno, python)

    def __eq__(self, other: object) -> Item:  # type: ignore[override]
        return self._compare(other, "eq")

    def __ne__(self, other: object) -> Item:  # type: ignore[override]
        return self._compare(other, "ne")

    def __lt__(self, other: Any) -> Item:
        return self._compare(other, "lt")

    def __le__(self, other: Any) -> Item:
        return self._compare(other, "le")

    def __gt__(self, other: Any) -> Item:
        return self._compare(other, "gt")

    def __ge__(self, other: Any) -> Item:
        return self._compare(other, "ge")

    __hash__ = None  # type: ignore[assignment]

    def _no_python(self, *args: Any) -> Any:
        raise _error(
            "uses a per-sample number (`.item()`, `.shape[i]`) as a Python value (arithmetic, "
            "int(), range(), formatting): it differs between the samples of one pipeline run. "
            "Compare it, branch on it, or pass it to an ndd op; compute with ndd ops on the "
            "tensor instead", _loc(self.lineno))

    for _name in ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__",
                  "__truediv__", "__rtruediv__", "__floordiv__", "__rfloordiv__", "__mod__",
                  "__rmod__", "__pow__", "__rpow__", "__neg__", "__abs__", "__int__",
                  "__float__", "__index__", "__str__", "__format__", "__len__", "__iter__"):
        locals()[_name] = _no_python
    del _name

    def __repr__(self) -> str:
        return "<per-sample number>"


class _Shape:
    """`x.shape` of a per-sample value: its items are per-sample numbers."""

    def __init__(self, node: Any, lineno: int):
        self._node = node.shape(dtype=_dali.types.DALIDataType.INT64)
        self._lineno = lineno
        definition = _scope.definition
        self._argument = definition.input_keys.get(_dali.node_key(node)) \
            if definition is not None else None

    def __getitem__(self, index: Any) -> Item:
        if not isinstance(index, int):
            raise _error("indexes a per-sample shape with something other than an int",
                                 _loc(self._lineno))
        python = None
        if self._argument is not None:  # an input's shape: known before the run
            argument = self._argument
            python = lambda sample: sample.shape(argument)[index]  # noqa: E731
        return Item(self._node[index], self._lineno, python)

    def __len__(self) -> int:
        raise _error("takes len() of a per-sample shape (use x.ndim)", _loc(self._lineno))


def _ndd_condition(value: Any, lineno: int, side_effect: int | None = None) -> Any:
    """A truth test: Python values pass through; a per-sample number becomes the predicate of
    DALI's conditional execution; a tensor is refused (eager's `if tensor:` is always true)."""
    if isinstance(value, Item):
        if side_effect is not None:
            raise _error(
                f"changes a Python object at line {side_effect} inside a per-sample branch: "
                "both branches are run once to build the pipeline, so the change would happen "
                "for every sample; keep per-sample branches to ndd ops on local variables",
                _loc(lineno))
        predicate = _dali.fn.cast(value.node, dtype=_dali.types.DALIDataType.BOOL)
        definition = _scope.definition
        if definition is not None and value.python is not None:
            python = value.python
            definition.predicates[_dali.node_key(predicate)] = \
                lambda sample: bool(python(sample))
        return predicate
    if _dali.is_data_node(value):
        raise _error(
            "uses a tensor as a Python bool (`if tensor:`): in eager ndd a Tensor has no "
            "truth value of its own, so such a test is always true. Test its value with "
            "`.item()` (e.g. `if flip.item():`), or a comparison of `.item()`", _loc(lineno))
    return value


def _ndd_loop_condition(value: Any, lineno: int) -> Any:
    if isinstance(value, Item) or _dali.is_data_node(value):
        raise _error("a `while` loop on a per-sample value is not supported (a "
                             "pipeline runs the same number of ops for every sample); loop a "
                             "fixed number of times, or branch with `if`", _loc(lineno))
    return value


def _ndd_attribute(value: Any, name: str, lineno: int) -> Any:
    """`x.shape`, `x.item()`, ... of a per-sample value; other objects' attributes as usual."""
    if isinstance(value, Item) and name == "item":
        return lambda: value
    if not _dali.is_data_node(value):
        return getattr(value, name)
    if name == "shape":
        return _Shape(value, lineno)
    if name == "item":
        definition = _scope.definition
        site = definition.site_keys.get(_dali.node_key(value)) if definition else None
        python = (lambda sample: sample.item(site)) if site is not None else None
        return lambda: Item(_dali.fn.reshape(value, shape=[]), lineno, python)
    if name in ("gpu", "cpu") and hasattr(value, name):
        return getattr(value, name)  # a transfer inside the pipeline
    raise _error(f"reads `.{name}` of a per-sample value, which a per-sample pipeline "
                         "does not provide (`.shape` and `.item()` are supported)", _loc(lineno))


_RUNTIME_HELPERS = {"_ndd_condition": _ndd_condition, "_ndd_loop_condition": _ndd_loop_condition,
                    "_ndd_attribute": _ndd_attribute}  # what the rewritten function calls
for _helper in _RUNTIME_HELPERS.values():
    _dali.do_not_convert(_helper)
del _helper


# ---------------------------------------------------------------------------------------------
# Defining the pipeline: ndd calls become pipeline-mode calls

@dataclasses.dataclass
class _Definition:
    """What defining the pipeline of one input signature found."""

    filename: str
    name: str
    observe: bool = True  # add the outputs that say which samples reached each random op
    random_sites: list[_RandomSite] = dataclasses.field(default_factory=list)
    output_tree: Any = None
    num_outputs: int = 0
    # node_key -> the Python guess of a branch predicate (see Item.python)
    predicates: dict[str, Callable[[_Sample], bool]] = dataclasses.field(default_factory=dict)
    site_keys: dict[str, int] = dataclasses.field(default_factory=dict)  # node_key -> site
    input_keys: dict[str, int] = dataclasses.field(default_factory=dict)  # node_key -> argument
    reach_nodes: list = dataclasses.field(default_factory=list)
    index_node: Any = None
    converted_filename: str = ""
    user_lines: dict[int, int] = dataclasses.field(default_factory=dict)


def _call_location(definition: _Definition) -> SourceLoc | None:
    """The user's line of an ndd call made while the pipeline is defined: the rewritten
    function runs as code DALI's AutoGraph generated from it, mapped back here."""
    frame = user_frame(sys._getframe(1))
    if frame is None:
        return None
    origin = _dali.autograph_origin(frame.f_code.co_filename, frame.f_lineno)
    if origin is None:
        return SourceLoc(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)
    filename, lineno = origin
    if filename == definition.converted_filename:
        return SourceLoc(definition.filename, definition.user_lines.get(lineno, lineno),
                         definition.name)
    return SourceLoc(filename, lineno, frame.f_code.co_name)


def _no_guess(sample: _Sample) -> bool:
    raise _Unknown("a predicate computed in the pipeline")


def _logical_guess(definition: _Definition, kind: str, operands: list, result: Any) -> None:
    """The Python guess of a `not`/`and`/`or` of per-sample predicates (see Item.python)."""
    guesses = []
    for operand in operands:
        if _dali.is_data_node(operand):  # unknown: `a or b` is still known where `a` is true
            guesses.append(definition.predicates.get(_dali.node_key(operand), _no_guess))
        else:
            guesses.append(lambda sample, value=bool(operand): value)
    if kind == "not":
        guess = lambda sample: not guesses[0](sample)  # noqa: E731
    elif kind == "and" and len(guesses) == 2:
        guess = lambda sample: guesses[0](sample) and guesses[1](sample)  # noqa: E731
    elif kind == "or" and len(guesses) == 2:
        guess = lambda sample: guesses[0](sample) or guesses[1](sample)  # noqa: E731
    else:
        return
    definition.predicates[_dali.node_key(result)] = guess


def _to_node(value: Any, cast: str | None = None) -> Any:
    if isinstance(value, Item):
        value = value.node
    if cast is not None and _dali.is_data_node(value):
        value = _dali.fn.cast(value, dtype=getattr(_dali.types.DALIDataType, cast))
    return value


def _handler(definition: _Definition, op_class: type, original: Any, inputs: tuple,
             kwargs: dict) -> Any:
    loc = _call_location(definition)
    if _dali.is_stateful(op_class):
        raise _error(f"calls stateful operator `{_dali.op_path(op_class)}` in a "
                             "per-sample function", loc)
    kwargs = {key: value for key, value in kwargs.items()
              if value is not None and key not in ("_caller_frame", "_backend")}
    if kwargs.pop("batch_size", None) is not None:
        raise _error("passes batch_size= in a per-sample function (it works on one "
                             "sample)", loc)
    function, device = _dali.fn_function(op_class, kwargs.pop("device", None))
    if device is not None:
        kwargs["device"] = _dali.decay_static(device)
    if _dali.is_random(op_class):
        rng = kwargs.pop("rng", None)
        rng = _dali.resolve_rng(rng) if rng is not None else None
        return _random_site(definition, op_class, inputs, kwargs, rng, loc)
    args = [_to_node(value) for value in inputs if value is not None]
    converted = {}
    for key, value in kwargs.items():
        cast = _dali.argument_dtype(op_class, key) if isinstance(value, Item) or \
            _dali.is_data_node(value) else None
        converted[key] = _to_node(value, cast) if key != "_random_state" else value
        if not (isinstance(value, Item) or _dali.is_data_node(value)):
            converted[key] = _dali.decay_static(value)
    return function(*args, **converted)


def _random_site(definition: _Definition, op_class: type, inputs: tuple, kwargs: dict,
                 rng: Any, loc: SourceLoc | None) -> Any:
    """A random op: its value for each sample is computed before the run, by the eager op with
    the eager loop's draws (see `_RandomStream`), and fed to the pipeline. A pipeline's random op
    cannot give those values itself: it reads one state per batch (its sample 0's) and derives
    each sample's stream from the sample's position in the batch, while the eager loop draws a
    new state per call. Inside a per-sample branch, the op also outputs the indices of the
    samples that reached it, and the values of its per-sample arguments (`range=` computed from
    the data): the run says which draws the eager loop made, and with what arguments."""
    name = f"ndd.{_dali.op_path(op_class)}"
    if any(value is not None for value in inputs):
        raise _EagerLoop(f"calls random op `{name}` on per-sample data (an op with a data "
                         "input; its values are computed before the run)", loc)
    chain = _dali.condition_chain()
    if any(branch is None for _, branch in chain):
        raise _EagerLoop(f"calls random op `{name}` where DALI merges branches", loc)
    device = kwargs.get("device") or "cpu"
    if device not in ("cpu", "gpu"):
        raise _EagerLoop(f"calls random op `{name}` with device={device!r}", loc)
    per_sample = {key: value for key, value in kwargs.items()
                  if isinstance(value, Item) or _dali.is_data_node(value)}
    static = {key: _dali.decay_static(value) for key, value in kwargs.items()
              if key != "device" and key not in per_sample}
    reach = None
    if chain and definition.observe:
        if definition.index_node is None:
            definition.index_node = _dali.sample_index_source(_SAMPLE_INDEX)
        definition.reach_nodes.append(_dali.in_this_branch(definition.index_node))
        reach = len(definition.reach_nodes) - 1
    arguments = []
    for key, value in per_sample.items():
        if not definition.observe:
            raise _EagerLoop(f"calls random op `{name}` with a per-sample `{key}=`", loc)
        node = _to_node(value, _dali.argument_dtype(op_class, key))
        definition.reach_nodes.append(_dali.in_this_branch(node))
        arguments.append((key, len(definition.reach_nodes) - 1))
    index = len(definition.random_sites)
    source = f"_random_{index}"
    definition.random_sites.append(_RandomSite(source, op_class, static, rng, device, loc,
                                               tuple(chain), reach, tuple(arguments)))
    node = _dali.fn.external_source(name=source, device=device)  # typed by what it is fed
    definition.site_keys[_dali.node_key(node)] = index
    return node


_SAMPLE_INDEX = "_ndd_sample_index"
# A call whose paths are not settled after this many runs (see `_RandomStream`) runs as the
# eager per-sample loop, and so does the function from then on: more runs would cost more than
# the loop.
_MAX_RUNS = 3


@dataclasses.dataclass
class _RandomSite:
    """One random op call of a per-sample function (its values are fed per call)."""

    source: str
    op_class: type
    static: dict[str, Any]
    rng: Any  # None: the calling thread's default generator
    device: str
    loc: SourceLoc | None
    chain: tuple[tuple[str, bool], ...]  # the branches it is inside: (predicate key, branch)
    reach: int | None  # its output of reaching sample indices (None: every sample reaches it)
    arguments: tuple[tuple[str, int], ...] = ()  # per-sample arguments: (name, output)
    placeholder: Any = None  # the value fed for samples that do not reach it


# ---------------------------------------------------------------------------------------------
# The per-sample random stream

class _Unknown(Exception):
    """A Python guess needs a value this sample does not have (a random op it did not reach)."""


class _Sample:
    """One sample's random values and input shapes, as the Python guesses of its predicates
    (`Item.python`) read them."""

    def __init__(self, stream: _RandomStream, index: int):
        self._stream = stream
        self.index = index
        self.values: dict[int, Any] = {}  # site -> this sample's value (a Tensor)

    def item(self, site: int) -> Any:
        if site not in self.values:
            raise _Unknown(site)
        return _dali.host_array(self.values[site]).item()

    def shape(self, argument: int) -> tuple:
        return self._stream.shapes(argument)[self.index]


class _RandomStream:
    """The random values of one call: what the eager loop `[f(s) for s in batch]` draws.

    The eager loop draws, for each random op call a sample makes, one state from the call's
    generator: sample 0's calls in program order, then sample 1's, and so on. Which calls a
    sample makes depends on its path. `assign` takes a guess of every sample's path and gives
    each random op call on it the next state in that order (its value computed by the eager op
    with that state); the run then reports the paths taken (`observe`). If they are the guess,
    the values are the eager loop's: by induction over the samples, each sample starts where
    the eager loop starts it and takes its path with its values. If not, the first (sample,
    random op) where the guess was wrong was decided in the run with the eager loop's values:
    the next guess takes the run's paths up to there (`settle`), so it is right on a longer
    prefix, and the loop would end after at most batch size x random ops runs (it stops at
    `_MAX_RUNS`, and the eager loop runs instead). Usually it ends
    after one run (the guess evaluates predicates on random values and input shapes in
    Python) or two (predicates on data computed in the pipeline are taken from the first)."""

    def __init__(self, definition: _Definition, args: tuple, batch_size: int):
        self._definition = definition
        self._args = args
        self._batch_size = batch_size
        self._shapes: dict[int, list] = {}
        self._rngs = [site.rng if site.rng is not None else _dali.default_rng()
                      for site in definition.random_sites]
        self._clones = {id(rng): _dali.rng_clone(rng) for rng in self._rngs}
        self._states: dict[int, list] = {key: [] for key in self._clones}
        self._used: dict[int, int] = {}
        self._settled = (-1, -1)  # the (sample, random op) up to which the paths are known
        self.last_settled = 0  # the random op of the last (sample, random op) settled
        self._values: dict[tuple, Any] = {}  # (site, state, arguments) -> value
        self._functions = [_dali.op_function_of(site.op_class)
                           for site in definition.random_sites]

    def shapes(self, argument: int) -> list:
        if argument not in self._shapes:
            self._shapes[argument] = self._args[argument].shape
        return self._shapes[argument]

    def _state(self, rng: Any, number: int) -> Any:
        states = self._states[id(rng)]
        while len(states) <= number:  # drawn from a clone: the generator moves at commit
            states.append(_dali.draw_state(self._clones[id(rng)]))
        return states[number]

    def _value(self, site: int, state: Any, arguments: tuple) -> Any:
        key = (site, state.tobytes(), arguments)
        if key not in self._values:
            spec = self._definition.random_sites[site]
            per_sample = {name: _dali.array_of(value) for name, value in arguments}
            self._values[key] = self._functions[site](
                **spec.static, **per_sample, device=spec.device, rng=_dali.ReplayRNG(state))
        return self._values[key]

    def _placeholder(self, site: int) -> Any:
        """The value fed for samples that do not reach the op (the branch drops it), or whose
        arguments are not known yet: the op's own value for an all-zero state (and its default
        per-sample arguments), so that its type and shape fit."""
        spec = self._definition.random_sites[site]
        if spec.placeholder is None:
            spec.placeholder = self._functions[site](
                **spec.static, device=spec.device,
                rng=_dali.ReplayRNG(_dali.zero_state())).evaluate()
        return spec.placeholder

    def _known(self, index: int, site: int) -> bool:
        return (index, site) <= self._settled

    def _reaches(self, site: int, sample: _Sample, observed: list | None) -> bool:
        """The guess: whether this sample reaches this random op."""
        if not self._definition.random_sites[site].chain:
            return True
        if self._known(sample.index, site):  # observed with the eager loop's values
            return site in observed[sample.index]
        unknown = False
        for key, branch in self._definition.random_sites[site].chain:
            predicate = self._definition.predicates.get(key)
            if predicate is None:
                unknown = True
                continue
            try:
                taken = predicate(sample)
            except Exception:  # noqa: BLE001 (a guess only: the run decides)
                unknown = True
                continue
            if taken != branch:
                return False
        if not unknown:
            return True
        return observed is None or site in observed[sample.index]

    def assign(self, observed: list | None) -> tuple[list, list]:
        """The values to feed (one batch per random op) and the paths guessed (for each
        sample, the random ops it reaches, with their per-sample arguments; None where not
        known), given the paths of the last run (None: none yet)."""
        sites = self._definition.random_sites
        per_site: list[list] = [[] for _ in sites]
        guessed = []
        used = {key: 0 for key in self._clones}
        with _dali.synchronous_cpu():  # many small op calls: no hand-off to a worker thread
            for index in range(self._batch_size):
                sample = _Sample(self, index)
                path: dict[int, tuple | None] = {}
                for site, rng in enumerate(self._rngs):
                    if self._reaches(site, sample, observed):
                        arguments: tuple | None = ()
                        if sites[site].arguments:  # the last run's, where it reached the op
                            arguments = observed[index].get(site) if observed else None
                        state = self._state(rng, used[id(rng)])
                        used[id(rng)] += 1
                        path[site] = arguments
                        if arguments is None:
                            value = self._placeholder(site)
                        else:
                            value = self._value(site, state, arguments)
                            sample.values[site] = value
                    else:
                        value = self._placeholder(site)
                    per_site[site].append(value)
                guessed.append(path)
        self._used = used
        return [_dali.storage_of(_dali.ndd.batch(values)) for values in per_site], guessed

    def settle(self, guessed: list, observed: list) -> None:
        """Mark the paths as known up to the first (sample, random op) where the run differs
        from the guess: up to there the run had the eager loop's values (see the class)."""
        for index, (guess, taken) in enumerate(zip(guessed, observed)):
            if guess != taken:
                self._settled = (index, min(site for site in guess.keys() | taken.keys()
                                            if guess.get(site, 0) != taken.get(site, 0)))
                self.last_settled = self._settled[1]
                return

    def observe(self, outputs: tuple) -> list:
        """The paths the run took: for each sample, the random ops it reached, with the
        values of their per-sample arguments."""
        paths: list[dict] = [{} for _ in range(self._batch_size)]
        for site, spec in enumerate(self._definition.random_sites):
            indices = _dali.host_ints(outputs[spec.reach]) if spec.reach is not None \
                else range(self._batch_size)
            arguments = [[(name, value) for value in _dali.host_samples(outputs[output])]
                         for name, output in spec.arguments]
            for position, index in enumerate(indices):
                paths[index][site] = tuple(values[position] for values in arguments)
        return paths

    def commit(self) -> None:
        """Advance each generator by the draws of the paths taken, as the eager loop does."""
        for rng in {id(rng): rng for rng in self._rngs}.values():
            _dali.rng_advance(rng, self._used[id(rng)] * _dali.STATE_WORDS)


def _flatten(value: Any, outputs: list) -> Any:
    """The output tree of a per-sample function's result; its DataNodes go into `outputs`."""
    def leaf(item: Any) -> tuple | None:
        if isinstance(item, Item):
            item = item.node
        if _dali.is_data_node(item):
            outputs.append(item)
            return ("out", len(outputs) - 1)
        return None

    return trees.flatten(value, leaf)


# ---------------------------------------------------------------------------------------------
# The compiled per-sample function

def _eager_loop(reason: str, loc: SourceLoc | None) -> Verdict:
    return Verdict(reason, loc, Runs.PER_SAMPLE_LOOP)


@dataclasses.dataclass
class _Variant:
    """One guard set's pipeline (or the decision to run the eager loop)."""

    key: tuple = ()
    pipeline: Any = None
    definition: _Definition | None = None
    max_batch_size: int = 0
    verdict: Verdict | None = None  # why it runs as the eager per-sample loop (None: it does not)

    @property
    def eager_reason(self) -> str | None:
        return self.verdict.reason if self.verdict is not None else None

    @property
    def eager_loc(self) -> SourceLoc | None:
        return self.verdict.loc if self.verdict is not None else None


class PerSampleFunction:
    """A function written for one sample, run on every sample of a batch in one pipeline."""

    def __init__(self, function: Callable, *, num_threads: int | None = None,
                 device_id: Any = "current", warning: type = UserWarning,
                 cache_limit: int = 8):
        functools.update_wrapper(self, function)
        self._function = function
        self.cache_limit = cache_limit
        self._num_threads = num_threads
        self._device_id = device_id
        self._converted = convert(function)
        self.converted_source = self._converted.source
        # The variants are keyed as compiled functions' entries are (guards.build_key): the
        # Batches' descriptions, the other arguments' values (baked into the pipeline), and
        # the globals and closure variables the function and its helpers read
        self._plan = guards.plan_for(function)
        self._variants: dict[tuple, _Variant] = {}
        self._fast: guards.FastGuard | None = None  # the last variant's guard, checked first
        self._last_key: tuple | None = None
        self.last_miss_reason: str | None = None
        self._lock = threading.RLock()
        self.builds = 0
        self.runs = 0  # pipeline runs so far (more than calls where paths were guessed wrong)
        self.last_runs = 0
        self._once = ledger.WarnOnce()
        self._warning = warning
        parameters = inspect.signature(function).parameters
        self._parameters = list(parameters)
        self._names = tuple(name for name, parameter in parameters.items()  # guards' labels
                            if parameter.kind in (inspect.Parameter.POSITIONAL_ONLY,
                                                  inspect.Parameter.POSITIONAL_OR_KEYWORD))

    def __repr__(self) -> str:
        return f"<ndd_trace per-sample function {self.__qualname__}>"

    def _options(self, batch_size: int) -> dict[str, Any]:
        num_threads = self._num_threads or _dali.current_num_threads()
        device_id = _dali.current_device_id() if self._device_id == "current" \
            else self._device_id
        return _dali.pipeline_options(batch_size, num_threads, device_id, 1)

    @property
    def variants_held(self) -> int:
        """Pipelines (or eager-loop decisions) its cache holds, one per guard key."""
        return len(self._variants)

    def guard_key(self, args: tuple) -> tuple:
        return guards.build_key(args, {}, self._plan, names=self._names, baked=True)

    def _batch_size(self, args: tuple) -> int:
        """The batch size of the Batch arguments (they must agree)."""
        sizes = {value.batch_size for value in args if isinstance(value, _dali.Batch)}
        if not sizes:
            raise TypeError(f"per-sample function `{self.__qualname__}` takes ndd Batches "
                            "(it runs once per sample of them)")
        if len(sizes) > 1:
            raise ValueError(f"per-sample function `{self.__qualname__}` got batches of "
                             f"different sizes ({sorted(sizes)})")
        return sizes.pop()

    def _define(self, args: tuple, batch_size: int, num_threads: int | None = None,
                observe: bool = True) -> tuple[Any, _Definition]:
        code = self._function.__code__
        definition = _Definition(code.co_filename, code.co_name, observe,
                                 converted_filename=self._converted.filename,
                                 user_lines=self._converted.user_lines)
        converted = self._converted.function
        parameters = self._parameters

        def make_inputs() -> list:
            values = []
            for index, value in enumerate(args):
                if isinstance(value, _dali.Batch):
                    meta = _dali.meta_of(value)
                    name = parameters[index] if index < len(parameters) else f"arg{index}"
                    node = _dali.fn.external_source(
                        name=name, device=meta.device,
                        dtype=getattr(_dali.types.DALIDataType, meta.dtype),
                        ndim=meta.ndim, layout=meta.layout or None)
                    definition.input_keys[_dali.node_key(node)] = index
                    values.append(node)
                else:
                    values.append(value)
            return values

        def outputs(result: Any) -> tuple:
            flat: list = []
            definition.output_tree = _flatten(result, flat)
            definition.num_outputs = len(flat)
            if not flat:
                raise _error("the per-sample function returns no ndd value")
            return (*flat, *definition.reach_nodes)

        _dali.do_not_convert(make_inputs)
        _dali.do_not_convert(outputs)

        def pipeline_definition():
            return outputs(converted(*make_inputs()))

        previous = _scope.definition
        _scope.definition = definition
        try:
            with _dali.intercept(functools.partial(_handler, definition)), \
                    _dali.logical_hooks(functools.partial(_logical_guess, definition)):
                options = self._options(batch_size)
                if num_threads:
                    options["num_threads"] = num_threads
                pipe = _dali.conditional_pipeline(pipeline_definition, **options)
        finally:
            _scope.definition = previous
        return pipe, definition

    def define_for_export(self, args: tuple, batch_size: int | None,
                          num_threads: int | None) -> tuple[Any, list[str], int, list[str]]:
        """The pipeline for these example arguments, unbuilt: (pipeline, data input names,
        number of outputs, random-value input names)."""
        size = self._batch_size(args)
        try:
            pipe, definition = self._define(args, batch_size or size, num_threads,
                                            observe=False)
        except Exception as error:
            raised, _scope.raised = _scope.raised, None
            if raised is not None and raised is not error:
                raise raised from None
            raise
        names = [self._parameters[i] if i < len(self._parameters) else f"arg{i}"
                 for i, value in enumerate(args) if isinstance(value, _dali.Batch)]
        return pipe, names, definition.num_outputs, [s.source for s in definition.random_sites]

    def _variant(self, args: tuple, batch_size: int) -> _Variant:
        """This call's variant: the last one if its fast guard matches, else its key's (built
        on a miss, or for a larger batch than it was built for)."""
        fast = self._fast
        if fast is not None and fast.matches(args):
            variant = fast.entry
            if variant.eager_reason is not None or batch_size <= variant.max_batch_size:
                self._last_key = variant.key
                return variant
        key = self.guard_key(args)
        variant = self._variants.get(key)
        if variant is None:
            self.last_miss_reason = keys.explain_miss(key, self._last_key)
            (logs.recompiles if self._variants else logs.trace).info(
                "`%s`: cache miss (%d of cache_limit %d variants held): %s", self.__qualname__,
                len(self._variants), self.cache_limit, self.last_miss_reason)
            self._plan = guards.plan_for(self._function)  # its helpers may have changed
            key = self.guard_key(args)
            variant = self._variants.get(key)
            if variant is None and len(self._variants) >= self.cache_limit:
                self._last_key = key
                return _Variant(key, verdict=_eager_loop(
                    f"was built {self.cache_limit} times (cache_limit), last change: "
                    f"{self.last_miss_reason}; new variants are not built. Make the changing "
                    "value an ndd Batch argument, or raise cache_limit", user_location()))
        if variant is None or not (variant.eager_reason is not None or
                                   batch_size <= variant.max_batch_size):
            if variant is not None:
                self.last_miss_reason = (f"batch size {batch_size} is larger than the "
                                         f"{variant.max_batch_size} its pipeline was built for")
            variant = self._build(key, args, batch_size)
        self._last_key = key
        self._fast = guards.FastGuard.of(args, self._plan, variant, baked=True)
        return variant

    def _build(self, key: tuple, args: tuple, batch_size: int) -> _Variant:
        variant = _Variant(key)
        _scope.raised = None
        try:
            try:
                pipe, definition = self._define(args, max(batch_size, 1))
                pipe.build()
            except Exception as error:
                raised, _scope.raised = _scope.raised, None
                if raised is not None and raised is not error:
                    raise raised from None  # ours, wrapped by DALI's AutoGraph
                raise
        except _EagerLoop as reason:
            variant.verdict = _eager_loop(reason.reason, reason.loc)
        else:
            variant.pipeline, variant.definition = pipe, definition
            variant.max_batch_size = batch_size
            self.builds += 1
        self._variants[key] = variant
        return variant

    def __call__(self, *args: Any) -> Any:
        batch_size = self._batch_size(args)
        with self._lock:
            variant = self._variant(args, batch_size)
            if variant.eager_reason is not None:
                self._warn_eager(variant)
                return self.eager(*args)
            definition = variant.definition
            try:
                outputs = self._run(variant, args, batch_size)
            except _RunFailed as failure:
                return self._after_failed_run(variant.key, args, failure)
            except _EagerCall:  # the generators are untouched: the loop draws as it would
                self._warn_eager(variant)
                return self.eager(*args)
        batches = [_dali.wrap_batch(output) for output in outputs]
        return trees.unflatten(definition.output_tree, lambda node: batches[node[1]])

    def _run(self, variant: _Variant, args: tuple, batch_size: int) -> tuple:
        """Run the pipeline until the random values fed agree with the paths the samples take
        (see `_RandomStream`), then advance the generators as the eager loop does."""
        pipe, definition = variant.pipeline, variant.definition
        stream = _RandomStream(definition, args, batch_size)
        observed = None
        for runs in itertools.count(1):
            values, guessed = stream.assign(observed)
            for index, value in enumerate(args):
                if isinstance(value, _dali.Batch):
                    name = self._parameters[index] if index < len(self._parameters) \
                        else f"arg{index}"
                    _dali.feed(pipe, name, _dali.storage_of(value))
            for site, batch in zip(definition.random_sites, values):
                _dali.feed(pipe, site.source, batch)
            if definition.index_node is not None:
                _dali.feed(pipe, _SAMPLE_INDEX, _dali.sample_indices(batch_size))
            try:
                outputs = pipe.run()
            except Exception as error:  # noqa: BLE001 (handed to the eager loop, see the caller)
                raise _RunFailed(error) from error
            observed = stream.observe(outputs[definition.num_outputs:])
            if observed == guessed:
                break
            stream.settle(guessed, observed)
            if runs == _MAX_RUNS:  # more runs would cost more than the eager loop
                self.runs += runs
                site = definition.random_sites[stream.last_settled]
                variant.pipeline = variant.definition = None
                variant.verdict = _eager_loop(
                    f"did not find in {runs} pipeline runs which samples call random op "
                    f"`ndd.{_dali.op_path(site.op_class)}` (a branch condition on random values "
                    "through pipeline ops, which cannot be evaluated before the run; each run "
                    "settles at least one more sample)", site.loc)
                raise _EagerCall()
        stream.commit()
        self.last_runs = runs
        self.runs += runs
        return outputs[:definition.num_outputs]

    def _after_failed_run(self, key: tuple, args: tuple, failure: _RunFailed) -> Any:
        """A run failed (its pipeline is unusable after that): the call runs as the eager loop,
        which raises the error where it is the function's own. Where the loop succeeds, the
        run failed on values fed for a wrong guess of the paths (stand-ins for random ops the
        guess skipped, or whose per-sample arguments were not known yet): the function runs
        as the eager loop from now on, and says so."""
        del self._variants[key]
        self._fast = None
        result = self.eager(*args)
        variant = _Variant(key, verdict=_eager_loop(
            "ran its pipeline on values fed for a guess of its samples' paths (stand-ins for "
            "random ops not known before the run), and the run failed where the eager loop "
            f"does not ({_dali.pipeline_failure(failure.error).summary()})", user_location()))
        self._variants[key] = variant
        self._warn_eager(variant)
        return result

    def eager(self, *args: Any) -> Any:
        """The eager per-sample loop: the function on each sample, results gathered into
        Batches (what the compiled call gives, value for value)."""
        batch_size = self._batch_size(args)
        results = []
        for index in range(batch_size):
            sample_args = [value.select(index) if isinstance(value, _dali.Batch) else value
                           for value in args]
            results.append(self._function(*sample_args))
        return _gather(results)

    def _warn_eager(self, variant: _Variant) -> None:
        loc = variant.eager_loc
        message = (f"ndd_trace: per-sample function `{self.__qualname__}` runs as the eager "
                   f"per-sample loop: it {variant.eager_reason}.")
        self._once.warn(message, loc, self._warning, stacklevel=3,
                        key=(loc.filename, loc.lineno) if loc else ("no line",))


def _gather(results: list) -> Any:
    first = results[0]
    if isinstance(first, _dali.Tensor):
        return _dali.ndd.batch(results)
    if isinstance(first, (tuple, list)):
        gathered = [_gather([r[i] for r in results]) for i in range(len(first))]
        return type(first)(gathered) if isinstance(first, tuple) else gathered
    if isinstance(first, dict):
        return {k: _gather([r[k] for r in results]) for k in first}
    return first
