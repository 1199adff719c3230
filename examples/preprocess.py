"""Main example: a compiled ndd preprocessing function fed by a real file reader.

    python examples/preprocess.py                 # CPU (default)
    python examples/preprocess.py --device gpu    # decode and augment on the GPU

Reads a folder of JPEGs (yours with --image-dir, else a small set it makes: examples/_images.py;
nothing beyond `pip install ndd_trace` is needed), runs the same preprocessing eagerly and
compiled, checks that both give the same bits (random augmentations included), and hands the
result to PyTorch (`.torch()`, where torch is installed; as numpy otherwise). Timing: one warm-up epoch per mode first (it pays DALI's start-up,
and for the compiled function the trace and the pipeline build), then the median of --epochs
steady-state epochs per mode, the modes taking turns so that both see the same machine load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import numpy as np

import nvidia.dali.experimental.dynamic as ndd
from _images import make_image_dir  # (beside this file)

import ndd_trace  # noqa: F401  (makes ndd.compile available)

try:
    import torch  # noqa: F401
except ImportError:  # a plain `pip install ndd_trace`: the batches go to numpy
    torch = None

MEAN = [0.485 * 255, 0.456 * 255, 0.406 * 255]
STD = [0.229 * 255, 0.224 * 255, 0.225 * 255]


def preprocess(jpegs, device="cpu", size=64):
    images = ndd.decoders.image(jpegs, device=device)
    images = ndd.random_resized_crop(images, size=[size, size])
    flip = ndd.random.coin_flip(batch_size=images.batch_size)
    images = ndd.crop_mirror_normalize(images, mirror=flip, mean=MEAN, std=STD)
    noise = ndd.random.uniform(batch_size=images.batch_size, range=[0, 0.1], device=device)
    return images * 0.5 + noise


compiled_preprocess = ndd.compile(preprocess)


def epoch(function, reader, device, batch_size):
    ndd.random.set_seed(42)
    outputs = []
    for jpegs, labels in reader.next_epoch(batch_size=batch_size):
        images = function(jpegs, device=device)
        outputs.append((to_numpy(images), to_numpy(labels)))
    return outputs


def to_numpy(batch):
    """A batch as one numpy array: through PyTorch (`.torch()`, as a training step takes it)
    where torch is installed."""
    if torch is not None:
        return batch.torch().cpu().numpy()
    return np.stack([np.asarray(sample) for sample in batch.cpu().tensors])


def timed_epoch(function, reader, device, batch_size):
    start = time.perf_counter()
    outputs = epoch(function, reader, device, batch_size)
    return time.perf_counter() - start, outputs


def assert_same_bits(eager, compiled):
    assert len(eager) == len(compiled)
    for (eager_images, eager_labels), (images, labels) in zip(eager, compiled):
        assert np.array_equal(eager_images, images) and np.array_equal(eager_labels, labels)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "gpu"])
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--images", type=int, default=30, help="images to make (no --image-dir)")
    parser.add_argument("--image-dir", help="a folder of JPEGs, a subfolder per class")
    parser.add_argument("--epochs", type=int, default=5, help="steady-state epochs timed per mode")
    args = parser.parse_args()

    root = args.image_dir or make_image_dir(
        os.path.join(tempfile.gettempdir(), "ndd_trace_example_images"), n=args.images)
    eager_reader = ndd.readers.File(file_root=str(root), random_shuffle=True, seed=1)
    compiled_reader = ndd.readers.File(file_root=str(root), random_shuffle=True, seed=1)

    # warm-up: the first epoch of each mode pays DALI's start-up (and the compiled function's
    # trace and pipeline build); whichever ran first would otherwise look slower
    eager_warmup, eager = timed_epoch(preprocess, eager_reader, args.device, args.batch_size)
    compiled_warmup, compiled = timed_epoch(compiled_preprocess, compiled_reader, args.device,
                                            args.batch_size)
    assert_same_bits(eager, compiled)
    eager_times, compiled_times = [], []
    for _ in range(args.epochs):  # the modes take turns: both see the same machine load
        seconds, eager = timed_epoch(preprocess, eager_reader, args.device, args.batch_size)
        eager_times.append(seconds)
        seconds, compiled = timed_epoch(compiled_preprocess, compiled_reader, args.device,
                                        args.batch_size)
        compiled_times.append(seconds)
        assert_same_bits(eager, compiled)

    print(f"{len(compiled)} batches, last batch of {compiled[-1][0].shape[0]} images "
          f"{tuple(compiled[-1][0].shape[1:])}: compiled == eager, bit for bit "
          f"({1 + args.epochs} epochs each)")
    eager_s, compiled_s = statistics.median(eager_times), statistics.median(compiled_times)
    print(f"epoch of {len(compiled)} batches (batch {args.batch_size}, {args.device}), "
          f"reader + preprocessing + {'.torch()' if torch else 'numpy'}, median of {args.epochs} epochs after one "
          f"warm-up epoch each: eager {eager_s * 1000:.1f} ms, compiled {compiled_s * 1000:.1f} "
          f"ms ({eager_s / compiled_s:.2f}x)")
    print(f"warm-up epochs (DALI start-up; compiled: also trace + build): eager "
          f"{eager_warmup * 1000:.0f} ms, compiled {compiled_warmup * 1000:.0f} ms")
    print(f"cache: {compiled_preprocess.cache_info()}")
    print(ndd_trace.explain(compiled_preprocess, compiled_reader_sample(root), device=args.device))


def compiled_reader_sample(root):
    reader = ndd.readers.File(file_root=str(root))
    for jpegs, _ in reader.next_epoch(batch_size=4):
        return jpegs


if __name__ == "__main__":
    main()
