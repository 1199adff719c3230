"""Where a compiled step called from a File reader loop spends its time, and whether its runs
were launched ahead: the step's host time split into the call and the consumer's wait, and how
many calls took a run launched ahead (`take_run` hits), ran their own (`start`), or were
served from a coalesced run (NDD_TRACE_COALESCE=K). One process per setting:

    python benchmarks/probe_reader_step.py --device gpu --batch-size 16 --steps 400
    NDD_TRACE_COALESCE=4 python benchmarks/probe_reader_step.py --device gpu --batch-size 32

The workload is bench_ops.py's train step (decoder, random_resized_crop, crop_mirror_normalize
with a coin-flip mirror) over `--images` JPEGs, results consumed with `.evaluate()` and, on the
GPU, a stream synchronization, as bench_ops.py consumes them. Written to explain the
twenty-first session's H100 figures (batch 16: the call took 1.20 ms on one host).
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import nvidia.dali.experimental.dynamic as ndd  # noqa: E402

import ndd_trace  # noqa: E402
from _data import make_jpeg_dir  # noqa: E402
from ndd_trace.ahead import coalescing, speculator  # noqa: E402
from ndd_trace.execution import runtime  # noqa: E402

COUNTS: collections.Counter = collections.Counter()


def counted(owner: type, name: str, hit: str, miss: str | None = None) -> None:
    """Count each call of `owner.name`: `hit` where it returned something, else `miss`."""
    original = getattr(owner, name)

    def wrapper(*args, **kwargs):
        result = original(*args, **kwargs)
        COUNTS[hit if result is not None or miss is None else miss] += 1
        return result

    setattr(owner, name, wrapper)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "gpu"), default="gpu")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--warmup", type=int, default=60)
    parser.add_argument("--images", type=int, default=4096)
    parser.add_argument("--side", type=int, default=224, help="random_resized_crop's size")
    parser.add_argument("--threads", type=int, default=16)
    options = parser.parse_args()
    root = make_jpeg_dir(os.path.join(os.environ.get("TMPDIR", "/tmp"),
                                      f"probe_reader_step_{options.images}"),
                         n=options.images, seed=42)
    counted(speculator.Speculator, "take_run", "took a run launched ahead", "no run ahead")
    counted(runtime.Executable, "start", "ran its own run")
    counted(coalescing.Coalescer, "launch", "coalesced launches", "coalesced launch refused")
    ndd.set_num_threads(options.threads)
    device, side = options.device, [options.side] * 2

    @ndd_trace.compile
    def step(jpegs):
        images = ndd.decoders.image(jpegs, device=device)
        images = ndd.random_resized_crop(images, size=side)
        mirror = ndd.random.coin_flip(probability=0.5, batch_size=images.batch_size)
        return ndd.crop_mirror_normalize(
            images, mirror=mirror, dtype=ndd.float32, output_layout="CHW",
            mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375])

    reader = ndd.readers.File(file_root=str(root), random_shuffle=True, seed=1,
                              pad_last_batch=True)

    def batches():
        while True:
            for jpegs, _ in reader.next_epoch(batch_size=options.batch_size):
                yield jpegs

    def consume(result) -> None:
        result.evaluate()
        if device == "gpu":
            ndd.get_current_stream().synchronize()

    source = batches()
    for _ in range(options.warmup):
        consume(step(next(source)))
    COUNTS.clear()
    took = {"source": 0.0, "call": 0.0, "consume": 0.0}
    started = time.perf_counter()
    for _ in range(options.steps):
        t0 = time.perf_counter()
        jpegs = next(source)
        t1 = time.perf_counter()
        result = step(jpegs)
        t2 = time.perf_counter()
        consume(result)
        t3 = time.perf_counter()
        took["source"] += t1 - t0
        took["call"] += t2 - t1
        took["consume"] += t3 - t2
    elapsed = time.perf_counter() - started
    per_step = ", ".join(f"{name} {1000 * seconds / options.steps:.2f}"
                         for name, seconds in took.items())
    print(f"batch {options.batch_size}, NDD_TRACE_COALESCE={os.environ.get('NDD_TRACE_COALESCE', '0')}"
          f": {options.steps / elapsed:.1f} steps/s, {options.steps * options.batch_size / elapsed:.0f}"
          f" samples/s; ms a step: {per_step}; calls: {dict(COUNTS)}")


if __name__ == "__main__":
    main()
