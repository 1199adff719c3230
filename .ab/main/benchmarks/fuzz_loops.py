"""Long differential fuzzing run of compiled generators with Python control flow over loop state.

    python benchmarks/fuzz_loops.py --programs 300 --seed 1
    python benchmarks/fuzz_loops.py --programs 0 --shapes 300 --seed 1    # loop shapes only
    python benchmarks/fuzz_loops.py --programs 0 --shapes 100 --no-known  # without earlier finds

`--programs`: loop bodies with Python control flow (tests/loopfuzz.py); `--shapes`: the loop's
shape and its consumer's plan (tests/loopshapes.py: functions, methods, `__iter__`, helper
generators, several readers, an ExternalSource, try/finally/with, breaks, raises, reseeds, ranks),
each run eager, compiled and in transparent mode; `--known` (the default) also draws the shapes
of mismatches found earlier, fixed since (`--no-known` leaves them out). Prints programs run, the path each compiled generator
took (compiled loop, checked loop), and every mismatch with its source (a mismatch is a bug: add
it as a regression test).
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
sys.path.insert(0, os.path.dirname(HERE))

from loopfuzz import LoopProgram, check_loop_program  # noqa: E402
from loopshapes import (LoopShape, check_loop_shape, corrupt_copy,  # noqa: E402
                        no_stray_modules)

from benchmarks._data import make_jpeg_dir  # noqa: E402
from benchmarks._examples import run_examples  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=int, default=300)
    parser.add_argument("--shapes", type=int, default=0)
    parser.add_argument("--known", action=argparse.BooleanOptionalAction, default=True,
                        help="also draw the shapes of mismatches found earlier (fixed since; "
                             "--no-known leaves them out)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    folder = tempfile.mkdtemp(prefix="ndd_trace_loopfuzz_")
    jpeg_dir = make_jpeg_dir(os.path.join(folder, "photos"), n=16, seed=0)
    short_dir = make_jpeg_dir(os.path.join(folder, "short"), n=10, seed=1)
    dirs = (str(jpeg_dir), str(short_dir), corrupt_copy(str(jpeg_dir),
                                                       os.path.join(folder, "corrupt")))
    paths: collections.Counter = collections.Counter()
    mismatches: list[str] = []

    def one(data):
        program = LoopProgram.draw(data)
        try:
            paths[check_loop_program(program, str(jpeg_dir), folder)] += 1
        except AssertionError as error:
            mismatches.append(f"{program.source}\n{str(error)[:400]}")

    def one_shape(data):
        shape = LoopShape.draw(data, known=args.known)
        try:
            with no_stray_modules():
                paths[check_loop_shape(shape, dirs, folder, known=args.known)] += 1
        except AssertionError as error:
            mismatches.append(str(error)[:6000])

    for kind, body, count in (("programs", one, args.programs),
                              ("shapes", one_shape, args.shapes)):
        if not count:
            continue
        paths.clear()
        mismatches.clear()
        start = time.perf_counter()
        run_examples(body, count, args.seed)
        print(f"{kind}: {sum(paths.values()) + len(mismatches)} in "
              f"{time.perf_counter() - start:.0f} s (seed {args.seed}); paths: {dict(paths)}; "
              f"mismatches: {len(mismatches)}")
        for text in mismatches:
            print("--- mismatch\n" + text)


if __name__ == "__main__":
    main()
