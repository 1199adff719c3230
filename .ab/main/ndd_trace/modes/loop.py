"""Compiled generators: the loop's Python runs as written; its body runs as one compiled step.

    @ndd.compile
    def train_batches(loader, size=224):
        loader.epoch += 1                                  # every epoch, as written
        for jpegs, labels in loader.reader.next_epoch(batch_size=64):
            images = ndd.decoders.image(jpegs)
            yield ndd.random_resized_crop(images, size=[size, size]), labels

runs as (`ndd_trace.explain` prints both):

    def train_batches(loader, size=224):
        loader.epoch += 1
        for jpegs, labels in __ndd_trace_epoch__(lambda: loader.reader.next_epoch(batch_size=64)):
            yield __ndd_trace_step__(jpegs, size, labels)

    def train_batches(jpegs, size, labels):               # compiled: one pipeline per step
        images = ndd.decoders.image(jpegs)
        return ndd.random_resized_crop(images, size=[size, size]), labels

The loop body, proved by stepcheck.py to run the same Python at every step, becomes a compiled
function of what it reads (the loop's targets, and the generator's locals it uses; of an object
used only for its attributes, those attributes: `self.size`, not `self`). Everything else runs
as the user wrote it, every epoch: code before and after the loop, `try`/`finally`, `with`,
`zip`/`enumerate` over several readers, the consumer's own code between steps. The readers the
loop opens read through their streams from the first epoch (ahead/), and the step's calls
run ahead of the consumer on the batches read ahead, used only where they were fed exactly what
the step is fed: values, batch counts, shards, random states and errors are eager's, however
the loop is driven (a `break`, two epochs open at once, draws from the generator between steps,
a re-trace when a value the body reads changes).
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import types
from collections.abc import Callable, Iterator
from typing import Any

from ..core import process_state
from ..ahead.loop_epochs import opening_loop_epochs
from ..core.errors import LoopError
from ..core.source import SourceLoc, unparse
from ..tracing.stepcheck import Finding, LoopSite, find_loop

__all__ = ["LoopError", "Split", "StepCall", "first_step", "loop_epoch", "split_generator"]

EPOCH = "__ndd_trace_epoch__"
STEP = "__ndd_trace_step__"
_FACTORY = "__ndd_trace_factory__"


@dataclasses.dataclass
class Split:
    """A compiled generator taken apart: its own Python, with the loop body replaced by a call
    of `step` (set `step_cell.cell_contents` to what runs it)."""

    generator: types.FunctionType
    step: types.FunctionType
    step_cell: Any
    generator_source: str
    step_source: str
    arguments: list[str]  # what the generator passes the step, as written there
    body_loc: SourceLoc


class StepCall:
    """What a compiled generator's loop body is replaced by: a call of the compiled body, or,
    while `first_step` describes the loop, the end of it (with the step's arguments)."""

    __slots__ = ("compiled",)

    def __init__(self, compiled: Callable):
        self.compiled = compiled

    def __call__(self, *args: Any) -> Any:
        if getattr(process_state.loop_describing, "active", False):
            raise _FirstStep(args)
        return self.compiled(*args)


class _FirstStep(BaseException):
    """Raised by the loop body of a generator that `first_step` runs: its arguments."""

    def __init__(self, args: tuple):
        super().__init__()
        self.args_given = args




def first_step(split: Split, args: tuple, kwargs: dict,
               stand_in: Callable[[Any, int], Any]) -> tuple | None:
    """What the loop body of `split` would be given at its first step, the generator called
    with these arguments: its Python runs up to there (what comes before the loop; a `finally`
    around it as the loop ends), each epoch the loop opens giving one step of
    `stand_in(reader or source, batch_size)`, nothing read. None if it yields no step."""
    generator = split.generator(*args, **kwargs)
    process_state.loop_describing.active = True
    try:
        with opening_loop_epochs(stand_in):
            for _ in generator:
                return None  # it yielded outside its loop first
    except _FirstStep as step:
        return step.args_given
    finally:
        process_state.loop_describing.active = False
        generator.close()
    return None


def loop_epoch(make_iterable: Callable[[], Any]) -> Iterator[Any]:
    """The iterable of a compiled loop (`lambda: reader.next_epoch(...)`), made and pulled from
    with the epochs it opens reading through their streams (loop_epochs.opening_loop_epochs)."""
    with opening_loop_epochs():
        iterator = iter(make_iterable())
    while True:
        with opening_loop_epochs():
            try:
                item = next(iterator)
            except StopIteration:
                return
        yield item


def split_generator(function: types.FunctionType) -> Split | Finding:
    """Take `function` (a generator) apart, or say why its loop body cannot be compiled."""
    site = find_loop(function)
    if isinstance(site, Finding):
        return site
    code = function.__code__
    where = SourceLoc(site.filename, site.loop.lineno, function.__name__)
    problem = _unsupported(function, site)
    if problem is not None:
        return Finding(problem, where)
    targets = _bound(site.loop.target)
    frame_names = set(code.co_varnames) | set(code.co_cellvars) | set(code.co_freevars)
    parameters, expressions = _step_parameters(site.loop.body, frame_names, targets)
    step_def = _step_definition(function.__name__, site, parameters)
    step = _compile_function(step_def, function, {})
    if isinstance(step, str):
        return Finding(step, where)
    generator_def = _generator_definition(site, expressions)
    step_cell = types.CellType()
    cells = dict(zip(code.co_freevars, function.__closure__ or ()))
    cells[EPOCH] = types.CellType(loop_epoch)
    cells[STEP] = step_cell
    generator = _compile_function(generator_def, function, cells)
    if isinstance(generator, str):
        return Finding(generator, where)
    generator.__defaults__ = function.__defaults__
    generator.__kwdefaults__ = function.__kwdefaults__
    for attribute in ("__qualname__", "__module__", "__doc__"):
        setattr(generator, attribute, getattr(function, attribute))
    step.__qualname__ = f"{function.__qualname__}.<loop body>"
    return Split(generator, step, step_cell, unparse(generator_def).strip(),
                 unparse(step_def).strip(), [unparse(e).strip() for e in expressions],
                 SourceLoc(site.filename, site.loop.body[0].lineno, function.__name__))


def _unsupported(function: types.FunctionType, site: LoopSite) -> str | None:
    if "__class__" in function.__code__.co_freevars:
        return ("calls super() or reads __class__ (the rewritten generator could not see its "
                "class); the generator runs in checked mode")
    for node in ast.walk(site.tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("__") and \
                not node.attr.endswith("__") and "." in function.__qualname__:
            return (f"reads the private attribute `{node.attr}` (Python mangles it by class, "
                    "which the rewritten generator is not in)")
    return None


def _bound(target: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(target) if isinstance(n, ast.Name)
            and isinstance(n.ctx, ast.Store)}


def _chain(node: ast.AST) -> list[str] | None:
    """`a.b.c` as ["a", "b", "c"] (None for anything else)."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(parts)]


def _step_parameters(body: list[ast.stmt], frame_names: set[str], targets: set[str]
                     ) -> tuple[list[str], list[ast.expr]]:
    """The step's parameters and, for each, what the generator passes: a name of its frame
    the body reads, or for a name the body uses only for attributes (never calling them), each
    attribute chain it reads (so the step is keyed on `self.size`, not on all of `self`)."""
    parents: dict[int, ast.AST] = {}
    for statement in body:
        for node in ast.walk(statement):
            for child in ast.iter_child_nodes(node):
                parents[id(child)] = node
    assigned: set[str] = set()
    for statement in body:
        assigned |= _bound(statement)
    order: list[str] = []
    chains: dict[str, list[list[str]]] = {}
    whole: set[str] = set()
    for statement in body:
        for node in ast.walk(statement):
            if not (isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)):
                continue
            name = node.id
            # a loop target the body sets again (`labels = labels + 1`) is still given to it;
            # any other name the body sets is its own (stepcheck: never read before it is set)
            if name not in frame_names or (name in assigned and name not in targets):
                continue
            if name not in order:
                order.append(name)
            top: ast.AST = node
            while isinstance(parents.get(id(top)), ast.Attribute):
                top = parents[id(top)]
            parent = parents.get(id(top))
            called = isinstance(parent, ast.Call) and parent.func is top
            if top is node or called or name in targets:
                whole.add(name)
            else:
                chains.setdefault(name, []).append(_chain(top))
    taken = frame_names | assigned | {n.id for s in body for n in ast.walk(s)
                                      if isinstance(n, ast.Name)}
    parameters: list[str] = []
    expressions: list[ast.expr] = []
    renames: dict[tuple, str] = {}
    for name in order:
        if name in whole or name not in chains:
            parameters.append(name)
            expressions.append(ast.Name(id=name, ctx=ast.Load()))
            continue
        for chain in chains[name]:
            key = tuple(chain)
            if key in renames:
                continue
            parameter = "_".join(chain)
            while parameter in taken:
                parameter += "_"
            taken.add(parameter)
            renames[key] = parameter
            parameters.append(parameter)
            expression: ast.expr = ast.Name(id=chain[0], ctx=ast.Load())
            for attribute in chain[1:]:
                expression = ast.Attribute(value=expression, attr=attribute, ctx=ast.Load())
            expressions.append(expression)
    for statement in body:
        _rename_chains(statement, renames)
    return parameters, expressions


def _rename_chains(statement: ast.stmt, renames: dict[tuple, str]) -> None:
    """Replace the attribute chains in `renames` by their parameter names, in place."""
    if not renames:
        return

    class Renamer(ast.NodeTransformer):
        def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
            chain = _chain(node)
            if chain is not None and tuple(chain) in renames and isinstance(node.ctx, ast.Load):
                return ast.copy_location(ast.Name(id=renames[tuple(chain)], ctx=ast.Load()),
                                         node)
            return self.generic_visit(node)

    Renamer().visit(statement)


def _step_definition(name: str, site: LoopSite, parameters: list[str]) -> ast.FunctionDef:
    body = copy.deepcopy(site.loop.body)
    last = body[-1]
    returned = ast.Return(value=last.value.value or ast.Constant(value=None))
    body[-1] = ast.copy_location(returned, last)
    arguments = ast.arguments(posonlyargs=[], args=[ast.arg(arg=p) for p in parameters],
                              vararg=None, kwonlyargs=[], kw_defaults=[], kwarg=None,
                              defaults=[])
    definition = ast.FunctionDef(name=name, args=arguments, body=body, decorator_list=[],
                                 returns=None, type_comment=None)
    return ast.copy_location(definition, site.loop)


def _generator_definition(site: LoopSite, expressions: list[ast.expr]) -> ast.FunctionDef:
    tree = copy.deepcopy(site.tree)
    tree.decorator_list = []
    loop = next(node for node in ast.walk(tree) if isinstance(node, ast.For)
                and node.lineno == site.loop.lineno and node.col_offset == site.loop.col_offset)
    make = ast.Lambda(args=ast.arguments(posonlyargs=[], args=[], vararg=None, kwonlyargs=[],
                                         kw_defaults=[], kwarg=None, defaults=[]),
                      body=loop.iter)
    loop.iter = ast.copy_location(
        ast.Call(func=ast.Name(id=EPOCH, ctx=ast.Load()), args=[make], keywords=[]), loop.iter)
    call = ast.Call(func=ast.Name(id=STEP, ctx=ast.Load()), args=expressions, keywords=[])
    loop.body = [ast.copy_location(ast.Expr(value=ast.Yield(value=call)), site.yielded)]
    return tree


def _compile_function(definition: ast.FunctionDef, original: types.FunctionType,
                      cells: dict[str, Any]) -> types.FunctionType | str:
    """Compile `definition` under the original's file name and globals; its free names are
    given `cells` (the original's closure, ndd_trace's own); a message where that fails."""
    names = sorted(cells)
    factory = ast.FunctionDef(
        name=_FACTORY,
        args=ast.arguments(posonlyargs=[], args=[], vararg=None, kwonlyargs=[], kw_defaults=[],
                           kwarg=None, defaults=[]),
        body=[*(ast.Assign(targets=[ast.Name(id=name, ctx=ast.Store())],
                           value=ast.Constant(value=None)) for name in names),
              definition, ast.Return(value=ast.Name(id=definition.name, ctx=ast.Load()))],
        decorator_list=[], returns=None, type_comment=None)
    for node in ast.walk(factory):
        if not hasattr(node, "lineno") or node is factory or node in factory.body[:len(names)]:
            ast.copy_location(node, definition)
    ast.copy_location(factory, definition)
    module = ast.fix_missing_locations(ast.Module(body=[factory], type_ignores=[]))
    try:
        code = compile(module, original.__code__.co_filename, "exec")
    except SyntaxError as error:
        return f"its rewritten loop does not compile ({error.msg})"
    factory_code = next(c for c in code.co_consts if isinstance(c, types.CodeType))
    inner = next(c for c in factory_code.co_consts
                 if isinstance(c, types.CodeType) and c.co_name == definition.name)
    missing = [name for name in inner.co_freevars if name not in cells]
    if missing:
        return f"its loop reads `{missing[0]}` from an enclosing scope ndd_trace cannot reach"
    closure = tuple(cells[name] for name in inner.co_freevars)
    return types.FunctionType(inner, original.__globals__, definition.name, None, closure)
