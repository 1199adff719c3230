"""Random ndd programs for differential fuzzing: each runs eagerly and compiled, bits compared.

    program = Program.draw(data)         # inside a hypothesis test using st.data()
    outcome = check_program(program)     # "equal", "both-raise"; raises AssertionError otherwise

Values keep three channels and three dimensions: DALI 2.4's eager `hsv` crashes the process
(segfault) on a 1-channel image, so the generator never makes one; its `gaussian_blur` crashes
on a batch holding an empty sample (`.slice[2:]` of a 2-row image), so values that may hold one
are never blurred.

A program is a DAG of steps over an input batch (random dtype, ragged HWC shapes, batch size
1..5): unary operators with random valid arguments, arithmetic with constants, with per-sample
random scalars, with earlier values and with user data the program makes (`ndd.as_batch`), random
ops with seeds, and every value returned (a tuple, one value twice, a reordered OrderedDict or
nested containers). Used by tests/test_fuzz.py (small fixed budget) and benchmarks/fuzz.py
(long runs).
"""

from __future__ import annotations

import collections
import dataclasses
import os
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
from hypothesis import strategies as st

import nvidia.dali.experimental.dynamic as ndd
from harness import assert_runs_match, run

DTYPES = {"uint8": np.uint8, "float32": np.float32, "int16": np.int16}


