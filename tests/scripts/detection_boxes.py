"""Detection-style boxes: ragged per-sample boxes, flipped, padded for PyTorch with pad=True."""

import numpy as np
from _common import digest

import nvidia.dali.experimental.dynamic as ndd

rng = np.random.default_rng(1)
ndd.random.set_seed(2)
for step in range(4):
    boxes = ndd.as_batch([rng.random((int(n), 4), dtype=np.float32) * 0.5
                          for n in rng.integers(1, 6, size=4)])
    flipped = ndd.bb_flip(boxes, horizontal=1)
    jitter = ndd.random.uniform(batch_size=boxes.batch_size, range=[0.0, 0.01], shape=[4])
    moved = flipped + jitter
    digest(f"step {step} boxes", moved.torch(pad=True))
