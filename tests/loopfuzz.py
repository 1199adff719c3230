"""Random compiled generators whose loop bodies carry Python control flow over loop state.

    program = LoopProgram.draw(data)      # inside a hypothesis test using st.data()
    outcome = check_loop_program(program, jpeg_dir, tmp_path)   # or AssertionError

A program is the source of a generator over `reader.next_epoch(batch_size=...)` made of random
fragments: step counters (`enumerate`, `step += 1`), branches on them, `break`, `continue`,
`return`, `raise`, side effects (appending to a list the caller sees, writing a counter on an
object), code before and after the loop, random ops, and bodies with none of these. The source
is written to a module file (so ndd_trace can read it, as it reads users' files) and run
eagerly and through `ndd.compile` for several epochs by the same consumer; what the consumer
sees (values, step counts, the exception type and the step it came at, the side effects, the
random generator's state after) must be identical. Used by tests/test_loop_fuzz.py (small fixed
budget) and benchmarks/fuzz_loops.py (long runs).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import itertools
import os
from typing import Any

import numpy as np
from hypothesis import strategies as st

import nvidia.dali.experimental.dynamic as ndd
from harness import Step, assert_matches_eager

_counter = itertools.count()

# (fragment, needs a counter, is Python control flow or a side effect)
_FRAGMENTS = [
    ("images = ndd.flip(images, horizontal=1)", False, False),
    ("images = images + ndd.random.uniform(batch_size=images.batch_size, range=[0, 4])",
     False, False),
    ("images = ndd.resize(images, size=[{s}, {s}])", False, False),
    ("if step % {k} == 0:\n    images = ndd.flip(images, vertical=1)", True, True),
    ("if step == {k}:\n    break", True, True),
    ("if step == {k}:\n    continue", True, True),
    ("if step == {k}:\n    raise ValueError('stop at {k}')", True, True),
    ("if step == {k}:\n    return", True, True),
    ("log.append(('step', step))", True, True),
    ("state.count += 1", False, True),
    ("images = images * (step % 3 + 1)", True, True),
    ("if augment:\n    images = ndd.flip(images, horizontal=1)", False, False),
    ("images = helper(images)", False, False),
]


def helper(images):
    """A pure helper (proved so by ndd_trace's check)."""
    return ndd.cast(images, dtype=ndd.float32) * 0.5


@dataclasses.dataclass
class LoopProgram:
    """A drawn generator: its source, and how the consumer drives it."""

    source: str
    epochs: int
    batch_size: int
    seed: int
    break_after: int | None  # the consumer breaks out after this many steps of an epoch
    plain: bool  # no Python control flow nor side effect: must take the compiled path

    @staticmethod
    def draw(data: Any) -> LoopProgram:
        draw = data.draw
        counter = draw(st.sampled_from(["enumerate", "augassign", "none"]))
        fragments = draw(st.lists(st.sampled_from(_FRAGMENTS), min_size=0, max_size=4))
        if counter == "none":
            fragments = [f for f in fragments if not f[1]]
        body = ["images = ndd.cast(ndd.resize(ndd.decoders.image(jpegs), size=[12, 12]), "
                "dtype=ndd.float32)"]
        if counter == "augassign":
            body.append("step += 1")
        plain = counter != "augassign"
        for text, _, effect in fragments:
            plain = plain and not effect
            body.append(text.format(s=draw(st.integers(6, 14)), k=draw(st.integers(1, 4))))
        yielded = draw(st.sampled_from(["images, labels", "images", "(images, step)"
                                        if counter != "none" else "images"]))
        if yielded == "(images, step)":
            plain = False
        body.append(f"yield {yielded}")
        before = ["log.append('start')"] if draw(st.booleans()) else []
        after = ["log.append('end')"] if draw(st.booleans()) else []
        plain = plain and not before and not after and counter != "enumerate" or (
            plain and counter == "enumerate" and not any(f[1] for f in fragments)
            and yielded != "(images, step)" and not before and not after)
        header = ("for step, (jpegs, labels) in enumerate(reader.next_epoch(batch_size={b})):"
                  if counter == "enumerate" else
                  "for jpegs, labels in reader.next_epoch(batch_size={b}):")
        batch_size = draw(st.integers(2, 5))
        lines = ["def program(reader, log, state, augment=True):"]
        lines += [f"    {line}" for line in before]
        if counter == "augassign":
            lines.append("    step = 0")
        lines.append("    " + header.format(b=batch_size))
        for statement in body:
            lines += [f"        {line}" for line in statement.splitlines()]
        lines += [f"    {line}" for line in after]
        return LoopProgram("\n".join(lines) + "\n", draw(st.integers(1, 3)), batch_size,
                           draw(st.integers(0, 2**31)),
                           draw(st.one_of(st.none(), st.integers(1, 4))), plain)

    def load(self, folder: str) -> Any:
        """The generator function, from a module file of its own."""
        name = f"ndd_trace_loopfuzz_{next(_counter)}"
        path = os.path.join(folder, f"{name}.py")
        with open(path, "w") as file:
            file.write("import nvidia.dali.experimental.dynamic as ndd\n"
                       "from loopfuzz import helper\n\n" + self.source)
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.program


class _State:
    count = 0


def _drive(program: LoopProgram, function: Any, jpeg_dir: str) -> list:
    """Everything the consumer can observe over the program's epochs (from the harness's seed;
    the generator's state after is the harness's to compare)."""
    reader = ndd.readers.File(file_root=jpeg_dir, random_shuffle=True, seed=5)
    log: list = []
    state = _State()
    seen: list = []
    for epoch in range(program.epochs):
        steps = 0
        try:
            for item in function(reader, log, state):
                values = item if isinstance(item, tuple) else (item,)
                seen.append(tuple(
                    v if isinstance(v, int) else
                    np.concatenate([np.asarray(s).ravel() for s in v.cpu()])
                    for v in values))
                steps += 1
                if program.break_after is not None and steps == program.break_after \
                        and epoch == 0:
                    break
            seen.append(("epoch", steps))
        except Exception as error:  # noqa: BLE001 (compared with the other side's)
            seen.append(("raised", type(error).__name__, str(error), steps))
    seen.append(("log", tuple(log), state.count))
    return seen


def check_loop_program(program: LoopProgram, jpeg_dir: str, folder: str) -> str:
    """Run eagerly and compiled (tests/harness.py, mode step: the generator compiled, driven by
    the same consumer); return "compiled" or "checked" (the path the compiled generator took),
    or raise AssertionError on any difference."""
    function = program.load(folder)
    runs = assert_matches_eager(_drive, program, Step(function), jpeg_dir, modes=("step",),
                                seed=program.seed, warn="quiet", context=program.source)
    compiled = runs["step"].steps[0]
    path = compiled.entries[0].path if compiled.entries else "none"
    if program.plain:
        assert path == "compiled loop", (program.source, path)
    return path