def _unary_ops(draw: Callable) -> list[tuple[str, Callable]]:
    """One randomly parameterized instance of each unary op, as (description, function)."""
    size = [draw(st.integers(4, 24)), draw(st.integers(4, 24))]
    angle = draw(st.floats(-90, 90, allow_nan=False, width=32))
    crop = [draw(st.integers(1, 8)), draw(st.integers(1, 8))]
    horizontal = draw(st.integers(0, 1))
    vertical = draw(st.integers(0, 1))
    factor = draw(st.floats(0.125, 3.0, width=32))
    k = draw(st.integers(1, 9))
    lo = draw(st.integers(0, 3))
    # numpy constants as a user writes them: float64 by default (DALI's Constant holds no
    # doubles), exact in float32 or not
    const_dtype = draw(st.sampled_from(["float64", "float32", "int32"]))
    channel = np.array([draw(st.floats(0.25, 4.0, width=32)) for _ in range(3)])
    channel = (channel * 4).astype(const_dtype) if const_dtype == "int32" else \
        channel.astype(const_dtype)
    mean = np.array([draw(st.floats(0, 255, width=64)) for _ in range(3)])
    # user data the function makes itself (eager runs the op given it at the call): 2 channels
    # do not broadcast over 3, an error eager raises there
    user = [np.full((1, 1, draw(st.sampled_from([3, 3, 2]))), k, np.float32)]
    return [
        (f"flip(h={horizontal}, v={vertical})",
         lambda x: ndd.flip(x, horizontal=horizontal, vertical=vertical)),
        (f"resize({size})", lambda x: ndd.resize(x, size=size)),
        (f"rotate({angle:.2f})", lambda x: ndd.rotate(x, angle=angle, fill_value=0)),
        (f"crop({crop})", lambda x: ndd.crop(x, crop=crop)),
        ("cast(float32)", lambda x: ndd.cast(x, dtype=ndd.float32)),
        ("cast(uint8)", lambda x: ndd.cast(x, dtype=ndd.uint8)),
        (f"* {factor:.3f}", lambda x: x * factor),
        (f"+ {k}", lambda x: x + k),
        (f"// {k}", lambda x: x // k),
        (f"{k} - x", lambda x: k - x),
        ("abs(-x)", lambda x: abs(-x)),
        (f".slice[{lo}:]", lambda x: x.slice[lo:]),
        ("transpose(1,0,2)", lambda x: ndd.transpose(x, perm=[1, 0, 2])),
        ("coord/hsv", lambda x: ndd.hsv(ndd.cast(x, dtype=ndd.uint8), hue=float(k))),
        (f"brightness({factor:.2f})", lambda x: ndd.brightness(x, brightness=factor)),
        ("gaussian_blur(3)", lambda x: ndd.gaussian_blur(x, window_size=3)),
        ("x > k", lambda x: ndd.cast(x > k, dtype=ndd.uint8)),
        ("noise.gaussian", lambda x: ndd.noise.gaussian(ndd.cast(x, dtype=ndd.float32),
                                                        stddev=factor)),
        ("random_angle_rotate", lambda x: ndd.rotate(
            x, angle=ndd.random.uniform(batch_size=x.batch_size, range=[-20, 20]),
            fill_value=0)),
        ("x * coin_flip", lambda x: x * ndd.cast(
            ndd.random.coin_flip(batch_size=x.batch_size), dtype=x.dtype)),
        ("x + uniform", lambda x: x + ndd.random.uniform(batch_size=x.batch_size, range=[0, 2])),
        ("reductions.sum(keep_dims)", lambda x: ndd.reductions.sum(x, axes=[0], keep_dims=True)),
        ("sqrt", lambda x: ndd.math.sqrt(ndd.cast(x, dtype=ndd.float32))),
        (f"* np.array({channel.tolist()}, {const_dtype})", lambda x: x * channel),
        (f"+ ndd.as_batch([np.full({user[0].shape}, {k})] * n)",
         lambda x: x + ndd.as_batch(user * x.batch_size)),
        (f"crop_mirror_normalize(mean=np.array({mean.tolist()}))",
         lambda x: ndd.crop_mirror_normalize(x, mean=mean, std=channel.astype(np.float64),
                                             output_layout="HWC")),
    ]


STRUCTURES = ["tuple", "repeated", "ordered", "nested"]

BINARY = [
    ("add", lambda a, b: a + b),
    ("mul", lambda a, b: a * b),
    ("max", lambda a, b: ndd.math.max(a, b)),
    ("sub", lambda a, b: a - b),
]


@dataclasses.dataclass
class Program:
    """A drawn program: input data, steps, outputs and a seed."""

    inputs: list[np.ndarray]
    steps: list[tuple[str, Any, tuple[int, ...]]]  # (description, function, argument indices)
    outputs: tuple[int, ...]
    seed: int
    # how the values are returned: a tuple, the last one twice (one object in two places), an
    # OrderedDict reordered (`move_to_end`), or nested containers
    structure: str = "tuple"

    @staticmethod
    def draw(data: Any, max_steps: int = 6) -> Program:
        draw = data.draw
        dtype = DTYPES[draw(st.sampled_from(sorted(DTYPES)))]
        batch_size = draw(st.integers(1, 5))
        rng = np.random.default_rng(draw(st.integers(0, 2**16)))
        inputs = []
        for _ in range(batch_size):
            shape = (int(rng.integers(2, 20)), int(rng.integers(2, 20)), 3)
            inputs.append((rng.random(shape) * 255).astype(dtype))
        steps = []
        count = 1
        may_be_empty = [False]  # per value: may a sample have a zero-length axis
        for _ in range(draw(st.integers(1, max_steps))):
            if count > 1 and draw(st.booleans()) and draw(st.booleans()):
                name, function = draw(st.sampled_from(BINARY))
                a = draw(st.integers(0, count - 1))
                steps.append((name, function, (a, a)))  # same value twice: shapes always agree
            else:
                ops = _unary_ops(draw)
                index = draw(st.integers(0, len(ops) - 1))
                name, function = ops[index]
                a = draw(st.integers(0, count - 1))
                if name.startswith("gaussian_blur") and may_be_empty[a]:
                    name, function = ops[0]  # DALI 2.4 crashes (see above): flip instead
                steps.append((name, function, (a,)))
            may_be_empty.append(may_be_empty[a] or (name.startswith(".slice[") and
                                                    not name.startswith(".slice[0")))
            count += 1
        # Every value is returned: an unused failing call fails eager ndd only when a sync
        # happens to meet its asynchronous error, while compiled code prunes it.
        outputs = tuple(range(1, count))
        return Program(inputs, steps, outputs, draw(st.integers(0, 2**31)),
                       draw(st.sampled_from(STRUCTURES)))

    def function(self) -> Callable:
        steps, outputs, structure = self.steps, self.outputs, self.structure

        def program(x):
            values = [x]
            for _, function, arguments in steps:
                values.append(function(*(values[i] for i in arguments)))
            returned = tuple(values[i] for i in outputs)
            if structure == "repeated":
                return (*returned, returned[-1])
            if structure == "ordered":
                named = collections.OrderedDict((f"v{i}", values[i]) for i in outputs)
                named.move_to_end(f"v{outputs[0]}")
                return named
            if structure == "nested":
                return {"last": returned[-1], "all": [returned, {"first": returned[0]}]}
            return returned

        return program

    def __str__(self) -> str:
        lines = [f"input: {len(self.inputs)} x {self.inputs[0].dtype} "
                 f"{[a.shape for a in self.inputs]}"]
        for i, (name, _, arguments) in enumerate(self.steps, 1):
            lines.append(f"  v{i} = {name}({', '.join(f'v{a}' for a in arguments)})")
        lines.append(f"  return {', '.join(f'v{i}' for i in self.outputs)} ({self.structure}); "
                     f"seed {self.seed}")
        return "\n".join(lines)


def check_program(program: Program, calls: int = 2, transparent: bool = False) -> str:
    """Run eagerly and compiled (or in transparent mode) through tests/harness.py; return the
    outcome or raise AssertionError on a mismatch. Raising counts as equal only with the same
    built-in type, in the same call, at the same stage (at the call, or when the result is
    consumed: an operator fed user data runs at the call in eager ndd, and raises there in
    ndd_trace too), with the calls before it equal and the generators in the same state
    afterwards."""
    function = program.function()
    if os.environ.get("NDD_TRACE_FUZZ_VERBOSE"):
        print(program, file=sys.stderr, flush=True)
    batch = ndd.as_batch(program.inputs, layout="HWC")
    eager = run(function, batch, seed=program.seed, calls=calls, warn="quiet")
    other = run(function, batch, mode="transparent" if transparent else "compiled",
                seed=program.seed, calls=calls, warn="quiet")
    assert_runs_match(eager, other, errors="kind", context=program)
    if eager.error is not None:
        return "both-raise"
    if transparent:
        return "equal"
    return "equal" if other.function.cache_info().fallbacks == 0 else "equal-eager"
