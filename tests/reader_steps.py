"""The reader loop that tests of reader streams and of coalescing share (this test process's and
their child processes'): a shuffling File reader and a step with random ops."""

import nvidia.dali.experimental.dynamic as ndd


def file_reader(root, **kwargs):
    """An ndd File reader over `root`, shuffling with seed 7 unless told otherwise."""
    kwargs.setdefault("random_shuffle", True)
    kwargs.setdefault("seed", 7)
    return ndd.readers.File(file_root=str(root), **kwargs)


def augment(jpegs):
    """Decode, random-resized-crop and randomly mirror a batch of JPEGs."""
    images = ndd.decoders.image(jpegs)
    images = ndd.random_resized_crop(images, size=[24, 24])
    flip = ndd.random.coin_flip(batch_size=images.batch_size)
    return ndd.crop_mirror_normalize(images, mirror=flip, mean=[10.0], std=[50.0])
