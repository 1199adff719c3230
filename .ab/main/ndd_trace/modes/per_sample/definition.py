"""Defining a per-sample function's pipeline: its ndd calls become pipeline-mode calls, and its
random ops become inputs fed per call (random_stream.py computes their values).

    with _dali.intercept(functools.partial(handler, definition)): ...   # see function.py
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from typing import Any

from ... import _dali
from ...core import process_state
from ...core.source import SourceLoc, is_internal_file, user_frame
from .conditions import Item, Sample, Unknown, noted_error


class EagerLoop(Exception):
    """Internal: this function runs as the eager per-sample loop (the reason, where)."""

    def __init__(self, reason: str, loc: SourceLoc | None):
        super().__init__(reason)
        self.reason = reason
        self.loc = loc
        process_state.per_sample_scope.raised = self


SAMPLE_INDEX = "_ndd_sample_index"  # the input of sample indices (who reaches a random op)


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


@dataclasses.dataclass
class Definition:
    """What defining the pipeline of one input signature found."""

    filename: str
    name: str
    observe: bool = True  # add the outputs that say which samples reached each random op
    random_sites: list[_RandomSite] = dataclasses.field(default_factory=list)
    output_tree: Any = None
    num_outputs: int = 0
    # node_key -> the Python guess of a branch predicate (see Item.python)
    predicates: dict[str, Callable[[Sample], bool]] = dataclasses.field(default_factory=dict)
    site_keys: dict[str, int] = dataclasses.field(default_factory=dict)  # node_key -> site
    input_keys: dict[str, int] = dataclasses.field(default_factory=dict)  # node_key -> argument
    reach_nodes: list = dataclasses.field(default_factory=list)
    index_node: Any = None
    converted_filename: str = ""
    user_lines: dict[int, int] = dataclasses.field(default_factory=dict)

    def is_rewritten(self, filename: str) -> bool:
        """Whether `filename` is this function's rewritten source: AutoGraph keeps one
        conversion for equal code objects (a code object's filename is not compared), so a
        later rewrite of the same function runs under an earlier one's name, same lines."""
        return filename == self.converted_filename or filename.startswith(
            f"<ndd_trace per-sample:{self.name}#")


def call_location(definition: Definition) -> SourceLoc | None:
    """The user's line of an ndd call made while the pipeline is defined: the rewritten
    function runs as code DALI's AutoGraph generated from it, mapped back here (AutoGraph also
    converts the helpers the rewritten code calls, ours among them: those lines are skipped)."""
    frame = user_frame(sys._getframe(1))
    while frame is not None:
        origin = _dali.autograph_origin(frame.f_code.co_filename, frame.f_lineno)
        if origin is None:
            return SourceLoc(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)
        filename, lineno = origin
        if definition.is_rewritten(filename):
            return SourceLoc(definition.filename, definition.user_lines.get(lineno, lineno),
                             definition.name)
        if not is_internal_file(filename):
            return SourceLoc(filename, lineno, frame.f_code.co_name)
        frame = user_frame(frame.f_back)
    return None


def _no_guess(sample: Sample) -> bool:
    raise Unknown("a predicate computed in the pipeline")


def logical_guess(definition: Definition, kind: str, operands: list, result: Any) -> None:
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
        value = _dali.cast_node(value, cast)
    return value


def handler(definition: Definition, op_class: type, original: Any, inputs: tuple,
            kwargs: dict) -> Any:
    loc = call_location(definition)
    if _dali.is_stateful(op_class):
        raise noted_error(f"calls stateful operator `{_dali.op_path(op_class)}` in a "
                          "per-sample function", loc)
    kwargs = {key: value for key, value in kwargs.items()
              if value is not None and key not in ("_caller_frame", "_backend")}
    if kwargs.pop("batch_size", None) is not None:
        raise noted_error("passes batch_size= in a per-sample function (it works on one "
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


def _random_site(definition: Definition, op_class: type, inputs: tuple, kwargs: dict,
                 rng: Any, loc: SourceLoc | None) -> Any:
    """A random op: its value for each sample is computed before the run, by the eager op with
    the eager loop's draws (see `RandomStream`), and fed to the pipeline. A pipeline's random op
    cannot give those values itself: it reads one state per batch (its sample 0's) and derives
    each sample's stream from the sample's position in the batch, while the eager loop draws a
    new state per call. Inside a per-sample branch, the op also outputs the indices of the
    samples that reached it, and the values of its per-sample arguments (`range=` computed from
    the data): the run says which draws the eager loop made, and with what arguments."""
    name = f"ndd.{_dali.op_path(op_class)}"
    if any(value is not None for value in inputs):
        raise EagerLoop(f"calls random op `{name}` on per-sample data (an op with a data "
                        "input; its values are computed before the run)", loc)
    chain = _dali.condition_chain()
    if any(branch is None for _, branch in chain):
        raise EagerLoop(f"calls random op `{name}` where DALI merges branches", loc)
    device = kwargs.get("device") or "cpu"
    if device not in ("cpu", "gpu"):
        raise EagerLoop(f"calls random op `{name}` with device={device!r}", loc)
    per_sample = {key: value for key, value in kwargs.items()
                  if isinstance(value, Item) or _dali.is_data_node(value)}
    static = {key: _dali.decay_static(value) for key, value in kwargs.items()
              if key != "device" and key not in per_sample}
    reach = None
    if chain and definition.observe:
        if definition.index_node is None:
            definition.index_node = _dali.sample_index_source(SAMPLE_INDEX)
        definition.reach_nodes.append(_dali.in_this_branch(definition.index_node))
        reach = len(definition.reach_nodes) - 1
    arguments = []
    for key, value in per_sample.items():
        if not definition.observe:
            raise EagerLoop(f"calls random op `{name}` with a per-sample `{key}=`", loc)
        node = _to_node(value, _dali.argument_dtype(op_class, key))
        definition.reach_nodes.append(_dali.in_this_branch(node))
        arguments.append((key, len(definition.reach_nodes) - 1))
    index = len(definition.random_sites)
    source = f"_random_{index}"
    definition.random_sites.append(_RandomSite(source, op_class, static, rng, device, loc,
                                               tuple(chain), reach, tuple(arguments)))
    node = _dali.input_node(source, device)  # typed by what it is fed
    definition.site_keys[_dali.node_key(node)] = index
    return node
