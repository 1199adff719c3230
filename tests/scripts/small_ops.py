"""The small-ops workload as a plain script: 13 cheap calls a step on batches of 8 images.

NDD_STEPS sets the step count; NDD_CAPTURE=1 runs it under DALI's capture mode instead (for
the benchmark). Prints a digest of the last batch, and the loop time on stderr.
"""

import os
import sys
import time

import numpy as np
from _common import digest

import nvidia.dali.experimental.dynamic as ndd

STEPS = int(os.environ.get("NDD_STEPS", "20"))
CAPTURE = os.environ.get("NDD_CAPTURE") == "1"

rng = np.random.default_rng(0)
batches = [ndd.as_batch([rng.integers(0, 255, (64, 64, 3), dtype=np.uint8) for _ in range(8)],
                        layout="HWC") for _ in range(4)]
source = ndd.ExternalSource(batches, cycle="quiet")
inputs = source.captured(batch_size=8) if CAPTURE else (source() for _ in iter(int, 1))
ndd.random.set_seed(1)
start = time.perf_counter()
for step, images in zip(range(STEPS), inputs):
    angle = ndd.random.uniform(range=[-15.0, 15.0], batch_size=images.batch_size)
    images = ndd.flip(images, horizontal=1)
    images = ndd.crop(images, crop=[56, 56])
    images = ndd.resize(images, size=[48, 48])
    images = ndd.rotate(images, angle=angle, keep_size=True, fill_value=0)
    images = ndd.hsv(images, hue=10.0, saturation=1.2)
    images = ndd.brightness_contrast(images, brightness=1.1, contrast=0.9)
    images = ndd.cast(images, dtype=ndd.float32)
    images = images * (1 / 255)
    images = images - 0.5
    images = ndd.normalize(images, mean=0.0, stddev=0.25)
    images = ndd.transpose(images, perm=[2, 0, 1])
    result = images.slice[:, 4:44, 4:44].torch()
elapsed = time.perf_counter() - start
digest("last batch", result)
print(f"loop {elapsed:.3f}s {STEPS / elapsed:.1f} steps/s", file=sys.stderr)
