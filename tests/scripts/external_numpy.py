"""ExternalSource feeding numpy data into arithmetic, slicing and ndd.math."""

import numpy as np
from _common import digest

import nvidia.dali.experimental.dynamic as ndd

SCALE = 0.5
data = [[np.full((6, 8), i + j, dtype=np.float32) for j in range(3)] for i in range(5)]
source = ndd.ExternalSource(data)
for step in range(5):
    batch = source(batch_size=3)
    values = ndd.math.sqrt(batch * SCALE + 1.0)
    values = values.slice[1:5, ::2] - ndd.math.clamp(batch.slice[1:5, ::2], 0.0, 2.0)
    digest(f"step {step}", np.stack([np.asarray(t) for t in values]))
