"""A small folder of JPEGs for the examples, made with what `pip install ndd_trace` installs.

    root = make_image_dir("/tmp/ndd_trace_images", n=30)   # root/<class>/*.jpg, made once

The images are drawn with numpy (smooth colour fields with a few shapes, of varied sizes) and
encoded by nvImageCodec, the image codec library DALI itself installs and decodes with (on the
CPU: no GPU needed). Bring your own folder instead with `--image-dir` (one subfolder per class,
as `ndd.readers.File` reads it).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

CLASSES = ("fields", "shapes")
MIN_SIDE, MAX_SIDE = 96, 320
_MARKER = ".complete.json"


def _draw(rng: np.random.Generator, height: int, width: int, shapes: bool) -> np.ndarray:
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    image = np.empty((height, width, 3), np.float32)
    for channel in range(3):  # a smooth field: a random mix of gradients and waves
        a, b, c = rng.uniform(-1, 1, 3)
        image[..., channel] = 128 + 80 * np.sin(a * x / 17 + b * y / 23 + c * 6)
    if shapes:
        for _ in range(int(rng.integers(2, 6))):
            top, left = int(rng.integers(0, height - 16)), int(rng.integers(0, width - 16))
            image[top:top + int(rng.integers(8, 48)), left:left + int(rng.integers(8, 48))] = \
                rng.uniform(0, 255, 3)
    image += rng.normal(0, 6, image.shape)  # sensor noise: a JPEG of a photo, not of a chart
    return np.clip(image, 0, 255).astype(np.uint8)


def make_image_dir(root: str | os.PathLike, n: int = 30, seed: int = 0) -> Path:
    """`n` JPEGs under `root/<class>/`, the same for the same `n` and `seed` (kept if present)."""
    import nvidia.nvimgcodec as codec  # DALI's image codec library (a dependency of DALI)

    root = Path(root)
    marker = root / _MARKER
    expected = {"n": n, "seed": seed}
    if marker.exists() and json.loads(marker.read_text()) == expected:
        return root
    for stale in root.glob("*/*.jpg"):
        stale.unlink()
    encoder = codec.Encoder(device_id=codec.NVIMGCODEC_DEVICE_CPU_ONLY)
    params = codec.EncodeParams(quality_type=codec.QualityType.QUALITY, quality_value=90)
    rng = np.random.default_rng(seed)
    for index in range(n):
        label = CLASSES[index % len(CLASSES)]
        height, width = (int(side) for side in rng.integers(MIN_SIDE, MAX_SIDE + 1, 2))
        pixels = _draw(rng, height, width, shapes=label == "shapes")
        (root / label).mkdir(parents=True, exist_ok=True)
        encoded = encoder.encode(pixels, "jpeg", params=params)
        (root / label / f"{index:05d}.jpg").write_bytes(bytes(encoded))
    marker.write_text(json.dumps(expected))
    return root
