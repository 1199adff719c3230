"""A reader loop that raises mid-epoch: `python -m ndd_trace` must exit with the script's code (1)."""

import nvidia.dali.experimental.dynamic as ndd
from _common import photo_dir

reader = ndd.readers.File(file_root=photo_dir(), random_shuffle=True)
for epoch in range(3):
    for step, (jpegs, labels) in enumerate(reader.next_epoch(batch_size=4)):
        images = ndd.resize(ndd.decoders.image(jpegs), size=[32, 32])
        images.torch()
        if epoch == 1 and step == 1:
            raise RuntimeError("stop mid-epoch")
