"""A module-level compiled function, as user code defines one, for the pickling tests."""

import numpy as np

import nvidia.dali.experimental.dynamic as ndd
import ndd_trace  # noqa: F401  (ndd.compile)


@ndd.compile
def flipped(x):
    return ndd.flip(x, horizontal=1) * 2


def _mirrored(x):
    return ndd.flip(x, vertical=1)


mirrored = ndd.compile(_mirrored)  # compiled without a decorator, under another name


def run_in_worker(function, values):
    """What a spawn worker does with a compiled function it was sent: call it on its data."""
    batch = ndd.as_batch([np.asarray(v, dtype=np.uint8) for v in values], layout="HWC")
    result = [np.asarray(t).tolist() for t in function(batch)]
    return result, (function.cache_info().traces if hasattr(function, "cache_info") else None)
