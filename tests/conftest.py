"""Shared fixtures: real JPEG photos (from scikit-learn's sample images), batches, GPU detection."""

from __future__ import annotations

import os
import sys
import warnings

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


def to_numpy(value):
    """Concrete numpy data of a Batch (padded), Tensor, or nested structure of them."""
    if isinstance(value, ndd.Batch):
        return [np.asarray(sample.cpu()) for sample in value]
    if isinstance(value, ndd.Tensor):
        return np.asarray(value.cpu())
    if isinstance(value, (list, tuple)):
        return type(value)(to_numpy(v) for v in value)
    if isinstance(value, dict):
        return {k: to_numpy(v) for k, v in value.items()}
    return value


def assert_same(eager, compiled):
    """Bit-exact equality of two results, structure, dtypes and shapes included."""
    if isinstance(eager, (ndd.Batch, ndd.Tensor)):  # transparent mode's are lazy subclasses
        base = ndd.Batch if isinstance(eager, ndd.Batch) else ndd.Tensor
        assert isinstance(compiled, base), (type(eager), type(compiled))
    else:
        assert type(eager) is type(compiled), (type(eager), type(compiled))
    if isinstance(eager, ndd.Batch):
        assert eager.batch_size == compiled.batch_size
        assert eager.dtype == compiled.dtype
        assert eager.layout == compiled.layout
        # the shapes of the data held (iteration and `batch_size` stop at the declared size)
        assert eager.shape == compiled.shape, (eager.shape, compiled.shape)
        for a, b in zip(to_numpy(eager), to_numpy(compiled)):
            assert a.dtype == b.dtype and a.shape == b.shape
            np.testing.assert_array_equal(a, b)
    elif isinstance(eager, ndd.Tensor):
        a, b = to_numpy(eager), to_numpy(compiled)
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)
    elif isinstance(eager, (list, tuple)):
        assert len(eager) == len(compiled)
        for a, b in zip(eager, compiled):
            assert_same(a, b)
    elif isinstance(eager, dict):
        assert eager.keys() == compiled.keys()
        for key in eager:
            assert_same(eager[key], compiled[key])
    elif isinstance(eager, np.ndarray):
        assert eager.dtype == compiled.dtype and eager.shape == compiled.shape
        np.testing.assert_array_equal(eager, compiled)
    else:
        assert eager == compiled


def run_both(function, *args, seed=1234, calls=1, **kwargs):
    """Run `function` eagerly and compiled with the same seed; compare each call and RNG state."""
    compiled = ndd.compile(function)
    ndd.random.set_seed(seed)
    eager = [function(*args, **kwargs) for _ in range(calls)]
    eager_state = str(ndd.random.get_default_rng().state)
    ndd.random.set_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ndd_trace.NddTraceWarning)
        results = [compiled(*args, **kwargs) for _ in range(calls)]
    assert str(ndd.random.get_default_rng().state) == eager_state
    for e, c in zip(eager, results):
        assert_same(e, c)
    info = compiled.cache_info()
    assert info.fallbacks == 0 and info.traces == 1, info
    return compiled
