"""Errors of asynchronous runs and of reader epochs: their tracebacks as a plain run's (the stack
DALI records at an op call starts at the script; no frames of the launcher or of ndd_trace)."""

import traceback

import numpy as np
from _common import photo_dir

import nvidia.dali.experimental.dynamic as ndd

uneven = ndd.as_batch([np.zeros((4, 4, 3), np.uint8), np.zeros((6, 4, 3), np.uint8)],
                      layout="HWC")
for step in range(2):
    try:
        ndd.flip(uneven, horizontal=1).torch()  # a non-uniform batch: raised at first use
    except ValueError:
        print(step, [line for line in traceback.format_exc().splitlines()
                     if line.startswith("  File")])

reader = ndd.readers.File(file_root=photo_dir())
for epoch, batch_size in enumerate([4, 6]):  # eager refuses the second epoch's batch size
    for jpegs, labels in reader.next_epoch(batch_size=batch_size):
        pass
    print("epoch", epoch, "done")
