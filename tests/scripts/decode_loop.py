"""A training-style reader loop: decode, random_resized_crop, flip + normalize, `.torch()`, a
model step. NDD_EPOCHS sets the epochs; NDD_CAPTURE=1 iterates with `capture=True` (DALI's
capture mode, for the benchmark). Prints a digest of every batch, and the loop time on stderr.
"""

import os
import sys
import time

import torch
from _common import digest, photo_dir

import nvidia.dali.experimental.dynamic as ndd

EPOCHS = int(os.environ.get("NDD_EPOCHS", "2"))
CAPTURE = os.environ.get("NDD_CAPTURE") == "1"

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 64 * 64, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.001)
ndd.random.set_seed(12)
reader = ndd.readers.File(file_root=photo_dir(32), random_shuffle=True, seed=1)
start = time.perf_counter()
steps = 0
for epoch in range(EPOCHS):
    for jpegs, labels in reader.next_epoch(batch_size=8, capture=CAPTURE):
        images = ndd.decoders.image(jpegs)
        images = ndd.random_resized_crop(images, size=[64, 64])
        flip = ndd.random.coin_flip(batch_size=8)
        images = ndd.crop_mirror_normalize(images, mirror=flip, mean=[124.0, 116.0, 104.0],
                                           std=[58.0, 57.0, 57.0])
        batch = images.torch()
        digest(f"epoch {epoch} step {steps}", batch)
        loss = torch.nn.functional.cross_entropy(model(batch), labels.torch().long().view(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        steps += 1
elapsed = time.perf_counter() - start
print(f"loss {loss.item():.6f}")
print(f"loop {elapsed:.3f}s {steps / elapsed:.1f} steps/s", file=sys.stderr)
