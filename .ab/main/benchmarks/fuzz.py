"""Long differential fuzzing run: thousands of random ndd programs, eager vs compiled.

    python benchmarks/fuzz.py --programs 2000 --seed 1

Prints programs run, outcomes (equal compiled, equal via eager fallback, both raise), the
operators covered and every mismatch (a mismatch is a bug: add it as a regression test).
"""

from __future__ import annotations

import argparse
import collections
import re
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "tests"))

from fuzzing import Program, check_program  # noqa: E402

from _examples import run_examples  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--max-steps", type=int, default=8)
    parser.add_argument("--transparent", action="store_true",
                        help="compare transparent mode (ndd_trace.enabled()) instead of compile")
    args = parser.parse_args()

    outcomes: collections.Counter = collections.Counter()
    ops: collections.Counter = collections.Counter()
    mismatches: list[str] = []
    start = time.perf_counter()

    def one(data):
        program = Program.draw(data, max_steps=args.max_steps)
        for name, _, _ in program.steps:
            ops[re.sub(r"\d+(\.\d+)?", "k", name.split("(")[0])] += 1
        try:
            outcomes[check_program(program, transparent=args.transparent)] += 1
        except AssertionError as error:
            outcomes["mismatch"] += 1
            mismatches.append(str(error))

    run_examples(one, args.programs, args.seed)
    elapsed = time.perf_counter() - start
    total = sum(outcomes.values())
    mode = "transparent mode" if args.transparent else "@ndd.compile"
    print(f"programs: {total} in {elapsed:.0f}s ({mode}, seed {args.seed}, "
          f"up to {args.max_steps} steps)")
    for outcome, count in sorted(outcomes.items()):
        print(f"  {outcome}: {count}")
    print(f"operators covered: {len(ops)}: {', '.join(sorted(ops))}")
    print(f"mismatches: {len(mismatches)}")
    for text in mismatches[:20]:
        print("---\n" + text)
    sys.exit(1 if mismatches else 0)


if __name__ == "__main__":
    main()
