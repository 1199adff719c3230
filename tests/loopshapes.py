"""Random training loops that vary the loop's shape, not only the ops in its body.

    shape = LoopShape.draw(data)                    # inside a hypothesis test using st.data()
    path = check_loop_shape(shape, dirs, folder)    # or AssertionError, naming the difference

A shape is a module: a generator over one or two readers and an ExternalSource (alone, zipped,
enumerated), written as a function, a method of a loader class or the class's `__iter__`, or
reached through a helper generator (`yield from`, a loop over it, or a compiled inner generator
under a plain outer one); with code before and after the loop, `try`/`finally`, `with`,
`try`/`except` around it, and a body of random ops, branches, `break`/`continue`/`return`/
`raise` at a step, side effects. Its consumer follows a plan drawn with it: per epoch, what
changes (a module global, an argument or an attribute of the loader, between epochs or in the
middle of one), reseeds and random draws between epochs and between steps, a `break` or a
`raise` at a step. The module is written to a file (ndd_trace reads generator sources from
files) and run eagerly, with its generator compiled, and eagerly under transparent mode; what
the consumer observes (every value, step counts, exceptions with their text and step, logs and
counters, the random generators' states) must be identical. Used by tests/test_loop_fuzz.py
(small fixed budget) and benchmarks/fuzz_loops.py (long runs, `--shapes`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import itertools
import os
import sys
from typing import Any

import numpy as np
from hypothesis import strategies as st

import nvidia.dali.experimental.dynamic as ndd
from harness import Run, assert_runs_match, run

import ndd_trace

_counter = itertools.count()
BATCH_SIZES = (3, 4, 5)
SIZES = (8, 10, 12, 14)

_PRELUDE = '''\
import contextlib
import types

import numpy as np
import nvidia.dali.experimental.dynamic as ndd

SIZE = 12
config = types.ModuleType("config")  # a configuration module
config.SIZE = 12


class StopTraining(Exception):
    """Raised by a generator to end training."""


def helper(images):
    """A pure helper (ndd_trace's check proves it so)."""
    return ndd.cast(images, dtype=ndd.float32) * 0.5


@contextlib.contextmanager
def tracked(log):
    log.append("enter")
    try:
        yield
    finally:
        log.append("exit")


'''

# (fragment, needs a step counter); {O} is the owner (loader/self), {L} its log, {A} the
# augment flag, {k} a step
_FRAGMENTS = [
    ("images = ndd.flip(images, horizontal=1)", False),
    ("images = ndd.flip(images, horizontal=ndd.random.coin_flip(batch_size=images.batch_size))",
     False),
    ("images = ndd.rotate(images, angle=ndd.random.uniform(batch_size=images.batch_size, "
     "range=[-20, 20]), keep_size=True)", False),
    ("images = images + ndd.random.uniform(batch_size=images.batch_size, range=[0, 4])", False),
    ("images = helper(images)", False),
    ("if {A}:\n    images = ndd.flip(images, vertical=1)", False),
    ("{O}.count += 1", False),
    ("if {O}.count % 2 == 1:\n    images = ndd.flip(images, vertical=1)", False),
    ("{L}.append(('step', step))", True),
    ("if step % {k} == 0:\n    images = ndd.flip(images, vertical=1)", True),
    ("images = images * (step % 3 + 1)", True),
    ("if step == {k}:\n    break", True),
    ("if step == {k}:\n    continue", True),
    ("if step == {k}:\n    return", True),
    ("if step == {k}:\n    raise ValueError('generator stops at {k}')", True),
    ("if step == {k}:\n    raise StopTraining('training stops at {k}')", True),
    ("yield images", False),
    ("for _ in range(2):\n    images = ndd.flip(images, horizontal=1)", False),
    ("if images.batch_size == {k} + 2:\n    images = ndd.flip(images, vertical=1)", False),
    ("views = [ndd.flip(images, horizontal=h) for h in (0, 1)]\nimages = views[1]", False),
    ("{O}.last = images", False),
    ("images = ndd.flip(images, horizontal=ndd.random.coin_flip(batch_size=images.batch_size, "
     "rng={O}.rng))", False),
]

# the shapes of mismatches found earlier (fixed since): drawn with `known=True` (the default)
_KNOWN_FRAGMENTS = [
    ("labels = labels + 1", False),
    ("jpegs = jpegs", False),
]
KNOWN_MISMATCHES: dict[str, str] = {}  # none left: each found was fixed, and is drawn again

_BEFORE = [
    "{L}.append('start')",
    "{O}.epochs += 1",
    "{L}.append(float(np.asarray(ndd.random.uniform(range=[0, 1]))))",
    "ndd.random.set_seed(len({L}))",
]
_AFTER = [
    "{L}.append('end')",
    "{L}.append(('count', {O}.count))",
    "raise StopTraining('after the loop')",
]


def _sometimes(draw: Any, percent: int, low: int, high: int) -> int | None:
    """An integer in [low, high] `percent` % of the time, else None (shrinking towards None)."""
    if draw(st.integers(0, 99)) < 100 - percent:
        return None
    return draw(st.integers(low, high))


def _indent(lines: list[str], levels: int = 1) -> list[str]:
    return ["    " * levels + line for line in lines]


@dataclasses.dataclass
class EpochPlan:
    """What the consumer does around and in one epoch."""

    size: int | None  # set before the epoch (global, argument or attribute), if the shape reads one
    change_at: int | None  # ...and changed again after this step of the epoch
    reseed: int | None  # ndd.random.set_seed before the epoch
    restore: bool  # the default generator's state set back to the one before the first epoch
    reseed_at: int | None  # ndd.random.set_seed(reseed_at) after this step of the epoch
    switch: str | None  # compiled runs only: this epoch "plain" (uncompiled) or "transparent"
    draw: bool  # a draw from the default generator before the epoch
    peek: int | None  # before the epoch, the consumer reads this many batches eagerly
    state_at: int | None  # the consumer records the readers' checkpoint state after this step
    break_at: int | None  # the consumer breaks after this many steps
    raise_at: int | None  # the consumer raises after this many steps


@dataclasses.dataclass
class LoopShape:
    """A drawn module and its consumer's plan."""

    source: str
    style: str  # function, method, iter
    nesting: str  # direct, yield_from, loop_over, compiled_inner
    size_from: str  # global, argument, attribute, module (with `known`), none
    parameters: list[str]  # the positional parameters the consumer passes, in order
    readers: int  # 0, 1 or 2
    second_short: bool  # the second reader has fewer batches
    source_kind: str | None  # None, or how the ExternalSource is made: items, cycle, callable
    source_items: int
    reader_options: dict
    batch_size: int
    seed: int
    consumer_draws: bool
    corrupt: bool  # the first reader's folder has a truncated JPEG (dirs[2])
    alternate: bool  # odd epochs run a second generator (program_odd)
    depth: int | None  # ndd.compile(prefetch_queue_depth=...)
    ranks: int  # 2: two data-parallel ranks, their epochs zipped by the consumer
    deferred: bool  # the consumer reads each epoch's items after the epoch
    plans: list[EpochPlan]

    @staticmethod
    def draw(data: Any, known: bool = True) -> LoopShape:
        """A shape; without `known`, none of the shapes of mismatches found earlier."""
        draw = data.draw
        style = draw(st.sampled_from(["function", "function", "method", "iter"]))
        nesting = "direct" if style != "function" else draw(st.sampled_from(
            ["direct", "direct", "yield_from", "loop_over", "compiled_inner"]))
        readers = draw(st.sampled_from([1, 1, 1, 2, 0] if known else [1, 1, 1, 2]))
        source_kind = draw(st.sampled_from([None, None, "items", "cycle", "callable"]))
        if readers == 0:  # the source alone ends the epoch: it must end
            source_kind = "items"
        size_from = draw(st.sampled_from(
            ["global", "attribute", "none"] + (["argument"] if style != "iter" else [])
            + (["module"] if known else [])))
        readers_as_arguments = style != "iter" and draw(st.booleans())
        owner = "loader" if style == "function" else "self"
        log = f"{owner}.log"
        size = {"global": "SIZE", "argument": "size", "attribute": f"{owner}.size",
                "module": "config.SIZE", "none": "12"}[size_from]
        names = {"reader": "reader", "second": "second", "source": "source"}
        if not readers_as_arguments:
            names = {key: f"{owner}.{key}" for key in names}
        batch_size = draw(st.sampled_from(BATCH_SIZES))

        # the loop header: what it iterates and what it binds
        parts, targets = [], []
        if readers >= 1:
            parts.append(f"{names['reader']}.next_epoch(batch_size={batch_size})")
            targets.append("(jpegs, labels)")
        if readers == 2:
            parts.append(f"{names['second']}.next_epoch(batch_size={batch_size})")
            targets.append("(jpegs2, labels2)")
        if source_kind is not None:
            at = draw(st.integers(0, len(parts)))  # the source's place in the zip
            parts.insert(at, f"{names['source']}.captured(batch_size={batch_size})")
            targets.insert(at, "extra")
        if len(parts) == 1:
            iterable, target = parts[0], targets[0].strip("()")
        else:
            iterable, target = f"zip({', '.join(parts)})", ", ".join(targets)
        counter = draw(st.sampled_from(["enumerate", "augassign", "none"]))
        if counter == "enumerate":
            iterable = f"enumerate({iterable})"
            target = f"step, ({target})" if "," in target else f"step, {target}"
        header = f"for {target} in {iterable}:"

        # the loop body
        body = []
        if readers:
            body.append(f"images = ndd.resize(ndd.decoders.image(jpegs), size=[{size}, {size}])")
        if readers == 2:
            body.append("images = ndd.cast(images, dtype=ndd.float32) + ndd.cast(ndd.resize("
                        f"ndd.decoders.image(jpegs2), size=[{size}, {size}]), "
                        "dtype=ndd.float32)")
            body.append("labels = labels * 10 + labels2" if known else
                        "mixed = labels * 10 + labels2")
        if source_kind is not None and (known or not readers):
            body.append("images = ndd.cast(images, dtype=ndd.float32) * extra" if readers else
                        f"images = ndd.resize(extra, size=[{size}, {size}])")
        if counter == "augassign":
            body.append("step += 1")
        fragments = draw(st.lists(st.sampled_from(_FRAGMENTS + (_KNOWN_FRAGMENTS if known
                                                                   else [])), max_size=4))
        for text, needs_step in fragments:
            if needs_step and counter == "none" or \
                    "ndd.random" in text and source_kind is not None and not known:
                continue
            body.append(text.format(O=owner, L=log, A="self.augment" if style == "iter"
                                    else "augment", k=draw(st.integers(1, 3))))
        if source_kind is not None and readers and not known:
            # last, only arithmetic, and no random op in the body: DALI's capture mode then
            # captures no operator, and runs the loop without its prefetch (KNOWN_MISMATCHES)
            body.append("images = ndd.cast(images, dtype=ndd.float32) * extra")
        labels = "mixed" if readers == 2 and not known else "labels"
        outputs = ["images", "images"] + ([f"images, {labels}", "{'image': images, "
                                           f"'label': {labels}}}"] if readers else [])
        if counter != "none":
            outputs.append("(images, step)")
        body.append(f"yield {draw(st.sampled_from(outputs))}")

        use_with = draw(st.booleans())
        before = [text.format(O=owner, L=log) for text in
                  draw(st.lists(st.sampled_from(_BEFORE), max_size=2, unique=True))]
        after = [text.format(O=owner, L=log) for text in _AFTER[:2] if draw(st.booleans())]
        if draw(st.integers(0, 5)) == 0:
            after.append(_AFTER[2])
        use_except, use_finally = draw(st.integers(0, 3)) == 0, draw(st.booleans())

        def generator_body(statements: list[str]) -> list[str]:
            loop = [header] + _indent([line for statement in statements
                                       for line in statement.splitlines()])
            if counter == "augassign":
                loop = ["step = 0"] + loop
            if use_with:
                loop = [f"with tracked({log}):"] + _indent(loop)
            core = before + loop + after
            if use_except:
                core = ["try:"] + _indent(core) + [
                    "except ValueError as error:", f"    {log}.append(('caught', str(error)))"]
            if use_finally:
                core = ["try:"] + _indent(core) + ["finally:", f"    {log}.append('finally')"]
            return core

        core = generator_body(body)

        # the signature and where the generator lives
        parameters = [] if style == "iter" else (["loader"] if style == "function" else [])
        if readers_as_arguments:
            parameters += [key for key, count in
                           (("reader", readers >= 1), ("second", readers == 2),
                            ("source", source_kind is not None)) if count]
        if size_from == "argument":
            parameters.append("size")
        signature = ", ".join((["self"] if style != "function" else []) + parameters
                              + ["augment=True"] * (style != "iter"))
        name = "__iter__" if style == "iter" else "program"
        lines = ["class Loader:", "    augment = True", "",
                 "    def __init__(self, reader, second, source, log, size):",
                 "        self.reader, self.second, self.source = reader, second, source",
                 "        self.log, self.size, self.count, self.epochs = log, size, 0, 0",
                 "        self.rng = ndd.random.RNG(seed=7)", ""]
        if nesting == "direct":
            definition = [f"def {name}({signature}):"] + _indent(core)
        else:
            call = ", ".join(parameters)
            outer = (["yield from inner(" + call + ")"] if nesting != "loop_over" else
                     ["for item in inner(" + call + "):", "    yield item"])
            if nesting == "compiled_inner" and draw(st.booleans()):
                outer = ["for item in inner(" + call + "):", "    yield item"]
            if draw(st.booleans()):
                outer = [f"{log}.append('outer')"] + outer
            definition = [f"def inner({signature}):"] + _indent(core) + ["", ""] + \
                [f"def {name}({signature}):"] + _indent(outer)
        alternate = style == "function" and nesting == "direct" and draw(st.booleans())
        if style == "function":
            lines += ["", ""] + definition
        else:
            lines += _indent(definition)
        if alternate:  # a second generator, for odd epochs: the same loop, one flip more
            odd = body[:-1] + ["images = ndd.flip(images, vertical=1)"] + body[-1:]
            lines += ["", "", f"def {name}_odd({signature}):"] + _indent(generator_body(odd))
        source = _PRELUDE + "\n".join(lines) + "\n"

        reader_options = draw(st.sampled_from([
            {"random_shuffle": True, "seed": 5}, {}, {"pad_last_batch": True},
            {"shard_id": 1, "num_shards": 2, "random_shuffle": True, "seed": 2},
            {"shard_id": 0, "num_shards": 3, "stick_to_shard": True},
            {"shuffle_after_epoch": True, "seed": 4},
            {"enable_checkpointing": True, "random_shuffle": True, "seed": 3},
        ]))
        epochs = draw(st.integers(1, 4))
        plans = []
        for _ in range(epochs):
            plans.append(EpochPlan(
                size=draw(st.sampled_from(SIZES)) if size_from != "none" else None,
                change_at=_sometimes(draw, 25, 0, 2) if size_from != "none" else None,
                reseed=_sometimes(draw, 30, 0, 9),
                restore=_sometimes(draw, 10, 0, 0) is not None,
                reseed_at=_sometimes(draw, 10, 1, 3),
                switch=(None, "plain", "transparent")[_sometimes(draw, 20, 1, 2) or 0]
                if style == "function" and nesting == "direct" else None,
                draw=_sometimes(draw, 25, 0, 0) is not None,
                peek=_sometimes(draw, 15, 1, 2) if readers else None,
                state_at=_sometimes(draw, 40, 1, 3)
                if reader_options.get("enable_checkpointing") else None,
                break_at=_sometimes(draw, 30, 1, 3),
                raise_at=_sometimes(draw, 12, 1, 3),
            ))
        return LoopShape(source, style, nesting, size_from, parameters, readers,
                         draw(st.booleans()), source_kind, draw(st.integers(2, 6)),
                         reader_options, batch_size, draw(st.integers(0, 2**31)),
                         draw(st.integers(0, 2)) == 0,
                         readers > 0 and (known or source_kind is None)
                         and _sometimes(draw, 15, 0, 0) is not None, alternate,
                         draw(st.sampled_from([None, None, 1, 3])),
                         draw(st.sampled_from([1, 1, 1, 2] if known or source_kind is None
                                              else [1])),
                         draw(st.integers(0, 3)) == 0, plans)

    def load(self, folder: str) -> Any:
        """The module, from a file of its own."""
        name = f"ndd_trace_loopshape_{next(_counter)}"
        path = os.path.join(folder, f"{name}.py")
        with open(path, "w") as file:
            file.write(self.source)
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # a class defined there is found by its module's name
        spec.loader.exec_module(module)
        return module

    def describe(self) -> str:
        """The source and the consumer's plan, for a mismatch report."""
        plans = "\n".join(f"#   epoch {index}: {plan}" for index, plan in enumerate(self.plans))
        return (f"{self.source}\n# style={self.style} nesting={self.nesting} "
                f"size_from={self.size_from} readers={self.readers} "
                f"second_short={self.second_short} source={self.source_kind}"
                f"({self.source_items}) options={self.reader_options} "
                f"batch_size={self.batch_size} seed={self.seed} "
                f"consumer_draws={self.consumer_draws} corrupt={self.corrupt} "
                f"alternate={self.alternate} "
                f"depth={self.depth} "
                f"ranks={self.ranks} "
                f"deferred={self.deferred}\n{plans}")


def _external_source(shape: LoopShape) -> Any:
    """A fresh ExternalSource of the shape's kind: weights (zipped with readers) or HWC
    frames (alone)."""
    rng = np.random.default_rng(shape.seed % 1000)
    shape_of, dtype = ((1, 1, 1), np.float32) if shape.readers else ((9, 7, 3), np.uint8)

    def item():
        data = rng.uniform(0, 2, shape_of) if dtype is np.float32 else \
            rng.integers(0, 255, shape_of)
        return ndd.as_batch([data.astype(dtype) for _ in range(shape.batch_size)],
                            layout=None if shape.readers else "HWC")

    if shape.source_kind == "callable":
        return ndd.ExternalSource(item)
    items = [item() for _ in range(shape.source_items)]
    return ndd.ExternalSource(items, cycle="quiet" if shape.source_kind == "cycle" else "raise")


def _plain(value: Any) -> Any:
    if isinstance(value, ndd.Batch):
        return ("Batch", str(value.dtype), str(value.layout),
                tuple(np.asarray(sample.cpu()) for sample in value))
    if isinstance(value, ndd.Tensor):
        return ("Tensor", np.asarray(value.cpu()))
    if isinstance(value, dict):
        return tuple((key, _plain(item)) for key, item in value.items())
    if isinstance(value, tuple):
        return tuple(_plain(item) for item in value)
    return value


class _Stop(Exception):
    """The consumer's own exception."""


def _rank_options(options: dict, rank: int) -> dict:
    """The reader options of data-parallel rank `rank` (its own shard, where sharded)."""
    if "num_shards" in options:
        return {**options, "shard_id": (options["shard_id"] + rank) % options["num_shards"]}
    return options


def _observe(item: Any, known: bool) -> Any:
    """What the consumer sees of an item; for one that fails (a truncated JPEG), the error."""
    try:
        return _plain(item)
    except RuntimeError as error:  # its text too, with `known`
        return ("failed", type(error).__name__, str(error) if known else None)


def _drive(shape: LoopShape, module: Any, mode: str, dirs: tuple[str, ...], known: bool,
           compiled: list) -> list:
    """Everything the consumer observes over the shape's epochs, from the harness's seed (the
    generator's state after is the harness's to compare); the compiled functions go to
    `compiled`. `mode`: "eager", or "compiled" (the shape's generator under ndd.compile).
    `dirs`: 16 photos, 10 others, and (optional) 15 photos and a truncated JPEG."""
    inner = getattr(module, "inner", None)
    loader_class = module.Loader
    program = plain_program = getattr(module, "program", None)
    program_odd = plain_odd = getattr(module, "program_odd", None)
    options = {} if shape.depth is None else {"prefetch_queue_depth": shape.depth}
    if mode == "compiled":
        if shape.nesting == "compiled_inner":
            module.inner = ndd.compile(inner, **options)
            compiled.append(module.inner)
        elif shape.style == "function":
            program = ndd.compile(program, **options)
            compiled.append(program)
            if program_odd is not None:
                program_odd = ndd.compile(program_odd, **options)
                compiled.append(program_odd)
        else:
            name = "__iter__" if shape.style == "iter" else "program"
            function = ndd.compile(getattr(loader_class, name), **options)
            compiled.append(function)
            loader_class = type("Loader", (loader_class,), {name: function})
    log: list = []
    ranks = []  # per rank: the loader and the values of the generator's parameters
    for rank in range(shape.ranks):
        reader = second = source = None
        if shape.readers >= 1:
            reader = ndd.readers.File(file_root=dirs[2] if shape.corrupt and len(dirs) > 2
                                      else dirs[0], **_rank_options(shape.reader_options, rank))
        if shape.readers == 2:
            second = ndd.readers.File(file_root=dirs[1] if shape.second_short else dirs[0],
                                      random_shuffle=True, seed=9 + rank)
        if shape.source_kind is not None:
            source = _external_source(shape)
        loader = loader_class(reader, second, source, log, 12)
        ranks.append((loader, {"loader": loader, "reader": reader, "second": second,
                               "source": source}))

    def set_size(size: int) -> None:
        module.SIZE = module.config.SIZE = size
        for loader, values in ranks:
            loader.size = values["size"] = size

    def open_epoch(loader: Any, values: dict, epoch: int, plain: bool) -> Any:
        arguments = [values[name] for name in shape.parameters]
        if shape.style == "iter":
            return iter(loader)
        if shape.style == "method":
            return loader.program(*arguments)
        if plain:
            return (plain_odd if shape.alternate and epoch % 2 else plain_program)(*arguments)
        return (program_odd if shape.alternate and epoch % 2 else program)(*arguments)

    seen: list = []
    first_state = ndd.random.get_default_rng().state
    try:
        for epoch, plan in enumerate(shape.plans):
            if plan.reseed is not None:
                ndd.random.set_seed(plan.reseed)
            if plan.restore:
                ndd.random.get_default_rng().state = first_state
            if plan.draw:
                seen.append(("drawn", float(np.asarray(ndd.random.uniform(range=[0, 1])))))
            if plan.size is not None:
                set_size(plan.size)
            if plan.peek is not None:  # the trainer looks at a few batches itself
                for loader, values in ranks:
                    batches = values["reader"].next_epoch(batch_size=shape.batch_size)
                    for _, (_, labels) in zip(range(plan.peek), batches):
                        seen.append(("peeked", _plain(labels)))
                    del batches
            steps = 0
            kept: list = []  # deferred: the items, read after the epoch
            epochs = None
            switch = plan.switch if mode == "compiled" else None
            scope = contextlib.ExitStack()
            if switch == "transparent" and not ndd_trace.is_enabled():
                scope.enter_context(ndd_trace.enabled())
            try:
                with scope:
                    epochs = [open_epoch(loader, values, epoch, switch == "plain")
                              for loader, values in ranks]
                    for item in epochs[0] if len(epochs) == 1 else zip(*epochs):
                        if shape.deferred:
                            kept.append((epoch, steps, item))
                        else:
                            seen.append(("item", epoch, steps, _observe(item, known)))
                        steps += 1
                        if shape.consumer_draws:
                            seen.append(float(np.asarray(ndd.random.uniform(range=[0, 1]))))
                        if plan.state_at == steps:
                            seen.append(("state", *(str(values["reader"].get_state())
                                                    for _, values in ranks)))
                        if plan.reseed_at == steps:
                            ndd.random.set_seed(plan.reseed_at)
                        if plan.change_at is not None and steps == plan.change_at + 1:
                            set_size(plan.size + 2)
                        if plan.break_at == steps:
                            break
                        if plan.raise_at == steps:
                            raise _Stop(f"consumer stops at {steps}")
                seen.append(("epoch", epoch, steps))
            except Exception as error:  # noqa: BLE001 (compared with the other runs')
                seen.append(("raised", epoch, steps, type(error).__name__, str(error)))
            epochs = None
            seen += [("item", *where, _observe(item, known)) for *where, item in kept]
            seen.append(("log", tuple(log), *((loader.count, loader.epochs, str(loader.rng.state),
                                               _observe(getattr(loader, "last", None), known))
                                              for loader, _ in ranks)))
    finally:
        if inner is not None:
            module.inner = inner
        module.SIZE = module.config.SIZE = 12
    return seen


def check_loop_shape(shape: LoopShape, dirs: tuple[str, ...], folder: str,
                     transparent: bool = True, known: bool = True) -> str:
    """Run the shape eagerly, compiled and (`transparent`) in transparent mode; return the
    path its compiled generator took, or raise AssertionError naming the first difference."""
    module = shape.load(folder)
    compiled: list = []

    def drive(how: str, mode: str = "eager", into: list | None = None) -> Run:
        return run(_drive, shape, module, how, dirs, known, [] if into is None else into,
                   mode=mode, seed=shape.seed, warn="quiet")  # (capture, checked mode notices)

    eager = drive("eager")
    assert_runs_match(eager, drive("compiled", into=compiled),
                      context=f"compiled\n{shape.describe()}")
    if transparent:
        assert_runs_match(eager, drive("eager", "transparent"),
                          context=f"transparent\n{shape.describe()}")
        if shape.seed % 4 == 0:  # a compiled generator in a transparent-mode script
            assert_runs_match(eager, drive("compiled", "transparent"),
                              context=f"compiled, transparent\n{shape.describe()}")
    paths = sorted({entry.path for function in compiled for entry in function.entries})
    return "+".join(paths) or "none"


def corrupt_copy(jpeg_dir: str, root: str) -> str:
    """A copy of the first 15 photos of `jpeg_dir` under `root`, with a truncated JPEG."""
    from pathlib import Path

    for index, path in enumerate(sorted(Path(jpeg_dir).rglob("*.jpg"))[:15]):
        folder = Path(root) / path.parent.name
        folder.mkdir(parents=True, exist_ok=True)
        (folder / path.name).write_bytes(path.read_bytes())
        if index == 5:
            data = path.read_bytes()
            (folder / f"{path.stem}_cut.jpg").write_bytes(data[:len(data) // 5])
    return str(root)


@contextlib.contextmanager
def no_stray_modules():
    """Drop the shapes' modules from sys.modules afterwards."""
    before = set(sys.modules)
    try:
        yield
    finally:
        for name in set(sys.modules) - before:
            if name.startswith("ndd_trace_loopshape_"):
                del sys.modules[name]
