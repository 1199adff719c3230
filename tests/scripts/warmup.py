"""A warm-up loop with one batch size, then the main loop; a helper called from two places."""

import numpy as np
from _common import digest

import nvidia.dali.experimental.dynamic as ndd

NOISE = [0.0, 4.0]


def augment(images):
    angle = ndd.random.uniform(batch_size=images.batch_size, range=[-5, 5])
    images = ndd.rotate(images, angle=angle, keep_size=True, fill_value=0)
    noise = ndd.random.uniform(batch_size=images.batch_size, range=NOISE, shape=[1, 1, 3])
    return ndd.cast(images, dtype=ndd.float32) + noise


ndd.random.set_seed(9)
rng = np.random.default_rng(3)
for step in range(2):  # warm-up with small batches
    batch = ndd.as_batch([rng.integers(0, 255, (20, 20, 3), dtype=np.uint8) for _ in range(2)],
                         layout="HWC")
    digest(f"warmup {step}", augment(batch).torch())
for step in range(4):  # main loop
    batch = ndd.as_batch([rng.integers(0, 255, (20, 20, 3), dtype=np.uint8) for _ in range(4)],
                         layout="HWC")
    digest(f"main {step}", (augment(batch) * 0.5).torch())
