"""A script that fails: exceptions and tracebacks must be those of a plain run."""

import numpy as np

import nvidia.dali.experimental.dynamic as ndd

batch = ndd.as_batch([np.zeros((4, 4, 3), np.uint8)] * 2, layout="HWC")
flipped = ndd.flip(batch)
print("shape", flipped.shape)
raise ValueError(f"script failure after {flipped.batch_size} samples")
