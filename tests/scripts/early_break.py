"""Breaking out of loops, then reading a second epoch; plus an exit code."""

import sys

from _common import digest, photo_dir

import nvidia.dali.experimental.dynamic as ndd

ndd.random.set_seed(6)
reader = ndd.readers.File(file_root=photo_dir(), random_shuffle=True, seed=2)
for epoch in range(2):
    for step, (jpegs, labels) in enumerate(reader.next_epoch(batch_size=3)):
        images = ndd.resize(ndd.decoders.image(jpegs), size=[24, 24])
        images = ndd.rotate(images, angle=ndd.random.uniform(batch_size=3, range=[-9, 9]),
                            keep_size=True)
        digest(f"epoch {epoch} step {step}", images.torch())
        if epoch == 0 and step == 1:
            break
    else:
        continue
    # leave the first epoch early: the rest of it is never consumed
    for _ in reader.next_epoch(batch_size=3):
        pass
sys.exit(3)
