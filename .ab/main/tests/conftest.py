"""Shared fixtures: real JPEG photos (from scikit-learn's sample images), batches, GPU detection."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import nvidia.dali.experimental.dynamic as ndd  # noqa: E402

import ndd_trace  # noqa: E402,F401
from benchmarks._data import jpeg_paths, make_jpeg_dir  # noqa: E402


def subprocess_env(**extra: str) -> dict:
    """The environment for a child Python: this checkout first on PYTHONPATH, keeping the rest
    (the GPU machine brings DALI through PYTHONPATH)."""
    path = os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, **extra}


def _has_gpu() -> bool:
    try:
        import nvidia.dali.backend as backend

        return backend.GetCUDADeviceCount() > 0
    except Exception:
        return False


HAS_GPU = _has_gpu()


def pytest_collection_modifyitems(config, items):
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def jpeg_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("photos")
    return make_jpeg_dir(root, n=16, seed=0)


@pytest.fixture(scope="session")
def jpeg_bytes(jpeg_dir):
    return [np.fromfile(path, dtype=np.uint8) for path in jpeg_paths(jpeg_dir)]


@pytest.fixture
def jpegs(jpeg_bytes):
    return ndd.as_batch(jpeg_bytes[:8])


@pytest.fixture(scope="session")
def images():
    """A ragged batch of 4 uint8 HWC images cut from a real photo."""
    from benchmarks._data import _load_sample_photos

    photo = _load_sample_photos()[0]
    samples = [np.ascontiguousarray(photo[10 * i: 10 * i + 40 + 4 * i, 20: 68 + 2 * i])
               for i in range(4)]
    return samples


@pytest.fixture
def batch(images):
    return ndd.as_batch(images, layout="HWC")


@pytest.fixture
def uniform_batch():
    """4 copies of one 4x4x3 uint8 image (HWC)."""
    return ndd.as_batch([np.arange(48, dtype=np.uint8).reshape(4, 4, 3)] * 4, layout="HWC")
