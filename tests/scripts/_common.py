"""Helpers shared by the script corpus: a digest of every consumed batch, printed."""

from __future__ import annotations

import hashlib
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)


def digest(name, value) -> None:
    """Print a stable digest of consumed data (numpy, torch, or a padded ndd batch)."""
    array = value.numpy() if hasattr(value, "numpy") else np.asarray(value)
    text = hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()[:16]
    print(f"{name}: {array.dtype} {tuple(array.shape)} {text}", flush=True)


def photo_dir(count: int = 12):
    from benchmarks._data import make_jpeg_dir

    return str(make_jpeg_dir(os.path.join(os.environ.get("NDD_TRACE_DATA", "/tmp"),
                                          "ndd_trace_script_photos"), n=count))
