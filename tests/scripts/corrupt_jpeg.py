"""A decode loop that meets broken files: a truncated JPEG and bytes that are no image, each
caught and skipped, given as arrays and read by a reader (whose steps run ahead under
ndd_trace). DALI's image codec logs each failure on stderr: a plain run's lines, once each."""

import os
import shutil

import numpy as np
from _common import digest, photo_dir
from benchmarks._data import jpeg_paths

import nvidia.dali.experimental.dynamic as ndd

paths = jpeg_paths(photo_dir(8))
files = [np.fromfile(path, dtype=np.uint8) for path in paths]
truncated = files[0][: len(files[0]) // 3].copy()
not_an_image = np.frombuffer(b"\xff\xd8\xff\xe0 not a jpeg" * 4, np.uint8).copy()
steps = [files[:4], [truncated, *files[1:4]], files[4:8], [not_an_image, *files[1:4]],
         files[:4], [truncated, *files[1:4]]]
for step, encoded in enumerate(steps):
    try:
        images = ndd.resize(ndd.decoders.image(ndd.as_batch(encoded)), size=[32, 32])
        digest(f"step {step}", images.torch())
    except RuntimeError as error:
        print(f"step {step} skipped: {type(error).__name__}", flush=True)

# a folder of the photos and, read last, the truncated one
folder = os.path.join(os.environ.get("NDD_TRACE_DATA", "/tmp"), "ndd_trace_broken_photos")
os.makedirs(os.path.join(folder, "photos"), exist_ok=True)
for path in paths:
    shutil.copy(path, os.path.join(folder, "photos", os.path.basename(path)))
truncated.tofile(os.path.join(folder, "photos", "zz_truncated.jpg"))
reader = ndd.readers.File(file_root=folder, random_shuffle=False)
for epoch in range(1):  # (a second epoch: see docs/transparent.md, "Logs on stderr")
    try:
        for step, (jpegs, labels) in enumerate(reader.next_epoch(batch_size=2)):
            images = ndd.resize(ndd.decoders.image(jpegs), size=[16, 16])
            digest(f"epoch {epoch} step {step}", images.torch())
    except RuntimeError as error:
        print(f"epoch {epoch} ended: {type(error).__name__}", flush=True)
