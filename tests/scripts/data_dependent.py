"""Data-dependent Python: branch on values of a batch, read .shape, loop a varying count."""

import numpy as np
from _common import digest

import nvidia.dali.experimental.dynamic as ndd

ndd.random.set_seed(8)
base = ndd.as_batch([np.arange(48, dtype=np.uint8).reshape(4, 4, 3) + i for i in range(3)],
                    layout="HWC")
x = base
for step in range(4):
    x = ndd.flip(x, horizontal=1) + ndd.cast(
        ndd.random.coin_flip(batch_size=x.batch_size), dtype=ndd.uint8)
    total = int(np.asarray(ndd.reductions.sum(x.select(0))))
    if total % 2 == 0:
        x = x // 2
    for _ in range(x.shape[0][0] % 3):
        x = ndd.flip(x, vertical=1)
    digest(f"step {step}", np.stack([np.asarray(t) for t in x]))
