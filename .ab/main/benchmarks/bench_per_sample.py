"""Per-sample augmentation: the eager per-sample loop against one compiled per-sample call.

The function is the headline example of docs/per-sample.md, written for one sample (a
Tensor): a random coin flip decides a rotation by a random angle drawn inside the branch, the
image height decides a resize (both per-sample branches; the crops are 150-400 pixels high, so
the threshold is 256 instead of the docs' 512). `eager` runs `[augment(sample) for sample in
batch]`; `compiled` runs `ndd.compile(augment, per_sample=True)(batch)` (one conditional
pipeline run per call; the random values are computed per sample before the run, in the
eager loop's order, and the run confirms the paths they were drawn for). Results and the
generator's state afterwards are checked equal first.

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
    if ndd.random.coin_flip(probability=0.3).item():
        image = ndd.rotate(image, angle=ndd.random.uniform(range=[-10, 10]))
    if image.shape[0] > 256:
        image = ndd.resize(image, resize_shorter=256)
    return image


def make_batch(batch_size: int, device: str) -> ndd.Batch:
    photos = _load_sample_photos()
    rng = np.random.default_rng(0)
    samples = []
    for i in range(batch_size):
        photo = photos[i % len(photos)]
        height, width = int(rng.integers(150, 400)), int(rng.integers(150, 400))
        top, left = int(rng.integers(0, photo.shape[0] - height)), \
            int(rng.integers(0, photo.shape[1] - width))
        samples.append(np.ascontiguousarray(photo[top:top + height, left:left + width]))
    batch = ndd.batch(samples, layout="HWC")
    return batch.gpu() if device == "gpu" else batch


def eager_loop(batch: ndd.Batch) -> ndd.Batch:
    return ndd.batch([augment(batch.select(i)) for i in range(batch.batch_size)])


def timed(steps: dict, rounds: int) -> dict:
    """The median time of each step, run in alternation (round by round), so that load from
    other processes on the machine falls on all of them alike."""
    times: dict = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            started = time.perf_counter()
            np.asarray(step().select(0).cpu())  # consume: the work is done
            times[name].append(time.perf_counter() - started)
    return {name: float(np.median(values)) for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    options = parser.parse_args()
    batch = make_batch(options.batch_size, options.device)
    compiled = ndd.compile(augment, per_sample=True)

    for seed in range(3):
        ndd.random.set_seed(seed)
        expected = eager_loop(batch)
        state = str(ndd.random.get_default_rng().state)
        ndd.random.set_seed(seed)
        actual = compiled(batch)
        assert str(ndd.random.get_default_rng().state) == state
        for a, b in zip(expected, actual):
            np.testing.assert_array_equal(np.asarray(a.cpu()), np.asarray(b.cpu()))

    for _ in range(options.warmup):
        eager_loop(batch).evaluate()
        compiled(batch).evaluate()
    runs_before = compiled.run_count
    medians = timed({"eager": lambda: eager_loop(batch), "compiled": lambda: compiled(batch)},
                    options.steps)
    eager_s, compiled_s = medians["eager"], medians["compiled"]
    runs = (compiled.run_count - runs_before) / options.steps
    print(f"batch {options.batch_size}, {options.device}, median of {options.steps} rounds "
          f"(results equal to the eager loop, checked)")
    print(f"eager per-sample loop: {eager_s * 1e3:8.2f} ms/batch "
          f"({options.batch_size / eager_s:8.1f} samples/s)")
    print(f"compiled per_sample:   {compiled_s * 1e3:8.2f} ms/batch "
          f"({options.batch_size / compiled_s:8.1f} samples/s)  x{eager_s / compiled_s:.2f}"
          f"  ({runs:.2f} pipeline runs per call)")


if __name__ == "__main__":
    main()
