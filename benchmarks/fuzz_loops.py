"""Long differential fuzzing run of compiled generators with Python control flow over loop state.

    python benchmarks/fuzz_loops.py --programs 300 --seed 1

Prints programs run, the path each compiled generator took (compiled loop, checked loop), and
every mismatch with its source (a mismatch is a bug: add it as a regression test).
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

from benchmarks._data import make_jpeg_dir  # noqa: E402
from benchmarks._examples import run_examples  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=int, default=300)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    folder = tempfile.mkdtemp(prefix="ndd_trace_loopfuzz_")
    jpeg_dir = make_jpeg_dir(folder, n=16, seed=0)
    paths: collections.Counter = collections.Counter()
    mismatches: list[str] = []
    start = time.perf_counter()

    def one(data):
        program = LoopProgram.draw(data)
        try:
            paths[check_loop_program(program, jpeg_dir, folder)] += 1
        except AssertionError as error:
            mismatches.append(f"{program.source}\n{str(error)[:400]}")

    run_examples(one, args.programs, args.seed)
    print(f"programs: {sum(paths.values()) + len(mismatches)} in "
          f"{time.perf_counter() - start:.0f} s; paths: {dict(paths)}; "
          f"mismatches: {len(mismatches)}")
    for text in mismatches:
        print("--- mismatch\n" + text)


if __name__ == "__main__":
    main()
