"""Soak test: memory over many cache-hit calls, and many threads calling one compiled function.

    python benchmarks/soak.py --calls 10000 --threads 8 --thread-calls 500

Prints the process's resident memory (RSS) every 1000 calls and the thread run's outcome: how
many calls, how many results differed from the single-threaded eager reference, any errors.
"""

from __future__ import annotations

import argparse
import resource
import threading
import time

import numpy as np

import nvidia.dali.experimental.dynamic as ndd
import ndd_trace  # noqa: F401


def rss_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def augment(x):
    angle = ndd.random.uniform(batch_size=x.batch_size, range=[-20, 20])
    return ndd.flip(ndd.rotate(x, angle=angle, fill_value=0, keep_size=True), horizontal=1) * 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=10000)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--thread-calls", type=int, default=500)
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    batch = ndd.as_batch([rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)] * 8, layout="HWC")
    compiled = ndd.compile(augment)

    start = time.perf_counter()
    for call in range(1, args.calls + 1):
        compiled(batch).evaluate()
        if call == 100 or call % 1000 == 0:
            print(f"calls {call:6d}: RSS {rss_mib():7.1f} MiB", flush=True)
    print(f"{args.calls} calls in {time.perf_counter() - start:.1f}s; {compiled.cache_info()}")

    def run(function, seed):
        ndd.random.set_seed(seed)
        return [np.asarray(ndd.as_tensor(function(batch))) for _ in range(args.thread_calls)]

    expected = {seed: run(augment, seed) for seed in range(args.threads)}
    results: dict[int, list] = {}
    errors: list[str] = []

    def worker(seed: int) -> None:
        try:
            results[seed] = run(compiled, seed)
        except Exception as error:  # counted and printed below
            errors.append(repr(error))

    start = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(s,)) for s in range(args.threads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - start
    mismatches = sum(
        not np.array_equal(a, b)
        for seed in results for a, b in zip(expected[seed], results[seed]))
    print(f"threads: {args.threads} x {args.thread_calls} calls in {elapsed:.1f}s, "
          f"mismatches {mismatches}, errors {len(errors)} {errors[:3]}")


if __name__ == "__main__":
    main()
