"""Per-sample augmentation: the eager per-sample loop against one compiled per-sample call.

The function is written for one sample (a Tensor): a random coin flip decides a mirror, the
image size decides a resize (both per-sample branches), then a normalization. `eager` runs
`[augment(sample) for sample in batch]`; `compiled` runs `ndd.compile(augment,
per_sample=True)(batch)` (one conditional pipeline run; the random values are computed per
sample before the run, as the eager loop draws them). Results are checked equal first.

Example::

    .venv/bin/python benchmarks/bench_per_sample.py --batch-size 32 --steps 30
    .venv/bin/python benchmarks/bench_per_sample.py --device gpu --batch-size 64
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import nvidia.dali.experimental.dynamic as ndd

import ndd_trace  # noqa: F401
from benchmarks._data import _load_sample_photos


def augment(image):
    flip = ndd.random.coin_flip(probability=0.5)
    if flip.item():
        image = ndd.flip(image, horizontal=1)
    if image.shape[0] > 200:
        image = ndd.resize(image, size=[160, 160])
    else:
        image = ndd.resize(image, size=[128, 128])
    return ndd.crop_mirror_normalize(image, mean=[120.0, 115.0, 100.0], std=[60.0, 58.0, 57.0])


def make_batch(batch_size: int, device: str) -> ndd.Batch:
    photos = _load_sample_photos()
    rng = np.random.default_rng(0)
    samples = []
    for i in range(batch_size):
        photo = photos[i % len(photos)]
        height, width = int(rng.integers(150, 300)), int(rng.integers(150, 300))
        top, left = int(rng.integers(0, photo.shape[0] - height)), \
            int(rng.integers(0, photo.shape[1] - width))
        samples.append(np.ascontiguousarray(photo[top:top + height, left:left + width]))
    batch = ndd.batch(samples, layout="HWC")
    return batch.gpu() if device == "gpu" else batch


def eager_loop(batch: ndd.Batch) -> ndd.Batch:
    return ndd.batch([augment(batch.select(i)) for i in range(batch.batch_size)])


def timed(step, steps: int) -> float:
    started = time.perf_counter()
    for _ in range(steps):
        np.asarray(step().select(0).cpu())  # consume: the work is done
    return (time.perf_counter() - started) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    options = parser.parse_args()
    batch = make_batch(options.batch_size, options.device)
    compiled = ndd.compile(augment, per_sample=True)

    ndd.random.set_seed(1)
    expected = eager_loop(batch)
    ndd.random.set_seed(1)
    actual = compiled(batch)
    for a, b in zip(expected, actual):
        np.testing.assert_array_equal(np.asarray(a.cpu()), np.asarray(b.cpu()))

    for _ in range(options.warmup):
        eager_loop(batch).evaluate()
        compiled(batch).evaluate()
    eager_s = timed(lambda: eager_loop(batch), options.steps)
    compiled_s = timed(lambda: compiled(batch), options.steps)
    print(f"batch {options.batch_size}, {options.device}, {options.steps} steps "
          f"(results equal to the eager loop, checked)")
    print(f"eager per-sample loop: {eager_s * 1e3:8.2f} ms/batch "
          f"({options.batch_size / eager_s:8.1f} samples/s)")
    print(f"compiled per_sample:   {compiled_s * 1e3:8.2f} ms/batch "
          f"({options.batch_size / compiled_s:8.1f} samples/s)  x{eager_s / compiled_s:.2f}")


if __name__ == "__main__":
    main()
