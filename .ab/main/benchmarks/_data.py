"""Small, deterministic JPEG data sets for the benchmarks, cut from scikit-learn's sample photos.

Example::

    from benchmarks._data import load_jpeg_bytes, make_jpeg_dir

    root = make_jpeg_dir("/tmp/ndd_trace_jpegs", n=64, seed=0)  # root/<class>/*.jpg
    encoded = load_jpeg_bytes(root)  # list of uint8 arrays, sorted by path
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
from pathlib import Path

import numpy as np
from PIL import Image

SAMPLE_PHOTOS = ("china.jpg", "flower.jpg")  # one class directory per photo
MIN_SIDE = 96
MAX_SIDE = 320
JPEG_QUALITY = 90
_MARKER_NAME = ".complete.json"


def _sample_photo_dir() -> Path:
    """Return scikit-learn's sample image directory without importing scikit-learn."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("scikit-learn is needed for its sample photos: pip install scikit-learn")
    return Path(next(iter(spec.submodule_search_locations))) / "datasets" / "images"


def _load_sample_photos() -> list[np.ndarray]:
    """Load the sample photos as RGB uint8 arrays (HWC)."""
    photo_dir = _sample_photo_dir()
    photos = []
    for name in SAMPLE_PHOTOS:
        with Image.open(photo_dir / name) as image:
            photos.append(np.asarray(image.convert("RGB")))
    return photos


def _encode_jpeg(pixels: np.ndarray, quality: int = JPEG_QUALITY) -> bytes:
    """Encode an RGB uint8 array as a baseline JPEG."""
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=quality)
    return buffer.getvalue()


def make_jpeg_dir(root: str | os.PathLike, n: int = 64, seed: int = 0) -> Path:
    """Create `n` JPEG crops of the sample photos under `root/<class>/` (skipped if present)."""
    root = Path(root)
    marker = root / _MARKER_NAME
    expected = {"n": n, "seed": seed, "quality": JPEG_QUALITY}
    if marker.exists() and json.loads(marker.read_text()) == expected:
        return root

    for stale in jpeg_paths(root):  # a different n or seed was written here before
        stale.unlink()
    photos = _load_sample_photos()
    rng = np.random.default_rng(seed)
    for index in range(n):
        class_index = index % len(photos)
        photo = photos[class_index]
        photo_height, photo_width = photo.shape[:2]
        height = int(rng.integers(MIN_SIDE, min(MAX_SIDE, photo_height) + 1))
        width = int(rng.integers(MIN_SIDE, min(MAX_SIDE, photo_width) + 1))
        top = int(rng.integers(0, photo_height - height + 1))
        left = int(rng.integers(0, photo_width - width + 1))
        crop = photo[top : top + height, left : left + width]
        if rng.random() < 0.5:
            crop = crop[:, ::-1]
        class_dir = root / Path(SAMPLE_PHOTOS[class_index]).stem
        class_dir.mkdir(parents=True, exist_ok=True)
        (class_dir / f"{index:05d}.jpg").write_bytes(_encode_jpeg(np.ascontiguousarray(crop)))

    marker.write_text(json.dumps(expected))
    return root


def jpeg_paths(root: str | os.PathLike) -> list[Path]:
    """Return the JPEG files under `root/<class>/`, sorted by path."""
    return sorted(Path(root).glob("*/*.jpg"))


def load_jpeg_bytes(root: str | os.PathLike) -> list[np.ndarray]:
    """Return the encoded bytes of every JPEG under `root/<class>/` as uint8 arrays, by path."""
    return [np.fromfile(path, dtype=np.uint8) for path in jpeg_paths(root)]
